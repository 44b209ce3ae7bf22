"""balance --layout shar|nemo: the same balanced plan, read back by the trainers' own readers.

Shar is read with lhotse's real ``CutSet.from_shar`` (and its ``split_for_dataloading`` dealing, driven as
lhotse reads ranks and workers: RANK/WORLD_SIZE, then a real torch DataLoader's workers). NeMo is read
with the standard library's tarfile and NeMo's dealing restated from its source (tests/nemo_split.py; NeMo's
own dataset class runs in test_balance_layouts_ddp.py when SHARDKIT_NEMO_PYTHON names a Python that has it).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands import balance
from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

import nemo_split

SPECS = (CorpusSpec("aishell", 48, 0.3, 0.9, "zh"), CorpusSpec("librispeech", 20, 1.5, 3.0, "en"),
         CorpusSpec("accented", 16, 0.3, 2.5, "mix"))
WORLD, WORKERS = 4, 2


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """Three corpora (plain, zst and bz2 shards, WAV and FLAC) and the truth about each utterance."""
    root = tmp_path_factory.mktemp("layout-mix")
    truth = {}
    for spec, codec, fmt in zip(SPECS, ("none", "zst", "bz2"), ("wav", "flac", "wav")):
        utts = list(corpus_utterances(spec, seed=3, audio_format=fmt))
        write_shards(utts, str(root / spec.name), utts_per_shard=6, codec=codec, audio_format=fmt)
        for key, text, audio, _ in utts:
            samples, rate = sf.read(io.BytesIO(audio), dtype="float32")
            truth[key] = {"text": text, "audio": audio, "samples": samples, "rate": rate, "format": fmt}
    return {"root": root, "truth": truth}


def _balance(mix, out, layout, *extra):
    args = [a for spec in SPECS for a in ("--corpus", f"{spec.name}={mix['root'] / spec.name}")]
    result = CliRunner().invoke(main, ["balance", *args, "--world-size", str(WORLD), "--num-workers", str(WORKERS),
                                       "--shard-duration", "6", "--layout", layout, "-o", str(out), "-j", "1", "-q",
                                       "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _originals(out) -> dict[str, str]:
    return {new: old for old, new in balance.read_repeats(str(out))}


@pytest.fixture(scope="module")
def shar_out(mix, tmp_path_factory):
    out = tmp_path_factory.mktemp("shar-out") / "out"
    return out, _balance(mix, out, "shar")


def test_shar_folder_reads_back_with_lhotse_every_cut_once_with_its_samples_and_text(mix, shar_out):
    from lhotse import CutSet

    out, report = shar_out
    n = report["num_shards"]
    assert n % (WORLD * WORKERS) == 0
    # the folder holds the Shar files only; the reports and the list are beside it
    assert sorted(os.listdir(out / "shar")) == sorted([f"cuts.{s:06d}.jsonl.gz" for s in range(n)]
                                                      + [f"recording.{s:06d}.tar" for s in range(n)])
    assert {"balance.json", "data.list"} <= set(os.listdir(out))
    assert report["layout"]["folder"] == str(out / "shar")
    truth, originals = mix["truth"], _originals(out)
    seen = Counter()
    per_shard = Counter()
    for cut in CutSet.from_shar(in_dir=out / "shar"):
        original = originals.get(cut.id, cut.id)
        seen[cut.id] += 1
        expected = truth[original]
        samples = cut.load_audio()[0]
        assert cut.sampling_rate == expected["rate"] and np.array_equal(samples, expected["samples"])
        assert cut.duration == len(expected["samples"]) / expected["rate"] == cut.recording.duration
        assert [s.text for s in cut.supervisions] == [expected["text"]]
        per_shard[cut.shard_origin.name] += cut.duration
    assert set(seen.values()) == {1} and len(seen) == n * report["utterances_per_shard"]
    assert {originals.get(k, k) for k in seen} == set(truth)  # every source utterance is there
    seconds = np.array(list(per_shard.values()))
    assert len(seconds) == n
    median = float(np.median([len(t["samples"]) / t["rate"] for t in truth.values()]))
    assert np.abs(seconds - seconds.mean()).max() <= max(0.005 * seconds.mean(), median)


def _deal(shar_dir, rank: int) -> list[tuple[str, float]]:
    """What lhotse's split_for_dataloading gives ``rank``, read through a real DataLoader with WORKERS workers."""
    import torch
    from lhotse import CutSet

    class Cuts(torch.utils.data.IterableDataset):
        def __iter__(self):
            cuts = CutSet.from_shar(in_dir=shar_dir, split_for_dataloading=True)
            for cut in cuts:
                yield cut.id, cut.duration, torch.utils.data.get_worker_info().id

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD))
    try:
        loader = torch.utils.data.DataLoader(Cuts(), batch_size=None, num_workers=WORKERS,
                                             multiprocessing_context="fork")
        return [(key, seconds, worker) for key, seconds, worker in loader]
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]


def test_shar_split_for_dataloading_gives_every_rank_and_worker_equal_seconds(mix, shar_out):
    out, report = shar_out
    dealt = {rank: _deal(out / "shar", rank) for rank in range(WORLD)}
    keys = [key for got in dealt.values() for key, _, _ in got]
    assert len(keys) == len(set(keys)) == report["num_shards"] * report["utterances_per_shard"]  # each cut once
    per_worker = Counter()
    for rank, got in dealt.items():
        for _, seconds, worker in got:
            per_worker[rank, worker] += seconds
    assert len(per_worker) == WORLD * WORKERS
    counts = {(r, w): sum(1 for _, _, x in dealt[r] if x == w) for r, w in per_worker}
    assert len(set(counts.values())) == 1  # equal utterances, so equal steps, on every rank and worker
    seconds = np.array(list(per_worker.values()))
    shards_each = report["num_shards"] // (WORLD * WORKERS)
    median = float(np.median([len(t["samples"]) / t["rate"] for t in mix["truth"].values()]))
    assert np.abs(seconds - seconds.mean()).max() <= shards_each * max(0.005 * seconds.mean() / shards_each, median)


def test_shar_rerun_skips_finished_shards_and_rewrites_one_without_its_cuts(mix, shar_out, tmp_path):
    out, report = shar_out
    again = _balance(mix, out, "shar")
    assert again["written"] == {"ok": 0, "skipped": report["num_shards"], "failed": 0}
    before = (out / "shar" / "recording.000001.tar").read_bytes(), (out / "shar" / "cuts.000001.jsonl.gz").read_bytes()
    os.remove(out / "shar" / "cuts.000001.jsonl.gz")
    third = _balance(mix, out, "shar")
    assert third["written"] == {"ok": 1, "skipped": report["num_shards"] - 1, "failed": 0}
    after = (out / "shar" / "recording.000001.tar").read_bytes(), (out / "shar" / "cuts.000001.jsonl.gz").read_bytes()
    assert after == before  # deterministic bytes: the same plan writes the same shard


def test_a_layout_refuses_a_bad_name(mix, tmp_path):
    args = [a for spec in SPECS for a in ("--corpus", f"{spec.name}={mix['root'] / spec.name}")]
    bad = CliRunner().invoke(main, ["balance", *args, "--world-size", "2", "--num-workers", "1", "--layout", "kaldi", "-o",
                                    str(tmp_path / "o"), "-q"])
    assert bad.exit_code == 2 and "kaldi" in bad.output


# --- NeMo -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nemo_out(mix, tmp_path_factory):
    out = tmp_path_factory.mktemp("nemo-out") / "out"
    return out, _balance(mix, out, "nemo")


def _tar_members(path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


def test_nemo_tars_and_manifest_match_and_hold_every_utterance_with_its_bytes_and_text(mix, nemo_out):
    out, report = nemo_out
    n = report["num_shards"]
    assert n % WORLD == 0 and sorted(p for p in os.listdir(out) if p.endswith(".tar")) == \
        sorted(f"audio_{k}.tar" for k in range(n))
    lines = [json.loads(line) for line in open(out / "tarred_audio_manifest.json", encoding="utf-8")]
    by_id = {nemo_split.file_id(line["audio_filepath"]): line for line in lines}
    assert len(by_id) == len(lines) == n * report["utterances_per_shard"]
    truth, originals = mix["truth"], _originals(out)
    members_seen = []
    for k in range(n):
        for name, data in _tar_members(out / f"audio_{k}.tar"):
            line = by_id[nemo_split.file_id(name)]  # NeMo's lookup: the member's file id
            assert line["audio_filepath"] == name and line["shard_id"] == k
            expected = truth[originals.get(line["key"], line["key"])]
            assert data == expected["audio"] and line["text"] == expected["text"]
            info = sf.info(io.BytesIO(data))
            assert line["duration"] == info.frames / info.samplerate
            members_seen.append(name)
    assert len(members_seen) == len(set(members_seen)) == len(lines)
    assert {originals.get(line["key"], line["key"]) for line in lines} == set(truth)


def _nemo_rank(train_ds: dict, rank: int) -> list[tuple[str, bytes, int]]:
    """What NeMo's tarred dataset gives ``rank``: its scatter of the tars, read by NeMo's WebDataset pipeline in a
    real DataLoader with WORKERS workers; (file id, audio bytes, worker) per utterance."""
    import torch

    tars = nemo_split.expand_sharded_filepaths(train_ds["tarred_audio_filepaths"], train_ds["tarred_shard_strategy"],
                                               WORLD, rank)

    class Tarred(torch.utils.data.IterableDataset):
        def __iter__(self):
            worker = torch.utils.data.get_worker_info().id
            for audio, file_id in nemo_split.tar_samples(tars):
                yield file_id, audio, worker

    loader = torch.utils.data.DataLoader(Tarred(), batch_size=None, num_workers=WORKERS, multiprocessing_context="fork")
    return list(loader)


def test_nemo_scatter_gives_every_rank_equal_seconds_and_reads_every_line_once(mix, nemo_out):
    out, report = nemo_out
    config = (out / "nemo_config.yaml").read_text()
    assert report["layout"]["config_fragment"] == config
    import yaml

    train_ds = yaml.safe_load(config)["train_ds"]
    assert train_ds["is_tarred"] is True and train_ds["tarred_shard_strategy"] == "scatter"
    assert train_ds["manifest_filepath"] == str(out / "tarred_audio_manifest.json")
    lines = {nemo_split.file_id(line["audio_filepath"]): line
             for line in map(json.loads, open(train_ds["manifest_filepath"], encoding="utf-8"))}
    truth, originals = mix["truth"], _originals(out)
    per_rank, per_worker, read = [], Counter(), []
    for rank in range(WORLD):
        seconds = 0.0
        for file_id, audio, worker in _nemo_rank(train_ds, rank):
            line = lines[file_id]  # NeMo's lookup; a miss would be a KeyError in _build_sample
            assert audio == truth[originals.get(line["key"], line["key"])]["audio"]
            seconds += line["duration"]
            per_worker[rank, worker] += 1
            read.append(file_id)
        per_rank.append(seconds)
    assert sorted(read) == sorted(lines)  # scatter drops nothing: every line read once
    assert len(per_worker) == WORLD * WORKERS and len(set(per_worker.values())) == 1  # equal steps everywhere
    per_rank = np.array(per_rank)
    shards_each = report["num_shards"] // WORLD
    median = float(np.median([line["duration"] for line in lines.values()]))
    assert np.abs(per_rank - per_rank.mean()).max() <= shards_each * max(0.005 * per_rank.mean() / shards_each, median)


def test_nemo_manifest_parts_let_a_rerun_skip_and_the_cli_prints_the_fragment(mix, nemo_out):
    out, report = nemo_out
    before = (out / "tarred_audio_manifest.json").read_bytes()
    args = [a for spec in SPECS for a in ("--corpus", f"{spec.name}={mix['root'] / spec.name}")]
    result = CliRunner().invoke(main, ["balance", *args, "--world-size", str(WORLD), "--num-workers", str(WORKERS),
                                       "--shard-duration", "6", "--layout", "nemo", "-o", str(out), "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    assert "tarred_shard_strategy: scatter" in result.stdout and "is_tarred: true" in result.stdout
    assert (out / "tarred_audio_manifest.json").read_bytes() == before
    with gzip.open(out / ".nemo_manifests" / "manifest_0.jsonl.gz", "rt", encoding="utf-8") as f:
        assert {json.loads(line)["shard_id"] for line in f} == {0}


@pytest.mark.parametrize("layout", ["nemo", "shar"])
def test_split_slices_then_merge_reports_give_what_one_run_gives(mix, layout, nemo_out, shar_out, tmp_path):
    """Each slice writes its block of shards with their companions; merge-reports writes what the layout needs
    for the whole dataset (NeMo's manifest and config fragment): the same files as one run."""
    one, _ = nemo_out if layout == "nemo" else shar_out
    out = tmp_path / "sliced"
    for i in (1, 2):
        _balance(mix, out, layout, "--split", f"{i}/2")
    if layout == "nemo":
        assert not (out / "tarred_audio_manifest.json").exists()  # no slice writes the whole dataset's files
    merged = CliRunner().invoke(main, ["merge-reports", str(out), "--command", "balance", "--json"])
    assert merged.exit_code == 0, merged.output
    summary = json.loads(merged.stdout)
    assert summary["layout"]["layout"] == layout and summary["problems"] == 0

    def files(folder):
        skip = ("balance", "data.", "nemo_config.yaml")  # reports and lists name their own folder
        return {os.path.relpath(os.path.join(root, n), folder): open(os.path.join(root, n), "rb").read()
                for root, _, names in os.walk(folder) for n in names if not n.startswith(skip)}

    assert files(out) == files(one)
    if layout == "nemo":
        assert summary["layout"]["config_fragment"] == (out / "nemo_config.yaml").read_text() == \
            (one / "nemo_config.yaml").read_text().replace(str(one), str(out))
        assert json.load(open(out / "balance.json"))["layout"]["manifest"] == str(out / "tarred_audio_manifest.json")
    assert [line.replace(str(out), "") for line in open(out / "data.list")] == \
        [line.replace(str(one), "") for line in open(one / "data.list")]
