"""WeNet's per-worker training data chain, for tests that must batch as the trainer batches.

WeNet itself is not installable here (no wheel on the package index this project uses), so this is
a copy written from ``docs/reference/wenet-format.md`` ("What the trainer does after reading"), stage for
stage, each a generator of plain dicts as in ``wenet/dataset/processor.py``:

list shuffle (whole list, same seed on every rank) -> split: line i of the shuffled list to consumer
i mod (world_size x num_workers), consumer = worker x world_size + rank -> read the tar (``r:*``),
group members by the prefix before the last '.' -> decode -> tokenize (characters) -> **filter**
(WeNet's defaults) -> **shuffle** buffer -> **sort** buffer by feature frames -> **dynamic batch**
(``max_frames_in_batch``) -> padding into WeNet's batch dict (``keys``, ``pcm``, ``pcm_length``,
``feats_lengths``). A ``DataLoader(batch_size=None)`` takes batches from its workers in turn.

Where it differs, and why it does not change the batches: audio is decoded with soundfile, not
``torchaudio.load`` (the same samples, without FFmpeg); the feature frames of Kaldi fbank (25 ms
window, 10 ms shift, ``snip_edges``) are counted, not computed (batching reads only the count);
resampling, speed perturbation and SpecAugment are off (as in many recipes' fine-tuning confs);
WeNet's shuffles use the worker's global ``random`` state, here a ``random.Random`` seeded by
(seed, epoch, rank, worker) so a test can replay a run exactly.
"""

from __future__ import annotations

import io
import random
import tarfile
import time

import numpy as np
import soundfile as sf
import torch

FILTER_DEFAULTS = {"max_length": 10240, "min_length": 10, "token_max_length": 200, "token_min_length": 1,
                   "min_output_input_ratio": 0.0005, "max_output_input_ratio": 1.0}


def split_lines(lines: list[str], rank: int, worker: int, world_size: int, num_workers: int, seed: int,
                epoch: int) -> list[str]:
    """The shards one (rank, worker) reads in an epoch."""
    shuffled = list(lines)
    random.Random(seed + epoch).shuffle(shuffled)
    return shuffled[worker * world_size + rank::world_size * num_workers]


def read_group_decode(paths):
    for path in paths:
        with tarfile.open(path, mode="r:*") as tar:
            sample: dict = {}
            for member in tar:
                prefix, _, ext = member.name.rpartition(".")
                if sample and sample["key"] != prefix:
                    yield sample
                    sample = {}
                sample["key"] = prefix
                data = tar.extractfile(member).read()
                if ext == "txt":
                    sample["txt"] = data.decode("utf-8").strip()
                else:
                    audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
                    sample["wav"] = torch.from_numpy(audio[:, 0].copy()).unsqueeze(0)  # single channel
                    sample["sample_rate"] = rate
            if sample:
                yield sample


def tokenize(samples):
    for s in samples:
        s["label"] = list(s["txt"])  # a character tokenizer: one token per character
        yield s


def keep(sample: dict, conf: dict = FILTER_DEFAULTS) -> bool:
    """WeNet's filter: 10 ms frames of the audio before resampling, token counts and their ratios."""
    frames = sample["wav"].size(1) / sample["sample_rate"] * 100
    tokens = len(sample["label"])
    return (conf["min_length"] <= frames <= conf["max_length"]
            and conf["token_min_length"] <= tokens <= conf["token_max_length"]
            and conf["min_output_input_ratio"] <= tokens / frames <= conf["max_output_input_ratio"])


def fbank_frames(samples):
    for s in samples:
        s["feat_frames"] = 1 + (s["wav"].size(1) - 400) // 160  # Kaldi fbank, 25 ms / 10 ms, snip_edges
        yield s


def shuffle(samples, size: int, rng: random.Random):
    buf = []
    for s in samples:
        buf.append(s)
        if len(buf) >= size:
            rng.shuffle(buf)
            yield from buf
            buf = []
    rng.shuffle(buf)
    yield from buf


def sort(samples, size: int):
    buf = []
    for s in samples:
        buf.append(s)
        if len(buf) >= size:
            buf.sort(key=lambda x: x["feat_frames"])
            yield from buf
            buf = []
    buf.sort(key=lambda x: x["feat_frames"])
    yield from buf


def dynamic_batch(samples, max_frames_in_batch: int):
    """Before adding a sample, close the batch if longest-so-far x (count + 1) would pass the limit."""
    batch, longest = [], 0
    for s in samples:
        longest = max(longest, s["feat_frames"])
        if longest * (len(batch) + 1) > max_frames_in_batch:
            if batch:
                yield batch
            batch, longest = [s], s["feat_frames"]
        else:
            batch.append(s)
    if batch:
        yield batch


def padding(batch: list[dict]) -> dict:
    order = sorted(range(len(batch)), key=lambda i: -batch[i]["feat_frames"])
    wavs = [batch[i]["wav"].squeeze(0) for i in order]
    return {"keys": [batch[i]["key"] for i in order],
            "pcm": torch.nn.utils.rnn.pad_sequence(wavs, batch_first=True),
            "pcm_length": torch.tensor([len(w) for w in wavs], dtype=torch.int32),
            "feats_lengths": torch.tensor([batch[i]["feat_frames"] for i in order], dtype=torch.int32)}


def worker_samples(lines, rank, worker, world_size, num_workers, *, seed=0, epoch=0, shuffle_size=40, sort_size=20):
    """One (rank, worker)'s samples in the order the batcher sees them (everything before the batch)."""
    rng = random.Random(f"{seed}-{epoch}-{rank}-{worker}")
    paths = split_lines(lines, rank, worker, world_size, num_workers, seed, epoch)
    samples = (s for s in tokenize(read_group_decode(paths)) if keep(s))
    return sort(shuffle(fbank_frames(samples), shuffle_size, rng), sort_size)


class WenetStyleDataset(torch.utils.data.IterableDataset):
    """The chain above as the IterableDataset WeNet hands to ``DataLoader(batch_size=None)``.
    ``start_delay``: seconds a worker sleeps before its first sample (a slow start)."""

    def __init__(self, data_list: str, rank: int, world_size: int, max_frames_in_batch: int, *, seed=0, epoch=0,
                 start_delay: float = 0.0):
        with open(data_list, encoding="utf-8") as f:
            self.lines = [line.strip() for line in f if line.strip()]
        self.rank, self.world_size, self.limit = rank, world_size, max_frames_in_batch
        self.seed, self.epoch, self.start_delay = seed, epoch, start_delay

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        time.sleep(self.start_delay)
        samples = worker_samples(self.lines, self.rank, worker, self.world_size, workers, seed=self.seed,
                                 epoch=self.epoch)
        for batch in dynamic_batch(samples, self.limit):
            yield padding(batch)


def batch_counts(sorted_frames: list[int], limits) -> dict[int, int]:
    """{limit: batches} of dynamic batching over one worker's sorted frame counts."""
    return {limit: sum(1 for _ in dynamic_batch(({"feat_frames": f} for f in sorted_frames), limit))
            for limit in limits}


def seconds_of(batch: dict, rate: int = 16000) -> float:
    return float(np.sum(batch["pcm_length"].numpy())) / rate
