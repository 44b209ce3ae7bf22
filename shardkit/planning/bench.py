"""bench's arithmetic, as pure functions of numbers: the corpus it generates, the DataLoader settings it
measures, and what it recommends from the measured figures. Nothing here reads a file, times anything or
asks the machine; ``shardkit.commands.bench`` measures and calls these.

The recommendation weighs the GPU side (assumed, docs/performance.md: an H100 takes ~0.42 h/s at WeNet's default
batches; fbank costs ~0.25 h/s per core) against each format's measured decode rate per core: one GPU
needs ``target x (1/decode + 1/fbank)`` workers, and the node's cores bound workers x GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardkit.planning.advice import prefetch_factor, workers_needed

BYTES_PER_HOUR_16K = 16000 * 2 * 3600  # 16 kHz mono 16-bit: 115.2 MB per hour of audio
BENCH_SHARDS = 16
# Batches as the recommendation has a trainer take them: int16 (half the bytes; scaled on the GPU
# with shardkit.training.dataset.audio_float), padded in the workers. float32 rows beside them for reference.
LOADER_DTYPE = "int16"

RULE = ("num_workers = ceil(target x (1/decode + 1/fbank)) per GPU, at most cores // gpus; "
        "prefetch = batches for 2 s of the GPU's consumption (120-s batches) per worker, >= 2")
START_METHOD_NOTE = ("fork starts fastest but is unsafe once the parent has started CUDA or threads; "
                     "forkserver is the safe choice when its start-up is close")
WEBDATASET_HOW = ("replace .decode(<audio handler>) with .map(shardkit.training.wds.decode_audio()); for shardkit's "
                  "reader too, wds.WebDataset(...) with shardkit.training.wds.WebDataset(...)")


# ---------------------------------------------------------------------------------------------
# What bench generates and measures


def corpus_shards(corpus_bytes: float, *, shards: int = BENCH_SHARDS) -> list[tuple[str, int, float, float, str]]:
    """(name, utterances, shortest s, longest s, language) per shard of a generated corpus of about
    ``corpus_bytes`` of 16 kHz 16-bit WAV.

    Alternating short (AISHELL-like, 2-6 s) and long (LibriSpeech-like, 8-20 s) shards; fewer
    shards for a tiny corpus, so that each holds at least one utterance of each kind.
    """
    shards = max(2, min(shards, int(corpus_bytes // 2_000_000)))
    per_shard = corpus_bytes / shards
    specs = []
    for i in range(shards):
        name, low, high, lang = ("short", 2.0, 6.0, "zh") if i % 2 == 0 else ("long", 8.0, 20.0, "en")
        mean_bytes = (low + high) / 2 * 32000
        specs.append((f"bench-{name}{i:02d}", max(1, round(per_shard / mean_bytes)), low, high, lang))
    return specs


def loader_grid(workers: tuple[int, ...], mp_contexts: tuple[str, ...]) -> list[tuple[int, str | None, str]]:
    """The DataLoader rows to measure, as (num_workers, start method or None in the main process, batch
    dtype): every worker count with every start method in ``LOADER_DTYPE``, then float32 rows for
    reference at the main process and the most workers with the first start method."""
    top = max(workers)
    configs = [(w, c, LOADER_DTYPE) for w in workers for c in ((None,) if w == 0 else mp_contexts)]
    configs += [(w, c, "float32") for w, c, _ in configs if w in (0, top) and c in (None, mp_contexts[0])]
    return configs


# ---------------------------------------------------------------------------------------------
# The recommendation


@dataclass(frozen=True)
class Node:
    """The training node the advice is for: its cores and GPUs, what one GPU consumes (h/s of audio) and
    what fbank costs (h/s per core)."""

    cores: int
    gpus_per_node: int
    target_hps: float
    fbank_hps: float

    @property
    def cores_per_gpu(self) -> int:
        """Cores per GPU on the training node, rounded down (0 when it has fewer cores than GPUs)."""
        return self.cores // self.gpus_per_node  # 0: fewer cores than GPUs, said so, not rounded up to 1


def format_candidates(formats: list[dict], node: Node) -> list[dict]:
    """Each measured format with the workers one GPU needs to read it, and whether the node's cores feed
    them; formats without a shardkit decode rate are left out."""
    candidates = []
    for row in formats:
        decode = (row.get("decode") or {}).get("shardkit")
        if not decode or not decode.get("hours_per_s"):
            continue
        need = workers_needed(node.target_hps, decode["hours_per_s"], node.fbank_hps)
        candidates.append({"format": row["format"], "audio": row["audio"], "size_ratio": row["size_ratio"],
                           "decode_hours_per_s_per_core": decode["hours_per_s"],
                           "write_mb_per_s": (row.get("write") or {}).get("mb_per_s"),
                           "workers_needed_per_gpu": round(need, 2),
                           "decode_share": round((node.target_hps / decode["hours_per_s"]) / need, 3),
                           "feeds": need <= node.cores_per_gpu})
    return candidates


def pick_format(candidates: list[dict], node: Node) -> tuple[dict, str]:
    """(the candidate to use, why): the smallest on disk among those the cores feed (ties: faster
    decode), else the fastest to decode, with the reason none fits."""
    feeding = [c for c in candidates if c["feeds"]]
    if feeding:
        best = min(feeding, key=lambda c: (round(c["size_ratio"], 2), -c["decode_hours_per_s_per_core"]))
        return best, _smallest_why(best, node)
    best = max(candidates, key=lambda c: c["decode_hours_per_s_per_core"])
    if node.cores_per_gpu == 0:
        return best, (f"this node has fewer cores ({node.cores}) than GPUs ({node.gpus_per_node}), so no format "
                      f"can be fed at {node.target_hps} h/s per GPU: the fastest to decode")
    plural = "s" if node.cores_per_gpu != 1 else ""
    return best, (f"no format fits {node.cores_per_gpu} core{plural} per GPU at {node.target_hps} h/s per GPU "
                  f"(fbank alone needs {node.target_hps / node.fbank_hps:.1f} cores): the fastest to decode; "
                  f"lower the target or add cores")


def _smallest_why(best: dict, node: Node) -> str:
    why = (f"smallest on disk ({best['size_ratio']:.2f} of the WAV tar) among formats whose decode plus fbank "
           f"fits {node.cores_per_gpu} cores per GPU at {node.target_hps} h/s per GPU")
    if best["write_mb_per_s"]:
        core_hours = 1000 * BYTES_PER_HOUR_16K / (best["write_mb_per_s"] * 1e6) / 3600
        why += (f"; converting to it runs {best['write_mb_per_s']:.1f} MB/s per core, about "
                f"{core_hours:.1f} core-hours per 1,000 h of audio")
    return why


def start_method_advice(loader: list[dict]) -> dict | None:
    """The start method whose fresh loader reached its first batch soonest (``LOADER_DTYPE`` rows with
    workers), with the caveat about fork; None without such rows."""
    started = [r for r in loader if r["workers"] > 0 and r.get("dtype", LOADER_DTYPE) == LOADER_DTYPE]
    if not started:
        return None
    fastest_start = min(started, key=lambda r: r["startup_s"])
    return {"mp_context": fastest_start["mp_context"], "startup_s": fastest_start["startup_s"],
            "note": START_METHOD_NOTE}


def batch_advice(loader: list[dict]) -> dict | None:
    """How batches should leave the workers, from the loader rows: int16 when measured at least as
    cheap per CPU-second as float32 (within 5%), with the measured figures; None without int16 rows."""
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


def recommend(formats: list[dict], loader: list[dict], *, cores: int, gpus_per_node: int,
              target_hps: float, fbank_hps: float, gpus_from: str = "--gpus-per-node", guessed: bool = False) -> dict:
    """Format, num_workers, prefetch and start method from the measurements.

    A format "feeds the GPUs" when the workers one GPU needs to decode it and compute fbank at
    the target rate, times the GPUs, fit in the cores (num_workers x gpus <= cores). Among
    those the smallest on disk wins (ties: faster decode); if none fits, the fastest to decode.
    ``gpus_from`` says where ``gpus_per_node`` came from; ``guessed``: no GPU was seen nor given.
    """
    node = Node(cores, gpus_per_node, target_hps, fbank_hps)
    candidates = format_candidates(formats, node)
    if not candidates:
        return {"format": None, "reason": "no shardkit decode figures to choose from"}
    best, why = pick_format(candidates, node)
    num_workers = min(node.cores_per_gpu, max(1, math.ceil(best["workers_needed_per_gpu"])))
    # buffer ~2 s of the GPU's consumption across the workers: rides out a slow shard open
    prefetch, prefetch_why = prefetch_factor(target_hps, num_workers)
    return {"format": best["format"], "audio": best["audio"], "why": why, "num_workers": num_workers,
            "prefetch": prefetch, "prefetch_why": prefetch_why, "persistent_workers": num_workers > 0,
            "cores": cores, "gpus_per_node": gpus_per_node, "gpus_from": gpus_from, "gpus_guessed": guessed,
            "cores_per_gpu": node.cores_per_gpu, "target_hours_per_s_per_gpu": target_hps,
            "fbank_hours_per_s_per_core": fbank_hps, "start_method": start_method_advice(loader),
            "batches": batch_advice(loader), "candidates": candidates, "rule": RULE}


# ---------------------------------------------------------------------------------------------
# WebDataset users


def _speedup(loaders: dict, a: str, b: str) -> float | None:
    """How many times faster loader ``a`` ran than loader ``b`` (median times); None when either is missing."""
    if a not in loaders or b not in loaders or not loaders[a]["median_s"]:
        return None
    return round(loaders[b]["median_s"] / loaders[a]["median_s"], 3)


def webdataset_gains(loaders: dict) -> dict:
    """Speed ratios: shardkit's stage and drop-in vs the soundfile handler, each loader vs shardkit's reader."""
    return {"stage_vs_soundfile": _speedup(loaders, "wds+shardkit", "wds+soundfile"),
            "dropin_vs_soundfile": _speedup(loaders, "shardkit.training.wds.WebDataset", "wds+soundfile"),
            "stage_vs_torchaudio": _speedup(loaders, "wds+shardkit", "wds+torchaudio"),
            "vs_shardkit_reader": {n: _speedup(loaders, n, "shardkit reader")
                                   for n in loaders if n != "shardkit reader"}}


def _gain_text(row: dict) -> str:
    g = row["gains"]
    text = (f"{row['format']}/{row['audio']}: {g['stage_vs_soundfile']:.1f}x with the stage"
            + (f", {g['dropin_vs_soundfile']:.1f}x with the drop-in" if g["dropin_vs_soundfile"] else ""))
    if g["stage_vs_torchaudio"]:
        text += f" ({g['stage_vs_torchaudio']:.0f}x over wds.torch_audio)"
    return text


def webdataset_recommendation(rows: list[dict]) -> dict | None:
    """What a WebDataset user gains by switching, per format; None without WebDataset rows."""
    if not rows:
        return None
    parts = [_gain_text(row) for row in rows if row["gains"]["stage_vs_soundfile"] is not None]
    return {"summary": "; ".join(parts), "how": WEBDATASET_HOW}
