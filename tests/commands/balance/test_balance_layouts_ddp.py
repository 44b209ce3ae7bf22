"""balance --layout shar|nemo (and prep --layout, which writes by the same rule) in a real multi-rank run: W=2 torch.distributed ranks (gloo, CPU), each with a
DataLoader of K=2 workers, read the output as the trainers deal it, with one all_reduce per batch standing for
DDP's gradient sync (a rank with an extra step would wait there until the group's timeout).

- Shar: lhotse's ``CutSet.from_shar(split_for_dataloading=True)`` under a ``DynamicCutSampler`` of
  ``max_cuts=B`` in an ``IterableDatasetWrapper`` (the sampler's own rank/world are 0/1: the Shar split deals
  shards to ranks, asking torch.distributed, then to workers), as a lhotse/icefall trainer reads Shar.
- NeMo: NeMo's scatter of the tars and its per-worker WebDataset pipeline (tests/nemo_split.py, restated from
  NeMo's source: nemo-toolkit is not installed here), batches of B by a DataLoader as NeMo's tarred dataset
  is read; each member is found in the manifest by its file id and decoded, as ``_build_sample`` does.

Every utterance is read exactly once across ranks and workers with its text and identical samples, every rank
takes the same number of steps, and the dealing drops nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections import Counter

import pytest
import soundfile as sf
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands import balance
from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

torch = pytest.importorskip("torch")
pytest.importorskip("lhotse")
pytest.importorskip("webdataset")
pytestmark = pytest.mark.torch

import torch.distributed as dist  # noqa: E402

import ddp_ranks  # noqa: E402
import nemo_own_reader  # noqa: E402
import nemo_split  # noqa: E402

# a few seconds of audio per corpus: WAV, FLAC and WAV in plain, zst and bz2 shards
SPECS = (CorpusSpec("aishell", 8, 0.3, 0.9, "zh"), CorpusSpec("librispeech", 3, 1.5, 3.0, "en"),
         CorpusSpec("accented", 5, 0.3, 2.5, "mix"))
WORLD, WORKERS, BATCH = 2, 2, 2


def _samples_digest(samples) -> str:
    return hashlib.sha256(samples.astype("float32").tobytes()).hexdigest()


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout-ddp-mix")
    truth = {}
    for spec, codec, fmt in zip(SPECS, ("none", "zst", "bz2"), ("wav", "flac", "wav")):
        utts = list(corpus_utterances(spec, seed=5, audio_format=fmt))
        write_shards(utts, str(root / spec.name), utts_per_shard=3, codec=codec, audio_format=fmt)
        for key, text, audio, _ in utts:
            samples, rate = sf.read(io.BytesIO(audio), dtype="float32")
            truth[key] = {"text": text, "digest": _samples_digest(samples), "frames": len(samples), "rate": rate}
    return {"root": root, "truth": truth}


def _balance(mix, out, layout, command="balance") -> dict:
    args = [a for spec in SPECS for a in ("--corpus", f"{spec.name}={mix['root'] / spec.name}")]
    result = CliRunner().invoke(main, [command, *args, "--world-size", str(WORLD), "--num-workers", str(WORKERS),
                                       "--shard-duration", "3", "--layout", layout, "-o", str(out), "-j", "1", "-q",
                                       "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_shards"] % (WORLD * WORKERS) == 0
    return report


def _originals(out, command: str) -> dict[str, str]:
    """Output key -> source key of every repeat (balance's repeats file, prep.json's repeats)."""
    if command == "prep":
        return {new: old for old, new in json.load(open(out / "prep.json"))["repeats"]}
    return {new: old for old, new in balance.read_repeats(str(out))}


def _worker() -> int:
    return torch.utils.data.get_worker_info().id


def _train(loader) -> dict:
    """The trainer's loop: one all_reduce per batch (DDP's gradient sync); then every rank's step count."""
    batches = []
    for batch in loader:
        grad = torch.ones(1)
        dist.all_reduce(grad)
        assert grad.item() == WORLD
        batches.append(batch)
    steps = [None] * WORLD
    dist.all_gather_object(steps, len(batches))
    return {"batches": batches, "steps": steps}


# --- the ranks ---------------------------------------------------------------------------------------


class _ReadCuts(torch.utils.data.Dataset):
    """A lhotse dataset: the sampler's CutSet in, what the test checks of each cut out."""

    def __getitem__(self, cuts):
        return [{"id": cut.id, "text": [s.text for s in cut.supervisions], "rate": cut.sampling_rate,
                 "duration": cut.duration, "digest": _samples_digest(cut.load_audio()[0]),
                 "frames": cut.load_audio().shape[1], "worker": _worker()} for cut in cuts]


def _shar_rank(rank: int, shar_dir: str) -> dict:
    from lhotse import CutSet
    from lhotse.dataset import DynamicCutSampler, IterableDatasetWrapper

    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ  # lhotse asks torch.distributed
    cuts = CutSet.from_shar(in_dir=shar_dir, split_for_dataloading=True)
    sampler = DynamicCutSampler(cuts, max_cuts=BATCH, rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(IterableDatasetWrapper(_ReadCuts(), sampler), batch_size=None,
                                         num_workers=WORKERS, multiprocessing_context="fork")
    return _train(loader)


class _NemoTarred(torch.utils.data.IterableDataset):
    """NeMo's tarred dataset for one rank: its scatter of the tars, its workers' WebDataset pipeline, the
    manifest line found by the member's file id, the audio decoded."""

    def __init__(self, tars: list[str], lines: dict):
        self.tars, self.lines = tars, lines

    def __iter__(self):
        for audio, file_id in nemo_split.tar_samples(self.tars):
            line = self.lines[file_id]  # a miss is _build_sample's KeyError
            samples, rate = sf.read(io.BytesIO(audio), dtype="float32")
            yield {"id": file_id, "key": line["key"], "text": line["text"], "duration": line["duration"],
                   "rate": rate, "frames": len(samples), "digest": _samples_digest(samples), "worker": _worker()}


def _nemo_rank(rank: int, train_ds: dict) -> dict:
    tars = nemo_split.expand_sharded_filepaths(train_ds["tarred_audio_filepaths"], train_ds["tarred_shard_strategy"],
                                               dist.get_world_size(), dist.get_rank())
    with open(train_ds["manifest_filepath"], encoding="utf-8") as f:
        lines = {nemo_split.file_id(line["audio_filepath"]): line for line in map(json.loads, f)}
    loader = torch.utils.data.DataLoader(_NemoTarred(tars, lines), batch_size=BATCH, num_workers=WORKERS,
                                         collate_fn=list, multiprocessing_context="fork")
    return _train(loader)


# --- the checks --------------------------------------------------------------------------------------


def _check_run(results: list[dict], expected_ids: set, original_of, truth: dict) -> list[dict]:
    """Equal steps on every rank; every id once across ranks and workers, with its text and samples."""
    steps = [len(res["batches"]) for res in results]
    assert all(res["steps"] == steps for res in results)  # what the ranks agreed on is what each counted
    assert len(set(steps)) == 1 and steps[0] > 1
    items = [dict(item, rank=rank) for rank, res in enumerate(results) for batch in res["batches"] for item in batch]
    ids = [item["id"] for item in items]
    assert len(ids) == len(set(ids)) and set(ids) == expected_ids  # once each; nothing dropped
    for item in items:
        expected = truth[original_of(item)]
        assert item["digest"] == expected["digest"] and item["frames"] == expected["frames"]
        assert item["rate"] == expected["rate"] and item["duration"] == expected["frames"] / expected["rate"]
    per_worker = Counter((item["rank"], item["worker"]) for item in items)
    assert len(per_worker) == WORLD * WORKERS and len(set(per_worker.values())) == 1
    assert {original_of(item) for item in items} == set(truth)  # every source utterance is there
    return items


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", ["balance", "prep"])
def test_shar_in_a_real_two_rank_run_with_lhotse_reads_every_cut_once_in_equal_steps(mix, tmp_path, command):
    from lhotse import CutSet

    out = tmp_path / "out"
    report = _balance(mix, out, "shar", command)
    originals = _originals(out, command)
    all_ids = {cut.id for cut in CutSet.from_shar(in_dir=out / "shar")}
    assert len(all_ids) == report["num_shards"] * report["utterances_per_shard"]
    results = ddp_ranks.ok(ddp_ranks.launch(tmp_path, _shar_rank, str(out / "shar"), world=WORLD))
    items = _check_run(results, all_ids, lambda item: originals.get(item["id"], item["id"]), mix["truth"])
    for item in items:
        assert item["text"] == [mix["truth"][originals.get(item["id"], item["id"])]["text"]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", ["balance", "prep"])
def test_nemo_in_a_real_two_rank_run_with_scatter_reads_every_line_once_in_equal_steps(mix, tmp_path, command):
    import yaml

    out = tmp_path / "out"
    _balance(mix, out, "nemo", command)
    train_ds = yaml.safe_load((out / "nemo_config.yaml").read_text())["train_ds"]
    assert train_ds["tarred_shard_strategy"] == "scatter"
    originals = _originals(out, command)
    with open(train_ds["manifest_filepath"], encoding="utf-8") as f:
        all_ids = {nemo_split.file_id(json.loads(line)["audio_filepath"]) for line in f}
    results = ddp_ranks.ok(ddp_ranks.launch(tmp_path, _nemo_rank, train_ds, world=WORLD))
    items = _check_run(results, all_ids, lambda item: originals.get(item["key"], item["key"]), mix["truth"])
    for item in items:
        assert item["text"] == mix["truth"][originals.get(item["key"], item["key"])]["text"]


# --- NeMo's own dataset class, in its own environment (scripts/test.sh makes it; tests/nemo_own_reader.py) -----


@pytest.mark.timeout(600)
@pytest.mark.skipif(not nemo_own_reader.NEMO_PYTHON, reason=nemo_own_reader.NEEDS_NEMO)
@pytest.mark.parametrize("command", ["balance", "prep"])
def test_nemo_own_tarred_dataset_reads_every_line_once_with_its_samples_in_equal_steps(mix, tmp_path, command):
    out = tmp_path / "out"
    _balance(mix, out, "nemo", command)
    ranks = nemo_own_reader.read_with_nemo(out / "nemo_config.yaml", WORLD, WORKERS, BATCH, tmp_path)
    originals = _originals(out, command)
    with open(out / "tarred_audio_manifest.json", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [len(rank["batches"]) for rank in ranks] == [len(ranks[0]["batches"])] * WORLD  # equal steps
    # ...taken in lockstep by real gloo ranks: no step where one rank waited in the all_reduce for another
    assert [(rank["lockstep_steps"], rank["uneven_steps"]) for rank in ranks] == [(len(ranks[0]["batches"]), 0)] * WORLD
    items = [item for rank in ranks for batch in rank["batches"] for item in batch]
    assert sorted(item["line"]["audio_filepath"] for item in items) == sorted(line["audio_filepath"] for line in lines)
    for item in items:
        expected = mix["truth"][originals.get(item["line"]["key"], item["line"]["key"])]
        assert item["text"] == expected["text"] and item["frames"] == expected["frames"]
        assert item["digest"] == expected["digest"]
