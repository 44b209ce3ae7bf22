"""scripts/run.sh end to end on a tiny demo: assertions on the lists and reports it writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from shardkit.inputs import read_list
from shardkit.tario import group_samples, iter_shard_members

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--demo_minutes", "1", "--utts_per_shard", "3", "--world_size", "2", "--num_workers", "1",
        "--batch_size", "2", "--jobs", "1", "--bench_formats", "none,zst:3", "--bench_audio", "wav",
        "--bench_workers", "", "--bench_seconds", "0.05"]


def recipe(workdir, *args):
    env = {**os.environ, "SHARDKIT_PYTHON": sys.executable}
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "run.sh"), "--workdir", str(workdir), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def keys_with_repeats(data_list):
    return [s["__key__"] for shard in read_list(str(data_list)) for s in group_samples(iter_shard_members(shard))]


def keys_of(data_list):
    """Keys of a list's utterances, without balance's -rep<N> suffix of repeated ones."""
    return [re.sub(r"-rep\d+$", "", s["__key__"]) for shard in read_list(str(data_list))
            for s in group_samples(iter_shard_members(shard))]


def has_command(name):
    from shardkit.cli import main

    return name in main.list_commands(None)


@pytest.mark.slow
def test_demo_stops_on_findings_then_goes_on_with_allow_rejects(tmp_path):
    work = tmp_path / "exp"
    stopped = recipe(work, *TINY, "--demo_faults", "true")
    assert stopped.returncode == 1, stopped.stderr
    assert "run.sh: stage 2 stopped: validation found problems in aishell" in stopped.stderr
    assert not (work / "data" / "train" / "data.list").exists()
    # stage 1 packed every utterance of the demo (the faults are legal audio; validate is what objects)
    demo = {line.split("=")[0] for line in (work / "corpora.txt").read_text().splitlines()}
    assert demo == {"aishell", "librispeech", "accented"}
    made = {name: load(work / "reports" / f"make_{name}.json") for name in demo}
    assert all(m["skipped_utterances"] == 0 and m["shards"] >= 1 for m in made.values())
    findings = load(work / "reports" / "validate_aishell.json")["findings"]
    assert {f["key"] for f in findings} == {"aishell/S0000-U000000", "aishell/S0000-U000001"}

    resumed = recipe(work, *TINY, "--stage", "2", "--allow_rejects", "true")
    assert resumed.returncode == 0, resumed.stderr
    train = work / "data" / "train" / "data.list"
    keys = keys_of(train)
    assert "aishell/S0000-U000000" not in keys and "aishell/S0000-U000001" not in keys
    expected = sum(m["utterances"] for m in made.values()) - 2
    assert len(set(keys)) == expected  # every clean utterance reaches the list

    summary = load(work / "reports" / "summary.json")
    assert summary["findings"] == 2
    assert summary["where"]["train_list"] == str(train)
    assert summary["hours"] > 0.01 and summary["bytes_source"] > 0 and summary["bytes_balanced"] > 0
    assert (work / "reports" / "summary.md").read_text().startswith("# shardkit recipe summary")
    if has_command("plan") and has_command("balance"):
        after = load(work / "reports" / "plan_after.json")
        before = load(work / "reports" / "plan_before.json")
        assert after["divides"]
        # a tiny demo balances within one median utterance, so "equal" is only approximately 1.0 here
        assert after["worst_rank_spread"] < before["worst_rank_spread"]
        assert load(work / "data" / "train" / "balance.json")["summary"]["balanced"]
    check = load(work / "reports" / "loader_check.json")
    assert check["ok"] and check["equal_batches"] and len({r["utterances"] for r in check["ranks"]}) == 1
    assert check["distinct_keys"] == len(set(keys_with_repeats(train)))
    assert summary["loader_check"]["ok"]
    if has_command("bench"):
        bench = load(work / "reports" / "bench.json")
        assert {(r["format"], r["audio"]) for r in bench["formats"]} == {("none", "wav"), ("zst:3", "wav")}
        assert [(r["format"], r["audio"]) for r in summary["bench"]] == [("none", "wav"), ("zst:3", "wav")]
        assert os.path.exists(summary["where"]["bench_chart"])


def test_corpora_given_as_shards_and_kaldi_dir(tmp_path, make_shards):
    from dataclasses import replace

    from shardkit.demo import DEMO_MIX, write_corpus

    shards = make_shards("bz2", utts_per_shard=4)
    segmented = replace(DEMO_MIX[2], spec=replace(DEMO_MIX[2].spec, name="meeting"))  # keys unlike the fixture's
    kaldi = write_corpus(segmented, str(tmp_path / "kaldi"), utterances=3)
    work = tmp_path / "exp"
    result = recipe(work, "--corpus", f"mix={os.path.dirname(shards[0])}/data.list", "--corpus",
                    f"meeting={kaldi['dir']}", "--stop_stage", "2", "--world_size", "2", "--num_workers", "1",
                    "--codec", "none", "--jobs", "1")
    assert result.returncode == 0, result.stderr
    assert "==== stage 0: demo data: skipped, corpora given (mix meeting)" in result.stderr
    assert not (work / "kaldi").exists()
    assert not (work / "shards" / "source" / "mix").exists()  # shards are not made again
    assert load(work / "reports" / "make_meeting.json")["utterances"] == 3
    keys = keys_of(work / "data" / "train" / "data.list")
    assert len(set(keys)) == 6 + 4 + 4 + 3  # SMALL_CORPORA and the Kaldi dir, every utterance
    assert all(p.endswith(".tar") for p in read_list(str(work / "data" / "train" / "data.list")))


def test_bad_options_are_usage_errors(tmp_path):
    unknown = recipe(tmp_path, "--wrold_size", "2")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "run.sh: unknown option --wrold_size (see --help)"
    corpus = recipe(tmp_path, "--corpus", "nopath")
    assert corpus.returncode == 2
    assert corpus.stderr.strip() == "run.sh: --corpus wants NAME=PATH, got 'nopath'"
    helped = recipe(tmp_path, "--help")
    assert helped.returncode == 0 and "--world_size" in helped.stdout


@pytest.mark.torch
@pytest.mark.parametrize("utts_per_shard,world_size,equal", [(7, 2, True), (5, 3, False)])
def test_loader_check_compares_ranks_through_the_torch_dataset(make_shards, utts_per_shard, world_size, equal):
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from shardkit.cli import main

    shards = make_shards("zst", utts_per_shard=utts_per_shard)  # 14 utterances: 7+7, or 5+5+4
    data_list = os.path.join(os.path.dirname(shards[0]), "data.list")
    result = CliRunner().invoke(main, ["loader-check", data_list, "--world-size", str(world_size), "--num-workers",
                                       "1", "--batch-size", "2", "--json"])
    assert result.exit_code == (0 if equal else 1), result.output
    report = json.loads(result.stdout)
    assert report["utterances"] == report["distinct_keys"] == 14
    expected = [7, 7] if equal else sorted([5, 5, 4])
    assert sorted(r["utterances"] for r in report["ranks"]) == expected
    assert report["ok"] is equal and report["equal_batches"] is equal


def test_stage_1_stops_when_make_skips_utterances(tmp_path):
    from shardkit.demo import DEMO_MIX, write_corpus

    kaldi = write_corpus(DEMO_MIX[0], str(tmp_path / "kaldi"), utterances=2)
    with open(os.path.join(kaldi["dir"], "text"), "a", encoding="utf-8") as f:
        f.write("aishell/lost 一个没有录音的句子\n")
    result = recipe(tmp_path / "exp", "--corpus", f"aishell={kaldi['dir']}", "--stop_stage", "1", "--jobs", "1")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "run.sh: stage 1 stopped: fix the data dir of aishell, or rerun with --allow_rejects true")
    made = load(tmp_path / "exp" / "shards" / "source" / "aishell" / "make.json")
    assert made["findings"] == [{"key": "aishell/lost", "check": "no_audio", "reason": "in text but not in wav.scp"}]


@pytest.mark.parametrize("utts_per_shard,world_size,equal", [(7, 2, True), (5, 3, False)])
def test_loader_check_without_torch_reads_in_worker_processes(make_shards, utts_per_shard, world_size, equal):
    from click.testing import CliRunner

    from shardkit.cli import main

    shards = make_shards("zst", utts_per_shard=utts_per_shard)
    data_list = os.path.join(os.path.dirname(shards[0]), "data.list")
    result = CliRunner().invoke(main, ["loader-check", data_list, "--world-size", str(world_size), "--num-workers",
                                       "2", "--batch-size", "2", "--engine", "shardkit", "--json"])
    assert result.exit_code == (0 if equal else 1), result.output
    report = json.loads(result.stdout)
    assert report["engine"] == "shardkit"
    assert report["utterances"] == report["distinct_keys"] == 14
    assert sorted(r["utterances"] for r in report["ranks"]) == ([7, 7] if equal else [4, 5, 5])
    if has_torch():  # the same counts as the DataLoader
        torch_report = json.loads(CliRunner().invoke(main, [
            "loader-check", data_list, "--world-size", str(world_size), "--num-workers", "2", "--batch-size", "2",
            "--engine", "torch", "--json"]).stdout)
        assert [(r["utterances"], r["batches"]) for r in torch_report["ranks"]] == \
            [(r["utterances"], r["batches"]) for r in report["ranks"]]


def has_torch():
    import importlib.util

    return importlib.util.find_spec("torch") is not None
