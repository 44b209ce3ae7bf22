"""scripts/run.sh end to end on a tiny demo: assertions on the lists and reports it writes."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from shardkit.io.inputs import read_list
from shardkit.io.tar import group_samples, iter_shard_members
from support import REPO

TINY = ["--demo_minutes", "1", "--utts_per_shard", "3", "--world_size", "2", "--num_workers", "1",
        "--batch_size", "2", "--jobs", "1", "--bench_formats", "none,zst:3", "--bench_audio", "wav",
        "--bench_workers", "", "--bench_seconds", "0.05"]


def recipe(workdir, *args):
    env = {**os.environ, "SHARDKIT_PYTHON": sys.executable}
    return subprocess.run(["bash", os.path.join(REPO, "scripts", "run.sh"), "--workdir", str(workdir), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


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
    # the stop shows what failed: shard, key, check, and where every finding is
    table = stopped.stderr[stopped.stderr.index("  2 findings (shard, key, check):"):]
    shard = work / "shards" / "source" / "aishell" / "shards_000000000.tar.bz2"  # prep reads the sources
    assert re.search(rf"aishell  {shard}  aishell/S0000-U000000  sample_rate  sample rate 8000 Hz", table)
    assert re.search(rf"aishell  {shard}  aishell/S0000-U000001  channels +2 channels, expected 1", table)
    assert f"every finding: {work / 'reports' / 'validate_aishell.json'}" in table
    assert not (work / "data" / "train" / "data.list").exists()
    # stage 1 packed every utterance of the demo (the faults are legal audio; validate is what objects)
    demo = {line.split("=")[0] for line in (work / "corpora.txt").read_text().splitlines()}
    assert demo == {"aishell", "librispeech", "accented"}
    made = {name: load(work / "reports" / f"make_{name}.json") for name in demo}
    assert all(m["skipped_utterances"] == 0 and m["shards"] >= 1 for m in made.values())
    findings = load(work / "reports" / "validate_aishell.json")["findings"]
    assert {f["key"] for f in findings} == {"aishell/S0000-U000000", "aishell/S0000-U000001"}

    # the rerun the message suggests; with DataLoader rows in the bench when torch is here (a stereo
    # utterance among mono ones crashed the collate when the bench read the unvalidated sources)
    resumed = recipe(work, *TINY, "--bench_workers", "0,1", "--stage", "2", "--allow_rejects", "true")
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    train = work / "data" / "train" / "data.list"
    assert all(p.endswith(".tar") for p in read_list(str(train)))  # plain tar: WeNet reads it with no hook
    keys = keys_of(train)
    assert "aishell/S0000-U000000" not in keys and "aishell/S0000-U000001" not in keys
    expected = sum(m["utterances"] for m in made.values()) - 2
    assert len(set(keys)) == expected  # every clean utterance reaches the list

    summary = load(work / "reports" / "summary.json")
    assert summary["findings"] == 2
    assert summary["where"]["train_list"] == str(train)
    assert summary["hours"] > 0.01 and summary["bytes_source"] > 0 and summary["bytes_balanced"] > 0
    first = read_list(str(train))[0]
    # the demo's librispeech is FLAC, the others WAV: every output shard mixes the three corpora
    listed = summary["format"]["list"]
    assert (listed["shard"], listed["codec"], sorted(listed["audio"])) == (first, "none", ["flac", "wav"])
    assert summary["format"]["needs_zstd_hook"] is False and summary["format"]["zstd_hook"] is None
    advice = summary["loader_advice"]
    assert advice["this_machine_cores"] == len(os.sched_getaffinity(0)) and advice["num_workers_used"] == 1
    assert not advice["node_known"]  # no --train_cores: the summary does not take this box for the training node
    text = (work / "reports" / "summary.md").read_text()
    assert text.startswith("# shardkit recipe summary")
    assert re.search(r"- training list format \(read from its first shard\): plain tar, WAV \d+%, FLAC \d+% members: "
                     r"WeNet reads it with no hook", text)
    assert re.search(r"rank balance for W=2 ranks \(GPUs\) x K=1 loader workers per rank: seconds of audio per rank "
                     r"in epoch 0: \[\d+, \d+\] before balancing, \[\d+, \d+\] after; worst max/min ratio over "
                     r"3 shuffled epochs: \d\.\d+ before, \d\.\d+ after", text)
    if has_command("plan") and has_command("balance"):
        after = load(work / "reports" / "plan_after.json")
        before = load(work / "reports" / "plan_before.json")
        assert after["divides"]
        # a tiny demo balances within one median utterance, so "equal" is only approximately 1.0 here
        assert after["worst_rank_spread"] < before["worst_rank_spread"]
        assert load(work / "data" / "train" / "prep.json")["summary"]["balanced"]
    check = load(work / "reports" / "loader_check.json")
    assert check["data_list"] == str(train)  # the loader check read the training list
    assert check["ok"] and check["equal_batches"] and len({r["utterances"] for r in check["ranks"]}) == 1
    assert check["distinct_keys"] == len(set(keys_with_repeats(train)))
    assert summary["loader_check"]["ok"]
    if has_command("bench"):
        bench = load(work / "reports" / "bench.json")
        assert bench["corpus"]["sampled_from"] == len(read_list(str(train)))  # the bench read the training list
        assert {(r["format"], r["audio"]) for r in bench["formats"]} == {("none", "wav"), ("zst:3", "wav")}
        assert [(r["format"], r["audio"]) for r in summary["bench"]] == [("none", "wav"), ("zst:3", "wav")]
        assert os.path.exists(summary["where"]["bench_chart"])
        if has_torch():
            assert sorted({r["workers"] for r in bench["loader"]}) == [0, 1]  # int16 rows, float32 rows beside them
        assert re.search(r"none WAV: size 1\.00 of the WAV tar, .* <- this list", text)
        assert "zst:3 WAV" in text and not re.search(r"zst:3 WAV: .*<- this list", text)
        # FLAC members were not measured (--bench_audio wav): the advice says so rather than borrow WAV's rate
        assert advice["unmeasured_audio"] == ["flac"] and advice["decode_hours_per_s"] is None
        assert "stage 3 measured no none row with FLAC members (this list's own): rerun stages 3-5 with " \
               "--bench_audio" in text


@pytest.mark.slow
def test_zst_list_summary_checks_the_hook_in_the_training_python(tmp_path):
    import venv

    bare = tmp_path / "bare"  # a training environment without the hook (and without shardkit)
    venv.create(bare, with_pip=False)
    bare_python = bare / "bin" / "python"
    work = tmp_path / "exp"
    result = recipe(work, *TINY, "--codec", "zst", "--stage", "0", "--train_python", str(bare_python))
    assert result.returncode == 0, result.stderr
    summary = load(work / "reports" / "summary.json")
    hook = summary["format"]["zstd_hook"]
    import sys as _sys

    if _sys.version_info >= (3, 14):
        assert hook["reads_zstd"]
        return
    assert not hook["reads_zstd"]
    # "PY -m pip install shardkit && " comes first where shardkit cannot be imported (PYTHONPATH may reach it)
    assert hook["command"].endswith(f"{bare_python} -m shardkit wenet enable-zstd")
    assert f"Run there: `{hook['command']}`" in (work / "reports" / "summary.md").read_text()


@pytest.mark.slow
def test_one_corpus_of_several_folders_with_the_same_shard_names(tmp_path):
    """Every WeNet corpus names its shards shards_000000000.tar, ...: a glob over several corpora's lists."""
    first = tmp_path / "first"
    made = recipe(first, *TINY, "--stop_stage", "1", "--demo_faults", "true")
    assert made.returncode == 0, made.stderr
    names = {os.path.basename(p) for p in glob.glob(str(first / "shards" / "source" / "*" / "*.tar.bz2"))}
    assert "shards_000000000.tar.bz2" in names  # every corpus has one
    work = tmp_path / "mix"
    result = recipe(work, *TINY, "--corpus", f"all={first}/shards/source/*/data.list", "--allow_rejects", "true")
    assert result.returncode == 0, result.stderr
    assert not (work / "shards").exists() and not (work / "quarantine").exists()  # one read, one copy (prep)
    # each rejected utterance is listed under its own corpus's source shard, though the names repeat
    rejects = [json.loads(line) for line in open(work / "data" / "train" / "rejects.jsonl")]
    assert {r["shard"] for r in rejects} == {str(first / "shards" / "source" / "aishell" / "shards_000000000.tar.bz2")}
    keys = keys_of(work / "data" / "train" / "data.list")
    made_utts = sum(load(first / "reports" / f"make_{n}.json")["utterances"]
                    for n in ("aishell", "librispeech", "accented"))
    assert len(set(keys)) == made_utts - 2
    assert load(work / "reports" / "loader_check.json")["ok"]


def test_options_take_both_forms_and_usage_errors_come_before_any_set_up(tmp_path):
    repo = tmp_path / "repo"  # a copy of the script, so that a set-up would show as repo/.venv
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "scripts", "run.sh"), repo / "scripts" / "run.sh")
    bare_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for args, message in [(["--stage", "9"], "run.sh: --stage must be a stage from 0 to 5 (got '9')"),
                          (["--stage=7"], "run.sh: --stage must be a stage from 0 to 5 (got '7')"),
                          (["--stop_stage=1", "--stage", "3"], "run.sh: --stage 3 comes after --stop_stage 1: "
                                                               "nothing to run"),
                          (["--wrold_size", "2"], "run.sh: unknown option --wrold_size"),
                          (["--codec=gz"], "run.sh: --codec must be none or zst (got 'gz')"),
                          (["--world_size"], "run.sh: option --world_size needs a value"),
                          (["--corpus", "nopath"], "run.sh: --corpus wants NAME=PATH, got 'nopath'")]:
        result = subprocess.run(["bash", str(repo / "scripts" / "run.sh"), "--workdir", str(tmp_path / "w"), *args],
                                env=bare_env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.splitlines()[0] == message
        assert "Options (--name value or --name=value" in result.stderr  # the usage follows
        assert not (repo / ".venv").exists() and not (tmp_path / "w").exists()
    helped = recipe(tmp_path, "--help")
    assert helped.returncode == 0 and "--world_size" in helped.stdout and "--stage=" not in helped.stdout
    assert re.search(r"--stage +first stage to run \(0-5\) \[0\]", helped.stdout)
    both = recipe(tmp_path / "forms", "--stage=0", "--stop_stage", "0", "--demo_minutes=0.2", "--seed", "1")
    assert both.returncode == 0, both.stderr
    assert "==== stage 0: demo data" in both.stderr and "==== stage 1" not in both.stderr
    assert len((tmp_path / "forms" / "corpora.txt").read_text().splitlines()) == 3


def test_corpora_given_as_shards_and_kaldi_dir(tmp_path, make_shards):
    from dataclasses import replace

    from shardkit.commands.demo import DEMO_MIX, write_corpus

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
    from shardkit.commands.demo import DEMO_MIX, write_corpus

    kaldi = write_corpus(DEMO_MIX[0], str(tmp_path / "kaldi"), utterances=2)
    with open(os.path.join(kaldi["dir"], "text"), "a", encoding="utf-8") as f:
        f.write("aishell/lost 一个没有录音的句子\n")
    result = recipe(tmp_path / "exp", "--corpus", f"aishell={kaldi['dir']}", "--stop_stage", "1", "--jobs", "1")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"run.sh: stage 1 stopped: fix the data dir of aishell, or go on without those utterances: bash "
        f"{REPO}/scripts/run.sh --corpus aishell={kaldi['dir']} --stop_stage 1 --jobs 1 --workdir {tmp_path / 'exp'} "
        f"--allow_rejects true")
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


def printed_paths(text, root):
    """Every path under ``root`` a summary prints (up to a space, a comma, a closing bracket or backquote)."""
    return set(re.findall(rf"({re.escape(str(root))}[^\s,)`]*)", text))


@pytest.mark.slow
def test_summary_of_a_three_corpus_bz2_mix_states_what_was_written(tmp_path, make_shards):
    """The issue's case: three corpora given as bz2 shards (no stage 1), so no make report has their sizes."""
    from support import SMALL_CORPORA, corpus

    sources = {spec.name: make_shards("bz2", specs=(spec,), utts_per_shard=3, name=spec.name) for spec in SMALL_CORPORA}
    given = [arg for name, shards in sources.items()
             for arg in ("--corpus", f"{name}={os.path.dirname(shards[0])}/data.list")]
    work = tmp_path / "exp"
    args = [*given, *TINY, "--bench_formats", "none", "--bench_audio", "wav,flac"]
    result = recipe(work, *args)
    assert result.returncode == 0, result.stderr
    summary = load(work / "reports" / "summary.json")
    text = (work / "reports" / "summary.md").read_text()
    assert text in result.stdout  # what was printed is what was kept

    # sizes: the files themselves, per corpus and in all
    for name, shards in sources.items():
        assert summary["corpora"][name]["bytes_source"] == sum(os.path.getsize(p) for p in shards)
        assert summary["corpora"][name]["source_shards"] == len(shards)
        assert not summary["corpora"][name]["made_by_stage_1"]
    all_sources = [p for shards in sources.values() for p in shards]
    assert summary["bytes_source"] == sum(os.path.getsize(p) for p in all_sources) > 0
    train = read_list(str(work / "data" / "train" / "data.list"))
    assert summary["bytes_balanced"] == sum(os.path.getsize(p) for p in train) > 0
    assert f"{len(all_sources)} source shards {summary['bytes_source'] / 1e6:.1f} MB -> {len(train)} training " \
           f"shards {summary['bytes_balanced'] / 1e6:.1f} MB" in text
    # hours: every utterance the fixture wrote, accepted (none has a finding)
    assert summary["hours"] == pytest.approx(sum(u[3] for u in corpus()) / 3600, abs=1e-4)
    assert summary["findings"] == 0 and summary["rejects_lines"] == 0

    # every path it prints exists, and it names prep's outputs, not convert's or balance's
    paths = printed_paths(text, work)
    assert paths >= {str(work / "data" / "train" / n) for n in ("data.list", "prep.json", "rejects.jsonl")}
    assert all(os.path.exists(p) for p in paths), [p for p in paths if not os.path.exists(p)]
    assert "balance.json" not in text and "quarantine" not in text and "converted" not in text

    # the advice reads the row of the list's own format: plain tar, WAV members (not the FLAC row)
    assert summary["format"]["list"]["label"] == "plain tar, WAV members"
    assert re.search(r"- none WAV: .* <- this list\n", text) and re.search(r"- none FLAC: [^\n]*no hook\n", text)
    advice = summary["loader_advice"]
    assert advice["measured_on"] == "none WAV shards of the training list"
    wav_rate = next(r["hours_per_s"] for r in summary["bench"] if r["audio"] == "wav")
    assert advice["decode_hours_per_s"] == wav_rate
    # no --train_cores: it cannot know the training node here, and says how to learn it there
    assert not advice["node_known"]
    assert "the training node's cores are not known here: this machine has" in text
    assert f"`shardkit bench {work / 'data' / 'train' / 'data.list'} --gpus-per-node G`" in text
    assert "`shardkit loader-check " in text
    # balanced for 1 worker; one GPU needs more for WAV + fbank: the command that rebalances
    assert advice["num_workers"] >= 2 and advice["rerun"].endswith(f"--stage 2 --num_workers {advice['num_workers']}")
    assert f"  to balance for {advice['num_workers']} workers: {advice['rerun']}" in text

    # told the training node (the command the summary gives, with its N and G filled in): the node's own advice
    told = re.search(r"Give them to the summary: (.*) \(`nproc`", text).group(1)
    told = told.replace("--train_cores N", "--train_cores 8").replace("--gpus_per_node G", "--gpus_per_node 4")
    again = subprocess.run(["bash", "-c", told], cwd=REPO, env={**os.environ, "SHARDKIT_PYTHON": sys.executable},
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "==== stage 4" not in again.stderr and "==== stage 5: summary" in again.stderr
    node = load(work / "reports" / "summary.json")["loader_advice"]
    assert node["node_known"] and (node["cores"], node["gpus_per_node"], node["num_workers"]) == (8, 4, 2)
    text = (work / "reports" / "summary.md").read_text()
    assert "- loader advice for the training node (8 cores: --train_cores; 4 GPUs per node: --gpus_per_node): " \
           "4 GPUs per node, 8 cores (2 per GPU)" in text
    rerun = re.search(r"  to balance for 2 workers: (.*)\n", text).group(1)

    # the rerun it prints, pasted as it is: the list is balanced for 2 workers, and the advice agrees
    rebalanced = subprocess.run(["bash", "-c", rerun], cwd=REPO, env={**os.environ, "SHARDKIT_PYTHON": sys.executable},
                                capture_output=True, text=True, timeout=300)
    assert rebalanced.returncode == 0, rebalanced.stderr
    prep = load(work / "data" / "train" / "prep.json")
    assert prep["settings"]["num_workers"] == 2 and prep["summary"]["num_shards"] % (2 * 2) == 0
    final = load(work / "reports" / "summary.json")["loader_advice"]
    assert final["num_workers_used"] == 2 and "rerun" not in final and final["node_known"]
    assert "(the --num_workers this list was balanced for)" in (work / "reports" / "summary.md").read_text()
