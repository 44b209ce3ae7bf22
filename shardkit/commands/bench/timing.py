"""How bench times a measurement: repeated until both a count and a duration are reached, every run's
result checked against the corpus (a reader that decodes nothing must not report a big number), the
median and spread kept, and throughputs derived from the median."""

from __future__ import annotations

import statistics
import time
from typing import Callable

from shardkit.commands.bench.settings import BenchCheckError

Counted = tuple[int, int]  # what one run read: (utterances or members, frames or bytes)


def summary(times: list[float], result: Counted) -> dict:
    """``{median_s, min_s, max_s, spread, runs, counted}`` of one measurement's run times (spread:
    (max - min) / median; counted: what the last run read)."""
    median = statistics.median(times)
    return {"median_s": round(median, 6), "min_s": round(min(times), 6), "max_s": round(max(times), 6),
            "spread": round((max(times) - min(times)) / median, 4) if median > 0 else 0.0, "runs": len(times),
            "counted": list(result)}


def timed(fn: Callable[[], Counted], *, repeat: int, min_seconds: float,
          check: Callable[[Counted], None]) -> dict:
    """Run ``fn`` until ``repeat`` runs and ``min_seconds`` are both reached; check every result.

    Returns :func:`summary`'s figures (counted: what the last run read, e.g. ``[utterances, frames]``,
    checked equal to the corpus).
    """
    times = []
    started = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        check(result)
    return summary(times, result)


def timed_interleaved(fns: dict[str, Callable[[], Counted]], *, repeat: int, min_seconds: float,
                      check: Callable[[str, Counted], None]) -> dict[str, dict]:
    """:func:`timed` for several configurations, one run of each per round, so noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, Counted] = {}
    started = time.perf_counter()
    while min(len(t) for t in times.values()) < repeat or time.perf_counter() - started < min_seconds * len(fns):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
            check(name, results[name])
    return {name: summary(ts, results[name]) for name, ts in times.items()}


def rates(stat: dict, *, tar_bytes: int, utterances: int, seconds: float) -> dict:
    """Throughputs from a stat's median (pure): MB/s of tar, utterances/s, hours/s, x real time."""
    t = stat["median_s"]
    if t <= 0:
        return {**stat, "mb_per_s": None, "utterances_per_s": None, "hours_per_s": None, "x_realtime": None}
    return {**stat, "mb_per_s": round(tar_bytes / t / 1e6, 2), "utterances_per_s": round(utterances / t, 1),
            "hours_per_s": round(seconds / 3600 / t, 4), "x_realtime": round(seconds / t, 1)}


def expect(label: str, corpus: dict, *, frames: bool) -> Callable[[Counted], None]:
    """The check of a reading run: every utterance read and (``frames``) every audio frame decoded."""
    def check(result: Counted) -> None:
        count, got_frames = result
        if count != corpus["utterances"]:
            raise BenchCheckError(f"{label}: read {count} of {corpus['utterances']} utterances")
        if frames and got_frames != corpus["frames"]:
            raise BenchCheckError(f"{label}: decoded {got_frames} of {corpus['frames']} audio frames")
    return check


def expect_bytes(label: str, plain_bytes: int) -> Callable[[Counted], None]:
    """The check of a decompression run: the plain tar's bytes, all of them."""
    def check(result: Counted) -> None:
        if result[1] != plain_bytes:
            raise BenchCheckError(f"{label} decompress: {result[1]} bytes instead of the tar's {plain_bytes}")
    return check


def expect_members(label: str) -> Callable[[Counted], None]:
    """The check of a writing run: members written."""
    def check(result: Counted) -> None:
        if result[0] < 2:
            raise BenchCheckError(f"{label} write: wrote {result[0]} members")
    return check
