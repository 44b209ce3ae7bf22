"""balance: equal-duration, equal-count shards for a multi-corpus mix, so no rank starves or waits.

The package is layered so that each half can be read (and tested) alone:

* the planner is pure and lives in ``shardkit.planning.balance``: :func:`plan_balance` takes
  durations per corpus and returns an assignment, deterministic for a seed (weights, shard count,
  remainder, dealing and swaps are described there).
* :mod:`.sources` reads: sources (shards, folders, data.list files or indexes) are indexed, with
  the checks that refuse a mix before anything is written; :mod:`.columns` loads the indexes into
  columns.
* :mod:`.write` writes: where each member lives comes from the index (offset in the decompressed
  tar), so each output shard is written by positioned reads (``os.pread``) in the planned order,
  one member in memory at a time, with a bounded set of open files. Plain sources are read in
  place; a compressed source is first decompressed once to a spool file in
  ``OUT_DIR/.balance/spool`` (the only way to reach its members without re-decompressing it for
  every output shard; it needs free disk equal to the uncompressed size of the compressed
  sources, and is removed at the end).
* :mod:`.report`: the report a run returns, the repeats file, ``merge-reports`` for balance.
* this module is the pipeline, :func:`run_balance`: load, plan, then write, then report. Output
  shards are independent tasks (``-j``, or Ray tasks with ``executor="ray"``), written to a
  temporary name, read back and verified, fsynced and renamed; a journal lets a killed run resume
  and skip the shards it finished. With ``split=(I, N)`` every job of an array computes the same
  plan and writes only block I of the output shards; each job spools into its own
  ``spool.slice-I-of-N`` folder (jobs run at once and end apart), while the indexes of shard
  sources in ``OUT_DIR/.balance/index`` are shared (built atomically, identical bytes) and removed
  by ``merge-reports``.

Progress goes through ``RunOptions.on_event`` (``shardkit.run.events``): a stage "index CORPUS" per
corpus indexed (a ``done`` per shard, with the error of one that cannot be read), the notes
"loading..." and "planning...", then the stages "decompress" (compressed sources spooled) and
"write" (a ``done`` per output shard, its report entry as the result).

Every public name of the submodules (and of the planner) is importable from ``shardkit.commands.balance``;
the pipeline's steps look up what they call here, in this module.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from shardkit.commands.balance.columns import (
    CorpusColumns,
    IndexKeys,
    MixColumns,
    line_refs,
    load_columns,
    read_threads,
)
from shardkit.commands.balance.report import (
    JOURNAL,
    MANIFEST,
    REPEATS,
    WORK_DIR,
    BalanceReport,
    Repeats,
    merge_reports,
    read_repeats,
    recorded_index_files,
    shard_table,
    write_repeats,
)
from shardkit.commands.balance.sources import (
    check_index_marks,
    check_index_slices,
    check_unique_keys,
    iter_repeated_keys,
    recorded_stamps,
    repeated_keys,
    resolve_index_files,
    take_keys,
)
from shardkit.commands.balance.write import (
    MAX_OPEN_SOURCES,
    WriteSettings,
    _init_worker,
    _is_compressed,
    _spool_task,
    _write_task,
    spool_dir_name,
    spool_path,
    write_output_shard,
)
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.mix import CorpusSource, check_corpora, output_paths, parse_corpus_spec, source_stamps
from shardkit.planning.balance import (
    DEFAULT_SHARD_DURATION,
    PLAN_VERSION,
    PLAN_VERSIONS,
    REFINE_FRACTION,
    REMAINDER_POLICIES,
    REPEAT_SUFFIX,
    TOLERANCE_FRACTION,
    BalancePlan,
    PlanSettings,
    apportion,
    plan_balance,
    plan_digest,
    repeat_key,
)
from shardkit.planning.balance.deal import TieOrder
from shardkit.planning.balance.draws import Draws
from shardkit.run.options import RunOptions
from shardkit.run.split import inputs_digest, slice_path, slice_record, with_list

if TYPE_CHECKING:
    from shardkit.run.lifecycle import Journal

__all__ = [
    "DEFAULT_SHARD_DURATION", "JOURNAL", "MANIFEST", "MAX_OPEN_SOURCES", "PLAN_VERSION", "PLAN_VERSIONS",
    "REFINE_FRACTION", "REMAINDER_POLICIES", "REPEAT_SUFFIX", "REPEATS", "TOLERANCE_FRACTION", "WORK_DIR",
    "BalancePlan", "BalanceReport", "BalanceSettings", "CorpusColumns", "CorpusSource", "Draws", "IndexKeys",
    "MixColumns", "PlanSettings", "Repeats", "TieOrder", "WriteSettings", "apportion", "check_corpora",
    "check_index_slices", "check_unique_keys", "iter_repeated_keys", "line_refs", "load_columns", "merge_reports",
    "output_paths", "parse_corpus_spec", "plan_balance", "plan_digest", "read_repeats", "read_threads",
    "recorded_index_files", "repeat_key", "repeated_keys", "resolve_index_files", "run_balance", "shard_table",
    "source_stamps", "spool_dir_name", "spool_path", "take_keys", "write_output_shard", "write_repeats",
]

_KEYS_AHEAD = 200_000  # repeats per corpus whose keys _plan reads while the planner deals (more: after it)


@dataclass(frozen=True)
class BalanceSettings:
    """What a balance run plans and writes (how it runs, its jobs, executor, ``--split``, overwrite and
    progress, is ``RunOptions``).

    ``wenet`` (a ``shardkit.wenet_conf.load.TrainerSpec``, from ``--wenet-conf``): plan only the utterances
    the trainer's filter keeps, and report what it drops and how the output batches; ``dropped_keys``: with
    it, the file the dropped keys are written to. ``part=(I, P)``: plan (and write) only part I of P of every
    corpus, the utterances whose row in the corpus' indexes is I - 1 modulo P (:func:`load_columns`): P such
    runs, each into its own OUT_DIR, plan a mix above one node's memory at 1/P of the peak (docs/guides/large-corpora.md, "Above
    one node's memory"). ``plan_version``: how the planner draws its seeded choices
    (``shardkit.planning.balance``); the same mix, seed and version give the same plan, byte for byte.
    """

    world_size: int
    num_workers: int
    shard_duration: float | None = None
    num_shards: int | None = None
    codec: str = "zst"
    level: int | None = 3
    remainder: str = "pad"
    seed: int = 0
    plan_version: int = PLAN_VERSION
    epochs: int = 3
    verify: bool = True
    dry_run: bool = False
    part: tuple[int, int] | None = None
    wenet: object | None = None
    dropped_keys: str | None = None
    layout: str = "wenet"

    def plan_settings(self) -> PlanSettings:
        """The planner's part of these settings (topology, shard size, remainder, seed, plan version)."""
        return PlanSettings(world_size=self.world_size, num_workers=self.num_workers,
                            shard_duration=self.shard_duration, num_shards=self.num_shards, remainder=self.remainder,
                            seed=self.seed, version=self.plan_version)

    def recorded(self) -> dict:
        """The ``settings`` balance.json records."""
        return {"world_size": self.world_size, "num_workers": self.num_workers, "shard_duration": self.shard_duration,
                "num_shards": self.num_shards, "codec": self.codec, "level": self.level,
                "remainder": self.remainder, "seed": self.seed, "plan_version": self.plan_version,
                **({"part": {"index": self.part[0], "count": self.part[1]}} if self.part is not None else {}),
                **({"layout": self.layout} if self.layout != "wenet" else {})}


@dataclass
class _Planned:
    """What planning hands to writing and reporting: the loaded mix, its plan, the plan's figures, and
    (``--wenet-conf``, ``--part``) the report's fields about them."""

    mix: MixColumns
    plan: BalancePlan
    repeats: Repeats
    figures: dict
    sources: dict
    facts: dict = dataclasses.field(default_factory=dict)


@dataclass
class _Layout:
    """Where a writing run puts everything, fixed before the first byte is written: the output shards,
    the block of them this run writes (all, or one slice of ``--split``), and its report, list,
    journal and spool paths (slice-named with ``--split``, so the jobs of an array never collide)."""

    out_dir: str
    work_dir: str
    split: tuple[int, int] | None
    paths: list[str]
    chosen: range
    slice_info: dict | None
    spool_dir: str
    manifest_path: str
    data_list: str
    journal_path: str
    reports: list[str]


def run_balance(corpora: Sequence[CorpusSource], out_dir: str, settings: BalanceSettings,
                options: RunOptions | None = None) -> BalanceReport:
    """Plan (and unless ``settings.dry_run``, write) balanced shards; see the module docstring.

    ``options``: where indexing, spooling and shard writing run (jobs, executor, Ray address: Ray workers
    must see OUT_DIR and the sources at the same paths), whether finished shards are redone
    (``overwrite``), and where progress goes. ``options.split=(I, N)``: every slice computes the same plan,
    then writes only slice I of N of the output shards, reported as balance.slice-I-of-N.json and
    data.slice-I-of-N.list for ``shardkit merge-reports``. With ``settings.dropped_keys`` the keys the
    trainer's filter drops are written to that file once the run is done.
    """
    started = time.perf_counter()
    options = options or RunOptions()
    _check_run_args(corpora, settings, options.split)
    if settings.layout != "wenet":  # NeMo and Lhotse read plain tars
        settings = dataclasses.replace(settings, codec="none", level=None)
    report = _run(corpora, out_dir, settings, options, started)
    if settings.wenet is not None and settings.dropped_keys:
        from shardkit.wenet_conf.report import write_dropped_keys

        write_dropped_keys(settings.dropped_keys, report.dropped_keys)
    return report


def _run(corpora: Sequence[CorpusSource], out_dir: str, settings: BalanceSettings, options: RunOptions,
         started: float) -> BalanceReport:
    """The run between the checks and the dropped keys: claim OUT_DIR (not for a dry run), load and plan,
    then write this run's block and report it."""
    import tempfile

    _remove_dead_scratch(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix=_scratch_prefix(os.getpid())) as scratch, ExitStack() as stack:
        out_dir, work_dir = _claim_out_dir(stack, scratch, corpora, out_dir, settings.dry_run, options.split)
        if not settings.dry_run:  # a failed or interrupted run leaves no half-made OUT_DIR/.balance (a rerun resumes
            stack.push(_work_dir_remover(work_dir, options.split))  # from the journal); a slice, only its spool
        planned = _load_and_plan(stack, corpora, work_dir, settings, options)
        if settings.dry_run:
            return BalanceReport(None, planned.plan, planned.figures, None,
                                 planned.repeats, True, planned.sources, elapsed=time.perf_counter() - started,
                                 **planned.facts)
        _check_balanced(planned.plan)
        layout = _claim_outputs(corpora, planned, out_dir, work_dir, settings.codec, options.split, settings.layout)
        return _write_and_report(planned, layout, settings, options, started)


SCRATCH_PREFIX = "shardkit-balance-"


def _scratch_prefix(pid: int) -> str:
    import socket

    return f"{SCRATCH_PREFIX}{pid}-{socket.gethostname()}-"


def _remove_dead_scratch(tmp: str) -> None:
    """Remove the scratch folders (``shardkit-balance-<pid>-<host>-<random>`` in ``TMPDIR``) of runs killed on
    this host (SIGKILL: no ``finally`` ran); a live run's stays, and so does another host's (a shared TMPDIR)."""
    import shutil

    from shardkit.io.files import pid_alive

    try:
        names = [n for n in os.listdir(tmp) if n.startswith(SCRATCH_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(SCRATCH_PREFIX):].partition("-")[0]
        if pid.isdigit() and name.startswith(_scratch_prefix(int(pid))) and int(pid) != os.getpid() \
                and not pid_alive(int(pid)):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def _load_and_plan(stack: ExitStack, corpora: Sequence[CorpusSource], work_dir: str, settings: BalanceSettings,
                   options: RunOptions) -> _Planned:
    """Index and load the mix (through the trainer's filter with ``--wenet-conf``), then plan it.

    Without a filter, the unique-key check runs beside the planner (:func:`_plan`), which leaves a core
    idle, and version 1's seeded permutations start while the index is read (the same draws, earlier).
    """
    wenet = settings.wenet
    draws = _drawing_ahead(stack) if wenet is None and settings.plan_version == 1 else None
    ahead = None if draws is None else (lambda c, n: draws.prefetch(n, corpora[c].weight, settings.seed, c,
                                                                    settings.remainder))
    mix, index_files = _load_mix(corpora, work_dir, options, check_keys=wenet is not None, part=settings.part,
                                 on_corpus_loaded=ahead, trainer=wenet)
    trainer = None
    if wenet is not None:  # the trainer's filter, before planning (shardkit.wenet_conf.mix)
        from shardkit.wenet_conf.mix import filter_mix

        mix, trainer = filter_mix(mix, wenet)  # from the columns load_columns read for it
    options.events.note("planning...")
    planned = _plan(corpora, mix, index_files, settings, check_keys=wenet is None, draws=draws)
    planned.facts = _facts(planned, trainer, settings)
    return planned


def _facts(planned: _Planned, trainer, settings: BalanceSettings) -> dict:
    """The report's fields of ``--wenet-conf`` (what the filter drops, the simulated batches) and ``--part``."""
    facts = {} if trainer is None else trainer.report(planned.plan, world_size=settings.world_size,
                                                      num_workers=settings.num_workers, seed=settings.seed,
                                                      epochs=settings.epochs)
    if "dropped_keys" in facts:  # read back now, past the plan's peak, while the index files are there
        facts["dropped_keys"] = list(facts["dropped_keys"])
    if settings.part is not None:
        facts["part"] = {"index": settings.part[0], "count": settings.part[1]}
    return facts


def _write_and_report(planned: _Planned, layout: _Layout, settings: BalanceSettings, options: RunOptions,
                      started: float) -> BalanceReport:
    """Write this run's block, save its report and list, and clean up (all of OUT_DIR/.balance once every
    shard is written; else the spool and indexes, rebuilt by the rerun, while the journal keeps what was
    written)."""
    import shutil

    journal, entries = _write(planned, layout, WriteSettings(codec=settings.codec, level=settings.level,
                                                             verify=settings.verify, layout=settings.layout), options)
    report = dataclasses.replace(_report(planned, layout, entries, started), **planned.facts)
    if settings.layout != "wenet" and not report.failures and layout.split is None:
        from shardkit.io.layouts import finish_layout

        report.layout = finish_layout(settings.layout, layout.out_dir, layout.paths)
    _save_report(report, layout, settings.recorded())
    if not report.failures:
        _clean_up(layout, journal)
    else:
        shutil.rmtree(layout.work_dir if layout.split is None else layout.spool_dir, ignore_errors=True)
    return report


def _drawing_ahead(stack: ExitStack) -> Draws:
    """A :class:`Draws` on one thread of its own; draws the planner did not take are dropped at the end."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    stack.callback(pool.shutdown, wait=False, cancel_futures=True)
    return Draws(pool)


def _work_dir_remover(work_dir: str, split: tuple[int, int] | None) -> Callable[..., bool]:
    """An exit callback for a run that raised (a full disk, Ctrl-C, SIGTERM): it removes OUT_DIR/.balance
    (indexes, spool), or for a ``--split`` slice its own spool folder (the indexes are the other slices' too),
    and then OUT_DIR/.balance if that left it empty."""
    def remove(exc_type, exc, tb) -> bool:
        if exc_type is not None:
            import shutil

            shutil.rmtree(work_dir if split is None else os.path.join(work_dir, spool_dir_name(split)),
                          ignore_errors=True)
            _remove_if_empty(work_dir)
        return False
    return remove


def _remove_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:  # another slice's spool or the shared indexes are still in it
        pass


# --- the steps of run_balance, in order ------------------------------------------------------


def _check_run_args(corpora: Sequence[CorpusSource], settings: BalanceSettings,
                    split: tuple[int, int] | None) -> None:
    """Refuse bad arguments before the output folder is claimed or any source indexed."""
    check_corpora(corpora)
    if settings.world_size < 1 or settings.num_workers < 1:
        raise UsageError(f"--world-size and --num-workers must be >= 1 (got {settings.world_size} and "
                         f"{settings.num_workers})")
    if settings.remainder not in REMAINDER_POLICIES:
        raise UsageError(f"--remainder must be one of {', '.join(REMAINDER_POLICIES)}")
    if settings.plan_version not in PLAN_VERSIONS:
        raise UsageError(f"--plan-version must be one of {', '.join(map(str, PLAN_VERSIONS))} "
                         f"(got {settings.plan_version!r})")
    from shardkit.io.layouts import check_layout

    check_layout(settings.layout)
    if split is not None and settings.dry_run:
        raise UsageError("--split writes a slice of the shards and --dry-run writes none; plan without --split")


def _claim_out_dir(stack: ExitStack, scratch: str, corpora: Sequence[CorpusSource], out_dir: str, dry_run: bool,
                   split: tuple[int, int] | None) -> tuple[str, str]:
    """(out_dir, work_dir): a dry run indexes into ``scratch`` and touches no OUT_DIR; a writing run
    holds OUT_DIR's lock (released by ``stack``) and keeps its indexes and spool in OUT_DIR/.balance."""
    if dry_run:
        return out_dir, scratch
    from shardkit.run.lifecycle import claimed_output_dir

    out_dir, _ = stack.enter_context(claimed_output_dir(
        out_dir, [s for c in corpora for s in c.sources if os.path.isfile(s)], "balance", split, urls=False))
    return out_dir, os.path.join(out_dir, WORK_DIR)


def _load_mix(corpora: Sequence[CorpusSource], work_dir: str, options: RunOptions, *, check_keys: bool = True,
              part: tuple[int, int] | None = None, on_corpus_loaded: Callable[[int, int], None] | None = None,
              trainer=None) -> tuple[MixColumns, list[list[str]]]:
    """Index the corpora's shard sources and read every index into columns; refuse an empty corpus or
    (unless ``check_keys`` is false: then :func:`_plan` checks) a key twice, since either would make a
    plan that cannot be written. ``trainer`` (``--wenet-conf``'s TrainerSpec): the same read also
    collects the columns its filter needs. ``options``: how indexing runs, and where its progress goes."""
    events = options.events
    index_files = resolve_index_files(corpora, os.path.join(work_dir, "index"), options, events)
    events.note("loading...")
    names = [c.name for c in corpora]
    mix = load_columns(names, index_files, part, on_corpus_loaded, trainer_columns=trainer is not None,
                       txt_members=trainer is not None and trainer.tokenizer is not None)
    for name, corpus in zip(names, mix.corpora):
        if not len(corpus.durations):
            raise UsageError(f"corpus {name!r} is empty (no utterances in its sources)")
    check_index_marks(mix, events)
    if check_keys:
        check_unique_keys(mix)
    return mix, index_files


def _plan(corpora: Sequence[CorpusSource], mix: MixColumns, index_files: list[list[str]], settings: BalanceSettings,
          *, check_keys: bool = False, draws: Draws | None = None) -> _Planned:
    """The plan and everything reported about it. Pure (no I/O): a dry run stops after this step,
    and every job of a ``--split`` array computes the same result.

    ``check_keys``: run :func:`check_unique_keys` in a thread beside the planner (whose last steps use
    one core); a key twice is still the error reported first, before any the planner raises. A writing
    run (not ``settings.dry_run``) reads the repeats' keys ahead, as the planner deals (a dry run only
    counts them).
    """
    from concurrent.futures import ThreadPoolExecutor

    from shardkit.planning.partition import plan_figures

    names = [c.name for c in corpora]
    known: dict[int, tuple] = {}
    keys_read = not settings.dry_run or Repeats.check_reads_keys(mix)

    def read_ahead(c: int, utts: np.ndarray) -> None:  # the repeats' keys, read while the planner deals
        if keys_read and 0 < len(utts) <= _KEYS_AHEAD:
            unique = np.unique(utts)
            known[c] = (unique, pool.submit(_keys_released, mix.corpora[c], unique))

    with ThreadPoolExecutor(1) as pool:
        checked = pool.submit(check_unique_keys, mix) if check_keys else None
        try:
            plan = plan_balance([c.durations for c in mix.corpora], [c.weight for c in corpora],
                                settings.plan_settings(), names=names, threads=min(os.cpu_count() or 1, 8),
                                draws=draws, on_repeats=read_ahead)
        finally:
            if checked is not None:
                checked.result()
        repeats = Repeats(plan, mix, {c: (u, f.result()) for c, (u, f) in known.items()})
        repeats.check()  # a clash is refused now, before a shard is written
    figures = plan_figures(np.full(plan.num_shards, plan.utts_per_shard), plan.shard_seconds,
                           world_size=settings.world_size, num_workers=settings.num_workers, epochs=settings.epochs,
                           seed=settings.seed)
    sources = {name: {"sources": list(c.sources), "index_files": files, **recorded_stamps(mix, files)}
               for name, c, files in zip(names, corpora, index_files)}
    return _Planned(mix, plan, repeats, figures, sources)


def _keys_released(corpus: CorpusColumns, utts: np.ndarray) -> list[str]:
    """take_keys, then the row groups' buffers handed back (it runs while the planner is at its peak)."""
    import sys

    keys = take_keys(corpus, utts)
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    return keys


def _check_balanced(plan: BalancePlan) -> None:
    """A dry run reports an unbalanced plan; a writing run refuses it before writing a shard."""
    if not plan.balanced:
        raise ShardkitError(f"cannot balance within tolerance: the worst shard is {plan.max_deviation:.3f} s off "
                            f"the mean (tolerance {plan.tolerance:.3f} s); ask for longer or fewer shards")


def _claim_outputs(corpora: Sequence[CorpusSource], planned: _Planned, out_dir: str, work_dir: str, codec: str,
                   split: tuple[int, int] | None, output_layout: str = "wenet") -> _Layout:
    """Name every output, refuse outputs that would replace an input, and pick this run's block."""
    from shardkit.run.lifecycle import claim_output

    plan, mix = planned.plan, planned.mix
    inputs = set(mix.shards) | set(mix.index_files) | {os.path.abspath(s) for c in corpora for s in c.sources
                                                         if os.path.isfile(s)}
    if output_layout == "wenet":
        paths = output_paths(out_dir, plan.num_shards, codec)
    else:
        from shardkit.io.layouts import shard_paths

        paths = shard_paths(output_layout, out_dir, plan.num_shards)
    claim_output(out_dir, sorted(inputs), paths, what="OUT_DIR")
    return _layout(out_dir, work_dir, paths, plan, split)


def _layout(out_dir: str, work_dir: str, paths: list[str], plan: BalancePlan,
            split: tuple[int, int] | None) -> _Layout:
    """The block of shards this run writes and where it reports. Pure: with ``split``, a slice
    records the plan's digest so that ``merge-reports`` refuses slices of different plans."""
    chosen = range(plan.num_shards)
    slice_info = None
    if split is not None:  # every slice planned the same shards; each writes its own block of them
        slice_info = slice_record(paths, *split)
        slice_info["inputs_sha256"] = inputs_digest(paths + [plan_digest(plan)])
        chosen = range(slice_info["start"], slice_info["stop"])
    manifest_path = os.path.join(out_dir, MANIFEST)
    data_list = os.path.join(out_dir, "data.list")
    journal_path = os.path.join(out_dir, JOURNAL)
    reports = [manifest_path]
    if split is not None:
        manifest_path, data_list, journal_path = (slice_path(p, *split) for p in (manifest_path, data_list,
                                                                                   journal_path))
        reports.insert(0, manifest_path)
    return _Layout(out_dir, work_dir, split, paths, chosen, slice_info, os.path.join(work_dir, spool_dir_name(split)),
                   manifest_path, data_list, journal_path, reports)




def _write(planned: _Planned, layout: _Layout, settings: WriteSettings,
           options: RunOptions) -> tuple[Journal, dict[str, dict]]:
    """Spool, then write this run's block of shards; (the journal, each output path's entry).

    The journal is left in place (closed) for the report step: it goes only once every shard is written.
    """
    from shardkit.io.files import remove_leftovers
    from shardkit.run.lifecycle import Journal

    read_paths = _spool_sources(planned, layout, options)
    record_files = line_refs(planned.mix, os.path.join(layout.spool_dir, "records"))
    journal = Journal(layout.journal_path)
    previous = {} if options.overwrite else _previous_entries(layout, journal)
    remove_leftovers(layout.paths[s] for s in layout.chosen)  # temporary files of a killed run (its lock died with it)
    tasks = _write_tasks(planned, layout, settings, previous)
    events = options.events
    events.stage("write", len(tasks))
    entries: dict[str, dict] = {}
    try:
        for _, entry in options.run_tasks(_write_task, tasks, initializer=_init_worker,
                                          initargs=(record_files, read_paths), on_error=_failed_write):
            entries[entry["path"]] = entry
            if entry["status"] == "ok":
                journal.append(entry)
            events.done(entry)
    finally:
        journal.close(remove=False)
    return journal, entries


def _failed_write(task: tuple, err: ShardkitError) -> dict:
    """The entry of an output shard whose task raised (its worker died, a Ray task failed)."""
    return {"path": task[0], "spec": None, "status": "failed", "error": str(err.located(shard=task[0])),
            "seconds_taken": 0.0}


def _used_sources(planned: _Planned, chosen: range) -> list[int]:
    """Ids (in ``mix.shards``) of the sources the shards in ``chosen`` read, sorted: a slice spools only these."""
    plan, mix = planned.plan, planned.mix
    positions = np.concatenate([np.arange(plan.shard_slice(s).start, plan.shard_slice(s).stop) for s in chosen]) \
        if len(chosen) else np.zeros(0, np.int64)
    return sorted({int(mix.corpora[c].shard[u]) for c, u in zip(plan.corpus[positions], plan.utt[positions])})


def _spool_sources(planned: _Planned, layout: _Layout, options: RunOptions) -> dict[str, str]:
    """Where each source the block reads is read: in place if plain, else its spool (decompressed here).

    An unreadable source fails the output shards that need it (they cannot open its spool), not the run.
    """
    read_paths = {}
    spool_tasks = []
    for sid in _used_sources(planned, layout.chosen):
        src = planned.mix.shards[sid]
        if _is_compressed(src):
            read_paths[src] = spool_path(layout.spool_dir, src)
            spool_tasks.append((src, read_paths[src]))
    if spool_tasks:
        os.makedirs(layout.spool_dir, exist_ok=True)
        events = options.events
        events.stage("decompress", len(spool_tasks))
        for _, (src, error) in options.run_tasks(_spool_task, spool_tasks, on_error=_spool_failed):
            events.done({"shard": src}, error=error)
    return read_paths


def _spool_failed(task: tuple, err: ShardkitError) -> tuple[str, str]:
    """A spool task that raised: that source's failure, unless the spool could not be written (a full disk),
    which is the run's error, naming the spool file."""
    from shardkit.io.files import OutputError

    if isinstance(err, OutputError):
        raise err
    return task[0], str(err.located(shard=task[0]))


def _previous_entries(layout: _Layout, journal: Journal) -> dict[str, dict]:
    """A finished run's entry per output path (its reports, then the journal of a killed run), so a
    rerun skips the shards whose spec and bytes are unchanged."""
    from shardkit.io.files import load_json

    previous = {}
    for entry in [e for path in layout.reports for e in (load_json(path) or {}).get("shards", [])] + journal.load():
        if entry.get("path"):
            previous[entry["path"]] = entry
    return previous


def _write_tasks(planned: _Planned, layout: _Layout, settings: WriteSettings,
                 previous: dict[str, dict]) -> list[tuple]:
    """One task per output shard of the block: its members as (index file id, line offset, copy), so
    a task carries numbers, not records, and a worker reads the records itself."""
    plan, mix = planned.plan, planned.mix
    tasks = []
    for s in layout.chosen:
        dst = layout.paths[s]
        part = plan.shard_slice(s)
        refs = []
        for c, u, k in zip(plan.corpus[part], plan.utt[part], plan.copy[part]):
            col = mix.corpora[c]
            refs.append((int(col.line_file[u]), int(col.line_offset[u]), int(k)))
        tasks.append((dst, refs, settings, previous.get(dst)))
    return tasks


def _report(planned: _Planned, layout: _Layout, entries: dict[str, dict], started: float) -> BalanceReport:
    """The block's rows of the shard table with what writing made of each; a skipped shard is ``ok``
    in the table (it is there, unchanged) and ``skipped`` only in what this run did."""
    from shardkit.run.lifecycle import this_run

    table = shard_table(planned.plan, layout.paths)[layout.chosen.start:layout.chosen.stop]
    for row in table:
        entry = entries[row["path"]]
        row.update({k: entry.get(k) for k in ("status", "size", "sha256", "members", "members_digest", "spec",
                                               "error")})
        if row["status"] == "skipped":
            row["status"] = "ok"
    failures = [{"shard": e["path"], "error": e["error"]} for e in entries.values() if e["status"] == "failed"]
    report = BalanceReport(layout.out_dir, planned.plan, planned.figures, table, planned.repeats, False,
                           planned.sources, failures, elapsed=time.perf_counter() - started,
                           slice=layout.slice_info)
    for row in report.shards:
        row["status_this_run"] = entries[row["path"]]["status"]
        row["this_run"] = this_run(row["status_this_run"])
    return report


def _save_report(report: BalanceReport, layout: _Layout, settings: dict) -> None:
    """data.list (the shards that are there) and balance.json (or their slice-named files)."""
    from shardkit import __version__
    from shardkit.io.files import publish_list
    from shardkit.io.files import atomic_write_json

    table = report.shards
    # a failed shard: data.partial.list, so that no list that looks finished lacks a shard
    listed = [r["path"] for r in table if r["status"] == "ok"]
    report.data_list_path = publish_list(layout.data_list, listed, complete=not report.failures)
    removed = not report.failures and layout.split is None  # then OUT_DIR/.balance goes, with the indexes built there
    recorded_sources = {name: recorded_index_files(entry, layout.work_dir, removed)
                        for name, entry in report.sources.items()}
    atomic_write_json(layout.manifest_path, {
        **({"slice": with_list(layout.slice_info, listed)} if layout.slice_info else {}),
        "tool": "shardkit", "version": __version__, "command": "balance",
        "settings": settings,
        "summary": report.plan.summary(), "sources": recorded_sources, "shards": [
            {k: v for k, v in row.items() if k != "status_this_run"} for row in table],
        "plan": report.figures, "repeat_key_format": "{key}" + REPEAT_SUFFIX,
        "repeats_file": write_repeats(layout.out_dir, report.repeats), "repeated_copies": len(report.repeats),
        **({"wenet_conf": report.wenet_conf} if report.wenet_conf is not None else {})})


def _clean_up(layout: _Layout, journal: Journal) -> None:
    """Once every shard of the block is written: its journal goes, and OUT_DIR/.balance with it; a
    slice leaves the shared indexes to the other slices (merge-reports removes them)."""
    import shutil

    journal.close(remove=True)
    shutil.rmtree(layout.work_dir if layout.split is None else layout.spool_dir, ignore_errors=True)
    _remove_if_empty(layout.work_dir)
