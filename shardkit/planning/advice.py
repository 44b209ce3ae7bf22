"""Advice for the recipe's summary, as pure functions of numbers: loader workers per GPU from this
node's cores, its GPUs and the decode rate measured on the training shards, and the measured figures
behind the training list's format. Nothing here reads a file or asks the machine; every text states
the numbers it used.

The GPU side (assumed, docs/performance.md): one H100 at WeNet's default batches consumes ~0.42 h of audio per
second; Kaldi fbank costs ~0.25 h/s per core on top of decoding. A loader worker that decodes at
``d`` h/s per core and computes fbank at ``f`` h/s per core supplies ``1 / (1/d + 1/f)`` h/s, so one
GPU needs ``target x (1/d + 1/f)`` workers; the node's cores bound ``num_workers x GPUs``.
"""

from __future__ import annotations

import math

TARGET_HOURS_PER_S = 0.42  # one GPU's consumption, h of audio per second (an H100 at WeNet's default batches)
FBANK_HOURS_PER_S_PER_CORE = 0.25
BATCH_SECONDS = 120.0  # WeNet's default dynamic batch: 12,000 frames of 10 ms


def _g(x: float) -> str:
    """2-3 significant digits."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


PREFETCH_SECONDS = 2.0  # the batches ready in the workers cover this much of a GPU's consumption


def prefetch_factor(target_hours_per_s: float, num_workers: int) -> tuple[int | None, str]:
    """(``prefetch_factor``, why): the batches each worker keeps ready, so that all of them together cover
    PREFETCH_SECONDS of one GPU's consumption (a slow shard open or a long utterance does not starve it);
    at least 2, PyTorch's default. None with no workers (PyTorch refuses a factor then). Pure."""
    if num_workers < 1:
        return None, "no workers: the training process reads, and prefetch_factor does not apply"
    batches_per_s = target_hours_per_s * 3600 / BATCH_SECONDS
    factor = max(2, math.ceil(batches_per_s * PREFETCH_SECONDS / num_workers - 1e-9))
    why = (f"prefetch_factor={factor}: each of the {num_workers} worker{'s' if num_workers != 1 else ''} keeps "
           f"{factor} batches ready, so that together they hold {PREFETCH_SECONDS:g} s of one GPU's consumption "
           f"({_g(target_hours_per_s)} h/s of audio = {_g(batches_per_s)} batches of {BATCH_SECONDS:g} s per "
           f"second) and ride out a slow shard open; at least 2, PyTorch's default")
    return factor, why


def core_seconds_per_hour(decode_hps: float | None, fbank_hps: float) -> float:
    """Core-seconds one hour of audio costs a loader worker: fbank, plus decoding when its rate was measured."""
    return 1 / fbank_hps + (1 / decode_hps if decode_hps else 0.0)


def workers_needed(target_hps: float, decode_hps: float | None, fbank_hps: float) -> float:
    """Worker processes (cores) one GPU needs to decode and fbank ``target_hps`` hours/s."""
    return target_hps * core_seconds_per_hour(decode_hps, fbank_hps)


def loader_advice(*, cores: int, gpus_per_node: int, decode_hours_per_s: float | None,
                  target_hours_per_s: float = TARGET_HOURS_PER_S,
                  fbank_hours_per_s: float = FBANK_HOURS_PER_S_PER_CORE,
                  num_workers_used: int | None = None, measured_on: str = "the training shards") -> dict:
    """``num_workers`` and ``prefetch_factor`` per GPU, and a sentence that states the numbers used (pure).

    ``cores``: this node's usable cores; ``gpus_per_node``: GPUs that train on it (each gets
    ``cores // gpus_per_node`` cores for its workers); ``decode_hours_per_s``: read + decode rate of
    the training shards on one core (None when not measured: the advice then rests on fbank's cost
    alone and says so); ``num_workers_used``: the --num_workers the list was balanced for, compared
    with the advice. Raises ValueError for counts below 1 or rates <= 0.
    """
    if cores < 1 or gpus_per_node < 1:
        raise ValueError(f"cores and GPUs per node must be >= 1 (got {cores} and {gpus_per_node})")
    if target_hours_per_s <= 0 or fbank_hours_per_s <= 0 or (decode_hours_per_s is not None
                                                              and decode_hours_per_s <= 0):
        raise ValueError("rates must be > 0 h/s")
    cores_per_gpu = cores // gpus_per_node
    per_worker = 1 / core_seconds_per_hour(decode_hours_per_s, fbank_hours_per_s)  # h/s one worker supplies
    needed = workers_needed(target_hours_per_s, decode_hours_per_s, fbank_hours_per_s)
    if cores_per_gpu == 0:
        num_workers = 0
    else:
        num_workers = min(cores_per_gpu, max(1, math.ceil(needed - 1e-9)))
    feeds = cores_per_gpu >= 1 and needed <= cores_per_gpu + 1e-9
    supplied = (num_workers if cores_per_gpu else cores / gpus_per_node) * per_worker
    prefetch, prefetch_why = prefetch_factor(target_hours_per_s, num_workers)
    rate = (f"read + decode {_g(decode_hours_per_s)} h/s per core measured on {measured_on}"
            if decode_hours_per_s else "no decode rate measured (fbank's cost alone counted)")
    text = (f"{gpus_per_node} GPU{'s' if gpus_per_node != 1 else ''} per node, {cores} cores "
            f"({cores_per_gpu} per GPU); {rate}, fbank {_g(fbank_hours_per_s)} h/s per core: one worker supplies "
            f"{_g(per_worker)} h/s, one GPU consumes ~{_g(target_hours_per_s)} h/s, so it needs {_g(needed)} workers")
    if cores_per_gpu == 0:
        verdict = (f"fewer cores than GPUs: num_workers=0 (the training process reads), and this node supplies "
                   f"about {_g(supplied)} h/s per GPU of the {_g(target_hours_per_s)} it needs")
    elif feeds:
        verdict = f"num_workers={num_workers}, prefetch_factor={prefetch}: the loader keeps up"
    else:
        verdict = (f"num_workers={num_workers} (all {cores_per_gpu} cores per GPU), prefetch_factor={prefetch}: "
                   f"the loader supplies ~{_g(supplied)} h/s per GPU, short of {_g(target_hours_per_s)}; a faster "
                   f"format or more cores per GPU would close the gap")
    text = f"{text} -> {verdict}"
    if num_workers_used is not None and num_workers and num_workers_used != num_workers:
        text += (f". This list was balanced for --num_workers {num_workers_used}; to train with {num_workers} "
                 f"workers, rerun stage 2 with --num_workers {num_workers} so the shard count stays a multiple "
                 f"of world_size x num_workers")
    elif num_workers_used is not None and num_workers_used == num_workers:
        text += " (the --num_workers this list was balanced for)"
    return {"cores": cores, "gpus_per_node": gpus_per_node, "cores_per_gpu": cores_per_gpu,
            "decode_hours_per_s": decode_hours_per_s, "fbank_hours_per_s": fbank_hours_per_s,
            "target_hours_per_s": target_hours_per_s, "hours_per_s_per_worker": round(per_worker, 4),
            "workers_needed": round(needed, 3), "num_workers": num_workers, "prefetch_factor": prefetch,
            "prefetch_why": prefetch_why,
            "feeds": feeds, "num_workers_used": num_workers_used, "text": text}


def format_label(codec: str, audio: str) -> str:
    """How the summary names a shard format: ``plain tar, FLAC members``, ``zst tar, WAV members``."""
    container = "plain tar" if codec == "none" else f"{codec} tar"
    members = {"keep": "members as the sources had them", "wav": "WAV members", "flac": "FLAC members"}[audio]
    return f"{container}, {members}"


def matching_rows(bench_rows: list[dict], codec: str, audio: str) -> list[dict]:
    """The bench rows that measured the training list's format (codec; audio, or every audio for ``keep``)."""
    return [r for r in bench_rows
            if (r.get("codec") or r["format"].split(":")[0]) == codec and (audio == "keep" or r["audio"] == audio)]


def training_decode_rate(bench_rows: list[dict], codec: str, audio: str) -> tuple[float | None, str]:
    """(h/s per core, what it was measured on) for the training format: the slowest matching row (pure)."""
    rows = [r for r in matching_rows(bench_rows, codec, audio) if r.get("hours_per_s")]
    if not rows:
        return None, "nothing"
    slowest = min(rows, key=lambda r: r["hours_per_s"])
    return slowest["hours_per_s"], f"{slowest['format']} {slowest['audio'].upper()} shards of the training list"


def format_evidence(bench_rows: list[dict], codec: str, audio: str) -> list[str]:
    """Lines citing the measured size and decode rate of the chosen format next to the others (pure).

    ``bench_rows``: [{format, codec, audio, size_ratio, hours_per_s}] from the bench of the training list.
    """
    chosen = {(r["format"], r["audio"]) for r in matching_rows(bench_rows, codec, audio)}
    lines = []
    for r in bench_rows:
        hook = "needs the zstd hook" if (r.get("codec") or r["format"].split(":")[0]) == "zst" else "no hook"
        rate = "-" if not r.get("hours_per_s") else _g(r["hours_per_s"])
        mark = " <- this list" if (r["format"], r["audio"]) in chosen else ""
        lines.append(f"{r['format']} {r['audio'].upper()}: size {r['size_ratio']:.2f} of the WAV tar, "
                     f"{rate} h/s per core, {hook}{mark}")
    return lines
