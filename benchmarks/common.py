"""Shared helpers for the benchmark scripts: corpus generation, timing with repeats, machine info, results."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor


def machine_info() -> dict:
    """One description of the machine for every benchmark (shardkit.commands.bench's); importing this module imports no
    shardkit, so a benchmark's child process measuring another checkout can use its command line."""
    from shardkit.commands.bench import machine_info as describe

    return describe()


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
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

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


def corpus_parser(doc: str, *, corpus_mb: float, work_dir: str) -> argparse.ArgumentParser:
    """The options of a benchmark over ``bench_corpus``: --corpus-mb, --work-dir, --json; help is ``doc``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-mb", type=float, default=corpus_mb)
    p.add_argument("--work-dir", default=work_dir)
    p.add_argument("--json", help="also write the figures here")
    return p


def bench_corpus(work: str, corpus_mb: float, *, audio: tuple[str, ...] = ("wav",),
                 formats: tuple[str, ...] = ("none",)) -> tuple[dict, dict[str, list[str]]]:
    """shardkit.commands.bench's deterministic speech-like corpus in ``work`` (made once, then reused): totals and layout.

    16 kHz 16-bit utterances, alternating short and long shards, of about ``corpus_mb`` MB of WAV;
    packed in every ``audio`` (wav, flac) and format (none, zst:3, bz2, ...). The layout maps
    ``"FORMAT/AUDIO"`` (``"zst:3/wav"``) to the shard paths; the totals are shardkit.commands.bench's
    (utterances, frames, seconds, wav_tar_bytes, ...). The cache is reused only for the same settings.
    """
    from shardkit.commands.bench import BenchSettings, build_formats, generate_corpus

    marker = os.path.join(work, "corpus.json")
    asked = {"corpus_mb": corpus_mb, "audio": list(audio), "formats": list(formats)}
    if os.path.exists(marker):
        with open(marker) as f:
            saved = json.load(f)
        if all(saved.get(k) == v for k, v in asked.items()):
            return saved["totals"], saved["layout"]
    os.makedirs(work, exist_ok=True)
    settings = BenchSettings(corpus_mb=corpus_mb, audio=tuple(audio), formats=tuple(formats))
    jobs = os.cpu_count() or 1
    totals = generate_corpus(work, settings, jobs=jobs)
    layout = {f"{spec}/{a}": paths for (spec, a), paths in build_formats(work, settings, jobs).items()}
    write_json(marker, {**asked, "totals": totals, "layout": layout}, indent=None)
    return totals, layout


def write_json(path: str, doc: dict, *, indent: int | None = 2) -> None:
    """``doc`` as JSON in ``path``, through a temporary file beside it, fsynced and renamed: never half written."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=indent)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table of already formatted cells: the first column left-aligned, the figures right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def bullets(items: dict) -> str:
    """``- name: value`` lines, one per item (targets and ratios under a table)."""
    return "\n".join(f"- {k}: {v}" for k, v in items.items())


def emit_results(results: dict, json_out: str | None, *, echo: bool = True, text: str | None = None) -> None:
    """Report a benchmark's figures: the JSON document on stdout (unless ``echo`` is False), then ``text``
    (tables for people) when given; and the same document in ``json_out`` when given (``write_json``)."""
    if json_out:
        write_json(json_out, results)
    if echo:
        print(json.dumps(results, indent=2))
    if text is not None:
        print(text)
