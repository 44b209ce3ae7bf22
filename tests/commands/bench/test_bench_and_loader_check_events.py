"""bench and loader-check take RunOptions whole and report progress through its events: bench's notes are
the lines its command line has always printed; loader-check reports one stage and a done per rank."""

from __future__ import annotations

import json
import os

from shardkit.commands.bench import BenchSettings, run_bench
from shardkit.commands.loader_check import LoaderCheckSettings, run_loader_check
from shardkit.run.options import RunOptions


def test_bench_says_each_measurement_as_a_note_and_records_the_runs_jobs(tmp_path):
    seen = []
    settings = BenchSettings(formats=("none",), audio=("wav",), decoders=("shardkit",), reference=(), workers=(),
                             corpus_mb=0.3, repeat=1, min_seconds=0, webdataset=False)
    report = run_bench([], str(tmp_path / "out"), settings, RunOptions(jobs=1, on_event=seen.append))
    assert {e.kind for e in seen} == {"note"}
    texts = [e.text for e in seen]
    assert texts[0] == "bench: corpus" and texts[1].startswith("bench: corpus: ")
    assert texts[1].endswith("MB of WAV tar; writing 1 formats")
    assert texts[2:] == ["bench: none/wav: write", "bench: none/wav: decompress", "bench: none/wav: read + group",
                         "bench: none/wav: read + decode (shardkit)"]
    assert report.settings["jobs"] == 1 and "jobs" not in vars(settings)
    with open(report.outputs["json"]) as f:
        written = json.load(f)
    assert written["settings"] == json.loads(json.dumps(report.settings)) and "outputs" not in written
    assert report.summary()["outputs"] == report.outputs and os.path.exists(report.outputs["md"])


def test_loader_check_reports_a_stage_and_each_rank(make_shards):
    shards = make_shards("none", utts_per_shard=7)
    data_list = os.path.join(os.path.dirname(shards[0]), "data.list")
    seen = []
    settings = LoaderCheckSettings(world_size=2, num_workers=0, batch_size=2, engine="shardkit")
    report = run_loader_check(data_list, settings, RunOptions(on_event=seen.append))
    assert [(e.kind, e.stage) for e in seen] == [("stage", "loader check"), ("done", "loader check"),
                                                 ("done", "loader check")]
    assert (seen[0].total, seen[0].unit) == (2, "rank")
    assert [e.result for e in seen[1:]] == report["ranks"] and report["ok"]
    assert run_loader_check(data_list, settings)["ranks"] == report["ranks"]  # no options: reports to nobody
