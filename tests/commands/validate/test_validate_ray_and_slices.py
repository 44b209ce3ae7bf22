"""validate --executor ray and --split I/N: slices merged by merge-reports equal one run over the whole list."""

import json
import logging
import os
import shutil

import pytest

from shardkit.io.synth import CorpusSpec, corpus_utterances
from shardkit.io.tar import TarWriter
from shardkit.io.files import load_json
from support import folder_bytes, is_slice_file, run_cli, without

TIMING = ("elapsed_s", "utterances_per_s", "audio_hours_per_s")


def _write(path, utts):
    with open(path, "wb") as f:
        tar = TarWriter(f)
        for key, text, audio in utts:
            tar.add(f"{key}.txt", text)
            tar.add(f"{key}.wav", audio)
        tar.close()
    return str(path)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """6 shards (3 slices of 2): a truncated WAV, and duplicate keys within a slice and across slices."""
    folder = tmp_path_factory.mktemp("validate-sources")
    u = [(key, text.encode(), audio) for key, text, audio, _ in
         corpus_utterances(CorpusSpec("dist", 9, 0.3, 0.6, "mix"), seed=3)]
    truncated = ("bad/truncated", b"HELLO", u[8][2][: len(u[8][2]) // 2])
    layout = [[u[0], u[1]], [u[2], u[3], truncated], [u[4], u[5]],
              [u[0], u[6]],  # slice 2: every key but one is in slice 1
              [u[7]], [u[2], u[7]]]  # slice 3: a key of slice 1, then a key of the shard before it
    return [_write(folder / f"s{i}.tar", utts) for i, utts in enumerate(layout)]


TIMINGS = {"totals": set(TIMING), "options": {"threads"}, "shards": set(TIMING)}


def test_three_slices_merged_equal_one_run_with_quarantine(sources, tmp_path):
    out, quarantine = tmp_path / "out", tmp_path / "q"
    out.mkdir()
    args = ["validate", *sources, "--sample-rate", "16000", "-q", "-j", "1", "--quarantine", quarantine]
    result = run_cli(*args, "--report", out / "validate.json")
    assert result.exit_code == 1, result.output
    single = without(load_json(str(out / "validate.json")), **TIMINGS)
    single_files = folder_bytes(quarantine, skip=is_slice_file)
    assert [(os.path.basename(f["shard"]), f["key"], f["check"]) for f in single["findings"]] == [
        ("s1.tar", "bad/truncated", "truncated"), ("s3.tar", single["findings"][1]["key"], "duplicate_key"),
        ("s5.tar", single["findings"][2]["key"], "duplicate_key"),
        ("s5.tar", single["findings"][3]["key"], "duplicate_key")]
    shutil.rmtree(out)
    shutil.rmtree(quarantine)
    out.mkdir()
    for i in (1, 2, 3):
        result = run_cli(*args, "--report", out / "validate.json", "--split", f"{i}/3", "--json")
        assert result.exit_code in (0, 1), result.output
        assert json.loads(result.stdout)["slice"]["index"] == i
    assert sorted(os.listdir(out)) == [f"validate.slice-{i}-of-3.json" for i in (1, 2, 3)]
    # each slice saw only its own keys: the duplicate of slice 1's keys is not found yet
    assert load_json(str(out / "validate.slice-2-of-3.json"))["findings"] == []
    result = run_cli("merge-reports", out, "--command", "validate")
    assert result.exit_code == 1, result.output
    assert result.stderr == (f"merged 3 slices of validate: 6 entries (4 findings in 3 shards); report: "
                             f"{out}/validate.json; list: {quarantine}/data.list\n")
    assert without(load_json(str(out / "validate.json")), **TIMINGS) == single
    assert folder_bytes(quarantine, skip=is_slice_file) == single_files
    # every utterance of s5 repeats an earlier key: it has no cleaned copy to list
    assert open(quarantine / "data.list").read().split() == [
        sources[0], f"{quarantine}/s1.tar", sources[2], f"{quarantine}/s3.tar", sources[4]]


def test_split_without_report_and_missing_slice(sources, tmp_path):
    result = run_cli("validate", *sources, "--split", "1/3")
    assert result.exit_code == 2
    assert result.stderr == ("Error: --split needs --report FILE (each slice writes FILE's slice report "
                             "for merge-reports)\n")
    for i in (1, 3):
        assert run_cli("validate", *sources, "-q", "--report", tmp_path / "validate.json",
                       "--split", f"{i}/3").exit_code in (0, 1)
    result = run_cli("merge-reports", tmp_path, "--command", "validate")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: {tmp_path}: missing slice 2 of 3 (no validate.slice-2-of-3.json); "
                             f"rerun those jobs, then merge again\n")
    assert not (tmp_path / "validate.json").exists()


def test_ray_executor_reports_what_the_local_one_reports(sources, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, logging_level=logging.WARNING)
    try:
        reports = {}
        for executor in ("local", "ray"):
            report = tmp_path / f"{executor}.json"
            result = run_cli("validate", *sources, "-q", "--executor", executor, "--report", report,
                             "--quarantine", tmp_path / f"q-{executor}")
            assert result.exit_code == 1, result.output
            doc = without(load_json(str(report)), **TIMINGS)
            reports[executor] = json.loads(json.dumps(doc).replace(f"q-{executor}", "q"))
            reports[executor]["files"] = {name: data.replace(f"q-{executor}".encode(), b"q") for name, data
                                          in folder_bytes(tmp_path / f"q-{executor}", skip=is_slice_file).items()}
        assert reports["ray"] == reports["local"]
    finally:
        ray.shutdown()
