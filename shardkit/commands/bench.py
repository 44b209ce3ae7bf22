"""bench: what each shard format and loader setting costs on this machine, and what to pick.

One run measures, on the same utterances re-packed into every format (``none``, ``gz``, ``bz2``,
``xz``, ``zst:L``) for every audio codec (WAV, FLAC members):

- size relative to the plain WAV tar;
- writing the format from the plain WAV tar (compression, plus FLAC transcoding as convert does);
- decompression alone; read + group (no decode); read + decode per decoder (shardkit's reader);
- a reference row the way WeNet reads: ``tarfile`` ``r:*`` + ``torchaudio.load(io.BytesIO(...))``;
- a real torch ``DataLoader`` over ``ShardDataset`` for each worker count and start method.

Every measurement repeats until both ``repeat`` runs and ``min_seconds`` are reached and keeps the
median and spread; every run must read every utterance and decode every frame, or the bench
fails (a reader that decodes nothing must not report a big number). The recommendation is
computed from the figures by pure functions (``recommend``), with the GPU side's consumption
and fbank cost as inputs (PERFORMANCE.md: an H100 takes ~0.42 h/s at WeNet's default batches;
fbank costs ~0.25 h/s per core).
"""

from __future__ import annotations

import io
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable

from shardkit import __version__
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.codecs import CODECS, iter_decompressed, open_writer, parse_codec_spec
from shardkit.io.tar import TarWriter
from shardkit.planning.advice import prefetch_factor

DEFAULT_FORMATS = ("none", "gz", "bz2", "xz", "zst:1", "zst:3", "zst:19")
MP_CONTEXTS = ("fork", "spawn", "forkserver")
BYTES_PER_HOUR_16K = 16000 * 2 * 3600  # 16 kHz mono 16-bit: 115.2 MB per hour of audio
WENET_BATCH_SECONDS = 120.0  # WeNet's default dynamic batch: 12,000 frames of 10 ms
BENCH_SHARDS = 16


class BenchCheckError(ShardkitError):
    """A measured run did not read or decode the whole corpus: its figure would be a lie."""

    check = "bench"


@dataclass(frozen=True)
class BenchSettings:
    formats: tuple[str, ...] = DEFAULT_FORMATS
    audio: tuple[str, ...] = ("wav", "flac")
    decoders: tuple[str, ...] = ("shardkit", "soundfile")
    reference: tuple[str, ...] = ("bz2",)  # formats that get the WeNet-style reference row
    workers: tuple[int, ...] = (0, 1, 2, 4)
    mp_contexts: tuple[str, ...] = MP_CONTEXTS
    loader_format: str = "zst:3"
    loader_batch_size: int = 16
    min_seconds: float = 0.5
    repeat: int = 3
    corpus_mb: float = 32.0
    max_bytes: int = 100_000_000
    write_sample_mb: float = 4.0
    gpus_per_node: int | None = None  # None: the GPUs seen here (gpus_seen), else 1, said to be a guess
    target_hours_per_second: float = 0.42
    fbank_hours_per_second_per_core: float = 0.25
    seed: int = 0
    jobs: int | None = None
    webdataset: bool = True  # WebDataset loader rows (when webdataset is installed)


def parse_list(text: str, what: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise UsageError(f"{what}: give at least one value")
    return items


def check_settings(s: BenchSettings) -> None:
    """UsageError for anything the run could not measure; pure."""
    for spec in s.formats + s.reference + (s.loader_format,):
        parse_codec_spec(spec)
    for spec in s.reference:  # a reference format not among --formats is simply not measured
        if parse_codec_spec(spec)[0] == "zst":
            raise UsageError("the WeNet reference row needs a format tarfile reads (none, gz, bz2, xz), not zst")
    for a in s.audio:
        if a not in ("wav", "flac"):
            raise UsageError(f"unknown audio codec {a!r}; choose from wav, flac")
    from shardkit.training.reader import DECODERS

    for d in s.decoders:
        if d not in DECODERS:
            raise UsageError(f"unknown decoder {d!r}; choose from {', '.join(DECODERS)}")
    for w in s.workers:
        if w < 0:
            raise UsageError("--workers values must be >= 0")
    for c in s.mp_contexts:
        if c not in MP_CONTEXTS:
            raise UsageError(f"unknown multiprocessing context {c!r}; choose from {', '.join(MP_CONTEXTS)}")
    if s.repeat < 1 or s.min_seconds < 0:
        raise UsageError("--repeat must be >= 1 and --min-seconds >= 0")
    if s.corpus_mb <= 0 or s.max_bytes <= 0 or (s.gpus_per_node is not None and s.gpus_per_node < 1) \
            or s.target_hours_per_second <= 0:
        raise UsageError("--corpus-mb, --max-bytes, --gpus-per-node and --target-hours-per-second must be > 0")


# ---------------------------------------------------------------------------------------------
# Corpus: plain WAV and FLAC tars of the same utterances


def plan_corpus(corpus_bytes: float, *, shards: int = BENCH_SHARDS):
    """CorpusSpecs for a generated corpus of about ``corpus_bytes`` of WAV (pure).

    Alternating short (AISHELL-like, 2-6 s) and long (LibriSpeech-like, 8-20 s) shards; fewer
    shards for a tiny corpus, so that each holds at least one utterance of each kind.
    """
    from shardkit.io.synth import CorpusSpec

    shards = max(2, min(shards, int(corpus_bytes // 2_000_000)))
    per_shard = corpus_bytes / shards
    specs = []
    for i in range(shards):
        name, low, high, lang = ("short", 2.0, 6.0, "zh") if i % 2 == 0 else ("long", 8.0, 20.0, "en")
        mean_bytes = (low + high) / 2 * 32000
        specs.append(CorpusSpec(f"bench-{name}{i:02d}", max(1, round(per_shard / mean_bytes)), low, high, lang))
    return specs


def _write_pair(wav_path: str, flac_path: str | None, utterances) -> dict:
    """Write the same utterances as a plain WAV tar and (optionally) a plain FLAC tar."""
    from shardkit.io.synth import encode

    count = frames = 0
    seconds = 0.0
    with open(wav_path, "wb") as wav_f, (open(flac_path, "wb") if flac_path else io.BytesIO()) as flac_f:
        wav_tar, flac_tar = TarWriter(wav_f), TarWriter(flac_f)
        for key, text, wav, _ in utterances:
            pcm, rate = pcm16(wav)
            wav_tar.add(f"{key}.txt", text.encode("utf-8"))
            wav_tar.add(f"{key}.wav", wav)
            if flac_path:
                flac_tar.add(f"{key}.txt", text.encode("utf-8"))
                flac_tar.add(f"{key}.flac", encode(pcm, rate, "flac"))
            count += 1
            frames += len(pcm)
            seconds += len(pcm) / rate
        wav_tar.close()
        flac_tar.close()
    return {"utterances": count, "frames": frames, "seconds": seconds}


def pcm16(data) -> tuple:
    """16-bit samples of any audio member (exact for 16-bit sources; others are converted)."""
    from shardkit.errors import AudioError
    from shardkit.io.audio import decode_soundfile
    from shardkit.training.reader import decode_fast

    try:
        return decode_fast(data, "int16")
    except AudioError:
        return decode_soundfile(bytes(data), "int16")


def _generate_shard(args) -> dict:
    from shardkit.io.synth import corpus_utterances

    spec, seed, wav_path, flac_path = args
    return _write_pair(wav_path, flac_path, corpus_utterances(spec, seed=seed))


def _pool(jobs: int) -> ProcessPoolExecutor:
    from shardkit.run.executor import local_pool

    return local_pool(jobs)


def generate_corpus(work: str, settings: BenchSettings, jobs: int) -> dict:
    """The deterministic bench corpus in ``work/base-wav`` and ``work/base-flac``; its totals."""
    specs = plan_corpus(settings.corpus_mb * 1e6)
    tasks = []
    for i, spec in enumerate(specs):
        wav = os.path.join(work, "base-wav", f"shards_{i:09d}.tar")
        flac = os.path.join(work, "base-flac", f"shards_{i:09d}.tar") if "flac" in settings.audio else None
        tasks.append((spec, settings.seed, wav, flac))
    for sub in ("base-wav", "base-flac"):
        os.makedirs(os.path.join(work, sub), exist_ok=True)
    if jobs > 1:
        with _pool(jobs) as pool:
            parts = list(pool.map(_generate_shard, tasks))
    else:
        parts = [_generate_shard(t) for t in tasks]
    return _corpus_totals(parts, [t[2] for t in tasks], source="generated")


def sample_corpus(shard_args: list[str], work: str, settings: BenchSettings) -> dict:
    """Up to ``max_bytes`` of WAV from the user's shards, re-encoded as 16-bit WAV (and FLAC).

    Shards are visited in a seeded order, so the sample spreads over the list; utterances are
    read whole, in shard order, until the WAV bytes reach ``max_bytes``.
    """
    import random

    from shardkit.io.inputs import expand_shards
    from shardkit.io.synth import encode
    from shardkit.training.reader import iter_utterances

    shards = expand_shards(shard_args)
    order = list(shards)
    random.Random(settings.seed).shuffle(order)

    def utterances():
        total = 0
        for utt in iter_utterances(order):
            pcm, rate = pcm16(utt["audio_bytes"])
            wav = encode(pcm, rate, "wav")
            yield utt["key"], utt["txt"], wav, len(pcm) / rate
            total += len(wav) + 1024
            if total >= settings.max_bytes:
                return

    picked = list(utterances())
    if not picked:
        raise UsageError("the shards hold no utterances to sample")
    n = max(1, min(BENCH_SHARDS, len(picked)))
    per = math.ceil(len(picked) / n)
    os.makedirs(os.path.join(work, "base-wav"), exist_ok=True)
    os.makedirs(os.path.join(work, "base-flac"), exist_ok=True)
    parts, paths = [], []
    for i in range(0, len(picked), per):
        wav = os.path.join(work, "base-wav", f"shards_{i // per:09d}.tar")
        flac = os.path.join(work, "base-flac", f"shards_{i // per:09d}.tar") if "flac" in settings.audio else None
        parts.append(_write_pair(wav, flac, picked[i:i + per]))
        paths.append(wav)
    totals = _corpus_totals(parts, paths, source="sampled")
    totals["sampled_from"] = len(shards)
    return totals


def _corpus_totals(parts: list[dict], wav_paths: list[str], *, source: str) -> dict:
    seconds = sum(p["seconds"] for p in parts)
    return {"source": source, "shards": len(parts), "utterances": sum(p["utterances"] for p in parts),
            "frames": sum(p["frames"] for p in parts), "seconds": round(seconds, 3), "hours": round(seconds / 3600, 4),
            "wav_tar_bytes": sum(os.path.getsize(p) for p in wav_paths)}


def _compress_file(args) -> None:
    src, dst, codec, level = args
    with open(src, "rb") as inp, open(dst, "wb") as raw:
        out = open_writer(raw, codec, level)
        while chunk := inp.read(1 << 20):
            out.write(chunk)
        out.close()


def build_formats(work: str, settings: BenchSettings, jobs: int) -> dict[tuple[str, str], list[str]]:
    """Every (format, audio) as shard files under ``work``; compression spread over processes."""
    base = {a: sorted(os.path.join(work, f"base-{a}", n) for n in os.listdir(os.path.join(work, f"base-{a}")))
            for a in settings.audio}
    layout: dict[tuple[str, str], list[str]] = {}
    tasks = []
    for audio in settings.audio:
        for spec in settings.formats:
            codec, level = parse_codec_spec(spec)
            if codec == "none":
                layout[(spec, audio)] = base[audio]
                continue
            folder = os.path.join(work, f"{spec.replace(':', '-')}-{audio}")
            os.makedirs(folder, exist_ok=True)
            outs = [os.path.join(folder, os.path.basename(p) + CODECS[codec].suffix) for p in base[audio]]
            layout[(spec, audio)] = outs
            tasks += [(src, dst, codec, level) for src, dst in zip(base[audio], outs)]
    # longest first, so that the slow codecs (xz, zst:19) start at once
    tasks.sort(key=lambda t: -{"xz": 3, "bz2": 2}.get(t[2], 1 if (t[3] or 0) < 10 else 4))
    if jobs > 1 and len(tasks) > 1:
        with _pool(jobs) as pool:
            list(pool.map(_compress_file, tasks))
    else:
        for t in tasks:
            _compress_file(t)
    return layout


# ---------------------------------------------------------------------------------------------
# Timing


def timed(fn: Callable[[], tuple[int, int]], *, repeat: int, min_seconds: float,
          check: Callable[[tuple[int, int]], None]) -> dict:
    """Run ``fn`` until ``repeat`` runs and ``min_seconds`` are both reached; check every result.

    Returns ``{median_s, min_s, max_s, spread, runs, counted}`` (spread: (max - min) / median;
    counted: what the last run read, e.g. ``[utterances, frames]``, checked equal to the corpus).
    """
    times = []
    started = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        check(result)
    median = statistics.median(times)
    return {"median_s": round(median, 6), "min_s": round(min(times), 6), "max_s": round(max(times), 6),
            "spread": round((max(times) - min(times)) / median, 4) if median > 0 else 0.0, "runs": len(times),
            "counted": list(result)}


def rates(stat: dict, *, tar_bytes: int, utterances: int, seconds: float) -> dict:
    """Throughputs from a stat's median (pure): MB/s of tar, utterances/s, hours/s, x real time."""
    t = stat["median_s"]
    if t <= 0:
        return {**stat, "mb_per_s": None, "utterances_per_s": None, "hours_per_s": None, "x_realtime": None}
    return {**stat, "mb_per_s": round(tar_bytes / t / 1e6, 2), "utterances_per_s": round(utterances / t, 1),
            "hours_per_s": round(seconds / 3600 / t, 4), "x_realtime": round(seconds / t, 1)}


def _expect(label: str, corpus: dict, *, frames: bool) -> Callable[[tuple[int, int]], None]:
    def check(result: tuple[int, int]) -> None:
        count, got_frames = result
        if count != corpus["utterances"]:
            raise BenchCheckError(f"{label}: read {count} of {corpus['utterances']} utterances")
        if frames and got_frames != corpus["frames"]:
            raise BenchCheckError(f"{label}: decoded {got_frames} of {corpus['frames']} audio frames")
    return check


def _expect_bytes(label: str, plain_bytes: int) -> Callable[[tuple[int, int]], None]:
    def check(result: tuple[int, int]) -> None:
        if result[1] != plain_bytes:
            raise BenchCheckError(f"{label} decompress: {result[1]} bytes instead of the tar's {plain_bytes}")
    return check


def _expect_members(label: str) -> Callable[[tuple[int, int]], None]:
    def check(result: tuple[int, int]) -> None:
        if result[0] < 2:
            raise BenchCheckError(f"{label} write: wrote {result[0]} members")
    return check


def decompress_only(paths: list[str]) -> tuple[int, int]:
    """Decompressed bytes of the shards, the fastest way the reader decompresses (count, bytes)."""
    from shardkit.io.codecs import detect_codec
    from shardkit.training.reader import ZSTD_READ_SIZE

    total = 0
    scratch = bytearray(1 << 20)
    for path in paths:
        with open(path, "rb", buffering=1 << 20) as f:
            codec = detect_codec(f.peek(16)[:16])
            if codec == "zst":
                import zstandard

                reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=ZSTD_READ_SIZE,
                                                                    read_across_frames=True)
                while n := reader.readinto(scratch):
                    total += n
            elif codec == "none":
                while n := f.readinto(scratch):
                    total += n
            else:
                for chunk in iter_decompressed(f, shard=path, codec=codec):
                    total += len(chunk)
    return len(paths), total


def read_group(paths: list[str]) -> tuple[int, int]:
    from shardkit.training.reader import iter_samples

    return sum(1 for _ in iter_samples(paths, decode=False)), 0


def read_decode(paths: list[str], decoder: str) -> tuple[int, int]:
    from shardkit.training.reader import iter_samples

    count = frames = 0
    for sample in iter_samples(paths, decoder=decoder):
        count += 1
        frames += len(sample["audio"])
    return count, frames


def wenet_reference(paths: list[str]) -> tuple[int, int]:
    """How WeNet reads: tarfile ``r:*``, group by prefix, ``torchaudio.load(io.BytesIO(...))``."""
    import tarfile

    import torchaudio

    count = frames = 0
    for path in paths:
        with open(path, "rb") as stream, tarfile.open(fileobj=stream, mode="r:*") as tar:
            prev = None
            for info in tar:
                pos = info.name.rfind(".")
                prefix, postfix = info.name[:pos], info.name[pos + 1:]
                data = tar.extractfile(info).read()
                if postfix == "txt":
                    data.decode("utf8").strip()
                elif postfix in ("wav", "flac"):
                    waveform, _ = torchaudio.load(io.BytesIO(data))
                    frames += waveform.shape[1]
                if prefix != prev:
                    count += 1
                    prev = prefix
    return count, frames


def _warm_up_torchaudio(work: str, audio: tuple[str, ...]) -> None:
    """Load torchaudio's decoder once per codec before timing (its first call loads FFmpeg)."""
    from shardkit.training.reader import decode_utterances, iter_utterances

    for a in audio:
        folder = os.path.join(work, f"base-{a}")
        first = os.path.join(folder, sorted(os.listdir(folder))[0])
        utt = next(iter_utterances([first]))
        next(decode_utterances([utt], decoder="torchaudio"))


def write_sample(plain_wav_shard: str, limit_bytes: int) -> bytes:
    """The first utterances of a plain WAV shard, up to ``limit_bytes``, as one tar (the write input)."""
    from shardkit.io.tar import iter_shard_members

    buf = io.BytesIO()
    tar = TarWriter(buf)
    for name, data in iter_shard_members(plain_wav_shard):
        if buf.tell() >= limit_bytes and name.endswith(".txt"):
            break
        tar.add(name, data)
    tar.close()
    return buf.getvalue()


class _NullSink:
    def write(self, data) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def write_format(sample_tar: bytes, codec: str, level: int | None, audio: str) -> tuple[int, int]:
    """Produce one format from a plain WAV tar in memory, as convert does (count of members, 0)."""
    from shardkit.io.tar import iter_tar_members
    from shardkit.io.transcode import transcode_member

    out = open_writer(_NullSink(), codec, level)
    tar = TarWriter(out)
    count = 0
    for name, data in iter_tar_members(io.BytesIO(sample_tar)):
        if audio == "flac":
            name, data, _ = transcode_member(name, data, "flac")
        tar.add(name, data)
        count += 1
    tar.close()
    out.close()
    return count, 0


# ---------------------------------------------------------------------------------------------
# The DataLoader


# Batches as the recommendation has a trainer take them: int16 (half the bytes; scaled on the GPU
# with shardkit.training.dataset.audio_float), padded in the workers. float32 rows beside them for reference.
LOADER_DTYPE = "int16"


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux /proc), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def make_loader(paths: list[str], workers: int, context: str | None, batch_size: int, dtype: str):
    """The DataLoader the rows measure: ShardDataset + collate_padded, persistent workers, as in training."""
    import warnings

    import torch.utils.data

    from shardkit.training.dataset import ShardDataset, collate_padded

    dataset = ShardDataset(paths, rank=0, world_size=1, shuffle=False, dtype=dtype)
    with warnings.catch_warnings():  # more workers than cores is one of the settings measured
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate_padded,
                                           num_workers=workers, multiprocessing_context=context if workers else None,
                                           persistent_workers=workers > 0)


def loader_pass(loader) -> tuple[int, int, float, float | None]:
    """One epoch: (utterances, frames, seconds to the first batch, CPU seconds of this process and the
    workers, None where the workers' CPU cannot be read). The trainer's side reads one value per
    4 KB page of every batch, as a copy to the GPU would touch them."""
    import warnings

    started, cpu0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        iterator = iter(loader)
    pids = [w.pid for w in getattr(iterator, "_workers", [])]
    before = [process_cpu_seconds(p) for p in pids]
    count = frames = 0
    first = None
    for batch in iterator:
        if first is None:
            first = time.perf_counter() - started
        count += len(batch["key"])
        frames += int(batch["lengths"].sum())
        batch["audio"].reshape(-1)[::2048].sum()
    after = [process_cpu_seconds(p) for p in pids]
    cpu = time.process_time() - cpu0
    if pids:
        cpu = None if None in before + after else cpu + sum(after) - sum(before)
    return count, frames, first or 0.0, cpu


def loader_run(paths: list[str], workers: int, context: str | None, batch_size: int,
               dtype: str = LOADER_DTYPE) -> tuple[int, int, float]:
    """One pass of a fresh DataLoader (workers started for it): (utterances, frames, seconds to the first batch)."""
    count, frames, first, _ = loader_pass(make_loader(paths, workers, context, batch_size, dtype))
    return count, frames, first


def measure_loader(paths: list[str], corpus: dict, settings: BenchSettings, progress) -> list[dict]:
    """Rows per (workers, start method, batch dtype): start-up of a fresh loader, then epochs of the
    same loader with persistent workers (as in training): h/s of wall time and h per CPU-second of
    this process and its workers together, against the same loader in the main process."""
    rows = []
    top = max(settings.workers)
    configs = [(w, c, LOADER_DTYPE) for w in settings.workers for c in ((None,) if w == 0 else settings.mp_contexts)]
    configs += [(w, c, "float32") for w, c, _ in configs if w in (0, top) and c in (None, settings.mp_contexts[0])]
    for workers, context, dtype in configs:
        label = f"loader workers={workers}" + (f" {context}" if context else "") + f" {dtype}"
        progress(label)
        loader = make_loader(paths, workers, context, settings.loader_batch_size, dtype)
        count, frames, startup, _ = loader_pass(loader)  # starts the workers, warms up
        _expect(label, corpus, frames=True)((count, frames))
        cpus: list[float | None] = []

        def run():
            n, f, _, cpu = loader_pass(loader)
            cpus.append(cpu)
            return n, f

        stat = timed(run, repeat=settings.repeat, min_seconds=settings.min_seconds,
                     check=_expect(label, corpus, frames=True))
        del loader
        row = rates(stat, tar_bytes=corpus["wav_tar_bytes"], utterances=corpus["utterances"],
                    seconds=corpus["seconds"])
        cpu = statistics.median(cpus) if None not in cpus else None
        row.update(workers=workers, mp_context=context or "main", dtype=dtype, startup_s=round(startup, 4),
                   steady_hours_per_s=row["hours_per_s"], cpu_s=round(cpu, 4) if cpu else None,
                   hours_per_cpu_s=round(corpus["seconds"] / 3600 / cpu, 4) if cpu else None)
        rows.append(row)
    for row in rows:
        main = next((r for r in rows if r["workers"] == 0 and r["dtype"] == row["dtype"]), None)
        row["per_cpu_vs_main"] = (round(row["hours_per_cpu_s"] / main["hours_per_cpu_s"], 3)
                                  if main and main["hours_per_cpu_s"] and row["hours_per_cpu_s"] else None)
    return rows


# ---------------------------------------------------------------------------------------------
# Recommendation (pure)


def workers_needed(target_hps: float, decode_hps: float, fbank_hps: float) -> float:
    """Worker processes (cores) one GPU needs to decode and fbank ``target_hps`` hours/s."""
    return target_hps * (1 / decode_hps + 1 / fbank_hps)


def gpus_seen() -> tuple[int, str]:
    """(GPUs on this machine, how that was found): torch's count where torch is installed, else the
    NVIDIA driver's per-GPU folders; 0 when neither sees one."""
    import glob
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            return torch.cuda.device_count(), "torch.cuda.device_count()"
        except Exception as err:  # a broken CUDA install: say so, count none
            return 0, f"torch could not count GPUs ({type(err).__name__})"
    return len(glob.glob("/proc/driver/nvidia/gpus/*")), "/proc/driver/nvidia/gpus (torch is not installed)"


def gpus_for_advice(given: int | None) -> tuple[int, str, bool]:
    """(GPUs per node to advise for, where the number comes from, whether it is a guess)."""
    if given is not None:
        return given, "--gpus-per-node", False
    seen, how = gpus_seen()
    if seen:
        return seen, f"the GPUs seen here ({how})", False
    return 1, (f"a guess: no GPU seen here ({how}), so 1 per node; give --gpus-per-node N for the training "
               f"nodes"), True


def recommend(formats: list[dict], loader: list[dict], *, cores: int, gpus_per_node: int,
              target_hps: float, fbank_hps: float, gpus_from: str = "--gpus-per-node", guessed: bool = False) -> dict:
    """Format, num_workers, prefetch and start method from the measurements (pure).

    A format "feeds the GPUs" when the workers one GPU needs to decode it and compute fbank at
    the target rate, times the GPUs, fit in the cores (num_workers x gpus <= cores). Among
    those the smallest on disk wins (ties: faster decode); if none fits, the fastest to decode.
    ``gpus_from`` says where ``gpus_per_node`` came from; ``guessed``: no GPU was seen nor given.
    """
    cores_per_gpu = cores // gpus_per_node  # 0: fewer cores than GPUs, said so, not rounded up to 1
    candidates = []
    for row in formats:
        decode = (row.get("decode") or {}).get("shardkit")
        if not decode or not decode.get("hours_per_s"):
            continue
        need = workers_needed(target_hps, decode["hours_per_s"], fbank_hps)
        candidates.append({"format": row["format"], "audio": row["audio"], "size_ratio": row["size_ratio"],
                           "decode_hours_per_s_per_core": decode["hours_per_s"],
                           "write_mb_per_s": (row.get("write") or {}).get("mb_per_s"),
                           "workers_needed_per_gpu": round(need, 2),
                           "decode_share": round((target_hps / decode["hours_per_s"]) / need, 3),
                           "feeds": need <= cores_per_gpu})
    if not candidates:
        return {"format": None, "reason": "no shardkit decode figures to choose from"}
    feeding = [c for c in candidates if c["feeds"]]
    if feeding:
        best = min(feeding, key=lambda c: (round(c["size_ratio"], 2), -c["decode_hours_per_s_per_core"]))
        why = (f"smallest on disk ({best['size_ratio']:.2f} of the WAV tar) among formats whose decode plus fbank "
               f"fits {cores_per_gpu} cores per GPU at {target_hps} h/s per GPU")
        if best["write_mb_per_s"]:
            core_hours = 1000 * BYTES_PER_HOUR_16K / (best["write_mb_per_s"] * 1e6) / 3600
            why += (f"; converting to it runs {best['write_mb_per_s']:.1f} MB/s per core, about "
                    f"{core_hours:.1f} core-hours per 1,000 h of audio")
    elif cores_per_gpu == 0:
        best = max(candidates, key=lambda c: c["decode_hours_per_s_per_core"])
        why = (f"this node has fewer cores ({cores}) than GPUs ({gpus_per_node}), so no format can be fed at "
               f"{target_hps} h/s per GPU: the fastest to decode")
    else:
        best = max(candidates, key=lambda c: c["decode_hours_per_s_per_core"])
        why = (f"no format fits {cores_per_gpu} core{'s' if cores_per_gpu != 1 else ''} per GPU at {target_hps} h/s "
               f"per GPU (fbank alone needs {target_hps / fbank_hps:.1f} cores): the fastest to decode; lower the "
               f"target or add cores")
    num_workers = min(cores_per_gpu, max(1, math.ceil(best["workers_needed_per_gpu"])))
    # buffer ~2 s of the GPU's consumption across the workers: rides out a slow shard open
    prefetch, prefetch_why = prefetch_factor(target_hps, num_workers)
    method = None
    started = [r for r in loader if r["workers"] > 0 and r.get("dtype", LOADER_DTYPE) == LOADER_DTYPE]
    if started:
        fastest_start = min(started, key=lambda r: r["startup_s"])
        method = {"mp_context": fastest_start["mp_context"], "startup_s": fastest_start["startup_s"],
                  "note": "fork starts fastest but is unsafe once the parent has started CUDA or threads; "
                          "forkserver is the safe choice when its start-up is close"}
    return {"format": best["format"], "audio": best["audio"], "why": why, "num_workers": num_workers,
            "prefetch": prefetch, "prefetch_why": prefetch_why, "persistent_workers": num_workers > 0,
            "cores": cores, "gpus_per_node": gpus_per_node, "gpus_from": gpus_from, "gpus_guessed": guessed,
            "cores_per_gpu": cores_per_gpu, "target_hours_per_s_per_gpu": target_hps,
            "fbank_hours_per_s_per_core": fbank_hps, "start_method": method, "batches": loader_advice(loader),
            "candidates": candidates,
            "rule": "num_workers = ceil(target x (1/decode + 1/fbank)) per GPU, at most cores // gpus; "
                    "prefetch = batches for 2 s of the GPU's consumption (120-s batches) per worker, >= 2"}


def loader_advice(loader: list[dict]) -> dict | None:
    """How batches should leave the workers, from the loader rows (pure): int16 when measured at
    least as cheap per CPU-second as float32, with the measured figures."""
    def best(dtype):
        rows = [r for r in loader if r["workers"] > 0 and r.get("dtype") == dtype and r.get("hours_per_cpu_s")]
        return max(rows, key=lambda r: r["hours_per_cpu_s"]) if rows else None

    compact, full = best(LOADER_DTYPE), best("float32")
    if compact is None:
        return None
    use = compact if full is None or compact["hours_per_cpu_s"] >= 0.95 * full["hours_per_cpu_s"] else full
    return {"dtype": use["dtype"], "collate": "shardkit.training.dataset.collate_padded",
            "scale": "shardkit.training.dataset.audio_float(batch, device)" if use["dtype"] == "int16" else None,
            "workers": use["workers"], "mp_context": use["mp_context"], "hours_per_cpu_s": use["hours_per_cpu_s"],
            "per_cpu_vs_main": use.get("per_cpu_vs_main"),
            "float32_hours_per_cpu_s": full["hours_per_cpu_s"] if full else None,
            "bytes_per_hour": BYTES_PER_HOUR_16K * (2 if use["dtype"] == "float32" else 1)}


# ---------------------------------------------------------------------------------------------
# The run


def machine_info() -> dict:
    import numpy
    import soundfile
    import zstandard

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {"shardkit": __version__, "numpy": numpy.__version__, "soundfile": soundfile.__version__,
                "libsndfile": soundfile.__libsndfile_version__, "zstandard": zstandard.__version__}
    for name in ("torch", "torchaudio", "indexed_bzip2", "isal", "matplotlib"):
        try:
            module = __import__(name)
            versions[name] = getattr(module, "__version__", "?")
        except ImportError:
            versions[name] = None
    from shardkit.run.executor import usable_cores

    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable_cores(), "python": platform.python_version(),
            "platform": platform.platform(), "libraries": versions}


@dataclass
class BenchReport:
    machine: dict
    settings: dict
    corpus: dict
    formats: list[dict] = field(default_factory=list)
    loader: list[dict] = field(default_factory=list)
    recommendation: dict = field(default_factory=dict)
    seconds: float = 0.0
    webdataset: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"tool": "shardkit", "version": __version__, "command": "bench", "machine": self.machine,
                "settings": self.settings, "corpus": self.corpus, "formats": self.formats, "loader": self.loader,
                "webdataset": self.webdataset, "recommendation": self.recommendation,
                "seconds": round(self.seconds, 2)}


def run_bench(shard_args: list[str], settings: BenchSettings, *, work_dir: str | None = None,
              progress: Callable[[str], None] = lambda text: None) -> BenchReport:
    """Build the corpus in every format, measure everything, recommend. Temporary files are removed."""
    from shardkit.training.reader import reuse_freed_memory

    check_settings(settings)
    if "torchaudio" in settings.decoders or set(settings.reference) & set(settings.formats):
        try:
            import torchaudio  # noqa: F401
        except ImportError:
            raise UsageError("the torchaudio decoder and the WeNet reference row need torchaudio "
                             "(pip install 'shardkit[torch]'), or pass --reference ''") from None
    started = time.perf_counter()
    jobs = settings.jobs or os.cpu_count() or 1
    # as in the loader workers (ShardDataset does the same there): see reuse_freed_memory
    tuned = reuse_freed_memory()
    work = tempfile.mkdtemp(prefix="shardkit-bench-", dir=work_dir)
    try:
        progress("corpus")
        corpus = (sample_corpus(shard_args, work, settings) if shard_args
                  else generate_corpus(work, settings, jobs))
        progress(f"corpus: {corpus['utterances']} utterances, {corpus['hours']:.2f} h, "
                 f"{corpus['wav_tar_bytes'] / 1e6:.1f} MB of WAV tar; writing {len(settings.formats)} formats")
        layout = build_formats(work, settings, jobs)
        first_wav = os.path.join(work, "base-wav", sorted(os.listdir(os.path.join(work, "base-wav")))[0])
        sample_tar = write_sample(first_wav, int(settings.write_sample_mb * 1e6))
        if "torchaudio" in settings.decoders or set(settings.reference) & set(settings.formats):
            _warm_up_torchaudio(work, settings.audio)
        report = BenchReport(machine={**machine_info(), "malloc_tuned": tuned},
                             settings=asdict(settings), corpus=corpus)
        plain_bytes = {a: sum(os.path.getsize(os.path.join(work, f"base-{a}", n))
                              for n in os.listdir(os.path.join(work, f"base-{a}"))) for a in settings.audio}
        corpus["plain_tar_bytes"] = plain_bytes
        repeat = {"repeat": settings.repeat, "min_seconds": settings.min_seconds}
        for audio in settings.audio:
            # MB/s of each row count its own plain tar (WAV or FLAC); h/s and utt/s compare across rows
            figures = {"tar_bytes": plain_bytes[audio], "utterances": corpus["utterances"],
                       "seconds": corpus["seconds"]}
            for spec in settings.formats:
                codec, level = parse_codec_spec(spec)
                paths = layout[(spec, audio)]
                label = f"{spec}/{audio}"
                size = sum(os.path.getsize(p) for p in paths)
                row: dict = {"format": spec, "codec": codec, "level": level, "audio": audio, "bytes": size,
                             "size_ratio": round(size / corpus["wav_tar_bytes"], 4)}
                progress(f"{label}: write")
                write = timed(lambda: write_format(sample_tar, codec, level, audio), **repeat,
                              check=_expect_members(label))
                row["write"] = {**write, "mb_per_s": round(len(sample_tar) / write["median_s"] / 1e6, 2),
                                "input": "plain WAV tar", "input_bytes": len(sample_tar)}
                progress(f"{label}: decompress")
                row["decompress"] = rates(timed(lambda: decompress_only(paths), **repeat,
                                                check=_expect_bytes(label, plain_bytes[audio])), **figures)
                progress(f"{label}: read + group")
                row["group"] = rates(timed(lambda: read_group(paths), **repeat,
                                           check=_expect(f"{label} read + group", corpus, frames=False)), **figures)
                row["decode"] = {}
                for decoder in settings.decoders:
                    progress(f"{label}: read + decode ({decoder})")
                    row["decode"][decoder] = rates(timed(lambda: read_decode(paths, decoder), **repeat,
                                                         check=_expect(f"{label} decode ({decoder})", corpus,
                                                                       frames=True)), **figures)
                row["reference"] = None
                if spec in settings.reference:
                    progress(f"{label}: WeNet reference (tarfile + torchaudio)")
                    row["reference"] = rates(timed(lambda: wenet_reference(paths), **repeat,
                                                   check=_expect(f"{label} WeNet reference", corpus, frames=True)),
                                             **figures)
                report.formats.append(row)
        loader_format = settings.loader_format if settings.loader_format in settings.formats else settings.formats[0]
        loader_key = (loader_format, "wav" if "wav" in settings.audio else settings.audio[0])
        if settings.workers:
            try:
                import torch  # noqa: F401
            except ImportError:
                progress("loader: skipped (torch is not installed)")
            else:
                report.loader = measure_loader(layout[loader_key], corpus, settings, progress)
                for row in report.loader:
                    row["format"], row["audio"] = loader_key
        gpus, gpus_from, guessed = gpus_for_advice(settings.gpus_per_node)
        report.recommendation = recommend(report.formats, report.loader, cores=report.machine["usable_cores"],
                                          gpus_per_node=gpus, gpus_from=gpus_from, guessed=guessed,
                                          target_hps=settings.target_hours_per_second,
                                          fbank_hps=settings.fbank_hours_per_second_per_core)
        if settings.webdataset:
            report.webdataset = measure_webdataset(layout, corpus, plain_bytes, settings, progress)
            if report.webdataset:
                report.recommendation["webdataset"] = webdataset_recommendation(report.webdataset)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.seconds = time.perf_counter() - started
    return report


# ---------------------------------------------------------------------------------------------
# Outputs


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _spread(stat: dict | None) -> str:
    return "-" if not stat else f"±{stat['spread'] * 50:.0f}%"


def format_tables(report: dict) -> str:
    """bench.md: the tables and the recommendation, from a report's JSON (pure)."""
    c, m = report["corpus"], report["machine"]
    decoders = report["settings"]["decoders"]
    lines = [f"# shardkit bench ({time.strftime('%Y-%m-%d', time.gmtime())})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}. Corpus ({c['source']}): "
             f"{c['utterances']} utterances, {c['hours']:.2f} h, {c['wav_tar_bytes'] / 1e6:.1f} MB of WAV tar, "
             f"{c['shards']} shards. One core per measurement; medians of >= {report['settings']['repeat']} runs "
             f"(± is half the spread). Hours/s count audio; 1 h/s of 16 kHz 16-bit audio is 115 MB/s.", "",
             "| format | audio | size | write MB/s | decompress MB/s | read+group utt/s | "
             + " | ".join(f"{d} utt/s | {d} h/s | {d} x RT" for d in decoders) + " | WeNet-style h/s |",
             "|---|---|---:|---:|---:|---:|" + "---:|---:|---:|" * len(decoders) + "---:|"]
    for row in report["formats"]:
        cells = [row["format"], row["audio"], f"{row['size_ratio']:.3f}", _fmt(row["write"]["mb_per_s"]),
                 f"{_fmt(row['decompress']['mb_per_s'], 0)} {_spread(row['decompress'])}",
                 f"{_fmt(row['group']['utterances_per_s'], 0)} {_spread(row['group'])}"]
        for d in decoders:
            stat = row["decode"][d]
            cells += [f"{_fmt(stat['utterances_per_s'], 0)} {_spread(stat)}", _fmt(stat["hours_per_s"], 3),
                      _fmt(stat["x_realtime"], 0)]
        ref = row.get("reference")
        cells.append(f"{_fmt(ref['hours_per_s'], 3)} {_spread(ref)}" if ref else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if report["loader"]:
        lines += ["", f"DataLoader over ShardDataset ({report['loader'][0]['format']} "
                      f"{report['loader'][0]['audio']}, batch_size={report['settings']['loader_batch_size']} "
                      "padded in the workers, persistent workers; start-up = time to the first batch of a fresh "
                      "loader; rates over later epochs; CPU = this process + its workers; int16 batches are "
                      "scaled on the trainer's device):", "",
                  "| workers | start method | batch dtype | start-up s | utt/s | h/s | h per CPU-s | vs 0 workers |",
                  "|---:|---|---|---:|---:|---:|---:|---:|"]
        for r in report["loader"]:
            lines.append(f"| {r['workers']} | {r['mp_context']} | {r.get('dtype', 'float32')} | {r['startup_s']:.3f} | "
                         f"{_fmt(r['utterances_per_s'], 0)} {_spread(r)} | {_fmt(r['hours_per_s'], 3)} | "
                         f"{_fmt(r.get('hours_per_cpu_s'), 3)} | {_fmt(r.get('per_cpu_vs_main'), 2)} |")
        note = loader_panel_note(report)
        if note:
            lines += ["", f"Note: {note}."]
    lines += format_webdataset_table(report)
    lines += ["", "## Recommendation", "", recommendation_text(report["recommendation"]), ""]
    return "\n".join(lines)


MIN_LOADER_PASS_S = 2.0  # a pass shorter than this is mostly worker start-up: workers cannot show a speed-up


def loader_panel_note(report: dict) -> str | None:
    """Why the workers figures cannot be read as a speed-up, when the corpus is too small (pure), else None.

    Too small: one pass in the main process takes under ``MIN_LOADER_PASS_S``, or the corpus has
    fewer than two shards per worker (WeNet's split gives each worker whole shards).
    """
    rows = report.get("loader") or []
    started = [r["workers"] for r in rows if r["workers"] > 0]
    if not started:
        return None
    main = [r for r in rows if r["workers"] == 0]
    shards, most = report["corpus"]["shards"], max(started)
    short = main and main[0]["median_s"] < MIN_LOADER_PASS_S
    if not short and shards >= 2 * most:
        return None
    why = []
    if short:
        why.append(f"one pass takes {main[0]['median_s']:.2g} s in the main process, less than starting workers costs")
    if shards < 2 * most:
        why.append(f"{shards} shards for up to {most} workers (each worker reads whole shards)")
    return ("corpus too small to measure what workers gain: " + "; ".join(why)
            + f". Give bench a corpus of at least {2 * most} shards and {MIN_LOADER_PASS_S:.0f} s of decoding "
            "(--corpus-mb, or more --max-bytes of your shards) to see it")


def recommendation_text(rec: dict) -> str:
    if not rec.get("format"):
        return rec.get("reason", "no recommendation")
    text = (f"- Format: **{rec['format']} with {rec['audio'].upper()} members**: {rec['why']}.\n"
            f"- Loader per GPU ({rec['gpus_per_node']} GPU{'s' if rec['gpus_per_node'] != 1 else ''} per node: "
            f"{rec.get('gpus_from', '--gpus-per-node')}; {rec['cores']} cores): num_workers={rec['num_workers']}, "
            f"prefetch={rec['prefetch']}, persistent_workers={rec.get('persistent_workers', True)} ({rec['rule']}). "
            f"Why {rec.get('prefetch_why') or 'this prefetch'}.")
    if rec.get("batches"):
        b = rec["batches"]
        text += (f"\n- Batches: `ShardDataset(dtype=\"{b['dtype']}\")` + `collate_padded`"
                 + (f", scaled on the GPU with `{b['scale']}`" if b["scale"] else "")
                 + f": {b['hours_per_cpu_s']:.2f} h of audio per CPU-second with {b['workers']} worker(s) here"
                 + (f" ({b['per_cpu_vs_main']:.2f}x the same loader in the main process)" if b["per_cpu_vs_main"] else "")
                 + (f", float32 batches {b['float32_hours_per_cpu_s']:.2f}" if b["float32_hours_per_cpu_s"] else "")
                 + ".")
    if rec.get("start_method"):
        sm = rec["start_method"]
        text += (f"\n- Start method: {sm['mp_context']} started workers fastest here ({sm['startup_s']:.2f} s to the "
                 f"first batch); {sm['note']}.")
    if rec.get("webdataset"):
        text += (f"\n- WebDataset users: {rec['webdataset']['how']}. Speed vs a soundfile handler: "
                 f"{rec['webdataset']['summary']}.")
    return text


def plot(report: dict) -> bytes:
    """bench.png's bytes: decode rate per format and decoder (h/s per core), loader rate vs workers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_loader = bool(report["loader"])
    has_wds = bool(report.get("webdataset"))
    columns = 1 + has_loader + has_wds
    fig, axes = plt.subplots(1, columns, figsize=(5 + 4.5 * columns, 5), squeeze=False)
    if has_wds:
        plot_webdataset(axes[0][columns - 1], report)
    plot_decode(axes[0][0], report)
    if has_loader:
        plot_loader(axes[0][1], report)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def plot_decode(ax, report: dict) -> None:
    """bench.png's first panel: read + decode h/s per format, one bar per decoder (and the WeNet-style
    reference where measured), on a log scale so slow and fast formats share it, against what one GPU
    consumes: the format choice at a glance."""
    rows = report["formats"]
    labels = [f"{r['format']}\n{r['audio']}\n{r['size_ratio']:.2f}x" for r in rows]
    series = [(d, [r["decode"][d]["hours_per_s"] for r in rows]) for d in report["settings"]["decoders"]]
    if any(r.get("reference") for r in rows):
        series.append(("WeNet-style", [(r["reference"] or {}).get("hours_per_s") or 0 for r in rows]))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=name)
    target = report["recommendation"].get("target_hours_per_s_per_gpu")
    if target:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"one GPU consumes ({target} h/s)")
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("hours of audio per second, one core (log)")
    ax.set_title("read + decode per format (size vs WAV tar under each)")
    ax.legend(fontsize=8)


def plot_loader(ax, report: dict) -> None:
    """bench.png's workers panel: DataLoader h/s (wall) and h per CPU-second vs num_workers, one colour
    per start method, each line starting from the main-process row; the two rates together show
    whether more workers buy speed or only burn cores. A too-small corpus gets its note over the panel."""
    loader_rows = [r for r in report["loader"] if r.get("dtype", LOADER_DTYPE) == LOADER_DTYPE]
    contexts = sorted({r["mp_context"] for r in loader_rows if r["workers"] > 0})
    main = [r for r in loader_rows if r["workers"] == 0]
    for i, context in enumerate(contexts):
        rows_c = sorted((r for r in loader_rows if r["mp_context"] == context), key=lambda r: r["workers"])
        rows_c = main[:1] + rows_c
        xs = [r["workers"] for r in rows_c]
        color = f"C{i}"
        ax.plot(xs, [r["hours_per_s"] or 0 for r in rows_c], marker="o", color=color,
                label=f"{context}: h/s (wall)")
        ax.plot(xs, [r.get("hours_per_cpu_s") or 0 for r in rows_c], marker="x", linestyle="--", color=color,
                label=f"{context}: h per CPU-second")
    ax.set_xticks(sorted({r["workers"] for r in report["loader"]}))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("hours of audio per second")
    ax.set_title(f"DataLoader over ShardDataset ({report['loader'][0]['format']}, {LOADER_DTYPE} batches)")
    ax.legend(fontsize=8)
    note = loader_panel_note(report)
    if note:
        import textwrap

        ax.text(0.5, 0.5, textwrap.fill(note, 60), transform=ax.transAxes, ha="center", va="center",
                fontsize=8, color="darkred", bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "darkred"})


def write_outputs(report: BenchReport, out_dir: str) -> dict:
    """OUT_DIR/bench.json, bench.md and bench.png (each written atomically); returns their paths."""
    from shardkit.io.files import atomic_write_bytes, atomic_write_json
    from shardkit.run.lifecycle import prepare_out_dir

    out_dir = prepare_out_dir(out_dir)
    data = report.to_json()
    paths = {"json": os.path.join(out_dir, "bench.json"), "md": os.path.join(out_dir, "bench.md"),
             "png": os.path.join(out_dir, "bench.png")}
    atomic_write_json(paths["json"], data)
    atomic_write_bytes(paths["md"], format_tables(data).encode("utf-8"))
    try:
        atomic_write_bytes(paths["png"], plot(data))
    except ImportError:
        paths["png"] = None  # matplotlib is the bench extra
    return paths


# ---------------------------------------------------------------------------------------------
# WebDataset loaders: what a WebDataset user runs today, and what shardkit's stage gains them

WDS_LOADERS = {
    "wds+soundfile": "wds.WebDataset(urls).decode(soundfile handler)",
    "wds+soundfile pipe:zstd": "the same over pipe:zstd -dc < shard (zst only)",
    "wds+torchaudio": "wds.WebDataset(urls).decode(wds.torch_audio)",
    "wds+shardkit": "wds.WebDataset(urls).map(shardkit.training.wds.decode_audio())",
    "shardkit.training.wds.WebDataset": "shardkit.training.wds.WebDataset(urls).map(shardkit.training.wds.decode_audio())",
    "shardkit reader": "shardkit.iter_samples(urls)",
}


def soundfile_handler(key: str, data: bytes):
    """The audio handler a WebDataset user writes: soundfile from ``io.BytesIO``, float32."""
    if key.rsplit(".", 1)[-1] not in ("wav", "flac"):
        return None
    import soundfile as sf

    return sf.read(io.BytesIO(data), dtype="float32", always_2d=True)


def webdataset_read(paths: list[str], loader: str) -> tuple[int, int]:
    """One pass of a WebDataset pipeline over the shards, decoding every utterance: (count, frames)."""
    if loader == "shardkit reader":
        return read_decode(paths, "shardkit")
    import webdataset as wds

    from shardkit.training import wds as skwds
    if loader == "wds+soundfile":
        ds = wds.WebDataset(paths, shardshuffle=False).decode(soundfile_handler)
    elif loader == "wds+soundfile pipe:zstd":
        ds = wds.WebDataset([f"pipe:zstd -dc < {p}" for p in paths], shardshuffle=False).decode(soundfile_handler)
    elif loader == "wds+torchaudio":
        ds = wds.WebDataset(paths, shardshuffle=False).decode(wds.torch_audio)
    elif loader == "wds+shardkit":
        ds = wds.WebDataset(paths, shardshuffle=False).map(skwds.decode_audio())
    elif loader == "shardkit.training.wds.WebDataset":
        ds = skwds.WebDataset(paths, shardshuffle=False).map(skwds.decode_audio())
    else:
        raise UsageError(f"unknown WebDataset loader {loader!r}")
    axis = -1 if loader == "wds+torchaudio" else 0  # torchaudio: (channels, frames)
    count = frames = 0
    for sample in ds:
        audio = sample["wav"] if "wav" in sample else sample["flac"]
        count += 1
        frames += audio[0].shape[axis]
    return count, frames


def timed_interleaved(fns: dict[str, Callable[[], tuple[int, int]]], *, repeat: int, min_seconds: float,
                      check: Callable[[str, tuple[int, int]], None]) -> dict[str, dict]:
    """:func:`timed` for several configurations, one run of each per round, so noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, tuple[int, int]] = {}
    started = time.perf_counter()
    while min(len(t) for t in times.values()) < repeat or time.perf_counter() - started < min_seconds * len(fns):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
            check(name, results[name])
    out = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        out[name] = {"median_s": round(median, 6), "min_s": round(min(ts), 6), "max_s": round(max(ts), 6),
                     "spread": round((max(ts) - min(ts)) / median, 4) if median > 0 else 0.0, "runs": len(ts),
                     "counted": list(results[name])}
    return out


def webdataset_formats(settings: BenchSettings) -> list[tuple[str, str]]:
    """The (format, audio) pairs the WebDataset rows cover: plain WAV, one zstd level, FLAC in plain tar."""
    zst = [f for f in settings.formats if parse_codec_spec(f)[0] == "zst"]
    zst_spec = settings.loader_format if settings.loader_format in zst else (zst[0] if zst else None)
    pairs = []
    for audio in settings.audio:
        for spec in settings.formats:
            if spec == "none" or (spec == zst_spec and audio == "wav"):
                pairs.append((spec, audio))
    return pairs


def measure_webdataset(layout: dict, corpus: dict, plain_bytes: dict, settings: BenchSettings, progress) -> list[dict]:
    """WebDataset pipelines next to shardkit's reader, interleaved, per (format, audio); [] without webdataset.

    zstd shards reach WebDataset's tarfile through the zstd hook (patched in this process for the
    run, as ``shardkit wenet enable-zstd`` arranges at start-up) and, where the ``zstd`` command
    exists, through ``pipe:zstd -dc``, the way WebDataset documents.
    """
    try:
        import webdataset  # noqa: F401
    except ImportError:
        progress("webdataset: skipped (not installed: pip install 'shardkit[wds]')")
        return []
    import tarfile

    from shardkit.io import zstd_tarfile as hook
    has_torchaudio = True
    try:
        import torchaudio  # noqa: F401
    except ImportError:
        has_torchaudio = False
    patched = hook.needed() and hook.patch(tarfile)
    rows = []
    try:
        for spec, audio in webdataset_formats(settings):
            paths = layout[(spec, audio)]
            is_zst = parse_codec_spec(spec)[0] == "zst"
            names = [n for n in WDS_LOADERS if (n != "wds+torchaudio" or has_torchaudio)
                     and (n != "wds+soundfile pipe:zstd" or (is_zst and shutil.which("zstd")))]
            progress(f"{spec}/{audio}: WebDataset loaders ({', '.join(names)})")
            check_one = {n: _expect(f"{spec}/{audio} {n}", corpus, frames=True) for n in names}
            stats = timed_interleaved({n: (lambda n=n: webdataset_read(paths, n)) for n in names},
                                      repeat=settings.repeat, min_seconds=settings.min_seconds,
                                      check=lambda n, result: check_one[n](result))
            figures = {"tar_bytes": plain_bytes[audio], "utterances": corpus["utterances"],
                       "seconds": corpus["seconds"]}
            loaders = {n: rates(stats[n], **figures) for n in names}
            rows.append({"format": spec, "audio": audio, "loaders": loaders,
                         "gains": webdataset_gains(loaders)})
    finally:
        if patched:
            hook.unpatch(tarfile)
    return rows


def webdataset_gains(loaders: dict) -> dict:
    """Speed ratios (pure): shardkit's stage and drop-in vs the soundfile handler, each loader vs shardkit's reader."""
    def ratio(a: str, b: str):
        if a not in loaders or b not in loaders or not loaders[a]["median_s"]:
            return None
        return round(loaders[b]["median_s"] / loaders[a]["median_s"], 3)

    return {"stage_vs_soundfile": ratio("wds+shardkit", "wds+soundfile"),
            "dropin_vs_soundfile": ratio("shardkit.training.wds.WebDataset", "wds+soundfile"),
            "stage_vs_torchaudio": ratio("wds+shardkit", "wds+torchaudio"),
            "vs_shardkit_reader": {n: ratio(n, "shardkit reader") for n in loaders if n != "shardkit reader"}}


def webdataset_recommendation(rows: list[dict]) -> dict | None:
    """What a WebDataset user gains by switching, per format (pure); None without WebDataset rows."""
    if not rows:
        return None
    parts = []
    for row in rows:
        g = row["gains"]
        if g["stage_vs_soundfile"] is None:
            continue
        text = (f"{row['format']}/{row['audio']}: {g['stage_vs_soundfile']:.1f}x with the stage"
                + (f", {g['dropin_vs_soundfile']:.1f}x with the drop-in" if g["dropin_vs_soundfile"] else ""))
        if g["stage_vs_torchaudio"]:
            text += f" ({g['stage_vs_torchaudio']:.0f}x over wds.torch_audio)"
        parts.append(text)
    return {"summary": "; ".join(parts),
            "how": "replace .decode(<audio handler>) with .map(shardkit.training.wds.decode_audio()); for shardkit's reader "
                   "too, wds.WebDataset(...) with shardkit.training.wds.WebDataset(...)"}


def format_webdataset_table(report: dict) -> list[str]:
    """bench.md's WebDataset section (pure); [] without WebDataset rows."""
    rows = report.get("webdataset") or []
    if not rows:
        return []
    names = [n for n in WDS_LOADERS if any(n in r["loaders"] for r in rows)]
    lines = ["", "WebDataset loaders, interleaved in one run (h/s of audio per core; x = speed vs shardkit's reader):",
             "", "| format | audio | " + " | ".join(names) + " | stage gain | drop-in gain |",
             "|---|---|" + "---:|" * (len(names) + 2)]
    for r in rows:
        cells = [r["format"], r["audio"]]
        for n in names:
            stat = r["loaders"].get(n)
            vs = r["gains"]["vs_shardkit_reader"].get(n)
            cells.append("-" if stat is None else f"{_fmt(stat['hours_per_s'], 3)} {_spread(stat)}"
                         + (f" ({vs:.2f}x)" if vs else ""))
        g = r["gains"]
        cells += [f"{g['stage_vs_soundfile']:.2f}x" if g["stage_vs_soundfile"] else "-",
                  f"{g['dropin_vs_soundfile']:.2f}x" if g["dropin_vs_soundfile"] else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "; ".join(f"{n}: {WDS_LOADERS[n]}" for n in names) + "."]
    return lines


def plot_webdataset(ax, report: dict) -> None:
    """bench.png's WebDataset panel: h/s per loader, grouped by format."""
    rows = report["webdataset"]
    names = [n for n in WDS_LOADERS if any(n in r["loaders"] for r in rows)]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([x + i * width for x in range(len(rows))],
               [(r["loaders"].get(name) or {}).get("hours_per_s") or 0 for r in rows], width, label=name)
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels([f"{r['format']}\n{r['audio']}" for r in rows], fontsize=8)
    ax.set_ylabel("hours of audio per second, one core (log)")
    ax.set_title("WebDataset pipelines vs shardkit's reader")
    ax.legend(fontsize=7)
