"""Shared helpers for the benchmark scripts: corpus generation, timing with repeats, machine info."""

from __future__ import annotations

import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from shardkit.bench import machine_info  # noqa: F401  (one description of the machine for every benchmark)


def timed(fn, *, repeat: int = 3, min_seconds: float = 0.0) -> dict:
    """Run ``fn`` until both ``repeat`` runs and ``min_seconds`` are reached; median and spread."""
    times, result = [], None
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "runs": len(times),
            "result": result}


def _make_shard(args):
    from shardkit.synth import CorpusSpec, corpus_utterances, write_shards

    index, out_dir, seconds_per_shard, codec, level, audio_format = args
    # alternate short (AISHELL-like) and long (LibriSpeech-like) shards
    spec = (CorpusSpec(f"short{index:03d}", int(seconds_per_shard / 4), 2.0, 6.0, "zh") if index % 2 == 0
            else CorpusSpec(f"long{index:03d}", int(seconds_per_shard / 14), 8.0, 20.0, "en"))
    sub = os.path.join(out_dir, f"part{index:03d}")
    paths = write_shards(corpus_utterances(spec, seed=index, audio_format=audio_format), sub,
                         utts_per_shard=10 ** 9, codec=codec, level=level, prefix=f"shards_{index:03d}_",
                         audio_format=audio_format)
    return paths[0]


def make_corpus(out_dir: str, *, total_mb: float, shards: int, codec: str = "bz2", level: int | None = None,
                audio_format: str = "wav", jobs: int | None = None) -> list[str]:
    """A deterministic speech-like corpus of about ``total_mb`` MB of 16 kHz 16-bit tar, in shards."""
    marker = os.path.join(out_dir, "corpus.json")
    if os.path.exists(marker):
        with open(marker) as f:
            saved = json.load(f)
        if saved["args"] == [total_mb, shards, codec, level, audio_format]:
            return saved["paths"]
    seconds_per_shard = total_mb * 1e6 / 32000 / shards
    with ProcessPoolExecutor(jobs or os.cpu_count()) as pool:
        paths = list(pool.map(_make_shard, [(i, out_dir, seconds_per_shard, codec, level, audio_format)
                                            for i in range(shards)]))
    with open(os.path.join(out_dir, "data.list"), "w") as f:
        f.writelines(p + "\n" for p in paths)
    with open(marker, "w") as f:
        json.dump({"args": [total_mb, shards, codec, level, audio_format], "paths": paths}, f)
    return paths


def emit_results(results: dict, json_out: str | None) -> None:
    """Print the figures as JSON on stdout, and also write them to ``json_out`` when given."""
    text = json.dumps(results, indent=2)
    if json_out:
        with open(json_out, "w") as f:
            f.write(text + "\n")
    print(text)
