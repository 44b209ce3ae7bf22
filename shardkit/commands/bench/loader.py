"""The DataLoader rows: a real torch ``DataLoader`` over ``ShardDataset`` per worker count, start method
and batch dtype; start-up of a fresh loader, then epochs with persistent workers as in training, in
wall time and in CPU time of this process and its workers."""

from __future__ import annotations

import os
import statistics
import time

from shardkit.commands.bench.settings import BenchSettings, say
from shardkit.commands.bench.timing import expect, rates, timed
from shardkit.planning.bench import LOADER_DTYPE, loader_grid
from shardkit.run.events import Events


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


def measure_loader(paths: list[str], corpus: dict, settings: BenchSettings, events: Events) -> list[dict]:
    """Rows per (workers, start method, batch dtype) of :func:`shardkit.planning.bench.loader_grid`:
    start-up of a fresh loader, then epochs of the same loader with persistent workers (as in training):
    h/s of wall time and h per CPU-second of this process and its workers together, against the same
    loader in the main process."""
    rows = [_loader_row(paths, corpus, settings, events, config)
            for config in loader_grid(settings.workers, settings.mp_contexts)]
    for row in rows:
        row["per_cpu_vs_main"] = per_cpu_vs_main(row, rows)
    return rows


def _loader_row(paths: list[str], corpus: dict, settings: BenchSettings, events: Events,
                config: tuple[int, str | None, str]) -> dict:
    workers, context, dtype = config
    label = f"loader workers={workers}" + (f" {context}" if context else "") + f" {dtype}"
    say(events, label)
    stat, startup, cpu = _time_loader(paths, corpus, settings, config, label)
    row = rates(stat, tar_bytes=corpus["wav_tar_bytes"], utterances=corpus["utterances"], seconds=corpus["seconds"])
    row.update(workers=workers, mp_context=context or "main", dtype=dtype, startup_s=round(startup, 4),
               steady_hours_per_s=row["hours_per_s"], cpu_s=round(cpu, 4) if cpu else None,
               hours_per_cpu_s=round(corpus["seconds"] / 3600 / cpu, 4) if cpu else None)
    return row


def _time_loader(paths: list[str], corpus: dict, settings: BenchSettings, config: tuple[int, str | None, str],
                 label: str) -> tuple[dict, float, float | None]:
    """(timed epochs, seconds to the first batch of the fresh loader, median CPU seconds of an epoch or
    None): one loader, its first epoch starting the workers, then epochs of the same workers. The loader
    and its workers go when this returns, before the next configuration starts."""
    workers, context, dtype = config
    loader = make_loader(paths, workers, context, settings.loader_batch_size, dtype)
    count, frames, startup, _ = loader_pass(loader)  # starts the workers, warms up
    expect(label, corpus, frames=True)((count, frames))
    cpus: list[float | None] = []

    def run():
        n, f, _, cpu = loader_pass(loader)
        cpus.append(cpu)
        return n, f

    stat = timed(run, repeat=settings.repeat, min_seconds=settings.min_seconds,
                 check=expect(label, corpus, frames=True))
    return stat, startup, statistics.median(cpus) if None not in cpus else None


def per_cpu_vs_main(row: dict, rows: list[dict]) -> float | None:
    """A row's h per CPU-second over the main-process row's of the same batch dtype (pure)."""
    main = next((r for r in rows if r["workers"] == 0 and r["dtype"] == row["dtype"]), None)
    if not (main and main["hours_per_cpu_s"] and row["hours_per_cpu_s"]):
        return None
    return round(row["hours_per_cpu_s"] / main["hours_per_cpu_s"], 3)


def loader_key(settings: BenchSettings) -> tuple[str, str]:
    """The (format, audio) the DataLoader reads: ``loader_format`` where measured (else the first format),
    WAV members where measured (else the first audio codec)."""
    loader_format = settings.loader_format if settings.loader_format in settings.formats else settings.formats[0]
    return loader_format, "wav" if "wav" in settings.audio else settings.audio[0]


def loader_rows(layout: dict[tuple[str, str], list[str]], corpus: dict, settings: BenchSettings,
                events: Events) -> list[dict]:
    """:func:`measure_loader` on the format of :func:`loader_key`, each row naming it; [] without
    ``workers`` to measure or without torch (said in a note)."""
    if not settings.workers:
        return []
    try:
        import torch  # noqa: F401
    except ImportError:
        say(events, "loader: skipped (torch is not installed)")
        return []
    key = loader_key(settings)
    rows = measure_loader(layout[key], corpus, settings, events)
    for row in rows:
        row["format"], row["audio"] = key
    return rows
