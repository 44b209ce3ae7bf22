"""Loader check: read a shard list the way training will, once per rank, and compare the ranks.

For each rank of a simulated world of ``world_size`` ranks, a torch ``DataLoader`` with
``num_workers`` worker processes reads the list through shardkit's dataset (which splits lines
by rank and worker as WeNet does) and batches utterances statically. The check passes when every
rank sees the same number of utterances and of batches: then no rank waits for another at the
end of an epoch (the hang of uneven DDP ranks). Audio is decoded in the workers as in training;
only counts and seconds travel back.

Without torch (the recipe's default install leaves it out) the ``shardkit`` engine does the same
with shardkit's own reader: ``num_workers`` worker processes per rank, each reading the lines that
WeNet's split gives (rank, worker) and batching its own stream statically, as a DataLoader over an
IterableDataset does (``batch_size`` per batch, the last one short).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardkit.errors import ShardkitError, UsageError
from shardkit.run.options import RunOptions

ENGINES = ("auto", "torch", "shardkit")


@dataclass(frozen=True)
class LoaderCheckSettings:
    """The training read to simulate: ``world_size`` ranks of ``num_workers`` DataLoader workers each,
    ``batch_size`` utterances per static batch, the shuffle of ``seed`` and ``epoch``, and the engine
    (``auto``: torch when installed, else shardkit's reader in worker processes)."""

    world_size: int
    num_workers: int
    batch_size: int = 16
    seed: int = 0
    epoch: int = 0
    engine: str = "auto"


def has_torch() -> bool:
    """Whether torch is installed (found, not imported): the loader check runs real DataLoaders."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _read_consumer(args) -> dict:
    """What one (rank, worker) consumer reads and batches: the shardkit engine's worker (a process)."""
    shards, rank, worker, world_size, workers, batch_size, seed, epoch = args
    from shardkit.planning.partition import lines_for
    from shardkit.training.reader import iter_samples

    paths = [shards[i] for i in lines_for(rank, worker, len(shards), world_size, workers, (seed, epoch))]
    utterances, seconds, keys = 0, 0.0, []
    for sample in iter_samples(paths):
        utterances += 1
        seconds += len(sample["audio"]) / sample["sample_rate"]
        keys.append(sample["key"])
    return {"utterances": utterances, "batches": math.ceil(utterances / batch_size), "seconds": seconds,
            "keys": keys}


def read_rank_shardkit(data_list: str, rank: int, settings: LoaderCheckSettings) -> dict:
    """``read_rank`` without torch: the rank's ``num_workers`` consumers in as many processes (0: here)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from shardkit.io.inputs import expand_shards

    shards = expand_shards([data_list])
    num_workers = settings.num_workers
    workers = max(1, num_workers)
    tasks = [(shards, rank, w, settings.world_size, workers, settings.batch_size, settings.seed, settings.epoch)
             for w in range(workers)]
    if num_workers == 0:
        parts = [_read_consumer(tasks[0])]
    else:
        with ProcessPoolExecutor(max_workers=num_workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
            parts = list(pool.map(_read_consumer, tasks))
    return {"rank": rank, "utterances": sum(p["utterances"] for p in parts),
            "batches": sum(p["batches"] for p in parts), "seconds": round(sum(p["seconds"] for p in parts), 3),
            "keys": [k for p in parts for k in p["keys"]]}


def _batch_figures(batch: list[dict]) -> tuple[int, float, list[str]]:
    """collate_fn: what a batch holds, without shipping its audio between processes."""
    seconds = sum(len(sample["audio"]) / sample["sample_rate"] for sample in batch)
    return len(batch), seconds, [sample["key"] for sample in batch]


def _from_worker(err: ShardkitError) -> ShardkitError:
    """A worker's ShardkitError as its one line: torch re-raises it in the trainer with the message
    "Caught X in DataLoader worker process N. Original Traceback ..." ending in "module.X: message"."""
    text = str(err)
    if not text.startswith("Caught ") or "Original Traceback" not in text:
        return err
    last = text.rstrip().splitlines()[-1]
    name = f"{type(err).__module__}.{type(err).__name__}: "
    return ShardkitError(last[len(name):] if last.startswith(name) else last)


def read_rank(data_list: str, rank: int, settings: LoaderCheckSettings) -> dict:
    """Utterances, batches and seconds one rank reads in one epoch, through a real DataLoader."""
    import torch.utils.data

    from shardkit.training.dataset import ShardDataset

    dataset = ShardDataset(data_list, rank=rank, world_size=settings.world_size, shuffle=True, seed=settings.seed,
                           epoch=settings.epoch)
    loader = torch.utils.data.DataLoader(dataset, batch_size=settings.batch_size, num_workers=settings.num_workers,
                                         collate_fn=_batch_figures)
    utterances = batches = 0
    seconds = 0.0
    keys: list[str] = []
    try:
        for count, batch_seconds, batch_keys in loader:
            utterances += count
            batches += 1
            seconds += batch_seconds
            keys += batch_keys
    except ShardkitError as err:
        raise _from_worker(err) from None
    return {"rank": rank, "utterances": utterances, "batches": batches, "seconds": round(seconds, 3), "keys": keys}


def compare_ranks(ranks: list[dict]) -> dict:
    """Whether every rank got the same utterances and batches, and the seconds spread (pure)."""
    utts = [r["utterances"] for r in ranks]
    batches = [r["batches"] for r in ranks]
    seconds = [r["seconds"] for r in ranks]
    all_keys = [k for r in ranks for k in r["keys"]]
    return {
        "equal_utterances": len(set(utts)) == 1,
        "equal_batches": len(set(batches)) == 1,
        "rank_seconds_spread": round(max(seconds) / min(seconds), 6) if min(seconds) > 0 else None,
        "utterances": sum(utts),
        "distinct_keys": len(set(all_keys)),
        "ok": len(set(utts)) == 1 and len(set(batches)) == 1 and min(utts) > 0,
    }


def resolve_engine(engine: str) -> str:
    """``torch`` or ``shardkit`` for an ``--engine`` choice (``auto``: torch when installed); UsageError for
    an unknown engine, or torch's without torch."""
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if engine == "auto":
        return "torch" if has_torch() else "shardkit"
    if engine == "torch" and not has_torch():
        raise UsageError("the torch engine needs torch (pip install 'shardkit[torch]'); --engine shardkit "
                         "reads with shardkit's own reader")
    return engine


def run_loader_check(data_list: str, settings: LoaderCheckSettings, options: RunOptions | None = None) -> dict:
    """Every rank's reading of one epoch, compared. ``settings.engine``: torch (a DataLoader over shardkit's
    dataset), shardkit (shardkit's reader in worker processes), auto (torch when installed).

    ``options``: progress only (one stage, "loader check", a ``done`` event per rank read with its
    figures); the worker processes are the simulated DataLoader's, ``settings.num_workers`` per rank.
    """
    events = (options or RunOptions()).events
    engine = resolve_engine(settings.engine)
    read = read_rank if engine == "torch" else read_rank_shardkit
    events.stage("loader check", total=settings.world_size, unit="rank")
    ranks = []
    for rank in range(settings.world_size):
        ranks.append(read(data_list, rank, settings))
        events.done(_without_keys(ranks[-1]))
    verdict = compare_ranks(ranks)
    return {"command": "loader-check", "engine": engine, "data_list": data_list, "world_size": settings.world_size,
            "num_workers": settings.num_workers, "batch_size": settings.batch_size, "seed": settings.seed,
            "epoch": settings.epoch, **verdict, "ranks": [_without_keys(r) for r in ranks]}


def _without_keys(rank: dict) -> dict:
    """A rank's figures as the report lists them: its utterance keys only counted, not listed."""
    return {k: v for k, v in rank.items() if k != "keys"}
