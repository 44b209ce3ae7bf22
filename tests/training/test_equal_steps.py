"""equal_steps in real torch.distributed runs (gloo, CPU): the same steps on every rank, the tail reported.

The WeNet side is ``tests/wenet_chain.py``: WeNet's per-worker chain (list shuffle, (rank, worker)
split, read/group/decode, filter, shuffle and sort buffers, dynamic batches by max_frames_in_batch)
copied from docs/reference/wenet-format.md, because WeNet itself has no installable wheel here. Shards
are real WAV/FLAC tars balanced by ``shardkit balance``'s library for 2 ranks x 2 workers; the frame
limit is chosen (by replaying the chain) so that the bare loader gives the ranks different step counts.
"""

from __future__ import annotations

import os
import tarfile
import time

import pytest
from support import REPO

from shardkit.commands.balance import BalanceSettings, run_balance
from shardkit.io.mix import CorpusSource
from shardkit.run.options import RunOptions
from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.distributed as dist  # noqa: E402
import ddp_ranks  # noqa: E402
import wenet_chain  # noqa: E402

from shardkit import EqualSteps, equal_steps  # noqa: E402
from shardkit.training.steps import batch_seconds  # noqa: E402

WORLD, WORKERS = 2, 2
PG_TIMEOUT_S = 20
MIX = (CorpusSpec("zh", 120, 0.4, 1.2, "zh"), CorpusSpec("en", 50, 1.5, 3.0, "en"),
       CorpusSpec("acc", 70, 0.3, 2.5, "mix"))


def launch(tmp_path, target, *args, pg_timeout=PG_TIMEOUT_S, deadline=90) -> list[dict]:
    return ddp_ranks.launch(tmp_path, target, *args, world=WORLD, pg_timeout=pg_timeout, deadline=deadline)


_ok = ddp_ranks.ok


# --- balanced shards and a frame limit that makes the ranks' steps differ ----------------------------


def _shard_keys(path: str) -> list[str]:
    with tarfile.open(path) as tar:
        return [m.name.rpartition(".")[0] for m in tar if m.name.endswith(".txt")]


@pytest.fixture(scope="module")
def balanced(tmp_path_factory):
    """Three corpora (WAV, FLAC, WAV) balanced into 8 equal shards for 2 ranks x 2 workers; the frame
    limit whose dynamic batches give the ranks unequal steps; every (rank, worker)'s kept samples."""
    root = tmp_path_factory.mktemp("equal-steps")
    corpora = []
    for spec, fmt in zip(MIX, ("wav", "flac", "wav")):
        utts = list(corpus_utterances(spec, audio_format=fmt))
        write_shards(utts, str(root / spec.name), utts_per_shard=25, audio_format=fmt)
        corpora.append(CorpusSource(spec.name, (str(root / spec.name),)))
    report = run_balance(corpora, str(root / "balanced"), BalanceSettings(world_size=WORLD, num_workers=WORKERS,
                         num_shards=8, codec="none", epochs=1), RunOptions(jobs=1))
    assert not report.failures and report.plan.balanced
    data_list = str(root / "balanced" / "data.list")
    with open(data_list) as f:
        lines = f.read().split()
    assert len(lines) == 8
    per_worker = {(r, w): list(wenet_chain.worker_samples(lines, r, w, WORLD, WORKERS))
                  for r in range(WORLD) for w in range(WORKERS)}
    limits = range(300, 2000, 25)
    counts = {rw: wenet_chain.batch_counts([s["feat_frames"] for s in samples], limits)
              for rw, samples in per_worker.items()}
    steps = {limit: [sum(counts[(r, w)][limit] for w in range(WORKERS)) for r in range(WORLD)] for limit in limits}
    uneven = [limit for limit in limits if len(set(steps[limit])) > 1]
    assert uneven, "no frame limit gives unequal steps: the test could not see the hang"
    return {"data_list": data_list, "lines": lines, "limit": uneven[0], "steps": steps[uneven[0]],
            "all_keys": [k for line in lines for k in _shard_keys(line)],
            "kept": {rw: {s["key"]: s["wav"].size(1) for s in samples} for rw, samples in per_worker.items()}}


def _wenet_loader(data_list, rank, limit, workers=WORKERS, start_delay=0.0):
    ds = wenet_chain.WenetStyleDataset(data_list, rank, WORLD, limit, start_delay=start_delay)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                       multiprocessing_context="fork" if workers else None)


def _tap(loader, produced):
    """Every batch the loader yields, recorded before equal_steps sees it (consumed + left out)."""
    for batch in loader:
        produced.append([batch["keys"], wenet_chain.seconds_of(batch)])
        yield batch


# --- the trainer's run ------------------------------------------------------------------------------


def _train_rank(rank, data_list, limit, overlap=False):
    """Bare loader first (count the steps: the would-be hang), then equal_steps with one all_reduce per
    batch standing for DDP's gradient sync."""
    bare = sum(1 for _ in _wenet_loader(data_list, rank, limit))
    produced, consumed = [], []
    grad = torch.zeros(4)
    wrapped = equal_steps(_tap(_wenet_loader(data_list, rank, limit), produced), overlap=overlap)
    for batch in wrapped:
        grad.fill_(1.0)
        dist.all_reduce(grad)
        assert grad[0].item() == WORLD
        consumed.append(batch["keys"])
    return {"bare_steps": bare, "consumed": consumed, "produced": produced, "report": wrapped.last_epoch_report}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("overlap", [False, True])
def test_dynamic_batches_give_equal_steps_and_every_key_is_accounted_for(tmp_path, balanced, overlap):
    results = _ok(launch(tmp_path, _train_rank, balanced["data_list"], balanced["limit"], overlap))
    bare = [r["bare_steps"] for r in results]
    assert bare == balanced["steps"] and bare[0] != bare[1]  # without equal_steps one rank would wait forever
    steps = [len(r["consumed"]) for r in results]
    assert steps == [min(bare)] * WORLD

    # every rank's keys against the plan: what its workers were given (after the trainer's filter)
    all_consumed = [k for r in results for batch in r["consumed"] for k in batch]
    assert len(all_consumed) == len(set(all_consumed))  # no key twice
    for rank, res in enumerate(results):
        planned = {k for w in range(WORKERS) for k in balanced["kept"][(rank, w)]}
        produced = [k for keys, _ in res["produced"] for k in keys]
        assert sorted(produced) == sorted(planned)  # consumed + left out = the rank's plan, each once
        assert len(res["produced"]) == bare[rank]
    kept = {k for rw in balanced["kept"] for k in balanced["kept"][rw]}
    assert kept == set(balanced["all_keys"])  # WeNet's default filter keeps all of this mix: every balanced key

    # the report on rank 0: exact left-out batches and seconds per rank
    report = results[0]["report"]
    left = [len(r["produced"]) - len(r["consumed"]) for r in results]
    left_s = [sum(s for _, s in r["produced"][len(r["consumed"]):]) for r in results]
    done_s = [sum(s for _, s in r["produced"][:len(r["consumed"])]) for r in results]
    assert report["steps"] == min(bare) and report["world_size"] == WORLD and report["drained"]
    assert report["left_out_batches"] == left and max(left) >= 1 and min(left) == 0
    assert report["left_out_seconds"] == pytest.approx(left_s)
    assert report["seconds"] == pytest.approx(done_s)
    assert report["left_out_share"] == pytest.approx(sum(left_s) / (sum(left_s) + sum(done_s)))
    assert report["left_out_share"] <= 0.03  # >= 97% of the balanced audio reaches a rank
    assert len(report["drain_seconds"]) == WORLD and None not in report["drain_seconds"]
    other = results[1]["report"]
    assert other == {**report, "rank": 1}  # every rank gets the whole report


def _slow_start_rank(rank, delay):
    """Rank 1's first batch comes ``delay`` s late (past the group's timeout). With equal_steps both
    ranks finish; then the same late start without it: rank 0's all_reduce times out."""
    def batches():
        if rank == 1:
            time.sleep(delay)
        for i in range(5):
            yield {"pcm_length": torch.tensor([16000 * (i + 1)])}

    steps = 0
    for _ in equal_steps(batches()):
        dist.all_reduce(torch.ones(1))
        steps += 1
    try:
        for _ in batches():
            dist.all_reduce(torch.ones(1))
        bare = "no timeout"
    except RuntimeError as err:
        bare = str(err)
    return {"steps": steps, "bare": bare}


@pytest.mark.timeout(120)
def test_a_rank_whose_first_batch_comes_after_the_group_timeout_does_not_fail(tmp_path):
    results = _ok(launch(tmp_path, _slow_start_rank, 4.0, pg_timeout=3))
    assert [r["steps"] for r in results] == [5, 5]
    assert "timed out" in results[0]["bare"].lower() or "timeout" in results[0]["bare"].lower()


def _late_rank(rank):
    """Rank 1 comes 3 s late; rank 0 waits only 0.5 s for it (first_batch_timeout)."""
    if rank == 1:
        time.sleep(3)
    for _ in equal_steps([{"pcm_length": torch.tensor([8000])}], first_batch_timeout=0.5):
        pass
    return {"steps": 1}


@pytest.mark.timeout(120)
def test_a_rank_that_never_starts_is_named_after_first_batch_timeout(tmp_path):
    results = launch(tmp_path, _late_rank, pg_timeout=3)
    assert results[0]["error"].startswith("ShardkitError: equal_steps: rank(s) [1] did not reach its first batch "
                                          "within 0.5 s (first_batch_timeout)")
    assert "error" in results[1]  # its partner is gone: an error, not a hang (launch's deadline)


def _webdataset_phase(urls):
    """A WebDataset pipeline (split by node, decoded by shardkit's stage, batches of 6 samples), seconds
    given by a ``seconds=`` function: 4 shards (120 utterances) on rank 0, 3 on rank 1."""
    try:
        import webdataset
    except ImportError:
        return None
    from shardkit.training.wds import decode_audio

    def seconds(batch):
        audio = [next(v for k, v in s.items() if k in ("wav", "flac")) for s in batch]
        return sum(len(samples) / rate for samples, rate in audio)

    pipeline = (webdataset.WebDataset(urls, nodesplitter=webdataset.split_by_node, shardshuffle=False)
                .map(decode_audio()).batched(6, collation_fn=list))
    every = [seconds(b) for b in pipeline]
    wrapped = equal_steps(pipeline, seconds=seconds)
    return {"steps": sum(1 for _ in wrapped), "every": every, "report": wrapped.last_epoch_report}


def _edge_cases_rank(rank, lines):
    """A 0-worker ShardDataset loader (seconds from collate_padded's lengths), a rank with no batch at
    all, and a loader that raises on rank 1: each ends on both ranks at the same step."""
    from shardkit import ShardDataset, collate_padded

    ds = ShardDataset(lines[:7], shuffle=True, seed=3)  # 7 shards: 4 for rank 0, 3 for rank 1
    loader = torch.utils.data.DataLoader(ds, batch_size=7, collate_fn=collate_padded, num_workers=0)
    every = [(len(b["key"]), float(b["lengths"].sum()) / 16000) for b in loader]
    wrapped = equal_steps(loader)
    reports = []
    for _ in range(2):  # two epochs through one wrapper: fresh store keys each time
        ds.set_epoch(0)  # the same data again: a further iteration would count as the next epoch
        steps = sum(1 for _ in wrapped)
        reports.append(wrapped.last_epoch_report)
    out = {"zero_workers": {"steps": steps, "every": every, "report": reports[0], "again": reports[1]}}

    empty = equal_steps([] if rank == 1 else [{"pcm_length": torch.tensor([8000])}] * 3)
    out["empty"] = {"steps": sum(1 for _ in empty), "report": empty.last_epoch_report}

    out["webdataset"] = _webdataset_phase(lines[:7])

    cpu_group = dist.new_group(backend="gloo")  # as a NCCL trainer would pass it: the flag stays on the CPU
    grouped = equal_steps([{"pcm_length": torch.tensor([16000])}] * (4 + rank), group=cpu_group)
    out["group"] = {"steps": sum(1 for _ in grouped), "report": grouped.last_epoch_report}

    def failing():
        yield {"pcm_length": torch.tensor([8000])}
        if rank == 1:
            raise ValueError("shard 7 is corrupt")
        yield {"pcm_length": torch.tensor([8000])}

    try:
        out["failing"] = {"steps": sum(1 for _ in equal_steps(failing()))}
    except Exception as err:
        out["failing"] = {"error": f"{type(err).__name__}: {err}"}
    return out


@pytest.mark.timeout(120)
def test_zero_workers_an_empty_rank_and_a_failing_loader(tmp_path, balanced):
    results = _ok(launch(tmp_path, _edge_cases_rank, balanced["lines"]))
    every = [r["zero_workers"]["every"] for r in results]
    steps = min(len(e) for e in every)
    report = results[0]["zero_workers"]["report"]
    assert [r["zero_workers"]["steps"] for r in results] == [steps] * WORLD and report["steps"] == steps
    assert report["left_out_batches"] == [len(e) - steps for e in every]
    assert report["left_out_seconds"] == pytest.approx([sum(s for _, s in e[steps:]) for e in every])
    assert results[0]["zero_workers"]["again"] == {**report, "epoch": 1, "drain_seconds": pytest.approx(
        results[0]["zero_workers"]["again"]["drain_seconds"])}

    assert [r["empty"]["steps"] for r in results] == [0, 0]
    empty = results[0]["empty"]["report"]
    assert empty["left_out_batches"] == [3, 0] and empty["left_out_seconds"] == pytest.approx([1.5, 0.0])
    assert empty["left_out_share"] == 1.0

    if results[0]["webdataset"] is not None:
        every = [r["webdataset"]["every"] for r in results]
        assert [len(e) for e in every] == [20, 15] and [r["webdataset"]["steps"] for r in results] == [15, 15]
        report = results[0]["webdataset"]["report"]
        assert report["left_out_batches"] == [5, 0]
        assert report["left_out_seconds"] == pytest.approx([sum(every[0][15:]), 0.0])
        assert report["seconds"] == pytest.approx([sum(every[0][:15]), sum(every[1])])

    assert [r["group"]["steps"] for r in results] == [4, 4]
    assert results[0]["group"]["report"]["left_out_batches"] == [0, 1]

    assert "another rank's loader failed at step 2" in results[0]["failing"]["error"]
    assert results[1]["failing"]["error"] == "ValueError: shard 7 is corrupt"


# --- without a process group ------------------------------------------------------------------------


def test_without_a_process_group_it_passes_every_batch_through():
    assert not dist.is_initialized()
    batches = [{"pcm_length": torch.tensor([16000, 8000])}, {"pcm_length": torch.tensor([4000])}]
    wrapped = equal_steps(batches)
    assert list(wrapped) == batches and len(wrapped) == 2
    assert wrapped.last_epoch_report == {"epoch": 0, "steps": 2, "world_size": 1, "rank": 0, "drained": True,
                                         "left_out_batches": [0], "left_out_seconds": [0.0], "seconds": [1.75],
                                         "left_out_share": 0.0, "drain_seconds": [0.0]}
    assert list(wrapped) == batches and wrapped.last_epoch_report["epoch"] == 1


def test_batch_seconds_reads_wenet_and_shardkit_batches():
    assert batch_seconds({"pcm_length": torch.tensor([16000, 8000])}) == 1.5
    assert batch_seconds({"pcm_length": torch.tensor([8000])}, sample_rate=8000) == 1.0
    assert batch_seconds({"lengths": torch.tensor([16000, 32000]), "sample_rate": [16000, 16000]}) == 3.0
    assert batch_seconds({"audio": torch.zeros(24000, 1), "sample_rate": 16000}) == 1.5
    assert batch_seconds(("a", "b")) is None and batch_seconds({"feats": 1}) is None
    wrapped = equal_steps([("x",), ("y",)], seconds=lambda b: 2.0)
    list(wrapped)
    assert wrapped.last_epoch_report["seconds"] == [4.0]
    unknown = equal_steps([("x",)])
    list(unknown)
    assert unknown.last_epoch_report["seconds"] == [None] and unknown.last_epoch_report["left_out_share"] is None


class _Stateful:
    def __init__(self):
        self.state = {"position": 0}

    def __iter__(self):
        return iter([1, 2, 3])

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def test_state_dict_delegates_to_the_loader_and_counts_the_steps():
    loader = _Stateful()
    wrapped = EqualSteps(loader)
    it = iter(wrapped)
    next(it), next(it)
    loader.state["position"] = 2
    state = wrapped.state_dict()
    assert state == {"epoch": 1, "steps": 2, "loader": {"position": 2}}
    fresh = EqualSteps(_Stateful())
    fresh.load_state_dict({"epoch": 0, "steps": 2, "loader": {"position": 2}})
    assert fresh.loader.state == {"position": 2}
    assert len(list(fresh)) == 3 and fresh.last_epoch_report["steps"] == 5  # 2 before the checkpoint + 3
    assert EqualSteps([1]).state_dict() == {"epoch": 0, "steps": 0}
    loader.dataset = "the dataset"
    assert wrapped.dataset == "the dataset"  # other attributes are the loader's
    with pytest.raises(AttributeError):
        _ = wrapped.no_such_attribute


def test_the_trainer_side_imports_without_torch_pyarrow_or_planning_conf():
    import subprocess
    import sys

    code = ("import sys; import shardkit.training.steps as s; assert 'torch' not in sys.modules, 'torch';"
            "import shardkit; assert shardkit.equal_steps is s.equal_steps;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'yaml')"
            " or m.startswith(('shardkit.commands', 'shardkit.run'))];"
            "assert not bad, bad")
    root = REPO
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": root})


def test_the_flag_goes_where_the_backend_takes_it():
    """NCCL: the current CUDA device (no GPU needed to check the choice); gloo, gloo+nccl, MPI: the CPU."""
    from types import SimpleNamespace

    from shardkit.training.steps import _flag_device

    fake_torch = SimpleNamespace(device=torch.device, cuda=SimpleNamespace(current_device=lambda: 3))
    for backend, expected in [("nccl", torch.device("cuda", 3)), ("gloo", torch.device("cpu")),
                              ("cpu:gloo,cuda:nccl", torch.device("cpu")), ("mpi", torch.device("cpu"))]:
        fake_dist = SimpleNamespace(get_backend=lambda group, b=backend: b)
        assert _flag_device(fake_torch, fake_dist, None) == expected, backend
