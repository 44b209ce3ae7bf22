"""The resume state of a ShardDataset: what it holds, how it is checked, merged and restored.

A ``ShardDataset`` follows torchdata's ``Stateful`` protocol (``state_dict()`` / ``load_state_dict()``),
so ``torchdata.stateful_dataloader.StatefulDataLoader`` saves it per loader worker after every batch
it hands over (prefetched batches not yet handed over are not counted) and gives each worker its own
state back on restore. One *consumer* state (a (rank, worker) pair) is a small dict of plain values:

    format      "shardkit.ShardDataset/1"
    digest      sha256 of the shard list (paths in order, sizes, mtimes: stat only, never shard bytes),
    shards      computed once when the dataset is made; and the number of shards
    seed, shuffle, epoch
    world_size, num_workers, rank, worker          the topology it was read under
    pieces      None: the normal split (``planning.partition.lines_for``); else the list of
                [line, start offset] this consumer reads (after an elastic restore)
    index       the piece (or shard of its split) being read
    shard       its path (None when the consumer has read everything)
    offset      the tar-stream byte offset in it where the next utterance's headers begin

Restoring under the same world size and workers is exact (``StatefulDataLoader.load_state_dict``:
each worker seeks its shard to the offset; a compressed one is skipped by decompressing only).
Restoring under another topology (:func:`restore_loader_state`, :func:`merge`) gathers every consumer's rest
of the epoch into pieces and deals them to the new consumers (``planning.resume``): each unread
utterance is read exactly once; the ranks' remaining work stays within one shard of each other.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable

from shardkit.errors import UsageError
from shardkit.planning.partition import lines_for

FORMAT = "shardkit.ShardDataset/1"
EPOCH_FORMAT = "shardkit.ShardDataset.epoch/1"
_COMPRESSED = (".gz", ".tgz", ".bz2", ".tbz2", ".xz", ".txz", ".zst", ".zstd", ".tzst")


class StateMismatchError(UsageError):
    """A saved resume state that does not belong to this dataset (another list, seed or shard set).

    Raised instead of resuming at a wrong place: the message says what differs (the list's length,
    its paths, sizes or mtimes, the seed, or a missing (rank, worker) of an elastic restore).

    Example:
        ```python
        try:
            shardkit.restore_loader_state(loader, dataset, ckpt["loader"])
        except shardkit.StateMismatchError as err:
            print("starting the epoch over:", err)
        ```
    """

    check = "resume_state"


def shard_set_digest(paths: list[str]) -> tuple[str, list[int]]:
    """``(digest, sizes)``: sha256 over every path in order with its size and mtime (stat only).

    A URL or ``pipe:`` input counts by its name alone (size -1): stat-ing a store costs a request each.
    """
    from shardkit.io.remote import is_local

    facts, sizes = [], []
    for path in paths:
        size = mtime = -1
        if is_local(path):
            try:
                st = os.stat(path)
                size, mtime = st.st_size, st.st_mtime_ns
            except OSError:
                pass  # a missing shard fails where it is read, with its own message
        facts.append([path, size, mtime])
        sizes.append(size)
    digest = hashlib.sha256(json.dumps(facts, separators=(",", ":")).encode()).hexdigest()
    return digest, sizes


def check(state: dict, *, digest: str, shards: int, seed: int, shuffle: bool) -> None:
    """Raise StateMismatchError, saying what differs, unless ``state`` was saved for this shard set."""
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, EPOCH_FORMAT):
        raise StateMismatchError(f"not a ShardDataset state (format {_get(state, 'format')!r}, expected {FORMAT!r})")
    if state["shards"] != shards:
        raise StateMismatchError(f"the state was saved for a list of {state['shards']} shards, this dataset has "
                                 f"{shards}: another data.list or shard set")
    if state["digest"] != digest:
        raise StateMismatchError("the state was saved for another shard list (the paths, their order, sizes or "
                                 "modification times differ): another data.list, or shards rewritten since")
    if state["seed"] != seed or state["shuffle"] != shuffle:
        raise StateMismatchError(f"the state was saved with seed={state['seed']} shuffle={state['shuffle']}, this "
                                 f"dataset has seed={seed} shuffle={shuffle}: the epoch's order would differ")


def _get(state, key):
    return state.get(key) if isinstance(state, dict) else type(state).__name__


def consumer_lines(state: dict) -> list[list[int]]:
    """``[[line, start], ...]`` a consumer state reads in its epoch (its pieces, or its normal split)."""
    if state["pieces"] is not None:
        return [list(p) for p in state["pieces"]]
    lines = lines_for(state["rank"], state["worker"], state["shards"], state["world_size"], state["num_workers"],
                      (state["seed"], state["epoch"]) if state["shuffle"] else None)
    return [[int(line), 0] for line in lines]


def remaining_pieces(state: dict) -> list[list[int]]:
    """The ``[line, start]`` pieces a consumer has not read yet: its current one from ``offset``, then the rest."""
    pieces = consumer_lines(state)[state["index"]:]
    if pieces:
        pieces[0] = [pieces[0][0], state["offset"]]
    return pieces


def consumer_states(states) -> list[dict]:
    """Every consumer state inside ``states``: a ``StatefulDataLoader.state_dict()`` (0 or K workers),
    a ``ShardDataset.state_dict()``, or a list of them (one per rank, as :func:`gather_loader_state` returns)."""
    if isinstance(states, (list, tuple)):
        return [c for s in states for c in consumer_states(s)]
    if not isinstance(states, dict):
        raise StateMismatchError(f"not a loader or dataset state: {type(states).__name__}")
    if states.get("format") == FORMAT:
        return [states]
    if "_snapshot" in states:  # StatefulDataLoader with workers
        if states.get("_steps_since_snapshot", 0):
            raise StateMismatchError("the loader state was saved between snapshots (snapshot_every_n_steps > 1): "
                                     "an elastic restore needs snapshot_every_n_steps=1, the default")
        workers = states["_snapshot"]["_worker_snapshots"]
        return [consumer_states(workers[k]["dataset_state"])[0] for k in sorted(workers, key=_worker_number)]
    if "dataset_state" in states:  # StatefulDataLoader, num_workers=0
        return consumer_states(states["dataset_state"])
    raise StateMismatchError("no ShardDataset state inside this state (was the loader's dataset a ShardDataset?)")


def _worker_number(key: str) -> int:
    return int(str(key).rsplit("_", 1)[-1])


def merge(states) -> dict:
    """One epoch state from every consumer's state of one run (all ranks, all workers).

    Refuses a set that is not whole (a (rank, worker) missing or twice) or mixes runs, epochs or
    shard lists: a missing consumer would lose its utterances, a doubled one read them twice.
    """
    consumers = consumer_states(states)
    if not consumers:
        raise StateMismatchError("no consumer states to merge")
    first = consumers[0]
    _refuse_mixed_runs(consumers)
    world, workers = first["world_size"], first["num_workers"]
    _refuse_incomplete(consumers, world, workers)
    # consumer id order (as the epoch's shards were dealt), so the pieces keep the old reading order
    consumers.sort(key=lambda c: (c["worker"] * world + c["rank"]))
    pieces = [p for c in consumers for p in remaining_pieces(c)]
    return {"format": EPOCH_FORMAT, **{k: first[k] for k in ("digest", "shards", "seed", "shuffle", "epoch")},
            "from": [world, workers], "pieces": pieces}


def _refuse_mixed_runs(consumers: list[dict]) -> None:
    """Every consumer state must come from one run, epoch and shard list (the first one's)."""
    first = consumers[0]
    for c in consumers:
        for key in ("digest", "shards", "seed", "shuffle", "epoch", "world_size", "num_workers"):
            if c[key] != first[key]:
                raise StateMismatchError(f"the states mix {key}={first[key]!r} and {key}={c[key]!r}: not one run's")


def _refuse_incomplete(consumers: list[dict], world: int, workers: int) -> None:
    """Each (rank, worker) of a ``world`` x ``workers`` run must be named exactly once."""
    seen = sorted((c["rank"], c["worker"]) for c in consumers)
    expected = [(r, w) for r in range(world) for w in range(workers)]
    if seen != expected:
        missing = sorted(set(expected) - set(seen))
        raise StateMismatchError(f"the states of a {world} x {workers} run must name each (rank, worker) once; "
                                 f"missing {missing[:8]}, {len(seen)} given: gather every rank's loader state")


def piece_weights(pieces: Iterable, sizes: list[int], shards: list[str]) -> list[float]:
    """Remaining work of each ``[line, start]`` piece, in bytes of its shard on disk.

    Plain tar: exactly the bytes left. A compressed shard read partly counts half its size (the
    offset is in the decompressed stream, whose length is not known without reading it); a URL
    (size unknown) counts 1.
    """
    weights = []
    for line, start in pieces:
        size = sizes[line]
        if size < 0:
            weights.append(1.0)
        elif start == 0:
            weights.append(float(size))
        elif shards[line].lower().endswith(_COMPRESSED):
            weights.append(size / 2)
        else:
            weights.append(float(max(size - start, 0)))
    return weights


def gather_loader_state(loader) -> list:
    """Every rank's ``loader.state_dict()``, in rank order: what a checkpoint keeps to resume the data.

    With a process group up, every rank must call it (it is a collective,
    ``torch.distributed.all_gather_object``); each gets the whole list and rank 0 saves it. Without
    one, the list holds this process's state alone. Keeping every rank's state is what lets
    :func:`restore_loader_state` resume under another world size or worker count.

    Args:
        loader (StatefulDataLoader): a ``torchdata.stateful_dataloader.StatefulDataLoader`` over a
            :class:`~shardkit.training.dataset.ShardDataset` (anything with ``state_dict()`` works,
            e.g. an :class:`~shardkit.training.steps.EqualSteps` around one).

    Returns:
        One state per rank, in rank order (plain values: ``torch.save`` and JSON take them).

    Raises:
        RuntimeError: from torch.distributed when a rank of the group does not take part.

    Example:
        ```python
        states = shardkit.gather_loader_state(loader)  # on every rank
        if torch.distributed.get_rank() == 0:
            torch.save({"model": model.state_dict(), "loader": states}, "ckpt.pt")
        ```
    """
    state = loader.state_dict()
    try:
        import torch.distributed as dist
    except ImportError:
        return [state]
    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, state)
    return out


def restore_loader_state(loader, dataset, states) -> str:
    """Resume a run's data from the states :func:`gather_loader_state` saved; returns how.

    "exact" when world size and workers are those of the save: this rank's loader state (the
    others may be left out) goes to the loader, each worker resumes at its own shard and offset,
    and the order equals an uninterrupted run's. "elastic" otherwise: the rest of the epoch is dealt
    anew over the new ranks and workers (:func:`merge`; each unread utterance is read exactly once)
    and the loader starts fresh. Call it on every rank before iterating, after ``set_epoch`` with
    the saved epoch (or none).

    Args:
        loader (StatefulDataLoader): the new run's loader (a ``StatefulDataLoader`` for an exact restore with workers).
        dataset (ShardDataset): the :class:`~shardkit.training.dataset.ShardDataset` the loader reads: the same
            list, seed and shuffle as the saved run.
        states (list[dict] | dict): the saved list (one state per rank), or one rank's state.

    Returns:
        ``"exact"`` or ``"elastic"``.

    Raises:
        StateMismatchError: the states belong to another shard list, seed or shard set, mix runs or
            epochs, or miss a (rank, worker) (an elastic restore needs every rank's state).

    Example:
        ```python
        ckpt = torch.load("ckpt.pt", weights_only=True)
        mode = shardkit.restore_loader_state(loader, dataset, ckpt["loader"])  # on every rank
        for batch in loader:  # "exact": where the save stood; "elastic": the epoch's rest, dealt anew
            ...
        ```
    """
    states = list(states) if isinstance(states, (list, tuple)) else [states]
    per_rank = [consumer_states(s) for s in states]
    mine = _own_states(dataset, states, per_rank)
    first = per_rank[0][0]
    saved_workers = first["num_workers"] if "_snapshot" in states[0] else 0
    same_layout = first["world_size"] == dataset.world_size and len(mine) == 1
    if same_layout and _restores_exactly(loader, saved_workers):
        loader.load_state_dict(mine[0])  # this rank's own state (the others may be absent)
        return "exact"
    if same_layout and saved_workers == 0 and getattr(loader, "num_workers", 0) == 0:
        # a plain DataLoader reading in this process
        dataset.load_state_dict(consumer_states(mine[0])[0])
        return "exact"
    dataset.load_state_dict(merge(states))
    return "elastic"


# the names the old README taught before the public API (``shardkit.training.state.gather``/``.restore``)
gather = gather_loader_state
restore = restore_loader_state


def _own_states(dataset, states: list, per_rank: list[list[dict]]) -> list:
    """The saved states of this rank (each consumer state checked against ``dataset`` first)."""
    for c in (c for cs in per_rank for c in cs):
        dataset.check_state(c)
    return [s for s, cs in zip(states, per_rank) if cs and cs[0]["rank"] == dataset.rank]


def _restores_exactly(loader, saved_workers: int) -> bool:
    """Whether ``loader`` takes a saved loader state as it is: it has ``load_state_dict`` (StatefulDataLoader)
    and the workers of the save."""
    return hasattr(loader, "load_state_dict") and saved_workers == getattr(loader, "num_workers", 0)
