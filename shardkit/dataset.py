"""A torch ``IterableDataset`` over shards, split across ranks and loader workers as WeNet splits them.

Each epoch every rank shuffles the shard list with the same seed, and position i of the shuffled
list goes to consumer ``i mod (world_size * num_workers)`` with consumer id
``worker * world_size + rank`` (the rule lives in :mod:`shardkit.partition`). Each consumer reads
its shards with :func:`shardkit.reader.iter_samples` and yields
``{key, shard, txt, audio, sample_rate}``; ``audio`` is a tensor of shape (frames, channels).

The dataset holds only plain values (paths, integers, names), so it pickles cleanly for the
spawn and forkserver start methods. torch is imported only when a dataset is made.
"""

from __future__ import annotations

import os
from typing import Callable

from .errors import ShardkitError, UsageError
from .partition import lines_for
from .reader import check_decode_settings, iter_samples, reuse_freed_memory

try:
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # the dataset needs torch; the rest of shardkit does not
    _Base = object


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments, else torch.distributed when initialised, else the
    RANK / WORLD_SIZE environment variables (torchrun sets them), else (0, 1)."""
    if rank is None or world_size is None:
        dist_rank = dist_world = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist_rank, dist_world = dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
        if dist_world is None:
            dist_rank, dist_world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = dist_rank if rank is None else rank
        world_size = dist_world if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size


class ShardDataset(_Base):
    """Samples of WeNet-style shards for a torch ``DataLoader``, split by rank and worker.

    ``shards``: a data.list path, a shard or folder path, or a list of shard paths.
    ``rank``/``world_size``: default from torch.distributed or the environment (see
    :func:`resolve_world`), fixed when the dataset is made, so workers need no process group.
    ``shuffle``/``seed``: the list order of an epoch is ``shardkit.partition.shuffled_order(n,
    seed, epoch)``, identical on every rank. ``set_epoch(e)`` before iterating, as in WeNet. With
    ``persistent_workers=True`` the workers keep the copy they started with, so each further
    iteration of a worker's copy counts as the next epoch (same result as calling set_epoch with
    consecutive epochs). ``dtype``, ``decoder``, ``on_error``: as for ``iter_samples``
    (``on_error`` must be picklable, e.g. ``shardkit.reader.warn_and_skip``). ``as_tensor``:
    audio as a torch tensor (default) or the numpy array.
    """

    def __init__(self, shards, *, rank: int | None = None, world_size: int | None = None, shuffle: bool = True,
                 seed: int = 0, epoch: int = 0, dtype: str = "float32", decoder: str = "shardkit",
                 on_error: Callable[[ShardkitError], None] | None = None, as_tensor: bool = True,
                 threads: int = 1):
        try:
            import torch  # noqa: F401
        except ImportError as err:
            raise UsageError("ShardDataset needs torch: pip install 'shardkit[torch]'") from err
        from .inputs import expand_shards

        check_decode_settings(decoder, dtype)
        paths = [shards] if isinstance(shards, (str, os.PathLike)) else list(shards)
        self.shards = expand_shards([os.fspath(p) for p in paths])
        self.rank, self.world_size = resolve_world(rank, world_size)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = epoch
        self.dtype = dtype
        self.decoder = decoder
        self.on_error = on_error
        self.as_tensor = as_tensor
        self.threads = threads
        self._iterations = 0  # since the last set_epoch, in this process's copy

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._iterations = 0

    def shards_for(self, worker: int, num_workers: int, epoch: int | None = None) -> list[str]:
        """The shards one worker of this rank reads in an epoch, in reading order (pure)."""
        epoch = self.epoch if epoch is None else epoch
        lines = lines_for(self.rank, worker, len(self.shards), self.world_size, num_workers,
                          (self.seed, epoch) if self.shuffle else None)
        return [self.shards[i] for i in lines]

    def __iter__(self):
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None:
            reuse_freed_memory()  # this process is a loader worker: its allocator is ours to tune
        epoch = self.epoch + self._iterations
        self._iterations += 1
        to_tensor = torch.from_numpy if self.as_tensor else None
        for sample in iter_samples(self.shards_for(worker, num_workers, epoch), dtype=self.dtype,
                                   decoder=self.decoder, on_error=self.on_error, threads=self.threads):
            if to_tensor is not None:
                sample["audio"] = to_tensor(sample["audio"])
            yield sample


def collate_padded(samples: list[dict]) -> dict:
    """``collate_fn`` for batches: audio zero-padded into one (batch, frames, channels) tensor.

    One tensor per batch crosses from a worker to the trainer instead of one per utterance
    (each crossing costs a shared-memory segment); ``lengths`` holds the true frame counts.
    """
    import torch

    audio = [torch.as_tensor(s["audio"]) for s in samples]
    frames = max(a.shape[0] for a in audio)
    batch = audio[0].new_zeros((len(audio), frames, audio[0].shape[1]))
    for i, a in enumerate(audio):
        batch[i, :a.shape[0]] = a
    return {"key": [s["key"] for s in samples], "txt": [s["txt"] for s in samples], "audio": batch,
            "lengths": torch.tensor([a.shape[0] for a in audio]),
            "sample_rate": [s["sample_rate"] for s in samples]}

