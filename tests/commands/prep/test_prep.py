"""prep: one read from raw shards to balanced, validated training shards, judged against the three-command
chain (convert, validate --quarantine, balance) on a mixed corpus with planted faults."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from support import corpus
from shardkit.run.options import RunOptions
from shardkit.cli import main
from shardkit.commands.balance import BalanceSettings, CorpusSource, run_balance
from shardkit.commands.convert import ConvertSettings, run_convert
from shardkit.commands.prep import PrepSettings, run_prep
from shardkit.planning.prep import StreamingPlanner
from shardkit.commands.validate import ValidateOptions, run_validate
from shardkit.io.synth import CorpusSpec, encode, speech_like, write_shards
from shardkit.io.tar import iter_shard_members

W, K = 2, 2
CHECKS = ValidateOptions(sample_rate=16000, channels=1)


def _faulty_mix(root) -> tuple[dict[str, str], set[str]]:
    """Three corpora in three codecs (bz2, gz, plain) with planted faults; (corpus -> source folder, bad keys)."""
    a = list(corpus((CorpusSpec("aishell", 10, 0.4, 1.2, "zh"),)))
    li = list(corpus((CorpusSpec("librispeech", 8, 1.5, 3.0, "en"),)))
    x = list(corpus((CorpusSpec("accented", 8, 0.3, 2.5, "mix"),)))
    a[2] = (a[2][0], a[2][1], encode(speech_like(0.8, 8000, seed=1), 8000), 0.8)  # sample_rate
    a[5] = (a[5][0], "  ", a[5][2], a[5][3])  # empty_text
    li[3] = (li[3][0], li[3][1], li[3][2][: len(li[3][2]) // 2], li[3][3])  # truncated
    x[1] = (x[1][0], x[1][1], b"this is not audio " * 64, x[1][3])  # decode
    x.append(x[0])  # duplicate_key: the same utterance again, in the corpus' last shard
    bad = {a[2][0], a[5][0], li[3][0], x[1][0], x[0][0]}  # x[0]: its second copy only
    folders = {}
    for name, utts, codec in (("aishell", a, "bz2"), ("librispeech", li, "gz"), ("accented", x, "none")):
        folders[name] = str(root / "src" / name)
        write_shards(utts, folders[name], utts_per_shard=3, codec=codec)
    return folders, bad


@pytest.fixture
def faulty_mix(tmp_path):
    return _faulty_mix(tmp_path)


def _members(list_path: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with open(list_path) as f:
        for shard in f.read().split():
            for name, data in iter_shard_members(shard):
                assert name not in out, f"{name} written twice"
                out[name] = data
    return out


def _shard_files(list_path: str) -> list[bytes]:
    with open(list_path) as f:
        return [open(p, "rb").read() for p in f.read().split()]


def _reject_rows(path: str) -> set[tuple]:
    """(corpus folder, shard stem, member, key, checks, reasons) per rejects.jsonl line, whatever the shard's codec."""
    rows = set()
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            shard = r["shard"]
            rows.add((os.path.basename(os.path.dirname(shard)), os.path.basename(shard).split(".tar")[0],
                      r["member"], r["key"], tuple(r["checks"]), tuple(r["reasons"])))
    return rows


def _prep(folders, out, jobs=1, **settings) -> object:
    corpora = [CorpusSource(name, (folder,)) for name, folder in folders.items()]
    return run_prep(corpora, str(out), PrepSettings(world_size=W, num_workers=K, codec="none", level=None,
                                                     **settings), CHECKS, RunOptions(jobs=jobs))


def _chain(folders, root, audio="keep") -> tuple[str, set[tuple]]:
    """convert (plain tar) -> validate --quarantine -> balance, as stage 2 of the recipe ran them."""
    rejects = set()
    corpora = []
    for name, folder in folders.items():
        converted, quarantine = root / "conv" / name, root / "quar" / name
        run_convert([folder], str(converted), ConvertSettings(codec="none", level=None, audio=audio), RunOptions(jobs=1))
        run_validate([str(converted / "data.list")], CHECKS, RunOptions(jobs=1), quarantine_dir=str(quarantine))
        rejects |= _reject_rows(str(quarantine / "rejects.jsonl"))
        corpora.append(CorpusSource(name, (str(quarantine / "data.list"),)))
    run_balance(corpora, str(root / "balanced"), BalanceSettings(world_size=W, num_workers=K, codec="none", level=None),
                RunOptions(jobs=1))
    return str(root / "balanced" / "data.list"), rejects


def _originals(members: dict[str, bytes]) -> dict[str, bytes]:
    return {n: d for n, d in members.items() if not re.search(r"-rep\d+\.[^./]+$", n)}


@pytest.mark.parametrize("audio", ["keep", "flac"])
def test_one_pass_equals_the_three_command_chain(faulty_mix, tmp_path, audio):
    folders, bad = faulty_mix
    report = _prep(folders, tmp_path / "prep", audio=audio)
    chain_list, chain_rejects = _chain(folders, tmp_path, audio)

    mine, theirs = _members(str(tmp_path / "prep" / "data.list")), _members(chain_list)
    assert _originals(mine) == _originals(theirs)  # same utterances, same bytes per member
    kept = [n.rsplit(".", 1)[0] for n in _originals(mine) if not n.endswith(".txt")]
    assert all(n.endswith((".txt", "." + ("wav" if audio == "keep" else "flac"))) for n in mine)
    assert set(kept) & bad == {"accented/S0000-U000000"} and kept.count("accented/S0000-U000000") == 1
    assert len(mine) - len(_originals(mine)) == len(theirs) - len(_originals(theirs))  # as many repeats
    for name, data in mine.items():  # a repeat carries its original's bytes
        original = re.sub(r"-rep\d+(\.[^./]+)$", r"\1", name)
        assert data == mine[original]
    assert _reject_rows(str(tmp_path / "prep" / "rejects.jsonl")) == chain_rejects
    assert {r[3] for r in chain_rejects} == bad
    summary = report.summary()
    assert summary["rejected_utterances"] == len(bad) and summary["balanced"] and summary["divides"]


def test_counts_divisible_equal_and_balanced(faulty_mix, tmp_path):
    folders, _ = faulty_mix
    report = _prep(folders, tmp_path / "out", pool_bytes=200_000, shard_duration=4.0)
    s = report.summary()
    assert s["num_shards"] % (W * K) == 0 and s["num_shards"] > W * K
    counts = {e["utterances"] for e in report.shards}
    assert counts == {s["utterances_per_shard"]}
    for entry in report.shards:  # what the report says is what the shard holds
        keys = {n.rsplit(".", 1)[0] for n, _ in iter_shard_members(entry["path"])}
        assert len(keys) == entry["utterances"]
    secs = np.array([e["seconds"] for e in report.shards])
    assert np.abs(secs - secs.mean()).max() <= s["tolerance_seconds"] + 1e-6
    assert s["repeated"] + s["accepted"] == s["num_shards"] * s["utterances_per_shard"]
    assert s["plan_after"]["divides"] and s["plan_after"]["worst_rank_spread"] < s["plan_before"]["worst_rank_spread"]


def test_remainder_drop_reports_what_it_left_out(faulty_mix, tmp_path):
    folders, _ = faulty_mix
    report = _prep(folders, tmp_path / "out", remainder="drop")
    s = report.summary()
    assert s["repeated"] == 0 and s["accepted"] - s["dropped"] == s["num_shards"] * s["utterances_per_shard"]
    doc = json.load(open(tmp_path / "out" / "prep.json"))
    assert len(doc["dropped"]) == s["dropped"]
    kept = {n.rsplit(".", 1)[0] for n in _members(str(tmp_path / "out" / "data.list"))}
    assert kept.isdisjoint(doc["dropped"])


def test_same_bytes_for_any_jobs(faulty_mix, tmp_path):
    folders, _ = faulty_mix
    _prep(folders, tmp_path / "j1", jobs=1, pool_bytes=300_000, shard_duration=4.0)
    _prep(folders, tmp_path / "j2", jobs=2, pool_bytes=300_000, shard_duration=4.0)
    assert _shard_files(str(tmp_path / "j1" / "data.list")) == _shard_files(str(tmp_path / "j2" / "data.list"))
    assert (tmp_path / "j1" / "rejects.jsonl").read_bytes() == (tmp_path / "j2" / "rejects.jsonl").read_bytes()


def test_ray_executor_writes_the_same_bytes(faulty_mix, tmp_path):
    ray = pytest.importorskip("ray")
    import logging

    _prep(folders := faulty_mix[0], tmp_path / "local", jobs=2)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    try:
        corpora = [CorpusSource(name, (folder,)) for name, folder in folders.items()]
        run_prep(corpora, str(tmp_path / "ray"), PrepSettings(world_size=W, num_workers=K, codec="none", level=None),
                 CHECKS, RunOptions(executor="ray"))
    finally:
        ray.shutdown()
    assert _shard_files(str(tmp_path / "ray" / "data.list")) == _shard_files(str(tmp_path / "local" / "data.list"))
    assert (tmp_path / "ray" / "rejects.jsonl").read_bytes() == (tmp_path / "local" / "rejects.jsonl").read_bytes()


def _cli_args(folders, out) -> list[str]:
    args = ["prep", "--world-size", str(W), "--num-workers", str(K), "--codec", "none", "--sample-rate", "16000",
            "--channels", "1", "-o", str(out), "-j", "1", "--pool-mb", "1", "-q"]
    for name, folder in folders.items():
        args += ["--corpus", f"{name}={folder}"]
    return args


def test_kill_9_mid_run_then_rerun_gives_the_same_bytes(tmp_path):
    big = list(corpus((CorpusSpec("big", 48, 1.5, 3.0, "en"),)))
    folders = {"big": str(tmp_path / "src" / "big")}
    write_shards(big, folders["big"], utts_per_shard=4, codec="bz2")
    reference, out = tmp_path / "reference", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "shardkit", *_cli_args(folders, reference)], env=env, check=True)

    proc = subprocess.Popen([sys.executable, "-m", "shardkit", *_cli_args(folders, out)], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_dir() and any(p.name.endswith(".partial") for p in out.iterdir()):
            break
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert any(p.name.endswith(".partial") for p in out.iterdir()) and not (out / "prep.json").exists()

    subprocess.run([sys.executable, "-m", "shardkit", *_cli_args(folders, out)], env=env, check=True)
    assert not any(p.name.endswith(".partial") for p in out.iterdir())
    assert _shard_files(str(out / "data.list")) == _shard_files(str(reference / "data.list"))
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("shards_"))
    assert names == sorted(p.name for p in reference.iterdir() if p.name.startswith("shards_"))


def test_cli_reports_findings_exit_1_json_and_rerun_skips(faulty_mix, tmp_path):
    folders, bad = faulty_mix
    runner = CliRunner()
    args = [a for a in _cli_args(folders, tmp_path / "out") if a != "-q"] + ["--json"]
    first = runner.invoke(main, args)
    assert first.exit_code == 1, first.output
    doc = json.loads(first.stdout)
    assert doc["command"] == "prep" and doc["this_run"] == "done" and doc["rejected_utterances"] == len(bad)
    assert doc["by_check"] == {"decode": 1, "duplicate_key": 1, "empty_text": 1, "sample_rate": 1, "truncated": 1}
    before = _shard_files(doc["data_list"])
    again = runner.invoke(main, args)
    assert again.exit_code == 1 and json.loads(again.stdout)["this_run"] == "skipped"
    assert _shard_files(doc["data_list"]) == before


def test_cli_refuses_index_sources_and_a_ray_address_without_ray(faulty_mix, tmp_path):
    folders, _ = faulty_mix
    runner = CliRunner()
    index = runner.invoke(main, ["prep", "--corpus", "a=x.jsonl", "--world-size", "1", "--num-workers", "1",
                                 "-o", str(tmp_path / "o")])
    assert index.exit_code == 2 and "--index" in index.output
    ray = runner.invoke(main, ["prep", "--corpus", f"a={folders['aishell']}", "--world-size", "1", "--num-workers",
                               "1", "-o", str(tmp_path / "o"), "--ray-address", "auto"])
    assert ray.exit_code == 2 and "Error: --ray-address needs --executor ray" in ray.output


def test_index_fixes_the_shard_count_before_reading(faulty_mix, tmp_path):
    from shardkit.commands.index import build_index

    folders, _ = faulty_mix
    shards = sorted(str(p) for p in (tmp_path / "src" / "librispeech").glob("*.tar.gz"))
    build_index(shards, str(tmp_path / "libri.jsonl"), "librispeech")
    corpora = [CorpusSource("librispeech", (folders["librispeech"],))]
    report = run_prep(corpora, str(tmp_path / "out"), PrepSettings(world_size=1, num_workers=2, codec="zst",
                                                                   shard_duration=3.0, pool_bytes=1),
                      CHECKS, RunOptions(jobs=1), index_files=[str(tmp_path / "libri.jsonl")])
    s = report.summary()
    from shardkit.io.indexfile import iter_index  # the index's records (its completeness marks are not records)

    total = sum(r["duration"] for r in iter_index(str(tmp_path / "libri.jsonl")))
    assert s["num_shards"] == max(2, round(total / 3.0 / 2) * 2) and not s["notes"]
    assert all(e["path"].endswith(".tar.zst") for e in report.shards) and s["balanced"]


def test_damaged_source_keeps_what_came_before_and_lists_the_cut(tmp_path):
    utts = list(corpus((CorpusSpec("cut", 6, 0.5, 1.0, "en"),)))
    [path] = write_shards(utts, str(tmp_path / "src"), utts_per_shard=6, codec="none")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    report = run_prep([CorpusSource("cut", (path,))], str(tmp_path / "out"),
                      PrepSettings(world_size=1, num_workers=1, codec="none", level=None), CHECKS, RunOptions(jobs=1))
    lines = [json.loads(x) for x in open(tmp_path / "out" / "rejects.jsonl")]
    assert lines[-1]["member"] is None and "cannot be read" in lines[-1]["reasons"][0]
    kept = {n.rsplit(".", 1)[0] for n in _originals(_members(str(tmp_path / "out" / "data.list")))}
    assert kept and kept < {u[0] for u in utts} and report.exit_code == 1


@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (2, 2), (4, 2), (3, 1)])
@pytest.mark.parametrize("pool_bytes", [1, 50_000, 10**9])  # 2, ~3 and 8 utterances per shard held back
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_streaming_planner_meets_balance_guarantees(world_size, num_workers, pool_bytes, remainder):
    rng = np.random.default_rng([world_size, num_workers, pool_bytes])
    seconds = np.round(rng.lognormal(1.2, 0.6, size=int(rng.integers(60, 400))), 3)

    def plan():
        planner = StreamingPlanner(world_size=world_size, num_workers=num_workers, pool_bytes=pool_bytes)
        streamed = []
        for seq, secs in enumerate(seconds):
            planner.add(seq, float(secs), 1000)
            if seq == 20:
                planner.set_num_shards(world_size * num_workers * 2)
            streamed += planner.evict()
        return streamed, planner.finish(remainder=remainder, seed=3), planner

    streamed, final, planner = plan()
    shards = planner.num_shards
    counts = np.bincount([s for _, s in streamed] + [s for _, _, s in final.placed], minlength=shards)
    assert shards % (world_size * num_workers) == 0 and (counts == final.utts_per_shard).all()
    totals = np.zeros(shards)
    for seq, shard in streamed:
        totals[shard] += seconds[seq]
    for seq, _, shard in final.placed:
        totals[shard] += seconds[seq]
    assert np.allclose(totals, final.shard_seconds)
    assert final.balanced == (np.abs(totals - totals.mean()).max() <= final.tolerance + 1e-9)
    if pool_bytes > 10**6:  # the pool holds RESERVE_PER_SHARD per shard: balance's tolerance is met
        assert final.balanced
    placed_once = [seq for seq, _ in streamed] + [seq for seq, copy, _ in final.placed if copy == 0]
    assert sorted(placed_once + final.dropped) == list(range(len(seconds)))  # nothing lost, nothing twice
    again = plan()
    assert again[0] == streamed and again[1].placed == final.placed


_KILL_AFTER_RESUME_POINT = """
import os, signal, sys
import shardkit.commands.prep.resume as resume
import shardkit.commands.prep.write as write
from shardkit.cli import main

resume.POOL_FACTOR = 0  # resume points as often as --checkpoint-mb allows, so that this small corpus has several
saved, added = [], [0]
save, add = resume.save, write.OutputShards.add

def counting_save(out_dir, state):
    save(out_dir, state)
    saved.append(state["next_source"])

def add_then_die(self, *args):
    add(self, *args)
    if saved:
        added[0] += 1
        if added[0] == 7:  # killed mid-writing: members past the resume point, some still queued
            os.kill(os.getpid(), signal.SIGKILL)

resume.save, write.OutputShards.add = counting_save, add_then_die
main(sys.argv[1:])
"""


def _inodes(folder) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in folder.iterdir() if ".tar" in p.name}


@pytest.mark.parametrize("damage,jobs", [(False, "1"), (False, "2"), (True, "1")])
def test_kill_9_after_a_resume_point_then_rerun_continues_the_shards(tmp_path, damage, jobs):
    utts = list(corpus((CorpusSpec("long", 60, 2.0, 4.0, "en"),)))
    folders = {"long": str(tmp_path / "src" / "long")}
    write_shards(utts, folders["long"], utts_per_shard=4, codec="bz2")
    reference, out = tmp_path / "reference", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    args = [*_cli_args(folders, out), "--checkpoint-mb", "1", "-j", jobs]  # the last -j wins
    subprocess.run([sys.executable, "-m", "shardkit", *_cli_args(folders, reference)], env=env, check=True)

    killed = subprocess.run([sys.executable, "-c", _KILL_AFTER_RESUME_POINT, *args], env=env)
    assert killed.returncode == -signal.SIGKILL
    from shardkit.commands.prep import resume

    state = resume._PlainUnpickler(open(out / resume.RESUME, "rb")).load()
    partials = _inodes(out)
    assert len(partials) == len(state["shards"]) and all(n.endswith(".partial") for n in partials)
    (tmp_path / "links").mkdir()  # hard links keep the partials' inodes from being reused by new files
    for name in partials:
        os.link(out / name, tmp_path / "links" / name)
    assert all(os.path.getsize(e["tmp"]) >= e["size"] > 0 for e in state["shards"])
    if damage:  # a partial that no longer starts with the resume point's bytes: no resume, a fresh start
        with open(state["shards"][0]["tmp"], "r+b") as f:
            f.truncate(state["shards"][0]["size"] - 1)

    rerun = subprocess.run([sys.executable, "-m", "shardkit", *_cli_args(folders, out), "--json"], env=env,
                           check=True, capture_output=True, text=True)
    doc = json.loads(rerun.stdout)
    assert _shard_files(str(out / "data.list")) == _shard_files(str(reference / "data.list"))
    assert (out / "rejects.jsonl").read_bytes() == (reference / "rejects.jsonl").read_bytes()
    assert not any(p.name.endswith(".partial") for p in out.iterdir()) and not (out / resume.RESUME).exists()
    final = _inodes(out)
    if damage:
        assert doc["resumed_at_source"] is None and not set(final.values()) & set(partials.values())
    else:  # the same files, continued and renamed: the part written before the kill was not written again
        assert doc["resumed_at_source"] == state["next_source"] > 0
        assert sorted(final.values()) == sorted(partials.values())
        ref = json.load(open(reference / "prep.json"))["summary"]
        assert {k: v for k, v in doc.items() if k in ref and k not in ("elapsed_seconds", "resumed_at_source")} == \
            {k: v for k, v in ref.items() if k not in ("elapsed_seconds", "resumed_at_source")}


def test_corpus_weights_copy_and_sample_as_balance_does(faulty_mix, tmp_path):
    """aishell:2 -> every clean utterance twice (key, key-rep1); accented:0.5 -> a seeded half, drawn per key;
    the pad repeats are numbered after the weighted copies, and the guarantees hold."""
    from shardkit.commands.prep import weighted_copies

    folders, bad = faulty_mix
    corpora = [CorpusSource("aishell", (folders["aishell"],), 2.0), CorpusSource("librispeech", (folders["librispeech"],)),
               CorpusSource("accented", (folders["accented"],), 0.5)]
    settings = PrepSettings(world_size=W, num_workers=K, codec="none", level=None, shard_duration=4.0)
    report = run_prep(corpora, str(tmp_path / "out"), settings, CHECKS, RunOptions(jobs=2))
    again = run_prep(corpora, str(tmp_path / "again"), settings, CHECKS, RunOptions(jobs=1))
    assert _shard_files(str(tmp_path / "out" / "data.list")) == _shard_files(str(tmp_path / "again" / "data.list"))
    s = report.summary()
    assert s["balanced"] and s["divides"] and s["num_shards"] % (W * K) == 0
    members = _members(str(tmp_path / "out" / "data.list"))  # asserts that no name is written twice
    keys = {n.rsplit(".", 1)[0] for n in members}
    doc = json.load(open(tmp_path / "out" / "prep.json"))
    padded = {new for _, new in doc["repeats"]}
    written = keys - padded
    rejected = {r["key"] for r in map(json.loads, open(tmp_path / "out" / "rejects.jsonl"))
                if r["checks"] != ["duplicate_key"]}  # a duplicate's first occurrence is kept
    clean = {folder: sorted({n.rsplit(".", 1)[0] for sh in sorted(os.listdir(folders[folder])) if ".tar" in sh
                             for n, _ in iter_shard_members(os.path.join(folders[folder], sh))} - rejected)
             for folder in folders}
    assert rejected | {r["key"] for r in map(json.loads, open(tmp_path / "out" / "rejects.jsonl"))} == bad
    assert written == (set(clean["aishell"]) | {k + "-rep1" for k in clean["aishell"]} | set(clean["librispeech"])
                       | {k for k in clean["accented"] if weighted_copies(0.5, 0, 2, k)}) - set(doc["dropped"])
    kept_accented = sum(1 for k in clean["accented"] if weighted_copies(0.5, 0, 2, k))
    assert 0 < kept_accented < len(clean["accented"])
    assert s["weighted_copies"] == len(clean["aishell"])
    assert s["left_out_by_weight"] == len(clean["accented"]) - kept_accented
    for original, new in doc["repeats"]:  # a pad of an aishell utterance is its third copy at least
        if original in clean["aishell"]:
            assert int(new.rsplit("-rep", 1)[1]) >= 2


@pytest.mark.parametrize("cores,jobs,tasks", [(2, 2, 15), (16, 15, 15), (16, 4, 4), (16, 16, 40), (3, 2, 5)])
def test_decoder_threads_fill_the_cores_without_oversubscribing_the_first_wave(cores, jobs, tasks):
    from shardkit.commands.prep import decoder_threads

    threads = [decoder_threads(cores, jobs, tasks, k) for k in range(tasks)]
    first = threads[:jobs]
    assert sum(first) == max(cores, jobs) and max(first) - min(first) <= 1  # every core, evenly, at the start
    if tasks > jobs:  # a later wave: the last source, alone at the end, decodes on all of them
        assert threads[-1] == cores
    assert all(t >= 1 for t in threads)


def test_writer_threads_write_the_same_bytes_as_one(tmp_path):
    """Each shard's members reach its file in the order added, whatever the thread count."""
    from shardkit.commands.prep.write import OutputShards
    from shardkit.io.files import member_digest

    rng = np.random.default_rng(3)
    members = [(int(rng.integers(5)), f"k{i:03d}.wav", rng.bytes(int(rng.integers(1, 30000)))) for i in range(120)]
    files = {}
    for threads in (1, 3, 8):
        folder = tmp_path / str(threads)
        folder.mkdir()
        outputs = OutputShards([str(folder / f"shards_{s:09d}.tar") for s in range(5)], "none", None, threads=threads)
        for shard, name, data in members:
            outputs.add(shard, name, data, member_digest(name, data))
        entries = outputs.finish(verify=True)
        files[threads] = [open(e["path"], "rb").read() for e in entries]
        assert [e["members"] for e in entries] == [sum(1 for s, _, _ in members if s == k) for k in range(5)]
    assert files[1] == files[3] == files[8]


def test_resume_file_holds_plain_data_and_refuses_classes(tmp_path):
    from shardkit.commands.prep import resume

    state = {"spec": "x", "seconds": np.float64(1.5), "counts": np.arange(3), "pool": {0: ("k", 0, [("k.wav", b"ab",
                                                                                                     b"d")], 0)}}
    resume.save(str(tmp_path), state)
    back = resume._PlainUnpickler(open(tmp_path / resume.RESUME, "rb")).load()
    assert back["seconds"] == 1.5 and type(back["seconds"]) is float and back["counts"] == [0, 1, 2]
    assert back["pool"][0][2][0][1] == b"ab"
    import pickle

    (tmp_path / resume.RESUME).write_bytes(pickle.dumps({"format": resume.FORMAT, "spec": "x", "evil": os.system}))
    assert resume.load(str(tmp_path), "x") is None  # refused, not run: the rerun starts again


def test_a_writer_thread_failure_reaches_the_caller_named_and_leaves_no_temporary_file(tmp_path):
    import errno

    from shardkit.commands.prep.write import OutputShards
    from shardkit.io.files import OutputError, member_digest

    paths = [str(tmp_path / f"shards_{s:09d}.tar") for s in range(4)]
    outputs = OutputShards(paths, "none", None, threads=2)

    def full(data):
        raise OSError(errno.ENOSPC, "No space left on device")

    outputs._files[3].file.write = full  # shard 3's disk is full
    with pytest.raises(OutputError) as caught:
        for i in range(400):
            outputs.add(i % 4, f"u{i:04d}.wav", b"x" * 5000, member_digest("", b"x" * 5000))
        outputs.finish(verify=True)
    assert caught.value.shard == paths[3] and "No space left" in str(caught.value)
    outputs.abort()
    assert sorted(os.listdir(tmp_path)) == []  # no shard renamed, no temporary file left
