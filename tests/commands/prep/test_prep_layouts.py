"""prep --layout shar|nemo: prep's one read, its output written in Lhotse Shar's or NeMo's tarred layout.

Read back as the trainers read it: Shar with lhotse's real ``CutSet.from_shar`` (``split_for_dataloading``
per rank, RANK/WORLD_SIZE as lhotse takes them), NeMo through its scatter rule restated from its source and
its WebDataset pipeline (tests/nemo_split.py, real webdataset). A prep killed after a resume point and run
again continues its temporary files (tars and spooled metadata lines) and gives the bytes of a run never killed.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections import Counter

import numpy as np
import pytest
import soundfile as sf

import nemo_split
from support import corpus, run_cli
from shardkit.io.synth import CorpusSpec, write_shards

SPECS = (CorpusSpec("aishell", 48, 0.3, 0.9, "zh"), CorpusSpec("librispeech", 20, 1.5, 3.0, "en"),
         CorpusSpec("accented", 16, 0.3, 2.5, "mix"))
WORLD, WORKERS = 4, 2


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """Three corpora (plain, zst and bz2 source shards; WAV, FLAC, WAV) and the truth about each utterance."""
    root = tmp_path_factory.mktemp("prep-layout-mix")
    truth = {}
    for spec, codec, fmt in zip(SPECS, ("none", "zst", "bz2"), ("wav", "flac", "wav")):
        utts = list(corpus((spec,), seed=3, audio_format=fmt))
        write_shards(utts, str(root / spec.name), utts_per_shard=6, codec=codec, audio_format=fmt)
        for key, text, audio, _ in utts:
            samples, rate = sf.read(io.BytesIO(audio), dtype="float32")
            truth[key] = {"text": text, "audio": audio, "samples": samples, "rate": rate}
    return {"root": root, "truth": truth}


def _prep_args(mix, out, layout, *extra) -> list:
    corpora = [a for spec in SPECS for a in ("--corpus", f"{spec.name}={mix['root'] / spec.name}")]
    return ["prep", *corpora, "--world-size", WORLD, "--num-workers", WORKERS, "--shard-duration", 6,
            "--layout", layout, "-o", out, "-j", 1, "-q", *extra]


def _prep(mix, out, layout, *extra) -> dict:
    result = run_cli(*_prep_args(mix, out, layout, "--json", *extra))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _originals(out) -> dict[str, str]:
    """Output key -> source key, from prep.json's repeats (pad copies)."""
    return {new: old for old, new in json.load(open(out / "prep.json"))["repeats"]}


def _within_tolerance(seconds, per_consumer_shards: int, median: float) -> bool:
    """balance's guarantee summed over the shards one consumer reads: each shard within max(0.5 % of the
    mean shard, one median utterance) of the mean."""
    seconds = np.asarray(seconds)
    mean_shard = seconds.mean() / per_consumer_shards
    return bool(np.abs(seconds - seconds.mean()).max() <= per_consumer_shards * max(0.005 * mean_shard, median) + 1e-6)


def _median(truth) -> float:
    return float(np.median([len(t["samples"]) / t["rate"] for t in truth.values()]))


# --- Shar ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shar_out(mix, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep-shar") / "out"
    return out, _prep(mix, out, "shar")


def test_shar_reads_back_with_lhotse_every_utterance_once_with_its_samples_and_text(mix, shar_out):
    from lhotse import CutSet

    out, report = shar_out
    n = report["num_shards"]
    assert n % (WORLD * WORKERS) == 0 and report["divides"] and report["balanced"]
    # the folder holds the Shar files only; the reports, the list and the rejects are beside it
    assert sorted(os.listdir(out / "shar")) == sorted([f"cuts.{s:06d}.jsonl.gz" for s in range(n)]
                                                      + [f"recording.{s:06d}.tar" for s in range(n)])
    assert {"prep.json", "data.list", "rejects.jsonl"} <= set(os.listdir(out))
    assert report["layout"]["folder"] == str(out / "shar")
    truth, originals = mix["truth"], _originals(out)
    seen = Counter()
    for cut in CutSet.from_shar(in_dir=out / "shar"):
        seen[cut.id] += 1
        expected = truth[originals.get(cut.id, cut.id)]
        samples = cut.load_audio()[0]
        assert cut.sampling_rate == expected["rate"] and np.array_equal(samples, expected["samples"])
        assert cut.duration == len(expected["samples"]) / expected["rate"] == cut.recording.duration
        assert [s.text for s in cut.supervisions] == [expected["text"]]
    assert set(seen.values()) == {1} and len(seen) == n * report["utterances_per_shard"]
    assert {originals.get(k, k) for k in seen} == set(truth)  # every source utterance is there


def test_shar_split_for_dataloading_gives_every_rank_equal_utterances_and_seconds(mix, shar_out):
    from lhotse import CutSet

    out, report = shar_out
    per_rank, read = [], []
    for rank in range(WORLD):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD))
        try:  # lhotse deals the shards to ranks by these variables (no DataLoader worker here: the rank's all)
            cuts = list(CutSet.from_shar(in_dir=out / "shar", split_for_dataloading=True))
        finally:
            del os.environ["RANK"], os.environ["WORLD_SIZE"]
        per_rank.append((len(cuts), sum(c.duration for c in cuts)))
        read += [c.id for c in cuts]
    assert len(read) == len(set(read)) == report["num_shards"] * report["utterances_per_shard"]  # each cut once
    assert len({count for count, _ in per_rank}) == 1  # equal utterances: equal steps on every rank
    assert _within_tolerance([s for _, s in per_rank], report["num_shards"] // WORLD, _median(mix["truth"]))


def test_shar_shards_hold_what_the_wenet_layout_holds_in_the_same_order(mix, shar_out, tmp_path):
    """The layout changes how each utterance is written, never the plan: shard k of both has the same audio."""
    out, report = shar_out
    wenet = _prep(mix, tmp_path / "wenet", "wenet")
    assert wenet["num_shards"] == report["num_shards"] and "layout" not in wenet
    doc = json.load(open(tmp_path / "wenet" / "prep.json"))
    assert "layout" not in doc["settings"]  # a WeNet run records what it did before layouts
    for k, path in enumerate(open(tmp_path / "wenet" / "data.list").read().split()):
        with tarfile.open(path) as plain, tarfile.open(out / "shar" / f"recording.{k:06d}.tar") as shar:
            audio = [(m.name, plain.extractfile(m).read()) for m in plain if not m.name.endswith(".txt")]
            assert audio == [(m.name, shar.extractfile(m).read()) for m in shar if not m.name.endswith(".json")]


def test_shar_rerun_skips_and_one_missing_cuts_file_redoes_the_run(mix, shar_out):
    out, report = shar_out
    before = {name: (out / "shar" / name).read_bytes() for name in os.listdir(out / "shar")}
    assert _prep(mix, out, "shar")["this_run"] == "skipped"
    os.remove(out / "shar" / "cuts.000001.jsonl.gz")
    again = _prep(mix, out, "shar")
    assert again["this_run"] == "done"
    assert {name: (out / "shar" / name).read_bytes() for name in os.listdir(out / "shar")} == before


# --- NeMo ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nemo_out(mix, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep-nemo") / "out"
    return out, _prep(mix, out, "nemo")


def test_nemo_scatter_reads_every_line_once_with_its_bytes_text_and_equal_seconds_per_rank(mix, nemo_out):
    import yaml

    out, report = nemo_out
    n = report["num_shards"]
    assert n % WORLD == 0 and sorted(p for p in os.listdir(out) if p.endswith(".tar")) == \
        sorted(f"audio_{k}.tar" for k in range(n))
    config = (out / "nemo_config.yaml").read_text()
    assert report["layout"]["config_fragment"] == config and config.startswith("# shardkit prep --layout nemo")
    train_ds = yaml.safe_load(config)["train_ds"]
    assert train_ds["is_tarred"] is True and train_ds["tarred_shard_strategy"] == "scatter"
    lines = [json.loads(line) for line in open(train_ds["manifest_filepath"], encoding="utf-8")]
    by_id = {nemo_split.file_id(line["audio_filepath"]): line for line in lines}
    assert len(by_id) == len(lines) == n * report["utterances_per_shard"]
    truth, originals = mix["truth"], _originals(out)
    per_rank, read = [], []
    for rank in range(WORLD):
        tars = nemo_split.expand_sharded_filepaths(train_ds["tarred_audio_filepaths"], "scatter", WORLD, rank)
        count, seconds = 0, 0.0
        for audio, file_id in nemo_split.tar_samples(tars):
            line = by_id[file_id]  # NeMo's lookup; a miss would be a KeyError in its _build_sample
            expected = truth[originals.get(line.get("key", file_id), line.get("key", file_id))]
            assert audio == expected["audio"] and line["text"] == expected["text"]
            info = sf.info(io.BytesIO(audio))
            assert line["duration"] == info.frames / info.samplerate
            count, seconds = count + 1, seconds + line["duration"]
            read.append(file_id)
        per_rank.append((count, seconds))
    assert sorted(read) == sorted(by_id)  # scatter drops nothing: every line read once
    assert len({count for count, _ in per_rank}) == 1
    assert _within_tolerance([s for _, s in per_rank], n // WORLD, _median(truth))
    keys = {originals.get(line.get("key", nemo_split.file_id(line["audio_filepath"])),
                          line.get("key", nemo_split.file_id(line["audio_filepath"]))) for line in lines}
    assert keys == set(truth)  # every source utterance is there


def test_nemo_parts_hold_each_shards_lines_and_the_cli_prints_the_fragment(mix, nemo_out):
    out, report = nemo_out
    result = run_cli(*_prep_args(mix, out, "nemo"))
    assert result.exit_code == 0, result.output
    assert "tarred_shard_strategy: scatter" in result.stdout and "is_tarred: true" in result.stdout
    for k in range(report["num_shards"]):
        with gzip.open(out / ".nemo_manifests" / f"manifest_{k}.jsonl.gz", "rt", encoding="utf-8") as f:
            assert {json.loads(line)["shard_id"] for line in f} == {k}


# --- usage --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["prep", "balance"])
@pytest.mark.parametrize("extra", [["--codec", "zst"], ["--level", "5"], ["--codec", "gz:6"]])
def test_a_codec_or_level_with_a_layout_is_a_usage_error_naming_why(mix, tmp_path, command, extra):
    args = _prep_args(mix, tmp_path / "o", "nemo", *extra)
    if command == "balance":
        args = ["balance", *args[1:]]
    result = run_cli(*args)
    assert result.exit_code == 2, result.output
    assert "plain tars" in result.output and extra[0] in result.output
    assert not (tmp_path / "o").exists()


def test_codec_none_with_a_layout_is_what_it_writes_anyway(mix, tmp_path):
    from shardkit.commands.prep import PrepSettings, run_prep
    from shardkit.commands.validate.options import ValidateOptions
    from shardkit.errors import UsageError
    from shardkit.io.mix import CorpusSource

    report = _prep(mix, tmp_path / "o", "shar", "--codec", "none")
    assert report["layout"]["layout"] == "shar"
    with pytest.raises(UsageError, match="plain tars"):  # the library refuses it too
        run_prep([CorpusSource("a", (str(mix["root"] / "aishell"),))], str(tmp_path / "lib"),
                 PrepSettings(world_size=1, num_workers=1, codec="zst", layout="nemo"), ValidateOptions())


# --- a kill, then the rerun ---------------------------------------------------------------------------


_KILL_AFTER_RESUME_POINT = """
import os, signal, sys
import shardkit.commands.prep.resume as resume
from shardkit.commands.prep.layout import LayoutOutputShards
from shardkit.cli import main

resume.POOL_FACTOR = 0  # resume points as often as --checkpoint-mb allows, so that this small corpus has several
saved, added = [], [0]
save, add = resume.save, LayoutOutputShards.add_utterance

def counting_save(out_dir, state):
    save(out_dir, state)
    saved.append(state["next_source"])

def add_then_die(self, *args):
    add(self, *args)
    if saved or os.environ.get("KILL_BEFORE_RESUME_POINT"):
        added[0] += 1
        if added[0] == 5:  # killed mid-writing: utterances past the resume point, some still queued
            os.kill(os.getpid(), signal.SIGKILL)

resume.save, LayoutOutputShards.add_utterance = counting_save, add_then_die
main(sys.argv[1:])
"""


def _files(folder, skip=()) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names if name not in skip}


@pytest.mark.parametrize("layout", ["nemo", "shar"])
def test_kill_9_after_a_resume_point_then_rerun_continues_and_gives_the_same_output(tmp_path, layout):
    _kill_and_rerun(tmp_path, layout, resume_point=True)


def test_kill_9_before_any_resume_point_then_rerun_starts_again_and_leaves_no_temporary_file(tmp_path):
    _kill_and_rerun(tmp_path, "shar", resume_point=False)


def _kill_and_rerun(tmp_path, layout: str, *, resume_point: bool) -> None:
    utts = list(corpus((CorpusSpec("long", 60, 2.0, 4.0, "en"),)))
    src = tmp_path / "src" / "long"
    write_shards(utts, str(src), utts_per_shard=4, codec="bz2")
    reference, out = tmp_path / "reference", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}

    def args(folder):
        return [str(a) for a in ["prep", "--corpus", f"long={src}", "--world-size", 2, "--num-workers", 2,
                                 "--codec", "none", "--layout", layout, "-o", folder, "-j", 1, "--pool-mb", 1, "-q"]]

    subprocess.run([sys.executable, "-m", "shardkit", *args(reference)], env=env, check=True, capture_output=True)
    killed = subprocess.run([sys.executable, "-c", _KILL_AFTER_RESUME_POINT, *args(out), "--checkpoint-mb",
                             "1" if resume_point else "100000"],
                            env={**env, **({} if resume_point else {"KILL_BEFORE_RESUME_POINT": "1"})})
    assert killed.returncode == -signal.SIGKILL
    from shardkit.commands.prep import resume

    if not resume_point:  # the temporary tars and spooled lines of the killed run, in OUT_DIR and its shar/ folder
        assert not (out / resume.RESUME).exists() and any(".partial" in name for name in _files(out))
        rerun = subprocess.run([sys.executable, "-m", "shardkit", *args(out), "--json"], env=env, check=True,
                               capture_output=True, text=True)
        assert json.loads(rerun.stdout)["resumed_at_source"] is None
        assert not any(".partial" in name for name in _files(out))
        skip = {"prep.json", "data.list"}
        assert _files(out, skip) == _files(reference, skip)
        return

    state = resume._PlainUnpickler(open(out / resume.RESUME, "rb")).load()
    spooled = [e["lines"] for e in state["shards"]]
    assert all(os.path.getsize(e["tmp"]) >= e["size"] > 0 for e in state["shards"] + spooled)
    inodes = {os.stat(e["tmp"]).st_ino for e in state["shards"]}
    links = tmp_path / "links"  # hard links keep the partials' inodes from being reused by new files
    links.mkdir()
    for i, e in enumerate(state["shards"]):
        os.link(e["tmp"], links / str(i))

    rerun = subprocess.run([sys.executable, "-m", "shardkit", *args(out), "--json"], env=env, check=True,
                           capture_output=True, text=True)
    doc = json.loads(rerun.stdout)
    assert doc["resumed_at_source"] == state["next_source"] > 0
    tars = [e["path"] for e in json.load(open(out / "prep.json"))["shards"]]
    assert {os.stat(p).st_ino for p in tars} == inodes  # continued and renamed, not written again
    skip = {"prep.json", "nemo_config.yaml", "data.list"}  # these name their own folder
    assert _files(out, skip) == _files(reference, skip)  # every tar, companion, manifest and the rejects
    assert (out / "data.list").read_text() == (reference / "data.list").read_text().replace(str(reference), str(out))
    assert not any(".partial" in name for name in _files(out)) and not (out / resume.RESUME).exists()
    if layout == "nemo":
        assert (out / "nemo_config.yaml").read_text() == \
            (reference / "nemo_config.yaml").read_text().replace(str(reference), str(out))


def test_a_rerun_with_another_layout_replaces_the_earlier_layouts_files(mix, tmp_path):
    out = tmp_path / "out"
    found = {}
    for layout in ("wenet", "nemo", "shar", "wenet"):
        result = run_cli("prep", "--corpus", f"aishell={mix['root'] / 'aishell'}", "--world-size", 2, "--num-workers", 1,
                         "--layout", layout, "-o", out, "-j", 1, "-q")
        assert result.exit_code == 0, result.output
        found[layout] = sorted(os.path.relpath(os.path.join(root, n), out) for root, _, names in os.walk(out)
                               for n in names)
    beside = ["data.list", "prep.json", "rejects.jsonl"]
    assert found["nemo"] == sorted(beside + ["audio_0.tar", "audio_1.tar", ".nemo_manifests/manifest_0.jsonl.gz",
                                             ".nemo_manifests/manifest_1.jsonl.gz", "nemo_config.yaml",
                                             "tarred_audio_manifest.json"])
    assert found["shar"] == sorted(beside + ["shar/cuts.000000.jsonl.gz", "shar/cuts.000001.jsonl.gz",
                                             "shar/recording.000000.tar", "shar/recording.000001.tar"])
    assert found["wenet"] == sorted(beside + ["shards_000000000.tar", "shards_000000001.tar"])
    assert sorted(os.listdir(out)) == sorted(beside + ["shards_000000000.tar", "shards_000000001.tar"])  # no folder left
