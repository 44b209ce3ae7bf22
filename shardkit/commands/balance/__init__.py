"""balance: equal-duration, equal-count shards for a multi-corpus mix, so no rank starves or waits.

The package is layered so that each half can be read (and tested) alone:

* :mod:`.plan` is pure: :func:`plan_balance` takes durations per corpus and returns an
  assignment, deterministic for a seed (weights, shard count, remainder, dealing and swaps are
  described there).
* :mod:`.sources` reads: sources (shards, folders, data.list files or indexes) are indexed and
  their indexes loaded into columns, with the checks that refuse a mix before anything is written.
* :mod:`.write` writes: where each member lives comes from the index (offset in the decompressed
  tar), so each output shard is written by positioned reads (``os.pread``) in the planned order,
  one member in memory at a time, with a bounded set of open files. Plain sources are read in
  place; a compressed source is first decompressed once to a spool file in
  ``OUT_DIR/.balance/spool`` (the only way to reach its members without re-decompressing it for
  every output shard; it needs free disk equal to the uncompressed size of the compressed
  sources, and is removed at the end).
* this module is the pipeline, :func:`run_balance`: load, plan, then write, then report. Output
  shards are independent tasks (``-j``, or Ray tasks with ``executor="ray"``), written to a
  temporary name, read back and verified, fsynced and renamed; a journal lets a killed run resume
  and skip the shards it finished. With ``split=(I, N)`` every job of an array computes the same
  plan and writes only block I of the output shards; each job spools into its own
  ``spool.slice-I-of-N`` folder (jobs run at once and end apart), while the indexes of shard
  sources in ``OUT_DIR/.balance/index`` are shared (built atomically, identical bytes) and removed
  by ``merge-reports``.

Every name of the submodules that was importable from ``shardkit.commands.balance`` before the
split still is; the pipeline's steps look up what they call here, in this module.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from shardkit.commands.balance.plan import (
    DEFAULT_SHARD_DURATION,
    PLAN_VERSION,
    PLAN_VERSIONS,
    REFINE_FRACTION,
    REMAINDER_POLICIES,
    REPEAT_SUFFIX,
    TOLERANCE_FRACTION,
    BalancePlan,
    Draws,
    TieOrder,
    apportion,
    plan_balance,
    plan_digest,
    repeat_key,
)
from shardkit.commands.balance.sources import (
    CorpusColumns,
    CorpusSource,
    IndexKeys,
    MixColumns,
    check_corpora,
    check_index_slices,
    check_unique_keys,
    iter_repeated_keys,
    line_refs,
    load_columns,
    parse_corpus_spec,
    repeated_keys,
    resolve_index_files,
    source_stamps,
    take_keys,
)
from shardkit.commands.balance.write import (
    MAX_OPEN_SOURCES,
    WriteSettings,
    _init_worker,
    _is_compressed,
    _spool_task,
    _write_task,
    output_paths,
    spool_dir_name,
    spool_path,
    write_output_shard,
)
from shardkit.errors import ShardkitError, UsageError
from shardkit.run.executor import run_tasks
from shardkit.run.split import inputs_digest, slice_path, slice_record

if TYPE_CHECKING:
    from shardkit.run.lifecycle import Journal

__all__ = [
    "DEFAULT_SHARD_DURATION", "JOURNAL", "MANIFEST", "MAX_OPEN_SOURCES", "PLAN_VERSION", "PLAN_VERSIONS",
    "REFINE_FRACTION", "REMAINDER_POLICIES", "TieOrder",
    "REPEAT_SUFFIX", "TOLERANCE_FRACTION", "WORK_DIR", "BalancePlan", "BalanceReport", "CorpusColumns", "Draws",
    "CorpusSource", "IndexKeys", "MixColumns", "WriteSettings", "apportion", "check_corpora", "check_index_slices",
    "check_unique_keys", "iter_repeated_keys", "line_refs", "load_columns", "merge_reports", "output_paths", "parse_corpus_spec", "plan_balance",
    "plan_digest", "read_repeats", "recorded_index_files", "repeat_key", "repeated_keys", "resolve_index_files", "run_balance",
    "shard_table", "source_stamps", "take_keys", "spool_dir_name", "spool_path", "write_output_shard",
]

MANIFEST = "balance.json"
_KEYS_AHEAD = 200_000  # repeats per corpus whose keys _plan reads while the planner deals (more: after it)
# [original key, output key] of every repeat, one JSON array a line: beside balance.json, not in it, so the
# report stays small (a weight of 2 on a 10 M-utterance corpus is 10 M repeats); every slice writes the same
REPEATS = "balance.repeats.jsonl"
WORK_DIR = ".balance"
JOURNAL = ".balance.journal.jsonl"


def shard_table(plan: BalancePlan, mix: MixColumns, paths: Sequence[str] | None) -> list[dict]:
    """One report row per planned shard (paths None in a dry run); writing adds what became of each."""
    secs = plan.shard_seconds
    counts = plan.shard_corpus_counts
    return [{"shard": s, "path": paths[s] if paths else None, "utterances": plan.utts_per_shard,
             "seconds": round(float(secs[s]), 3),
             "corpora": {name: int(counts[s, c]) for c, name in enumerate(plan.names)}}
            for s in range(plan.num_shards)]


class Repeats:
    """Every repeat's ``[original key, output key]``, corpus by corpus in index order: counted from the plan,
    and read a chunk at a time whenever iterated (:func:`iter_repeated_keys`), never held whole (a weight of
    2 on a 10 M-utterance corpus is 10 M pairs). ``known``: keys read ahead, as iter_repeated_keys takes them."""

    def __init__(self, plan: BalancePlan, mix: MixColumns, known: dict | None = None):
        self._plan, self._mix, self._known = plan, mix, known
        self.count = int(np.count_nonzero(plan.copy > 0))

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for pairs in iter_repeated_keys(self._plan, self._mix, self._known):
            yield from pairs

    @staticmethod
    def check_reads_keys(mix: MixColumns) -> bool:
        """Whether :meth:`check` must read the repeats' keys: every new name holds REPEAT_MARK, so not when
        loading found no real key that does (``mix.repeat_like`` empty: nearly always)."""
        return mix.repeat_like is None or bool(mix.repeat_like)

    def check(self) -> None:
        """Refuse a repeat's new name that is a real key, reading every repeat's key once, a chunk at a time
        (only when a clash is possible: :meth:`check_reads_keys`)."""
        if not self.check_reads_keys(self._mix):
            return
        for _ in iter_repeated_keys(self._plan, self._mix, self._known):
            pass


@dataclass
class BalanceReport:
    """What a run returns (and the CLI prints): the plan, its figures and the rows of the shards this run owns."""

    out_dir: str | None
    plan: BalancePlan
    figures: dict
    shards: list[dict]
    repeats: Repeats
    dry_run: bool
    sources: dict
    failures: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    slice: dict | None = None  # with --split: the slice of the output shards this run wrote
    part: dict | None = None  # with --part: {"index": I, "count": P}, the part of every corpus planned
    wenet_conf: dict | None = None  # with --wenet-conf: what the trainer's filter drops and how it batches
    warnings: list[str] = field(default_factory=list)
    dropped_keys: list[str] = field(default_factory=list)
    data_list_path: str | None = None  # where the list went (data.partial.list after a failed shard)

    def _named(self, name: str) -> str | None:
        if self.dry_run:
            return None
        path = os.path.join(self.out_dir, name)
        return slice_path(path, self.slice["index"], self.slice["count"]) if self.slice else path

    def summary(self) -> dict:
        counts = {s: sum(1 for e in self.shards if e.get("status_this_run") == s) for s in ("ok", "skipped", "failed")}
        return {"command": "balance", "dry_run": self.dry_run, "out_dir": self.out_dir,
                "data_list": self.data_list_path or self._named("data.list"), "manifest": self._named(MANIFEST),
                **({"slice": self.slice} if self.slice else {}), **({"part": self.part} if self.part else {}),
                **self.plan.summary(), "written": counts,
                "this_run": {"done": counts["ok"], "skipped": counts["skipped"], "failed": counts["failed"]},
                "failures": self.failures,
                "plan": self.figures, "repeated_copies": len(self.repeats),
                **({"wenet_conf": self.wenet_conf, "warnings": self.warnings} if self.wenet_conf is not None else {}),
                "elapsed_seconds": round(self.elapsed, 3)}

    @property
    def exit_code(self) -> int:
        return 1 if self.failures or not self.plan.balanced else 0


@dataclass
class _Planned:
    """What planning hands to writing and reporting: the loaded mix, its plan, and the plan's figures."""

    mix: MixColumns
    plan: BalancePlan
    repeats: Repeats
    figures: dict
    sources: dict


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


def run_balance(corpora: Sequence[CorpusSource], out_dir: str, *, world_size: int, num_workers: int,
                shard_duration: float | None = None, num_shards: int | None = None, codec: str = "zst",
                level: int | None = 3, remainder: str = "pad", seed: int = 0, dry_run: bool = False,
                jobs: int = 1, epochs: int = 3, verify: bool = True, overwrite: bool = False,
                on_event: Callable[..., None] | None = None, executor: str = "local", ray_address: str | None = None,
                split: tuple[int, int] | None = None, wenet=None, part: tuple[int, int] | None = None,
                plan_version: int = PLAN_VERSION) -> BalanceReport:
    """Plan (and unless ``dry_run``, write) balanced shards; see the module docstring.

    ``executor``/``ray_address``: where indexing, spooling and shard writing run (shardkit.run.executor;
    Ray workers must see OUT_DIR and the sources at the same paths). ``split=(I, N)``: every slice
    computes the same plan, then writes only slice I of N of the output shards, reported as
    balance.slice-I-of-N.json and data.slice-I-of-N.list for ``shardkit merge-reports``.
    ``wenet`` (a ``shardkit.commands.trainer.TrainerSpec``, from ``--wenet-conf``): plan only the
    utterances the trainer's filter keeps, and report what it drops and how the output batches.
    ``part=(I, P)``: plan (and write) only part I of P of every corpus, the utterances whose row in the
    corpus' indexes is I - 1 modulo P (:func:`load_columns`): P such runs, each into its own OUT_DIR, plan
    a mix above one node's memory at 1/P of the peak (README, "Above one node's memory").
    ``plan_version``: how the planner draws its seeded choices (:mod:`.plan`); the same mix, seed and
    version give the same plan, byte for byte.
    """
    import tempfile

    started = time.perf_counter()
    event = on_event or (lambda *a, **k: None)
    where = {"jobs": jobs, "executor": executor, "ray_address": ray_address}
    _check_run_args(corpora, world_size, num_workers, remainder, split, dry_run, plan_version)
    with tempfile.TemporaryDirectory(prefix="shardkit-balance-") as scratch, ExitStack() as stack:
        out_dir, work_dir = _claim_out_dir(stack, scratch, corpora, out_dir, dry_run, split)
        if not dry_run and split is None:  # a failed run leaves no half-made OUT_DIR/.balance (Ctrl-C: a rerun resumes)
            stack.push(_work_dir_remover(work_dir))
        # without a filter, the unique-key check runs beside the planner (_plan), which leaves a core idle,
        # and the planner's seeded permutations start while the index is read (the same draws, earlier)
        draws = _drawing_ahead(stack) if wenet is None and plan_version == 1 else None
        ahead = None if draws is None else (lambda c, n: draws.prefetch(n, corpora[c].weight, seed, c, remainder))
        mix, index_files = _load_mix(corpora, work_dir, event, check_keys=wenet is not None, part=part,
                                     on_corpus_loaded=ahead, trainer=wenet, **where)
        trainer = None
        if wenet is not None:  # the trainer's filter, before planning (shardkit.commands.trainer)
            from shardkit.commands.trainer import filter_mix

            mix, trainer = filter_mix(mix, wenet)  # from the columns load_columns read for it
        event("planning")
        planned = _plan(corpora, mix, index_files, world_size=world_size, num_workers=num_workers,
                        shard_duration=shard_duration, num_shards=num_shards, remainder=remainder, seed=seed,
                        epochs=epochs, check_keys=wenet is None, draws=draws, version=plan_version,
                        writing=not dry_run)
        wenet_facts = {} if trainer is None else trainer.report(planned.plan, world_size=world_size,
                                                                num_workers=num_workers, seed=seed, epochs=epochs)
        if "dropped_keys" in wenet_facts:  # read back now, past the plan's peak, while the index files are there
            wenet_facts["dropped_keys"] = list(wenet_facts["dropped_keys"])
        if part is not None:
            wenet_facts["part"] = {"index": part[0], "count": part[1]}
        if dry_run:
            return BalanceReport(None, planned.plan, planned.figures, shard_table(planned.plan, mix, None),
                                 planned.repeats, True, planned.sources, elapsed=time.perf_counter() - started,
                                 **wenet_facts)
        _check_balanced(planned.plan)
        layout = _claim_outputs(corpora, planned, out_dir, work_dir, codec, split)
        journal, entries = _write(planned, layout, WriteSettings(codec=codec, level=level, verify=verify),
                                  event, overwrite=overwrite, **where)
        report = dataclasses.replace(_report(planned, layout, entries, started), **wenet_facts)
        _save_report(report, layout, {"world_size": world_size, "num_workers": num_workers,
                                       "shard_duration": shard_duration, "num_shards": num_shards, "codec": codec,
                                       "level": level, "remainder": remainder, "seed": seed,
                                       "plan_version": plan_version,
                                       **({"part": report.part} if part is not None else {})})
        if not report.failures:
            _clean_up(layout, journal)
        else:  # the spool and indexes are rebuilt by the rerun; the journal (beside them) keeps what was written
            import shutil

            shutil.rmtree(work_dir if split is None else layout.spool_dir, ignore_errors=True)
        return report


def _drawing_ahead(stack: ExitStack) -> Draws:
    """A :class:`Draws` on one thread of its own; draws the planner did not take are dropped at the end."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    stack.callback(pool.shutdown, wait=False, cancel_futures=True)
    return Draws(pool)


def _work_dir_remover(work_dir: str) -> Callable[..., bool]:
    """An exit callback that removes OUT_DIR/.balance (indexes, spool) when the run raised."""
    def remove(exc_type, exc, tb) -> bool:
        if exc_type is not None:
            import shutil

            shutil.rmtree(work_dir, ignore_errors=True)
        return False
    return remove


# --- the steps of run_balance, in order ------------------------------------------------------


def _check_run_args(corpora: Sequence[CorpusSource], world_size: int, num_workers: int, remainder: str,
                    split: tuple[int, int] | None, dry_run: bool, plan_version: int = PLAN_VERSION) -> None:
    """Refuse bad arguments before the output folder is claimed or any source indexed."""
    check_corpora(corpora)
    if world_size < 1 or num_workers < 1:
        raise UsageError(f"--world-size and --num-workers must be >= 1 (got {world_size} and {num_workers})")
    if remainder not in REMAINDER_POLICIES:
        raise UsageError(f"--remainder must be one of {', '.join(REMAINDER_POLICIES)}")
    if plan_version not in PLAN_VERSIONS:
        raise UsageError(f"--plan-version must be one of {', '.join(map(str, PLAN_VERSIONS))} (got {plan_version!r})")
    if split is not None and dry_run:
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


def _load_mix(corpora: Sequence[CorpusSource], work_dir: str, event: Callable[..., None], *, jobs: int,
              executor: str, ray_address: str | None, check_keys: bool = True,
              part: tuple[int, int] | None = None,
              on_corpus_loaded: Callable[[int, int], None] | None = None,
              trainer=None) -> tuple[MixColumns, list[list[str]]]:
    """Index the corpora's shard sources and read every index into columns; refuse an empty corpus or
    (unless ``check_keys`` is false: then :func:`_plan` checks) a key twice, since either would make a
    plan that cannot be written. ``trainer`` (``--wenet-conf``'s TrainerSpec): the same read also
    collects the columns its filter needs."""
    index_files = resolve_index_files(corpora, os.path.join(work_dir, "index"), jobs=jobs,
                                      on_index=lambda *a: event("indexed", *a),
                                      on_corpus=lambda *a: event("indexing", *a), executor=executor,
                                      ray_address=ray_address)
    event("loading", sum(len(f) for f in index_files))
    names = [c.name for c in corpora]
    mix = load_columns(names, index_files, part, on_corpus_loaded, trainer_columns=trainer is not None,
                       txt_members=trainer is not None and trainer.tokenizer is not None)
    for name, corpus in zip(names, mix.corpora):
        if not len(corpus.durations):
            raise UsageError(f"corpus {name!r} is empty (no utterances in its sources)")
    if check_keys:
        check_unique_keys(mix)
    return mix, index_files


def _plan(corpora: Sequence[CorpusSource], mix: MixColumns, index_files: list[list[str]], *, world_size: int,
          num_workers: int, shard_duration: float | None, num_shards: int | None, remainder: str, seed: int,
          epochs: int, check_keys: bool = False, draws: Draws | None = None, version: int = PLAN_VERSION,
          writing: bool = True) -> _Planned:
    """The plan and everything reported about it. Pure (no I/O): a dry run stops after this step,
    and every job of a ``--split`` array computes the same result.

    ``check_keys``: run :func:`check_unique_keys` in a thread beside the planner (whose last steps use
    one core); a key twice is still the error reported first, before any the planner raises.
    ``writing``: the repeats' keys will be written (a dry run only counts them).
    """
    from concurrent.futures import ThreadPoolExecutor

    from shardkit.planning.partition import plan_figures

    names = [c.name for c in corpora]
    known: dict[int, tuple] = {}
    keys_read = writing or Repeats.check_reads_keys(mix)

    def read_ahead(c: int, utts: np.ndarray) -> None:  # the repeats' keys, read while the planner deals
        if keys_read and 0 < len(utts) <= _KEYS_AHEAD:
            unique = np.unique(utts)
            known[c] = (unique, pool.submit(_keys_released, mix.corpora[c], unique))

    with ThreadPoolExecutor(1) as pool:
        checked = pool.submit(check_unique_keys, mix) if check_keys else None
        try:
            plan = plan_balance([c.durations for c in mix.corpora], [c.weight for c in corpora],
                                world_size=world_size, num_workers=num_workers, shard_duration=shard_duration,
                                num_shards=num_shards, remainder=remainder, seed=seed, names=names,
                                threads=min(os.cpu_count() or 1, 8), draws=draws, on_repeats=read_ahead,
                                version=version)
        finally:
            if checked is not None:
                checked.result()
        repeats = Repeats(plan, mix, {c: (u, f.result()) for c, (u, f) in known.items()})
        repeats.check()  # a clash is refused now, before a shard is written
    figures = plan_figures(np.full(plan.num_shards, plan.utts_per_shard), plan.shard_seconds,
                           world_size=world_size, num_workers=num_workers, epochs=epochs, seed=seed)
    sources = {name: {"sources": list(c.sources), "index_files": files}
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
                   split: tuple[int, int] | None) -> _Layout:
    """Name every output, refuse outputs that would replace an input, and pick this run's block."""
    from shardkit.run.lifecycle import claim_output

    plan, mix = planned.plan, planned.mix
    inputs = set(mix.shards) | set(mix.index_files) | {os.path.abspath(s) for c in corpora for s in c.sources
                                                         if os.path.isfile(s)}
    paths = output_paths(out_dir, plan.num_shards, codec)
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


def _write(planned: _Planned, layout: _Layout, settings: WriteSettings, event: Callable[..., None], *,
           overwrite: bool, jobs: int, executor: str, ray_address: str | None) -> tuple[Journal, dict[str, dict]]:
    """Spool, then write this run's block of shards; (the journal, each output path's entry).

    The journal is left in place (closed) for the report step: it goes only once every shard is written.
    """
    from shardkit.run.lifecycle import Journal, remove_leftovers

    read_paths = _spool_sources(planned, layout, event, jobs=jobs, executor=executor, ray_address=ray_address)
    record_files = line_refs(planned.mix, os.path.join(layout.spool_dir, "records"))
    journal = Journal(layout.journal_path)
    previous = {} if overwrite else _previous_entries(layout, journal)
    remove_leftovers(layout.paths[s] for s in layout.chosen)  # temporary files of a killed run (its lock died with it)
    tasks = _write_tasks(planned, layout, settings, previous)
    event("writing", len(tasks))
    entries: dict[str, dict] = {}
    try:
        for _, entry in run_tasks(_write_task, tasks, jobs=jobs, executor=executor, ray_address=ray_address,
                                  initializer=_init_worker, initargs=(record_files, read_paths),
                                  on_error=lambda task, err: {"path": task[0], "spec": None, "status": "failed",
                                                              "error": str(err.located(shard=task[0])),
                                                              "seconds_taken": 0.0}):
            entries[entry["path"]] = entry
            if entry["status"] == "ok":
                journal.append(entry)
            event("written", entry)
    finally:
        journal.close(remove=False)
    return journal, entries


def _used_sources(planned: _Planned, chosen: range) -> list[int]:
    """Ids (in ``mix.shards``) of the sources the shards in ``chosen`` read, sorted: a slice spools only these."""
    plan, mix = planned.plan, planned.mix
    positions = np.concatenate([np.arange(plan.shard_slice(s).start, plan.shard_slice(s).stop) for s in chosen]) \
        if len(chosen) else np.zeros(0, np.int64)
    return sorted({int(mix.corpora[c].shard[u]) for c, u in zip(plan.corpus[positions], plan.utt[positions])})


def _spool_sources(planned: _Planned, layout: _Layout, event: Callable[..., None], *, jobs: int, executor: str,
                   ray_address: str | None) -> dict[str, str]:
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
        event("spooling", len(spool_tasks))
        for _, (src, error) in run_tasks(_spool_task, spool_tasks, jobs=jobs, executor=executor,
                                         ray_address=ray_address,  # any task error: that source's failure
                                         on_error=lambda task, err: (task[0], str(err.located(shard=task[0])))):
            event("spooled", src, error)
    return read_paths


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

    table = shard_table(planned.plan, planned.mix, layout.paths)[layout.chosen.start:layout.chosen.stop]
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
    report.data_list_path = publish_list(layout.data_list, [r["path"] for r in table if r["status"] == "ok"],
                                         complete=not report.failures)
    removed = not report.failures and layout.split is None  # then OUT_DIR/.balance goes, with the indexes built there
    recorded_sources = {name: recorded_index_files(entry, layout.work_dir, removed)
                        for name, entry in report.sources.items()}
    atomic_write_json(layout.manifest_path, {
        **({"slice": layout.slice_info} if layout.slice_info else {}),
        "tool": "shardkit", "version": __version__, "command": "balance",
        "settings": settings,
        "summary": report.plan.summary(), "sources": recorded_sources, "shards": [
            {k: v for k, v in row.items() if k != "status_this_run"} for row in table],
        "plan": report.figures, "repeat_key_format": "{key}" + REPEAT_SUFFIX,
        "repeats_file": _write_repeats(layout.out_dir, report.repeats), "repeated_copies": len(report.repeats),
        **({"wenet_conf": report.wenet_conf} if report.wenet_conf is not None else {})})


def _write_repeats(out_dir: str, repeats: Repeats) -> str:
    """OUT_DIR/balance.repeats.jsonl, a line at a time (atomically); its name, relative to OUT_DIR."""
    import json

    from shardkit.io.files import atomic_write_lines

    atomic_write_lines(os.path.join(out_dir, REPEATS), (json.dumps(pair, ensure_ascii=False) for pair in repeats))
    return REPEATS


def read_repeats(out_dir: str):
    """``(original key, output key)`` of every repeat balance wrote into ``out_dir`` (from the file balance.json
    names: ``repeats_file``; corpus by corpus, in index order; reports written before it: in output order)."""
    import json

    from shardkit.io.files import load_json

    manifest = load_json(os.path.join(out_dir, MANIFEST)) or {}
    name = manifest.get("repeats_file")
    if name is None:  # a report written before the side file: the repeats inline
        yield from (tuple(pair) for pair in manifest.get("repeats", []))
        return
    with open(os.path.join(out_dir, name), encoding="utf-8") as f:
        for line in f:
            yield tuple(json.loads(line))


def _clean_up(layout: _Layout, journal: Journal) -> None:
    """Once every shard of the block is written: its journal goes, and OUT_DIR/.balance with it; a
    slice leaves the shared indexes to the other slices (merge-reports removes them)."""
    import shutil

    journal.close(remove=True)
    shutil.rmtree(layout.work_dir if layout.split is None else layout.spool_dir, ignore_errors=True)


def recorded_index_files(entry: dict, work_dir: str, removed: bool) -> dict:
    """A corpus's ``sources`` record for balance.json (pure): index files built in ``work_dir`` are
    named only while they exist; once the run removes the folder, ``built_index`` says so instead."""
    inside = [p for p in entry["index_files"] if os.path.dirname(os.path.dirname(p)) == work_dir]
    if not (removed and inside):
        return entry
    return {**entry, "index_files": [p for p in entry["index_files"] if p not in inside],
            "built_index": f"indexed in {os.path.join(work_dir, 'index')} during the run and removed with it"}


def merge_reports(slices) -> dict:
    """merge-reports for balance (``shardkit.run.merge.Slices`` in): the generic join; once every shard is
    written, the report names no index below OUT_DIR/.balance and that folder is removed, as a single
    run removes it."""
    import shutil

    from shardkit.run.merge import concatenated, failed_entries, write_merged

    merged = concatenated(slices)
    finished = not failed_entries(merged[slices.entries_key])
    if finished and isinstance(merged.get("sources"), dict):
        merged["sources"] = {name: recorded_index_files(entry, os.path.join(slices.out_dir, WORK_DIR), True)
                             for name, entry in merged["sources"].items()}
    summary = write_merged(slices, merged)
    if finished:
        shutil.rmtree(os.path.join(slices.out_dir, WORK_DIR), ignore_errors=True)
    return summary
