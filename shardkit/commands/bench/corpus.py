"""The bench corpus: the same utterances as plain WAV and FLAC tars (generated, or sampled from the user's
shards), then re-packed into every format measured."""

from __future__ import annotations

import io
import math
import os
from concurrent.futures import ProcessPoolExecutor

from shardkit.commands.bench.settings import BenchSettings
from shardkit.errors import UsageError
from shardkit.io.codecs import CODECS, open_writer, parse_codec_spec
from shardkit.io.tar import TarWriter
from shardkit.planning.bench import BENCH_SHARDS, corpus_shards

# the order the compressions start in: the slow codecs (xz, zst:19) first
CODEC_COST = {"xz": 3, "bz2": 2}


def plan_corpus(corpus_bytes: float, *, shards: int = BENCH_SHARDS):
    """CorpusSpecs for a generated corpus of about ``corpus_bytes`` of WAV (see
    :func:`shardkit.planning.bench.corpus_shards`)."""
    from shardkit.io.synth import CorpusSpec

    return [CorpusSpec(*shard) for shard in corpus_shards(corpus_bytes, shards=shards)]


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


def _base_paths(work: str, settings: BenchSettings, index: int) -> tuple[str, str | None]:
    """The plain WAV tar and (when FLAC is measured) plain FLAC tar of corpus shard ``index``."""
    name = f"shards_{index:09d}.tar"
    flac = os.path.join(work, "base-flac", name) if "flac" in settings.audio else None
    return os.path.join(work, "base-wav", name), flac


def generate_corpus(work: str, settings: BenchSettings, jobs: int) -> dict:
    """The deterministic bench corpus in ``work/base-wav`` and ``work/base-flac``; its totals."""
    specs = plan_corpus(settings.corpus_mb * 1e6)
    tasks = [(spec, settings.seed, *_base_paths(work, settings, i)) for i, spec in enumerate(specs)]
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

    shards = expand_shards(shard_args)
    order = list(shards)
    random.Random(settings.seed).shuffle(order)
    picked = list(_sampled_utterances(order, settings.max_bytes))
    if not picked:
        raise UsageError("the shards hold no utterances to sample")
    n = max(1, min(BENCH_SHARDS, len(picked)))
    per = math.ceil(len(picked) / n)
    os.makedirs(os.path.join(work, "base-wav"), exist_ok=True)
    os.makedirs(os.path.join(work, "base-flac"), exist_ok=True)
    parts, paths = [], []
    for i in range(0, len(picked), per):
        wav, flac = _base_paths(work, settings, i // per)
        parts.append(_write_pair(wav, flac, picked[i:i + per]))
        paths.append(wav)
    totals = _corpus_totals(parts, paths, source="sampled")
    totals["sampled_from"] = len(shards)
    return totals


def _sampled_utterances(shards: list[str], max_bytes: int):
    """(key, text, 16-bit WAV bytes, seconds) of the shards' utterances in order, until the WAV bytes
    (and 1 KB of tar per utterance) reach ``max_bytes``."""
    from shardkit.io.synth import encode
    from shardkit.training.reader import iter_utterances

    total = 0
    for utt in iter_utterances(shards):
        pcm, rate = pcm16(utt["audio_bytes"])
        wav = encode(pcm, rate, "wav")
        yield utt["key"], utt["txt"], wav, len(pcm) / rate
        total += len(wav) + 1024
        if total >= max_bytes:
            return


def _corpus_totals(parts: list[dict], wav_paths: list[str], *, source: str) -> dict:
    seconds = sum(p["seconds"] for p in parts)
    return {"source": source, "shards": len(parts), "utterances": sum(p["utterances"] for p in parts),
            "frames": sum(p["frames"] for p in parts), "seconds": round(seconds, 3), "hours": round(seconds / 3600, 4),
            "wav_tar_bytes": sum(os.path.getsize(p) for p in wav_paths)}


def base_shards(work: str, audio: str) -> list[str]:
    """The plain tars of one audio codec (``wav``, ``flac``), in order."""
    folder = os.path.join(work, f"base-{audio}")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder))


def _compress_file(args) -> None:
    src, dst, codec, level = args
    with open(src, "rb") as inp, open(dst, "wb") as raw:
        out = open_writer(raw, codec, level)
        while chunk := inp.read(1 << 20):
            out.write(chunk)
        out.close()


def _compress_cost(task) -> int:
    """How slow a compression task is, for starting the slowest first (xz, zst:19, bz2, the rest)."""
    codec, level = task[2], task[3]
    return CODEC_COST.get(codec, 1 if (level or 0) < 10 else 4)


def build_formats(work: str, settings: BenchSettings, jobs: int) -> dict[tuple[str, str], list[str]]:
    """Every (format, audio) as shard files under ``work``; compression spread over processes."""
    layout: dict[tuple[str, str], list[str]] = {}
    tasks = []
    for audio in settings.audio:
        base = base_shards(work, audio)
        for spec in settings.formats:
            layout[(spec, audio)], todo = _format_files(work, spec, audio, base)
            tasks += todo
    tasks.sort(key=_compress_cost, reverse=True)
    if jobs > 1 and len(tasks) > 1:
        with _pool(jobs) as pool:
            list(pool.map(_compress_file, tasks))
    else:
        for t in tasks:
            _compress_file(t)
    return layout


def _format_files(work: str, spec: str, audio: str, base: list[str]) -> tuple[list[str], list[tuple]]:
    """(the shard files of one format, the compressions that make them): the plain tars themselves for
    ``none``, else one file per plain tar in a folder of their own."""
    codec, level = parse_codec_spec(spec)
    if codec == "none":
        return base, []
    folder = os.path.join(work, f"{spec.replace(':', '-')}-{audio}")
    os.makedirs(folder, exist_ok=True)
    outs = [os.path.join(folder, os.path.basename(p) + CODECS[codec].suffix) for p in base]
    return outs, [(src, dst, codec, level) for src, dst in zip(base, outs)]
