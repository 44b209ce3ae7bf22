"""A torch ``IterableDataset`` over shards, split across ranks and loader workers as WeNet splits them.

Each epoch every rank shuffles the shard list with the same seed, and position i of the shuffled
list goes to consumer ``i mod (world_size * num_workers)`` with consumer id
``worker * world_size + rank`` (the rule lives in :mod:`shardkit.planning.partition`). Each consumer reads
its shards with :func:`shardkit.training.reader.iter_samples` and yields
``{key, shard, txt, audio, sample_rate}``; ``audio`` is a tensor of shape (frames, channels).

The dataset holds only plain values (paths, integers, names), so it pickles cleanly for the
spawn and forkserver start methods. torch is imported only when a dataset is made.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.planning.partition import lines_for
from shardkit.training.pcm import DEFAULT_POOL
from shardkit.training.reader import ReadPosition, check_decode_settings, iter_samples, reuse_freed_memory
# a re-export for the old public path shardkit.dataset.equal_steps (shardkit.dataset is this module)
from shardkit.training.steps import equal_steps  # noqa: F401

if TYPE_CHECKING:  # annotations only: torch stays optional
    import torch

try:
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # the dataset needs torch; the rest of shardkit does not
    _Base = object


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments, else torch.distributed when initialised, else the
    RANK / WORLD_SIZE environment variables (torchrun sets them), else (0, 1)."""
    if rank is None or world_size is None:
        dist_rank, dist_world = _ambient_world()
        rank = dist_rank if rank is None else rank
        world_size = dist_world if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside world_size {world_size}")
    return rank, world_size


def _ambient_world() -> tuple[int, int]:
    """``(rank, world_size)`` of torch.distributed when initialised, else of RANK / WORLD_SIZE, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class ShardDataset(_Base):
    """Samples of WeNet-style shards for a torch ``DataLoader``, split by rank and worker as WeNet splits them.

    Each epoch every rank shuffles the shard list with the same seed and each (rank, worker)
    reads its own shards with :func:`~shardkit.training.reader.iter_samples`. ``set_epoch(e)``
    before iterating, as in WeNet. With ``persistent_workers=True`` the workers keep the copy they
    started with, so each further iteration of a worker's copy counts as the next epoch (the same
    as calling ``set_epoch`` with consecutive epochs). The dataset holds plain values only, so it
    pickles for the spawn and forkserver start methods.

    Stateful (torchdata's protocol): ``state_dict()`` names the epoch, seed and, for the (rank,
    worker) reading this copy, the shard and tar-stream offset reached; ``load_state_dict()`` resumes
    there without re-reading or decoding what was read (see :mod:`shardkit.training.state`: exact
    through ``StatefulDataLoader``, elastic through :func:`shardkit.training.state.restore_loader_state`).

    Args:
        shards: a data.list path, a shard or folder path, or a list of shard paths.
        rank: this process's rank; with ``world_size``, default from torch.distributed or the
            RANK / WORLD_SIZE environment (see :func:`resolve_world`). Fixed when the dataset is made,
            so workers need no process group.
        world_size: the number of ranks.
        shuffle: shuffle the list each epoch (``shardkit.planning.partition.shuffled_order(n, seed,
            epoch)``, identical on every rank).
        seed: the shuffle's seed.
        epoch: the first epoch (``set_epoch`` changes it).
        dtype: as for ``iter_samples``; "int16" with :func:`collate_padded` ships half the bytes of
            float32 out of the workers, and :func:`audio_float` scales on the trainer's device to the
            same float32 values.
        decoder: as for ``iter_samples``.
        on_error: as for ``iter_samples``; must be picklable (e.g.
            :func:`~shardkit.training.reader.warn_and_skip`).
        as_tensor: audio as a torch tensor (default) or the numpy array.
        threads: decompression threads per reader.
        sample_rate: resample other rates to it (soxr, high quality).
        channels: 1 downmixes other channel counts to mono (the mean). Without ``sample_rate`` and
            ``channels``, a batch mixing formats is a ShardkitError naming the odd utterance.
        allow_pipes: run the commands of ``pipe:CMD`` lines (as ``iter_samples``).

    Yields:
        sample (dict): (when iterated) ``{key, shard, txt, audio, sample_rate}`` per utterance of this
            (rank, worker)'s shards; ``audio`` has shape (frames, channels).

    Raises:
        UsageError: torch is not installed, a bad ``decoder``/``dtype``/``sample_rate``/``channels``,
            a rank outside the world, or a list that names no shard.
        StateMismatchError: ``load_state_dict`` with a state of another list, seed or shard set.
        ShardkitError: while iterating, as ``iter_samples`` (unless ``on_error`` takes it).

    Example:
        ```python
        import shardkit
        from torch.utils.data import DataLoader

        dataset = shardkit.ShardDataset("data/train/data.list", seed=0, dtype="int16")
        loader = DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=shardkit.collate_padded)
        for epoch in range(3):
            dataset.set_epoch(epoch)
            for batch in loader:
                audio = shardkit.audio_float(batch, device="cuda")  # (batch, frames, channels)
        ```
    """

    def __init__(self, shards: str | os.PathLike | Iterable[str], *, rank: int | None = None,
                 world_size: int | None = None, shuffle: bool = True,
                 seed: int = 0, epoch: int = 0, dtype: str = "float32", decoder: str = "shardkit",
                 on_error: Callable[[ShardkitError], None] | None = None, as_tensor: bool = True,
                 threads: int = 1, sample_rate: int | None = None, channels: int | None = None,
                 allow_pipes: bool | None = None):
        try:
            import torch  # noqa: F401
        except ImportError as err:
            raise UsageError("ShardDataset needs torch: pip install 'shardkit[torch]'") from err
        from shardkit.io.inputs import expand_shards

        check_decode_settings(decoder, dtype)
        if sample_rate is not None and sample_rate < 1:
            raise UsageError(f"sample_rate must be a positive number of Hz, not {sample_rate}")
        if channels not in (None, 1):
            raise UsageError(f"channels={channels!r}: only downmixing to mono (channels=1) is supported")
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
        self.sample_rate = sample_rate
        self.channels = channels
        self.allow_pipes = allow_pipes  # run pipe:CMD lines (as iter_samples; SHARDKIT_ALLOW_PIPES=1 too)
        self._iterations = 0  # since the last set_epoch, in this process's copy
        from shardkit.training.state import shard_set_digest

        # once, here: workers save their state after every batch, so it must cost nothing then
        self._digest, self._sizes = shard_set_digest(self.shards)
        self._resume: dict | None = None  # a loaded state, waiting for the iteration it resumes
        self._reading: dict | None = None  # the state of the iteration under way in this copy

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch``'s order on the next iteration (every rank must pass the same epoch). A loaded
        state of another epoch is dropped: it resumes its own epoch only."""
        self.epoch = epoch
        self._iterations = 0
        if self._resume is not None and self._resume["epoch"] != epoch:
            self._resume = None  # a loaded state resumes its own epoch only

    def shards_for(self, worker: int, num_workers: int, epoch: int | None = None) -> list[str]:
        """The shards one worker of this rank reads in an epoch, in reading order (pure)."""
        epoch = self.epoch if epoch is None else epoch
        lines = lines_for(self.rank, worker, len(self.shards), self.world_size, num_workers,
                          (self.seed, epoch) if self.shuffle else None)
        return [self.shards[i] for i in lines]

    # --- resume state (torchdata's Stateful protocol; the format is in shardkit.training.state)

    def state_dict(self) -> dict:
        """Where this copy's reading stands: epoch, seed, topology, shard and offset (plain values)."""
        if self._resume is not None:  # loaded, not yet iterated: saving again keeps it
            return dict(self._resume)
        if self._reading is None:  # never iterated: the start of the epoch, as worker 0 of 1
            self._reading = self._fresh_reading(0, 1, self.epoch)
        return dict(self._reading)

    def load_state_dict(self, state: dict) -> None:
        """Resume from a ``state_dict()`` (one consumer's, exact) or a ``shardkit.training.state.merge``
        of a whole run's (elastic); refuses, with StateMismatchError, a state of another list, seed
        or shard set. The next iteration resumes the state's epoch."""
        self.check_state(state)
        self._resume = dict(state)
        self.epoch = state["epoch"]
        self._iterations = 0

    def check_state(self, state: dict) -> None:
        """Raise StateMismatchError, saying what differs, unless ``state`` was saved for this shard
        list (paths, sizes, mtimes), seed and shuffle."""
        from shardkit.training.state import check

        check(state, digest=self._digest, shards=len(self.shards), seed=self.seed, shuffle=self.shuffle)

    def _fresh_reading(self, worker: int, num_workers: int, epoch: int) -> dict:
        from shardkit.training.state import FORMAT

        return {"format": FORMAT, "digest": self._digest, "shards": len(self.shards), "seed": self.seed,
                "shuffle": self.shuffle, "epoch": epoch, "world_size": self.world_size,
                "num_workers": num_workers, "rank": self.rank, "worker": worker, "pieces": None, "index": 0,
                "shard": None, "offset": 0}

    def _start_reading(self, worker: int, num_workers: int, epoch: int) -> dict:
        """The state this iteration starts from: a loaded one for this epoch, else the epoch's start."""
        resume, self._resume = self._resume, None
        reading = self._fresh_reading(worker, num_workers, epoch)
        if resume is None or resume["epoch"] != epoch:
            return reading
        from shardkit.training.state import EPOCH_FORMAT, StateMismatchError, piece_weights

        if resume["format"] == EPOCH_FORMAT:  # elastic: deal the rest of the epoch to this topology
            from shardkit.planning.resume import deal_remaining

            pieces = resume["pieces"]
            deal = deal_remaining(piece_weights(pieces, self._sizes, self.shards), self.world_size, num_workers)
            mine = [list(pieces[i]) for i in deal[worker * self.world_size + self.rank]]
            return {**reading, "pieces": mine, "offset": mine[0][1] if mine else 0}
        topology = (resume["rank"], resume["world_size"], resume["worker"], resume["num_workers"])
        if topology != (self.rank, self.world_size, worker, num_workers):
            raise StateMismatchError(
                f"the state is rank {topology[0]} of {topology[1]}, worker {topology[2]} of {topology[3]}; this "
                f"reader is rank {self.rank} of {self.world_size}, worker {worker} of {num_workers}: restore every "
                "rank's states with shardkit.restore_loader_state to change world size or workers")
        return {**reading, "pieces": resume["pieces"], "index": resume["index"], "shard": resume.get("shard"),
                "offset": resume["offset"]}

    def _reading_list(self, reading: dict) -> list[tuple[str, int]]:
        """``(shard path, start offset)`` per shard this iteration reads, from the state's index on."""
        if reading["pieces"] is None:
            lines = lines_for(self.rank, reading["worker"], len(self.shards), self.world_size,
                              reading["num_workers"], (self.seed, reading["epoch"]) if self.shuffle else None)
            todo = [(self.shards[line], 0) for line in lines]
        else:
            todo = [(self.shards[line], start) for line, start in reading["pieces"]]
        return todo

    def _read(self, reading: dict):
        """Samples from the state's position on, keeping ``reading`` (index, offset) up to date."""
        todo = self._reading_list(reading)
        position = ReadPosition()
        kwargs = {"dtype": self.dtype, "decoder": self.decoder, "on_error": self.on_error, "threads": self.threads,
                  "allow_pipes": getattr(self, "allow_pipes", None)}

        def at_next_shard(i: int) -> None:
            reading["index"] = i + 1
            reading["shard"], reading["offset"] = todo[i + 1] if i + 1 < len(todo) else (None, 0)

        for i in range(reading["index"], len(todo)):
            path, start = todo[i]
            if i == reading["index"]:
                start = reading["offset"]
            reading["shard"] = path
            for sample in iter_samples([path], start=start, position=position, **kwargs):
                if position.finished:  # the shard's last utterance: a resume starts at the next one
                    at_next_shard(i)
                else:
                    reading["index"], reading["offset"] = i, position.utt_end
                yield sample
            at_next_shard(i)

    def __iter__(self):
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None:
            reuse_freed_memory()  # this process is a loader worker: its allocator is ours to tune
        epoch = self.epoch + self._iterations
        self._iterations += 1
        # Set here, not when the first sample is asked for: a loader takes a worker's state as soon
        # as it makes the iterator, and that state must already name this epoch.
        self._reading = self._start_reading(worker, num_workers, epoch)
        return self._samples(self._reading, torch.from_numpy if self.as_tensor else None)

    def _samples(self, reading: dict, to_tensor):
        rate, channels = self.sample_rate, self.channels
        for sample in self._read(reading):
            if channels is not None and sample["audio"].shape[1] != channels:
                sample["audio"] = downmix(sample["audio"])
            if rate is not None and sample["sample_rate"] != rate:
                sample["audio"] = resample(sample["audio"], sample["sample_rate"], rate)
                sample["sample_rate"] = rate
            if to_tensor is not None:
                sample["audio"] = to_tensor(sample["audio"])
            yield sample


def downmix(audio: np.ndarray) -> np.ndarray:
    """(frames, channels) -> (frames, 1): the mean of the channels, in the same dtype (int16 rounded)."""
    if audio.dtype == np.int16:
        return np.round(audio.mean(axis=1, dtype=np.float32)).astype(np.int16).reshape(-1, 1)
    return audio.mean(axis=1, dtype=audio.dtype).reshape(-1, 1)


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    """(frames, channels) at ``rate`` -> at ``target`` Hz with soxr (high quality), same dtype."""
    import soxr

    out = soxr.resample(audio, rate, target, quality="HQ")
    return out.reshape(len(out), audio.shape[1])


def _as_numpy(audio):
    return audio if isinstance(audio, np.ndarray) else audio.numpy()


def _check_format(samples: list[dict], audio: list[np.ndarray]) -> None:
    """Every utterance of a batch must share the first one's channels, rate and dtype: else a
    ShardkitError naming the odd utterance (its shard and key) and the ShardDataset option that fixes it."""
    for s, a in zip(samples, audio):
        if a.ndim != 2:
            raise ShardkitError(f"audio has shape {tuple(a.shape)}, expected (frames, channels)",
                                shard=s.get("shard"), member=s.get("key"))
    first, (channels, dtype) = samples[0], (audio[0].shape[1], audio[0].dtype)
    rate = first["sample_rate"]
    for s, a in zip(samples, audio):
        if a.shape[1] != channels or s["sample_rate"] != rate or a.dtype != dtype:
            fix = ("pass channels=1 to ShardDataset to downmix to mono" if a.shape[1] != channels else
                   f"pass sample_rate={rate} to ShardDataset to resample" if s["sample_rate"] != rate else
                   "decode every shard with one dtype")
            raise ShardkitError(f"utterance has {a.shape[1]} channel(s), {s['sample_rate']} Hz, {a.dtype}, but the "
                                f"batch's first ({first.get('key')!r}) has {channels}, {rate} Hz, {dtype}: a batch "
                                f"needs one format; {fix}", shard=s.get("shard"), member=s.get("key"))


def batch_tensors(specs: list[tuple[tuple[int, ...], str]]) -> list:
    """New uninitialised tensors ``[(shape, dtype name), ...]`` for one batch.

    In the main process, plain tensors (the large ones over :data:`shardkit.training.reader.DEFAULT_POOL`'s
    buffers, reused once the batch is gone). Inside a loader worker, views of one reused shared-memory
    segment that cross to the trainer as a few numbers (:mod:`shardkit.training.batchshm`); when none is
    free, tensors in torch's own shared memory (allocated there, as torch's default_collate
    does, so their bytes are written once).
    """
    import torch
    import torch.utils.data

    if torch.utils.data.get_worker_info() is None:  # large ones from the reader's pool: no fresh pages
        return [torch.from_numpy(DEFAULT_POOL.array(n, getattr(np, dtype)).reshape(shape))
                if (n := int(np.prod(shape))) >= 16384 else torch.empty(shape, dtype=getattr(torch, dtype))
                for shape, dtype in specs]
    from shardkit.training.batchshm import shared_tensors

    tensors = shared_tensors(specs)
    if tensors is not None:
        return tensors
    out = []
    for shape, dtype in specs:
        tdtype = getattr(torch, dtype)
        storage = torch.UntypedStorage._new_shared(int(np.prod(shape)) * tdtype.itemsize)
        out.append(torch.empty(0, dtype=tdtype).set_(storage, 0, shape))
    return out


def collate_padded(samples: list[dict]) -> dict:
    """``collate_fn`` for batches: audio zero-padded into one (batch, frames, channels) tensor.

    One tensor per batch crosses from a worker to the trainer instead of one per utterance (each
    crossing costs a shared-memory segment); inside a loader worker the batch is built straight in
    shared memory. The batch keeps the samples' dtype: with ``ShardDataset(dtype="int16")`` it is half
    the bytes of float32, and the trainer scales it on its device (:func:`audio_float`).

    Args:
        samples: ShardDataset samples (``key``, ``txt``, ``audio`` of shape (frames, channels),
            ``sample_rate``), sharing channels, sample rate and dtype.

    Returns:
        ``{"key": [...], "txt": [...], "audio": tensor (batch, frames, channels), "lengths":
            int64 tensor of true frame counts, "sample_rate": [...]}``.

    Raises:
        ShardkitError: utterances differ in channels, sample rate or dtype (naming the odd one's shard
            and key, and the ShardDataset option that fixes it: ``channels=1``, ``sample_rate=...``).

    Example:
        ```python
        loader = DataLoader(shardkit.ShardDataset("data.list"), batch_size=8, collate_fn=shardkit.collate_padded)
        batch = next(iter(loader))
        batch["audio"].shape, batch["lengths"]  # (8, longest, 1), frames of each
        ```
    """
    import torch

    audio = [_as_numpy(s["audio"]) for s in samples]
    _check_format(samples, audio)
    lengths = [a.shape[0] for a in audio]
    frames = max(lengths)
    batch, lengths_t = batch_tensors([((len(audio), frames, audio[0].shape[1]), audio[0].dtype.name),
                                      ((len(audio),), "int64")])
    out = batch.numpy()
    for i, (a, n) in enumerate(zip(audio, lengths)):
        out[i, :n] = a
        out[i, n:] = 0
    lengths_t.numpy()[:] = lengths
    return {"key": [s["key"] for s in samples], "txt": [s["txt"] for s in samples], "audio": batch,
            "lengths": lengths_t, "sample_rate": [s["sample_rate"] for s in samples]}


def collate_packed(samples: list[dict]) -> dict:
    """``collate_fn`` without padding, for models that pad on their device anyway.

    No padding bytes are written or sent; :func:`pad_packed` gives the padded tensor where the
    model wants it (on the GPU, padding costs the CPU nothing).

    Args:
        samples: ShardDataset samples sharing channels, sample rate and dtype.

    Returns:
        As :func:`collate_padded`, but ``audio`` is every utterance's frames one after the
            other, shape (total frames, channels), and ``offsets`` (int64 tensor) says where each starts.

    Raises:
        ShardkitError: utterances differ in channels, sample rate or dtype (naming the odd one).

    Example:
        ```python
        loader = DataLoader(dataset, batch_size=8, collate_fn=shardkit.collate_packed)
        for batch in loader:
            batch["audio"] = batch["audio"].to("cuda")
            padded = shardkit.pad_packed(batch)  # (8, longest, channels), on the GPU
        ```
    """
    import torch

    audio = [_as_numpy(s["audio"]) for s in samples]
    _check_format(samples, audio)
    lengths = [a.shape[0] for a in audio]
    batch, lengths_t, offsets_t = batch_tensors([((sum(lengths), audio[0].shape[1]), audio[0].dtype.name),
                                                 ((len(audio),), "int64"), ((len(audio),), "int64")])
    np.concatenate(audio, axis=0, out=batch.numpy())
    lengths_t.numpy()[:] = lengths
    offsets_t.numpy()[0] = 0
    np.cumsum(lengths[:-1], out=offsets_t.numpy()[1:])
    return {"key": [s["key"] for s in samples], "txt": [s["txt"] for s in samples], "audio": batch,
            "lengths": lengths_t, "offsets": offsets_t, "sample_rate": [s["sample_rate"] for s in samples]}


def pad_packed(batch: dict) -> torch.Tensor:
    """The (batch, frames, channels) zero-padded audio of a :func:`collate_packed` batch.

    Args:
        batch: a :func:`collate_packed` batch; pad on the device its ``audio`` is on (move ``audio``
            first: padding on the GPU costs the CPU nothing).

    Returns:
        A tensor (batch, longest frames, channels), zeros after each utterance's end, on ``audio``'s device.

    Raises:
        KeyError: ``batch`` has no ``audio`` or ``lengths`` (not a collate_packed batch).

    Example:
        ```python
        padded = shardkit.pad_packed(batch)  # batch["lengths"] still holds the true lengths
        ```
    """
    import torch

    audio = batch["audio"]
    return torch.nn.utils.rnn.pad_sequence(list(audio.split(batch["lengths"].tolist())), batch_first=True)


INT16_SCALE = 1 / 32768


def audio_float(batch: dict, device: str | torch.device | None = None, non_blocking: bool = True) -> torch.Tensor:
    """A batch's ``audio`` as float32 on ``device``, moved before it is widened.

    int16 batches are moved as int16 (half the bytes) and scaled there by 1/32768, giving exactly
    the float32 values a float32 dataset would yield; float batches are moved and cast.

    Args:
        batch: a :func:`collate_padded` or :func:`collate_packed` batch.
        device: where to move ``audio`` (None: leave it where it is).
        non_blocking: passed to ``Tensor.to`` (asynchronous from pinned memory).

    Returns:
        The float32 audio tensor on ``device``, same shape as ``batch["audio"]``.

    Raises:
        KeyError: ``batch`` has no ``audio``.

    Example:
        ```python
        dataset = shardkit.ShardDataset("data.list", dtype="int16")
        for batch in DataLoader(dataset, batch_size=8, collate_fn=shardkit.collate_padded, pin_memory=True):
            audio = shardkit.audio_float(batch, device="cuda")
        ```
    """
    import torch

    audio = batch["audio"]
    if device is not None:
        audio = audio.to(device, non_blocking=non_blocking)
    if audio.dtype == torch.int16:
        return audio.to(torch.float32).mul_(INT16_SCALE)
    return audio.to(torch.float32)
