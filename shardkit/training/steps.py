"""``equal_steps(loader)``: every rank of the default process group takes the same number of batches per epoch.

Balanced shards give every rank the same seconds and utterances, but not always the same number of
*batches*: with dynamic batches (``max_frames_in_batch``) or buckets, a rank's step count depends on
its workers' sort buffers and longest utterances, and a rank that runs out one step early leaves the
others waiting in the gradient all-reduce until the process group times out. This wrapper ends the
epoch on every rank at the step where the first rank runs dry, and reports what that left out.

How it stays cheap and never hangs:

- **One tiny collective per step**: before yielding a batch, each rank fetches it and all-reduces
  one int32 flag with MIN (1: I have a batch, 0: I am done, -1: my loader raised). All ranks yield
  the batch only if every rank has one; otherwise all stop together at the same step. With
  ``overlap=True`` the next batch's flag is already in flight while the trainer works on this one.
  The flag lives on ``cuda.current_device()`` under NCCL and on the CPU under gloo/MPI (``device=``
  overrides).
  Under NCCL, reading the flag waits for the GPU work queued before it; a trainer that keeps the CPU
  ahead of the GPU passes ``group=torch.distributed.new_group(backend="gloo")`` (made on every rank)
  so the flag goes through gloo on the CPU, as WeNet's own join group does.
- **Slow starts**: DataLoader workers may take minutes to produce a rank's first batch (spawn,
  imports, remote shards), longer than a short process-group timeout. So before the first collective
  of an epoch each rank posts a key to the process group's store and waits for every rank's key with
  ``first_batch_timeout`` (default 30 minutes), its own generous limit, not the group's.
- **The tail is counted, exactly**: after the stop each rank drains its loader (``drain=True``,
  the default), counting the batches and audio seconds it leaves out. Draining reads the rest of the
  rank's data: on balanced shards that is the uneven tail (a batch or two), on unbalanced ones it can
  be much more, which is what the report is for. ``drain=False`` skips it (the report then counts only
  the batch in hand and says so). Then every rank posts a key to the store and waits (again with
  ``first_batch_timeout``) until all have counted their tail, so no rank moves on to another collective
  while one is still draining, and one ``all_gather`` hands every rank the figures (no rank can leave
  the epoch, or the program, before all are past the store). Rank 0 logs one line; every rank keeps
  the figures in :attr:`EqualSteps.last_epoch_report`.
- **A loader that raises** sends -1: the other ranks stop with a ShardkitError instead of waiting
  in the next collective, and the failing rank re-raises its own exception.
- **No process group** (or a world of one): a plain pass-through that counts its steps.

Audio seconds come from the batch (:func:`batch_seconds`: WeNet's ``pcm_length`` at ``sample_rate``,
or shardkit's ``collate_padded``/``collate_packed`` ``lengths`` and ``sample_rate``) or from the
``seconds=`` callable. torch is imported only when a wrapper iterates, so this module imports
anywhere shardkit does.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: torch is imported when a wrapper iterates
    import torch

from shardkit.errors import ShardkitError

log = logging.getLogger(__name__)

FIRST_BATCH_TIMEOUT_S = 1800.0
"""Default wait, in seconds, for every rank's first batch of an epoch (and for every rank's end-of-epoch
report): generous on purpose, since it only ever waits for ranks that are still starting or draining."""

HAVE, DONE, FAILED = 1, 0, -1

# One number per iteration of any wrapper in this process. Ranks run the same program, so the n-th
# iteration on one rank meets the n-th on the others; its store keys are unique without a name.
_iterations = itertools.count()


def batch_seconds(batch: Any, sample_rate: int = 16000) -> float | None:
    """Audio seconds in a batch, or None when the batch does not say.

    WeNet's batches: ``pcm_length`` (samples per utterance, after resampling to ``sample_rate``).
    shardkit's ``collate_padded``/``collate_packed`` batches: ``lengths`` and per-utterance
    ``sample_rate``. A single ShardDataset sample: ``audio`` frames and ``sample_rate``.
    """
    if not isinstance(batch, dict):
        return None
    if "pcm_length" in batch:
        return _total(batch["pcm_length"]) / sample_rate
    rate = batch.get("sample_rate")
    if rate is None:
        return None
    rate = rate[0] if isinstance(rate, (list, tuple)) else rate
    if "lengths" in batch:
        return _total(batch["lengths"]) / float(rate)
    if "audio" in batch:
        return int(batch["audio"].shape[0]) / float(rate)
    return None


def _total(values) -> float:
    return float(values.sum()) if hasattr(values, "sum") else float(sum(values))


class EqualSteps:
    """Wraps ``loader`` (any iterable of batches) so that every rank yields the same number per epoch.

    Every rank ends the epoch at the step where the first rank runs dry (one int32 all-reduce per
    step; see the module docstring), so no rank waits in a gradient all-reduce for a batch another
    rank never gets. Without a process group (or in a world of one) it passes batches through and
    counts them. Other attributes are the wrapped loader's (``wrapped.dataset``, ...).

    After each epoch :attr:`last_epoch_report` holds ``{"epoch", "steps", "world_size", "rank",
    "drained", "left_out_batches", "left_out_seconds", "seconds", "left_out_share", "drain_seconds"}``
    on every rank (rank 0 also logs it); the four lists have one entry per rank. ``seconds`` are the
    seconds each rank trained on; ``left_out_share`` the left-out share of all seconds (None where
    seconds are unknown); ``drain_seconds`` how long each rank spent counting its tail after the stop.

    Args:
        loader: any iterable of batches (a DataLoader, WeNet's loader, a list).
        seconds: ``batch -> seconds`` for the report (default :func:`batch_seconds`; return None when
            unknown).
        sample_rate: the rate of WeNet's ``pcm_length``.
        first_batch_timeout: seconds to wait for every rank's first batch of an epoch and for every
            rank's end-of-epoch report (default 30 minutes: loader workers can be slow to start).
        drain: count the left-out tail exactly by reading it (False: only the batch in hand).
        group: a process group of every rank for the flag and the report (default: the default
            group); e.g. a gloo group so that the flag never waits for queued GPU work.
        device: where the flag lives (default: the group's backend's device).
        overlap: fetch batch k+1 and start its flag's all-reduce before yielding batch k, so the
            collective runs while the trainer works; the loader is then one batch ahead (a stateful
            loader's ``state_dict()`` counts that batch, so resuming from it skips one).

    Yields:
        batch (Any): (when iterated) the wrapped loader's batches, the same number on every rank.

    Raises:
        ValueError: ``first_batch_timeout`` is not positive.
        ShardkitError: (while iterating) another rank's loader failed; the failing rank re-raises its
            own exception. A rank that does not reach the first-batch or report wait in time raises
            a ShardkitError naming the ranks that are missing.

    Example:
        ```python
        train = shardkit.EqualSteps(loader, group=torch.distributed.new_group(backend="gloo"))
        for batch in train:
            ...
        print(train.last_epoch_report["left_out_batches"])
        ```
    """

    def __init__(self, loader: Iterable, *, seconds: Callable[[Any], float | None] | None = None,
                 sample_rate: int = 16000, first_batch_timeout: float = FIRST_BATCH_TIMEOUT_S, drain: bool = True,
                 group: torch.distributed.ProcessGroup | None = None, device: torch.device | str | None = None,
                 overlap: bool = False):
        if first_batch_timeout <= 0:
            raise ValueError(f"first_batch_timeout must be > 0 seconds (got {first_batch_timeout})")
        self.loader = loader
        self.seconds = seconds or functools.partial(batch_seconds, sample_rate=sample_rate)
        self.first_batch_timeout = first_batch_timeout
        self.drain = drain
        self.group = group
        self.overlap = overlap
        self.device = device
        self.last_epoch_report: dict | None = None
        self._epoch = 0  # epochs started by this wrapper
        self._steps = 0  # steps taken in the current epoch
        self._resumed_steps = 0

    def __getattr__(self, name: str):
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self) -> int:
        """The wrapped loader's length on this rank (TypeError when it has none): an upper bound on
        the steps, exact when every rank's loader has the same length (e.g. a DistributedSampler)."""
        return len(self.loader)

    def state_dict(self) -> dict:
        """The epoch and steps taken in it, plus the wrapped loader's ``state_dict()`` when it has one."""
        state = {"epoch": self._epoch, "steps": self._steps}
        if hasattr(self.loader, "state_dict"):
            state["loader"] = self.loader.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`: the loader's own state (where it has ``load_state_dict``) resumes
        its data; the steps already taken count toward the next epoch's report."""
        if "loader" in state and hasattr(self.loader, "load_state_dict"):
            self.loader.load_state_dict(state["loader"])
        self._epoch = int(state.get("epoch", self._epoch))
        self._resumed_steps = int(state.get("steps", 0))

    def __iter__(self) -> Iterator:
        world = _World.current(self.group, self.device)
        epoch, self._steps, self._resumed_steps = self._epoch, self._resumed_steps, 0
        self._epoch += 1
        if world is None:
            yield from self._pass_through(epoch)
        else:
            yield from self._equal(epoch, world)

    def _pass_through(self, epoch: int) -> Iterator:
        total = 0.0
        for batch in self.loader:
            self._steps += 1
            total = _add(total, self.seconds(batch))
            yield batch
        self.last_epoch_report = _report(epoch, self._steps, 0, [0], [0.0], [total], True)

    def _equal(self, epoch: int, world: _World) -> Iterator:
        """Plan: fetch, agree, yield; then count the tail and report (see the module docstring)."""
        iteration = next(_iterations)
        it = iter(self.loader)
        batch, state, error = _fetch(it)
        ready = world.wait_for_all(iteration, "ready", self.first_batch_timeout)
        pending, total = world.agree(state), 0.0
        while True:
            agreed = pending()
            if ready:  # every rank is past the wait: its key can go
                world.forget(ready)
                ready = None
            if agreed != HAVE:
                break
            current = batch
            if self.overlap:  # the next step's flag is in flight while the trainer works on `current`
                batch, state, error = _fetch(it)
                pending = world.agree(state)
            self._steps += 1
            total = _add(total, self.seconds(current))
            yield current
            if not self.overlap:
                batch, state, error = _fetch(it)
                pending = world.agree(state)
        if state == FAILED:
            raise error
        if agreed == FAILED:
            raise ShardkitError(f"equal_steps: another rank's loader failed at step {self._steps + 1} of epoch "
                                f"{epoch}; this rank stopped with it (the failing rank's log names the cause)")
        tail = self._count_tail(it, batch if state == HAVE else None)
        self.last_epoch_report = world.report(iteration, epoch, self._steps, tail, total, self.drain,
                                              self.first_batch_timeout)

    def _count_tail(self, it: Iterator, in_hand) -> tuple[int, float | None, float]:
        """(batches, seconds, wall seconds) this rank leaves out: the batch in hand and, when draining,
        every batch its loader still holds."""
        started = time.perf_counter()
        batches, seconds = 0, 0.0
        rest = itertools.chain([] if in_hand is None else [in_hand], it if self.drain else [])
        for batch in rest:
            batches += 1
            seconds = _add(seconds, self.seconds(batch))
        return batches, seconds, time.perf_counter() - started


def equal_steps(loader: Iterable, **options: Any) -> EqualSteps:
    """The same number of batches on every rank of the process group, each epoch.

    The uneven tail (the batches some ranks hold after the first rank runs dry) is left out,
    counted and reported on rank 0, instead of leaving the other ranks waiting in the gradient
    all-reduce until the process group times out.

    Args:
        loader: any iterable of batches.
        **options: :class:`EqualSteps`'s keyword arguments (``seconds``, ``sample_rate``,
            ``first_batch_timeout``, ``drain``, ``group``, ``device``, ``overlap``).

    Returns:
        An :class:`EqualSteps` wrapping ``loader``; iterate it once per epoch.

    Raises:
        ValueError: a bad option value (``first_batch_timeout`` <= 0).
        TypeError: an unknown option.

    Example:
        ```python
        train = shardkit.equal_steps(loader)  # once: it counts the epochs
        for epoch in range(epochs):
            dataset.set_epoch(epoch)
            for batch in train:
                loss = model(batch)
                loss.backward()
                optimizer.step()
        ```
    """
    return EqualSteps(loader, **options)


def _add(total: float | None, seconds: float | None) -> float | None:
    return None if total is None or seconds is None else total + seconds


def _fetch(it: Iterator) -> tuple[Any, int, BaseException | None]:
    """(batch, state, error): the next batch and HAVE, or (None, DONE | FAILED, the exception)."""
    try:
        return next(it), HAVE, None
    except StopIteration:
        return None, DONE, None
    except Exception as err:  # told to the other ranks first, then re-raised on this one
        return None, FAILED, err


def _report(epoch: int, steps: int, rank: int, batches: list, seconds: list, trained: list, drained: bool,
            drain_seconds: list | None = None) -> dict:
    known = [s for s in seconds + trained if s is not None]
    share = None
    if len(known) == len(seconds) + len(trained) and sum(known) > 0:
        share = sum(seconds) / sum(known)
    return {"epoch": epoch, "steps": steps, "world_size": len(batches), "rank": rank, "drained": drained,
            "left_out_batches": batches, "left_out_seconds": seconds, "seconds": trained, "left_out_share": share,
            "drain_seconds": drain_seconds or [0.0] * len(batches)}


class _World:
    """The default process group as equal_steps uses it: one flag tensor and the group's store."""

    def __init__(self, dist, torch, group, device):
        self.dist, self.group = dist, group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.store = dist.distributed_c10d._get_default_store()
        self.torch, self.device = torch, device
        self.prefix = f"shardkit/equal_steps/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"

    @classmethod
    def current(cls, group, device) -> _World | None:
        """The initialised default group of more than one rank, else None (pass-through)."""
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            return None
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) < 2:
            return None
        device = torch.device(device) if device is not None else _flag_device(torch, dist, group)
        return cls(dist, torch, group, device)

    def key(self, iteration: int, what: str, rank: int) -> str:
        return f"{self.prefix}/{iteration}/{what}/{rank}"

    def agree(self, state: int) -> Callable[[], int]:
        """Start the all-reduce (MIN) of every rank's state; calling the result waits for it and gives
        HAVE only if every rank has a batch. Each call has its own flag tensor, so the next step's
        all-reduce can be in flight while the trainer works on (and all-reduces for) this one."""
        flag = self.torch.full((1,), state, dtype=self.torch.int32, device=self.device)
        work = self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN, group=self.group, async_op=True)

        def result() -> int:
            work.wait()
            return int(flag.item())

        return result

    def wait_for_all(self, iteration: int, what: str, timeout: float) -> str:
        """Post this rank's key and wait, up to ``timeout`` seconds, until every rank has posted its own.
        Returns the key, to delete once a collective shows every rank is past this wait."""
        mine = self.key(iteration, what, self.rank)
        self.store.set(mine, "1")
        keys = [self.key(iteration, what, r) for r in range(self.size)]
        try:
            self.store.wait(keys, timedelta(seconds=timeout))
        except Exception as err:  # the store's timeout error type differs across torch versions
            stage = "its first batch" if what == "ready" else "the end of the epoch"
            raise ShardkitError(f"equal_steps: rank(s) {self._missing(keys)} did not reach {stage} within "
                                f"{timeout:g} s (first_batch_timeout): {err}") from err
        return mine

    def _missing(self, keys: list[str]) -> list[int] | str:
        try:
            return [r for r, k in enumerate(keys) if not self.store.check([k])]
        except Exception:  # the store itself is gone (rank 0 ended): say so rather than fail again
            return "unknown (the store is unreachable)"

    def forget(self, key: str) -> None:
        """Delete a key every rank is past; a store without deletion keeps a few bytes per epoch."""
        try:
            self.store.delete_key(key)
        except Exception:  # old FileStore, HashStore: nothing to free that matters
            log.debug("equal_steps: could not delete store key %s", key)

    def report(self, iteration: int, epoch: int, steps: int, tail: tuple, trained: float | None, drained: bool,
               timeout: float) -> dict:
        """Wait (store, ``timeout``) until every rank has counted its tail, then one all_gather of every
        rank's figures: no rank leaves the epoch before all have, and the group's own timeout never
        meets a rank still draining. Rank 0 logs the report."""
        import torch

        batches, seconds, took = tail
        key = self.wait_for_all(iteration, "done", timeout)
        mine = torch.tensor([batches, _nan(seconds), _nan(trained), took], dtype=torch.float64,
                            device=self.device)
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        self.dist.all_gather(everyone, mine, group=self.group)
        self.forget(key)
        left, left_s, done_s, took_s = zip(*(t.tolist() for t in everyone))
        report = _report(epoch, steps, self.rank, [int(b) for b in left], _none(left_s), _none(done_s), drained,
                         list(took_s))
        if self.rank == 0:
            log.info("%s", describe(report))
        return report


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _none(values) -> list:
    return [None if math.isnan(v) else v for v in values]


def describe(report: dict) -> str:
    """One line for the log: steps, what each rank left out, and its share of the epoch's audio."""
    seconds = report["left_out_seconds"]
    secs = "unknown s" if None in seconds else "[" + ", ".join(f"{s:.1f}" for s in seconds) + "] s"
    line = (f"equal_steps: epoch {report['epoch']}: {report['steps']} steps on each of {report['world_size']} ranks; "
            f"left out {report['left_out_batches']} batches, {secs}")
    if report["left_out_share"] is not None:
        total = sum(seconds) + sum(report["seconds"])
        line += f" ({100 * report['left_out_share']:.2f}% of {total:,.1f} s)"
    if not report["drained"]:
        line += "; not drained: counts only the batch in hand"
    else:
        line += f"; counting the tail took up to {max(report['drain_seconds']):.2f} s"
    return line


def _flag_device(torch, dist, group):
    """The device a collective of the default group takes: CUDA under NCCL, the CPU under gloo or MPI
    (including gloo+nccl groups, whose CPU tensors go through gloo), else the current accelerator."""
    backend = str(dist.get_backend(group)).lower()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" in backend or "mpi" in backend or not hasattr(torch, "accelerator"):
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())
