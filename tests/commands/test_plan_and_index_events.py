"""plan's and index's library functions (run_plan, run_index, shard_sizes) return what the CLI prints and
report progress as events: one stage, then a ``done`` per shard with its utterances or its error."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands.index import run_index
from shardkit.commands.plan import PlanSettings, run_plan, shard_sizes
from shardkit.errors import UsageError
from shardkit.run.events import DONE, STAGE
from shardkit.run.options import RunOptions


def _recorded():
    seen = []
    return seen, RunOptions(jobs=1, on_event=seen.append)


def test_run_plan_is_the_json_document_of_plan(make_shards, tmp_path):
    shards = make_shards("none")
    seen, options = _recorded()
    result = run_plan(shards, PlanSettings(world_size=2, num_workers=1, epochs=2, seed=3), options)
    cli = CliRunner().invoke(main, ["plan", *shards, "--world-size", "2", "--num-workers", "1", "--epochs", "2",
                                    "--seed", "3", "--json", "-q", "-j", "1"])
    assert cli.exit_code == result.exit_code == 0
    assert json.loads(cli.stdout) == json.loads(json.dumps(result.summary()))
    assert [(e.kind, e.stage) for e in seen] == [(STAGE, "read")] + [(DONE, "read")] * len(shards)
    assert seen[0].total == len(shards) and [e.result["shard"] for e in seen[1:]] == shards


def test_run_plan_with_a_conf_writes_the_dropped_keys_and_lists_a_failure(make_shards, tmp_path):
    shards = make_shards("none")
    conf = tmp_path / "train.yaml"
    conf.write_text("dataset_conf:\n  filter_conf:\n    max_length: 150\n")
    dropped = tmp_path / "dropped.txt"
    settings = PlanSettings(world_size=1, num_workers=1, wenet_conf=str(conf), dropped_keys=str(dropped))
    result = run_plan(shards, settings, RunOptions(jobs=1))
    assert result.wenet_conf["filter"]["dropped_utterances"] == len(dropped.read_text().split()) > 0
    assert result.summary()["wenet_conf"] == result.wenet_conf
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"x" * 1000)
    seen, options = _recorded()
    failed = run_plan([*shards, str(broken)], settings, options)
    assert failed.exit_code == 1 and failed.summary() == {"command": "plan", "failures": failed.failures}
    assert [e.error for e in seen if e.kind == DONE and e.error] == [failed.failures[0]["error"]]


def test_run_index_reports_each_shard_and_claims_its_output(make_shards, tmp_path):
    shards = make_shards("none")
    seen, options = _recorded()
    report = run_index(shards, str(tmp_path / "out" / "i.jsonl"), "c", options)
    assert report.exit_code == 0 and report.utterances == 14
    assert [e.kind for e in seen] == [STAGE] + [DONE] * len(shards) and seen[0].stage == "index"
    assert sum(e.result["utterances"] for e in seen[1:]) == 14
    utts, _, failures = shard_sizes(shards, options=RunOptions(jobs=1))
    assert utts.sum() == 14 and failures == []
    rewritten = run_index([report.path], str(tmp_path / "i.parquet"), options=RunOptions())
    assert rewritten.converted_from == report.path and rewritten.summary()["converted_from"] == report.path
    data_list = os.path.join(os.path.dirname(shards[0]), "data.list")
    with pytest.raises(UsageError, match="would destroy the input"):
        run_index([data_list], data_list, options=RunOptions())
