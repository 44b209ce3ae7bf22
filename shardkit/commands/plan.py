"""``shardkit plan``: how WeNet would split a shard list across ranks and workers, epoch by epoch.

The list's utterances and seconds per shard come from index files, or from reading the shards
(:func:`shard_sizes`); with ``--wenet-conf`` they are what the trainer's filter keeps, and the
trainer's batches are simulated (:mod:`shardkit.wenet_conf.list_view`). The figures are
:func:`shardkit.planning.partition.plan_figures` (WeNet's split) and, for ``--reader webdataset``,
WebDataset's. No shard is written; the one file written is ``--dropped-keys``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardkit.errors import UsageError
from shardkit.run.options import RunOptions

if TYPE_CHECKING:
    from shardkit.wenet_conf.load import TrainerSpec


@dataclass(frozen=True)
class PlanSettings:
    """What ``plan`` shows: the loader (ranks, workers per rank, epochs, seed), whose split (``reader``
    "wenet" or "webdataset"; ``draws``: shards a resampling worker draws per epoch), the index files to
    take sizes from, and ``--wenet-conf``'s files (the conf, a tokenizer, where the dropped keys go)."""

    world_size: int
    num_workers: int
    epochs: int = 3
    seed: int = 0
    reader: str = "wenet"
    draws: int | None = None
    index_files: tuple[str, ...] = ()
    wenet_conf: str | None = None
    tokenizer: str | None = None
    dropped_keys: str | None = None
    layout: str = "wenet"
    tars: str | None = None
    batch_size: int = 1


@dataclass
class PlanResult:
    """What ``plan`` found: the figures (the JSON document's; for ``--reader webdataset`` WebDataset's, with
    "resampled" and "wenet"), the tables in the order shown, and ``--wenet-conf``'s report and
    warnings; or the shards that could not be read (then nothing else)."""

    shards: int  # distinct shards of the list
    figures: dict = field(default_factory=dict)
    shown: list[dict] = field(default_factory=list)
    wenet_conf: dict | None = None
    warnings: list[str] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    # with --index: the stamps of the listed shards, as the indexes recorded them (checked before use), and
    # the index files that carry none ({"source_stamps": ..., "unchecked_indexes": ...}); empty otherwise
    stamps: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The ``--json`` document."""
        if self.failures:
            return {"command": "plan", "failures": self.failures}
        extra = {} if self.wenet_conf is None else {"wenet_conf": self.wenet_conf, "warnings": self.warnings}
        return {"command": "plan", **self.figures, **extra, **self.stamps}

    @property
    def exit_code(self) -> int:
        """1 when a shard of the list could not be read, else 0 (the CLI's exit status)."""
        return 1 if self.failures else 0


def run_plan(shard_args: list[str], settings: PlanSettings, options: RunOptions | None = None) -> PlanResult:
    """The figures of the list ``shard_args`` names (files, folders, globs, data.list files).

    ``options``: jobs (and remote-input settings) of the shards read when no index is given, and
    progress: a stage "read" with a ``done`` per shard (its error when it cannot be read). With
    ``settings.dropped_keys`` the keys the trainer's filter drops are written there (atomically).
    """
    from shardkit.io.inputs import expand_shards
    from shardkit.wenet_conf.load import spec_of_options

    options = options or RunOptions()
    if settings.layout != "wenet":
        return _plan_layout(shard_args, settings)
    if settings.draws is not None and settings.reader != "webdataset":
        raise UsageError("--draws needs --reader webdataset")
    paths = expand_shards(list(shard_args))
    spec = spec_of_options(settings.wenet_conf, settings.tokenizer, settings.dropped_keys)
    result = PlanResult(shards=len(set(paths)))
    utts, secs, view = _sizes(paths, spec, settings, options, result)
    if result.failures:
        return result
    result.figures, result.shown = _figures(utts, secs, settings)
    if view is not None:
        result.wenet_conf, result.warnings = view.report, spec.warnings
        if settings.dropped_keys:
            from shardkit.wenet_conf.report import write_dropped_keys

            write_dropped_keys(settings.dropped_keys, view.dropped_keys)
    return result


def _plan_layout(shard_args: list[str], settings: PlanSettings) -> PlanResult:
    """An existing NeMo tarred dataset (``shard_args``: its manifest) or Shar folder, dealt by its trainer's rules
    (``shardkit.planning.trainers``): NeMo's scatter and replicate, or Lhotse's split_for_dataloading."""
    from shardkit.io.layouts.read import nemo_sizes, shar_sizes
    from shardkit.planning.trainers import trainer_figures

    if len(shard_args) != 1 or settings.wenet_conf or settings.index_files or settings.reader != "wenet":
        raise UsageError(f"--layout {settings.layout} takes one dataset (NeMo: its manifest; Shar: its folder), "
                         "without --index, --reader or --wenet-conf")
    if settings.layout == "nemo":
        sizes, rules = nemo_sizes(shard_args[0], settings.tars), ("nemo-scatter", "nemo-replicate")
    elif settings.layout == "shar":
        sizes, rules = shar_sizes(shard_args[0]), ("shar",)
    else:
        raise UsageError(f"--layout must be wenet, nemo or shar (got {settings.layout!r})")
    shown = [trainer_figures(rule, sizes.names, sizes.utterances, sizes.seconds, world_size=settings.world_size,
                             num_workers=settings.num_workers, batch_size=settings.batch_size) for rule in rules]
    figures = {"layout": sizes.layout, "dataset": shard_args[0], **shown[0],
               **({"replicate": shown[1]} if len(shown) > 1 else {})}
    if sizes.layout == "nemo":
        figures["unsharded"] = sizes.unsharded
    return PlanResult(shards=len(sizes.names), figures=figures, shown=shown)


def _sizes(paths: list[str], spec: TrainerSpec | None, settings: PlanSettings, options: RunOptions,
           result: PlanResult) -> tuple:
    """``(utterances, seconds, ListView or None)`` per listed shard: after the trainer's filter when there is
    a spec (its view holds the report); the shards that failed go into ``result``."""
    index_files = list(settings.index_files)
    if spec is None:
        utts, secs, result.failures = shard_sizes(paths, index_files=index_files, options=options,
                                                  stamps=result.stamps)
        return utts, secs, None
    from shardkit.commands.index import indexed_shards
    from shardkit.wenet_conf.list_view import plan_list
    from shardkit.wenet_conf.simulation import Loader

    loader = Loader(settings.world_size, settings.num_workers, settings.seed, settings.epochs)
    view, result.failures = plan_list(paths, spec, loader, lambda shards: indexed_shards(shards, options, stage="read"),
                                      index_files=index_files)
    return (None, None, None) if view is None else (view.utterances, view.seconds, view)


def _figures(utts, secs, settings: PlanSettings) -> tuple[dict, list[dict]]:
    """``(the JSON document's figures, the tables in the order shown)``: WeNet's split, or for
    ``--reader webdataset`` WebDataset's (split by node and worker), its resampled draw, and WeNet's."""
    from shardkit.planning.partition import plan_figures, plan_figures_webdataset

    sizes = {"world_size": settings.world_size, "num_workers": settings.num_workers, "epochs": settings.epochs,
             "seed": settings.seed}
    figures = plan_figures(utts, secs, **sizes)
    if settings.reader != "webdataset":
        return figures, [figures]
    resampled = plan_figures_webdataset(utts, secs, resampled=True, draws=settings.draws, **sizes)
    wenet = {"reader": "wenet", **figures}
    figures = {**plan_figures_webdataset(utts, secs, **sizes), "resampled": resampled, "wenet": wenet}
    return figures, [figures, resampled, wenet]


def shard_sizes(shards: list[str], *, index_files: list[str] | None = None, options: RunOptions | None = None,
                stamps: dict | None = None):
    """``(utterances, seconds, failures)`` per shard of the list: from indexes when given, else by reading
    (progress: a stage "read" of the distinct shards, a ``done`` per shard; ``options``' jobs).

    With indexes, a listed shard that no index covers is a UsageError (the figures would be wrong), and so
    is an index cut short or a listed shard changed since it was indexed; ``stamps`` (a dict) receives the
    listed shards' stamps (``source_stamps``) and the index files without any (``unchecked_indexes``).
    """
    import numpy as np

    utts = np.zeros(len(shards), np.int64)
    secs = np.zeros(len(shards), np.float64)
    position: dict[str, list[int]] = {}
    for i, s in enumerate(shards):
        position.setdefault(s, []).append(i)
    if index_files:
        _sizes_from_indexes(index_files, position, utts, secs, (options or RunOptions()).events,
                            {} if stamps is None else stamps)
        return utts, secs, []
    return utts, secs, _sizes_by_reading(position, utts, secs, options or RunOptions())


def _sizes_from_indexes(index_files: list[str], position: dict[str, list[int]], utts, secs, events,
                        stamps: dict) -> None:
    """Adds each listed shard's utterances and seconds from the index files; a shard in none is an error, and
    so is an index cut short or a listed shard changed since it was indexed (``shardkit.io.indexmarks``).
    An index without marks is a note on ``events``: it cannot be checked."""
    from shardkit.io.indexfile import is_parquet

    seen: set[str] = set()
    stamps["source_stamps"] = {}
    for path in index_files:
        found, marks = (_parquet_sizes if is_parquet(path) else _jsonl_sizes)(path, position, utts, secs)
        seen |= found
        if marks.note():
            events.note(f"note: {marks.note()}")
            stamps.setdefault("unchecked_indexes", []).append(path)
        marks.check_sources(found, digest=False)  # plan opens no shard: a stat each, not 128 KiB read each
        stamps["source_stamps"].update((s, stamp) for s, stamp in (marks.sources or {}).items() if s in found)
    missing = [s for s in position if s not in seen]
    if missing:
        raise UsageError(f"{len(missing)} listed shards are in no index given with --index "
                         f"(first: {missing[0]})")


def _parquet_sizes(path: str, position: dict[str, list[int]], utts, secs) -> tuple:
    """A Parquet index's sizes, vectorised (columns, not records); the listed shards it holds, its marks."""
    import numpy as np

    from shardkit.io.indexfile import open_parquet_index, shard_sizes_of
    from shardkit.io.indexmarks import parquet_marks

    marks = parquet_marks(path, open_parquet_index(path))
    unique = list(position)
    u_utts, u_secs = np.zeros(len(unique), np.int64), np.zeros(len(unique), np.float64)
    seen = shard_sizes_of(path, {s: i for i, s in enumerate(unique)}, u_utts, u_secs)
    for i, s in enumerate(unique):
        utts[position[s]] += u_utts[i]
        secs[position[s]] += u_secs[i]
    return seen, marks


def _jsonl_sizes(path: str, position: dict[str, list[int]], utts, secs) -> tuple:
    """A JSON lines index's sizes, a record at a time; the listed shards it holds, its marks."""
    counts: dict[str, int] = {}
    seconds: dict[str, float] = {}
    from shardkit.io.indexfile import iter_index
    from shardkit.io.indexmarks import JsonlMarks

    marks = JsonlMarks(path)
    for record in iter_index(path, marks):  # sums in plain dicts: a numpy scalar update per line costs 3x
        shard = record["shard"]
        counts[shard] = counts.get(shard, 0) + 1
        seconds[shard] = seconds.get(shard, 0.0) + record["duration"]
    seen = set()
    for shard, count in counts.items():
        where = position.get(shard)
        if where is not None:
            seen.add(shard)
            utts[where] += count
            secs[where] += seconds[shard]
    return seen, marks.marks


def _sizes_by_reading(position: dict[str, list[int]], utts, secs, options: RunOptions) -> list[dict]:
    """Each distinct listed shard read once (stage "read"); the shards that failed."""
    from shardkit.commands.index import indexed_shards

    failures = []
    for shard, records, error in indexed_shards(list(position), options, stage="read"):
        if error is not None:
            failures.append({"shard": shard, "error": error})
        else:
            utts[position[shard]] = len(records)
            secs[position[shard]] = sum(r["duration"] for r in records)
    return failures
