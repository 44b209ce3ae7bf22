"""prep: raw source shards in, balanced and validated training shards out, in one read.

What ``convert`` + ``validate --quarantine`` + ``balance`` do in three passes and two copies, in one:

* :mod:`.read` (worker processes, ``run.executor``): each source shard is decompressed once (all
  codecs; bz2 through indexed_bzip2 with the cores the other tasks leave idle), each utterance is
  checked by validate's own checks (its audio decoded once), and the utterances without a finding
  come back with their member bytes; rejected ones are listed (``rejects.jsonl``: shard, member,
  key, checks, reasons) and never reach a training shard.
* ``shardkit.planning.prep`` (pure): results are taken in list order, whatever finished first (``ordered``), so
  every decision (duplicate keys, shard count, which utterance goes where, pad and drop) is a
  function of the inputs and options alone, and the output bytes are the same for any ``-j``.
* :mod:`.write`: every output shard is open under its temporary name and filled as utterances are
  placed, by one writer thread per shard (hashing and writing outside the GIL, on every core), so
  the work folder holds one copy (plus a bounded pool of utterances in memory); at the end each is
  verified, fsynced and renamed on its thread.
* Corpus weights as balance takes them (:func:`weighted_copies`): floor(weight) copies of each
  utterance (``key-rep<N>``), plus one more for a seeded fraction, drawn per key.

The shard count is fixed before the first utterance is written: exactly from ``--index`` files
(``shardkit index`` JSONL; :func:`index_totals` is the one reader, so another index format plugs in
there), else from the seconds seen while the pool fills, scaled by the source bytes still to come
(compressed sizes: a header-only pass would have to decompress bz2 sources, which is the cost this
command exists to avoid). An estimate moves only the shard *size*, never the guarantees.

A rerun with the same sources and options finds prep.json and its shards unchanged and does
nothing. A run killed at any point leaves only temporary files: every output shard is open until
the last source is read, so none is finished, but the part of each written so far is kept at
*resume points* (:mod:`.resume`, plain tar output): the rerun cuts each temporary file back to the
last one, restores the planner and the held-back pool, and reads on from the next source, giving
the bytes an uninterrupted run gives. Without a resume point (other codecs, or a kill before the
first) the rerun removes the temporary files and starts again.

``--split`` is not offered: every output shard takes utterances from every source, so slices of
the sources would each need every output shard open (or a second, spooled copy), and slices of the
outputs would each decode every source; slices that each balance their own sources would break the
equal counts and the tolerance across slices. ``--executor ray`` spreads the reading and checking,
the bulk of the work, over many machines; this process plans and writes.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from shardkit import __version__
from shardkit.commands.prep import resume
from shardkit.commands.prep.datasets import DatasetLines
from shardkit.commands.prep.read import SourceTask, apply_duplicates, check_source_path, read_source, reject_lines
from shardkit.commands.prep.write import OutputShards, output_leftovers
from shardkit.commands.validate.duplicates import DuplicateKeys
from shardkit.commands.validate.options import ValidateOptions, check_options
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.mix import CorpusSource, check_corpora, output_paths, source_stamps
from shardkit.planning.balance import repeat_key
from shardkit.planning.prep import DEFAULT_POOL_BYTES, FinalPlan, StreamingPlanner, choose_num_shards
from shardkit.run.options import RunOptions

if TYPE_CHECKING:
    from shardkit.run.events import Events

MANIFEST = "prep.json"
REJECTS = "rejects.jsonl"


@dataclass(frozen=True)
class PrepSettings:
    """Everything that decides the output bytes (part of the rerun check), and how they are written."""

    world_size: int
    num_workers: int
    shard_duration: float | None = None
    num_shards: int | None = None
    codec: str = "none"  # plain tar: what every WeNet reads as installed (docs/guides/formats.md, "Why plain tar")
    level: int | None = 3
    remainder: str = "pad"
    seed: int = 0
    pool_bytes: int = DEFAULT_POOL_BYTES
    audio: str = "keep"
    flac_level: int | None = None
    verify: bool = True
    epochs: int = 3
    checkpoint_bytes: int = 1 << 30  # a resume point at most this often (plain tar output); never changes bytes
    layout: str = "wenet"  # or a trainer's own: nemo, shar (shardkit.io.layouts; plain tars, see .layout)

    def recorded(self) -> dict:
        """The settings prep.json records and its spec digests: ``layout`` only when it is not wenet (so a
        WeNet run records what it did before layouts)."""
        fields = asdict(self)
        if self.layout == "wenet":
            del fields["layout"]
        return fields


@dataclass
class PrepReport:
    """What ``prep`` did: the output folder, its figures, the shards written, the sources read, the plan
    before and after the correction step, and the findings (rejected utterances).
    """
    out_dir: str
    summary_fields: dict
    shards: list[dict]
    sources: list[dict]
    figures_before: dict | None
    figures_after: dict | None
    findings: list[dict] = field(default_factory=list)
    this_run: str = "done"

    def summary(self) -> dict:
        """The ``--json`` document: data.list, prep.json and rejects.jsonl paths, this run's outcome, the
        figures, and the plan's balance before and after correction.
        """
        return {"command": "prep", "out_dir": self.out_dir, "data_list": os.path.join(self.out_dir, "data.list"),
                "manifest": os.path.join(self.out_dir, MANIFEST), "rejects": os.path.join(self.out_dir, REJECTS),
                "this_run": self.this_run, **self.summary_fields,
                "plan_before": _figures_brief(self.figures_before), "plan_after": _figures_brief(self.figures_after)}

    @property
    def exit_code(self) -> int:
        """1 when an utterance was rejected or the shards are not balanced, else 0 (the CLI's exit status)."""
        return 1 if self.summary_fields["findings"] or not self.summary_fields["balanced"] else 0


def _figures_brief(figures: dict | None) -> dict | None:
    if figures is None:
        return None
    return {"shards": figures["shards"], "divides": figures["divides"],
            "worst_rank_spread": figures["worst_rank_spread"], "epochs": len(figures["epochs"])}


def index_totals(index_files: Sequence[str], shards: Sequence[str]) -> tuple[float, int] | None:
    """``(seconds, utterances)`` of ``shards`` from index files, or None if some shard is not indexed.

    The one place that reads an index (JSONL as ``shardkit index`` writes it): another format only
    has to answer this question.
    """
    from shardkit.io.indexfile import iter_index

    wanted = set(shards)
    seen: set[str] = set()
    seconds, count = 0.0, 0
    for path in index_files:
        if not os.path.isfile(path):
            raise UsageError("no such index file", shard=path)
        for record in iter_index(path):
            if record["shard"] in wanted:
                seen.add(record["shard"])
                seconds += float(record["duration"])
                count += 1
    return (seconds, count) if seen == wanted else None


# --- the run -------------------------------------------------------------------------------------


def run_prep(corpora: Sequence[CorpusSource], out_dir: str, settings: PrepSettings, checks: ValidateOptions,
             options: RunOptions | None = None, *, index_files: Sequence[str] = ()) -> PrepReport:
    """Read, check, plan and write; see the module docstring. ``checks``: validate's checks of every utterance.

    ``options``: jobs, executor and Ray address of the reading (``executor="ray"``: the sources are read and
    checked as Ray tasks across a cluster, which must see them at the same paths; this process plans and
    writes, so OUT_DIR is local to it), ``overwrite`` (redo a finished run), and where progress goes: the
    stage "read+check" (a ``done`` per source, its read result), and the notes "resuming a killed run: ..."
    and "closing and verifying N shards...". prep takes no ``split`` (the module docstring says why).
    """
    from shardkit.run.lifecycle import claimed_output_dir

    options = options or RunOptions()
    sources, datasets = _check_args(corpora, settings, checks, options)
    paths = [s for s, _ in sources]
    inputs = paths + sorted(set(datasets.values())) + [os.path.abspath(p) for p in index_files]
    with claimed_output_dir(out_dir, inputs, "prep", urls=False) as (out_dir, _):
        weights = [float(c.weight) for c in corpora]
        spec = _spec(sources, settings, checks, weights, datasets)
        previous = None if options.overwrite else _finished(out_dir, spec)
        if previous is not None:
            return previous
        saved = _resume_point(out_dir, spec, options.overwrite)
        totals = index_totals(index_files, paths) if index_files else None
        run = _Run(out_dir, sources, settings, checks, totals, options.events, weights)
        run.take_datasets(datasets)
        if saved is not None:
            run.restore(saved)
        return run.execute(options, spec)


def _resume_point(out_dir: str, spec: str, overwrite: bool) -> dict | None:
    """The saved state of a killed run of this spec (None with ``overwrite``, or when there is none); what an
    earlier run left that this one does not continue is removed."""
    saved = None if overwrite else resume.load(out_dir, spec)
    _remove_previous(out_dir, keep={t for e in saved["shards"] for t in (e["tmp"], e.get("lines", {}).get("tmp"))
                                    if t} if saved else set())
    return saved


def _check_args(corpora: Sequence[CorpusSource], settings: PrepSettings, checks: ValidateOptions,
                options: RunOptions) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """``(source path, corpus position)`` in list order, and the dataset of each tar of a NeMo tarred dataset or
    Shar folder (:mod:`.datasets`); refuses what prep cannot do before any output."""
    check_corpora(corpora)
    check_options(checks)
    _check_settings(settings)
    if options.split is not None:
        raise UsageError("prep takes no --split: every output shard takes utterances from every source")
    datasets: dict[str, str] = {}
    sources = _source_shards(corpora, datasets)
    if not sources:
        raise UsageError("no source shards given")
    return sources, datasets


def _check_settings(settings: PrepSettings) -> None:
    if settings.world_size < 1 or settings.num_workers < 1:
        raise UsageError(f"--world-size and --num-workers must be >= 1 (got {settings.world_size} and "
                         f"{settings.num_workers})")
    if settings.shard_duration is not None and settings.num_shards is not None:
        raise UsageError("give --shard-duration or --num-shards, not both")
    if settings.audio not in ("keep", "flac", "wav"):
        raise UsageError(f"--audio must be keep, flac or wav (got {settings.audio!r})")
    from shardkit.commands.prep.layout import check_layout_settings

    check_layout_settings(settings.layout, settings.codec)


def _source_shards(corpora: Sequence[CorpusSource], datasets: dict[str, str]) -> list[tuple[str, int]]:
    """Every corpus' source shards, ``(path, corpus position)`` in list order (a NeMo tarred dataset's or Shar
    folder's tars, each noted in ``datasets`` with its manifest or folder); an index among the sources, a
    pipe or standard input, or a shard in two corpora is refused."""
    from shardkit.commands.prep.datasets import expand_corpus
    from shardkit.io.indexfile import is_index_file

    sources: list[tuple[str, int]] = []
    owner: dict[str, str] = {}
    for c, corpus in enumerate(corpora):
        index = next((arg for arg in corpus.sources if is_index_file(arg)), None)
        if index is not None:
            raise UsageError(f"corpus {corpus.name!r}: {index} is an index; give it with --index and the shards "
                             f"as sources")
        for path, dataset in expand_corpus(list(corpus.sources)):
            if dataset is not None:
                datasets[path] = dataset
            check_source_path(path)
            if path in owner:
                raise UsageError(f"{path} is given to corpus {owner[path]!r} and to corpus {corpus.name!r}")
            owner[path] = corpus.name
            sources.append((path, c))
    return sources


def _spec(sources: list[tuple[str, int]], settings: PrepSettings, checks: ValidateOptions,
          weights: list[float], datasets: dict[str, str] | None = None) -> str:
    """Digest of what decides the output: the sources (size, mtime), the corpus of each, the corpus weights,
    every option, and a dataset's manifest or cuts files (with none, the digest of a run before datasets)."""
    decides = settings.recorded() | {"checkpoint_bytes": None}  # resume points never change the output bytes
    h = hashlib.sha256(repr((__version__, decides, asdict(checks) | {"threads": 0}, weights)).encode())
    for (path, corpus), stamp in zip(sources, source_stamps([p for p, _ in sources])):
        h.update(repr((corpus, stamp)).encode("utf-8", "surrogateescape"))
    if datasets:
        from shardkit.commands.prep.datasets import metadata_files

        metadata = metadata_files(list(datasets.values()))
        h.update(repr(list(zip(metadata, source_stamps(metadata)))).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _finished(out_dir: str, spec: str) -> PrepReport | None:
    """The report of an earlier run of the same spec whose shards are all still there, unchanged."""
    from shardkit.io.files import load_json, output_unchanged

    doc = load_json(os.path.join(out_dir, MANIFEST))
    if not doc or doc.get("spec") != spec:
        return None
    if not all(output_unchanged(e["path"], e["size"], e["sha256"]) for e in doc["shards"]):
        return None
    from shardkit.commands.prep.layout import finished_layout

    if not finished_layout(out_dir, doc):
        return None
    from shardkit.io.files import atomic_write_lines

    atomic_write_lines(os.path.join(out_dir, "data.list"), [e["path"] for e in doc["shards"]])  # removed since?
    return PrepReport(out_dir, doc["summary"], doc["shards"], doc["sources"], doc["plan_before"], doc["plan_after"],
                      doc.get("findings", []), this_run="skipped")


def _remove_previous(out_dir: str, keep: set[str] = frozenset()) -> None:
    """Temporary files of a killed run (but those a resume continues, ``keep``), and the shards of an earlier
    run with other inputs or options (they would be replaced anyway; removing them first keeps the folder at
    one copy)."""
    from shardkit.commands.prep.layout import earlier_outputs, remove_empty_folders
    from shardkit.io.files import load_json, remove_leftovers

    remove_leftovers(output_leftovers(out_dir), keep=keep)
    if not keep:
        resume.remove(out_dir)
    doc = load_json(os.path.join(out_dir, MANIFEST))
    if not doc or doc.get("command") != "prep":  # nothing of an earlier prep run: touch nothing else
        return
    for path in earlier_outputs(out_dir, doc):
        if os.path.isfile(path):
            os.unlink(path)
    remove_empty_folders(out_dir)
    for name in (MANIFEST, "data.list"):
        try:
            os.unlink(os.path.join(out_dir, name))
        except FileNotFoundError:
            pass


class _Run:
    """One run's state: the planner, the pool's bytes, the open outputs and what the report needs."""

    def __init__(self, out_dir: str, sources: list[tuple[str, int]], settings: PrepSettings,
                 checks: ValidateOptions, totals: tuple[float, int] | None, events: Events,
                 weights: list[float] | None = None):
        self.out_dir, self.sources, self.settings, self.checks, self.events = out_dir, sources, settings, checks, events
        self.weights = weights or [1.0] * (max(c for _, c in sources) + 1)
        self.next_copy: dict[str, int] = {}  # key -> its next free copy number, where weights made copies
        self.copy_keys: set[str] = set()  # the keys of those copies (a later source may not use them)
        self.weighted = {"copies": 0, "left_out": 0}
        self.planner = StreamingPlanner(world_size=settings.world_size, num_workers=settings.num_workers,
                                        pool_bytes=settings.pool_bytes)
        self.totals = totals
        self.pool: dict[int, tuple] = {}  # seq -> (key, corpus, members, copy number)
        self.keys: set[str] = set()
        self.outputs: OutputShards | None = None
        self.shard_utts: np.ndarray = np.zeros(0, np.int64)
        self.shard_corpus: np.ndarray = np.zeros((0, 0), np.int64)
        self.source_rows: list[dict] = []
        self.rejects: list[dict] = []
        self.findings: list[dict] = []
        self.seen_bytes = 0
        self.seen_seconds = 0.0
        self.seq = 0
        self.estimate_note: str | None = None
        self.start = 0  # the first source this run reads (a resumed run: the one after the resume point)
        self.duplicates = DuplicateKeys()
        self.placed_bytes = 0
        self.checkpoint_at = 0  # placed_bytes at the last resume point
        self.saved_outputs: list | None = None
        self.layout_written: dict | None = None  # a trainer's layout: what was written for the whole dataset
        self.datasets: dict[str, str] = {}  # a tar of a NeMo tarred dataset or Shar folder -> that dataset
        self.dataset_lines = DatasetLines({})

    def take_datasets(self, datasets: dict[str, str]) -> None:
        """Which sources are tars of a NeMo tarred dataset or Shar folder (:mod:`.datasets`)."""
        self.datasets, self.dataset_lines = datasets, DatasetLines(datasets)

    def execute(self, options: RunOptions, spec: str) -> PrepReport:
        started = time.perf_counter()
        self.spec = spec
        try:
            self._stream(options)
            if self.planner.num_shards is None:
                self._fix_shard_count(exact=True)
            final = self.planner.finish(remainder=self.settings.remainder, seed=self.settings.seed)
            self._write_final(final)
            self.events.note(f"closing and verifying {len(self.outputs.paths)} shards...")
            entries = self.outputs.finish(self.settings.verify)
            self._finish_layout()
        except BaseException as err:
            if self.outputs is not None:
                # Ctrl-C or SIGTERM (a scheduler's preemption) after a resume point: its temporary shards stay
                # for the rerun to continue (it cuts them back to the point); anything else removes them
                self.outputs.abort(keep_files=isinstance(err, KeyboardInterrupt) and self._resumable())
            raise
        report = self._report(final, entries, time.perf_counter() - started)
        self._save(report, spec, final)
        return report

    def _finish_layout(self) -> None:
        """A trainer's layout: what it writes for the whole dataset once every shard is (NeMo's manifest and
        config fragment)."""
        if self.settings.layout != "wenet":
            from shardkit.io.layouts import finish_layout

            self.layout_written = finish_layout(self.settings.layout, self.out_dir, self.outputs.paths, "prep")

    # reading, in list order
    def _stream(self, options: RunOptions) -> None:
        tasks = [SourceTask(path, corpus, self.checks, self.settings.audio, self.settings.flac_level,
                            self.datasets.get(path)) for path, corpus in self.sources[self.start:]]
        self.events.stage("read+check", len(tasks))
        if self.saved_outputs is not None:
            self._open_outputs(self.planner.num_shards, self.saved_outputs)
        for index, result in options.run_tasks(read_source, tasks, ordered=True, **_task_options(tasks, options)):
            apply_duplicates(result, self.duplicates)
            self.dataset_lines.take(result)
            self._take(result)
            self.events.done(result)
            self._after_source(self.start + index + 1)
        findings, rejects = self.dataset_lines.leftovers()  # NeMo lines no tar held: reported, never skipped
        self.findings.extend(findings)
        self.rejects.extend(rejects)

    def _after_source(self, read: int) -> None:
        """Once ``read`` sources are taken: the shard count fixed when the pool is full, the pool's rounds
        written, and a resume point saved when one is due (never after the last source)."""
        if self.planner.num_shards is None and self.planner.pool_held_bytes > self.settings.pool_bytes:
            self._fix_shard_count(exact=False)
        if self.planner.num_shards is not None:
            self._place(self.planner.evict())
        if self._checkpoint_due() and read < len(self.sources):
            self._checkpoint(read)

    # resume points
    def _resumable(self) -> bool:
        """Whether a resume point of this run (or of the run it continues) is saved."""
        return os.path.exists(os.path.join(self.out_dir, resume.RESUME))

    def _checkpoint_due(self) -> bool:
        """Plain tar output, writing begun, and enough written since the last resume point: at least
        ``checkpoint_bytes`` and POOL_FACTOR x the pool it saves (so saving costs a few % of the writes,
        and the work folder holds at most ~1/8 more than the shards)."""
        since = self.placed_bytes - self.checkpoint_at
        return (self.settings.codec == "none" and self.outputs is not None
                and since >= max(self.settings.checkpoint_bytes, resume.POOL_FACTOR * self.planner.pool_held_bytes))

    def _checkpoint(self, next_source: int) -> None:
        shards = self.outputs.checkpoint()
        resume.save(self.out_dir, {
            "spec": self.spec, "next_source": next_source, "shards": shards,
            "planner": resume.planner_state(self.planner), "pool": self.pool, "keys": sorted(self.keys),
            "shard_utts": self.shard_utts.tolist(), "shard_corpus": self.shard_corpus.tolist(),
            "source_rows": self.source_rows, "rejects": self.rejects, "findings": self.findings,
            "seen_bytes": self.seen_bytes, "seen_seconds": self.seen_seconds, "seq": self.seq,
            "estimate_note": self.estimate_note, "duplicates": self.duplicates.first,
            "placed_bytes": self.placed_bytes, "next_copy": self.next_copy, "copy_keys": sorted(self.copy_keys),
            "weighted": self.weighted, **self.dataset_lines.state()})
        self.checkpoint_at = self.placed_bytes

    def restore(self, state: dict) -> None:
        """Continue a killed run from its last resume point (see :mod:`.resume`)."""
        resume.restore_planner(self.planner, state["planner"])
        self.pool = state["pool"]
        self.keys = set(state["keys"])
        self.shard_utts = np.array(state["shard_utts"], np.int64)
        self.shard_corpus = np.array(state["shard_corpus"], np.int64)
        self.copy_keys = set(state["copy_keys"])
        for name in ("source_rows", "rejects", "findings", "seen_bytes", "seen_seconds", "seq", "estimate_note",
                     "placed_bytes", "next_copy", "weighted"):
            setattr(self, name, state[name])
        self.duplicates.first = state["duplicates"]
        self.dataset_lines.restore(state)
        self.checkpoint_at = self.placed_bytes
        self.start = state["next_source"]
        self.saved_outputs = list(zip(state["shards"], state["prefixes"]))
        self.events.note(f"resuming a killed run: the output shards so far are kept, reading from source "
                         f"{self.start + 1}")

    def _take(self, result: dict) -> None:
        self.rejects.extend(reject_lines(result))
        self.findings.extend(result["findings"])
        seconds = 0.0
        accepted = result.pop("accepted")
        corpus = result["corpus"]
        for key, secs, members in accepted:
            if key in self.copy_keys:
                raise ShardkitError(f"key {key!r} is already the name of a weighted copy", shard=result["shard"])
            self.keys.add(key)
            copies = weighted_copies(self.weights[corpus], self.settings.seed, corpus, key)
            self.weighted["copies"] += max(0, len(copies) - 1)
            self.weighted["left_out"] += not copies
            for copy in copies:
                self.planner.add(self.seq, secs, sum(len(d) for _, d, _ in members))
                self.pool[self.seq] = (key, corpus, members, copy)
                self.seq += 1
                if copy:
                    self._name_copy(key, copy)
            seconds += secs
        self.seen_bytes += result["bytes"] or 0
        self.seen_seconds += seconds
        self.source_rows.append({"shard": result["shard"], "corpus": result["corpus"], "bytes": result["bytes"],
                                 "codec": result["codec"], "utterances": result["utterances"],
                                 "accepted": len(accepted), "accepted_seconds": round(seconds, 4),
                                 "findings": len(result["findings"])})

    def _fix_shard_count(self, *, exact: bool) -> None:
        """The shard count, once: from the index, from everything read (exact), or scaled from what was read."""
        s = self.settings
        if self.totals is not None:
            seconds = self.totals[0]
        elif exact:
            seconds = self.seen_seconds
        else:
            total_bytes = sum(size or 0 for _, size in _sizes(self.sources))
            seconds = self.seen_seconds * total_bytes / max(self.seen_bytes, 1)
            self.estimate_note = (f"shard count from an estimate of {seconds:.0f} s of audio (the seconds of the first "
                                  f"{len(self.source_rows)} sources, scaled by source bytes)")
        count = choose_num_shards(seconds, world_size=s.world_size, num_workers=s.num_workers,
                                  shard_duration=s.shard_duration, num_shards=s.num_shards)
        self.planner.set_num_shards(count)
        self.shard_utts = np.zeros(count, np.int64)
        self.shard_corpus = np.zeros((count, max(c for _, c in self.sources) + 1), np.int64)
        self._open_outputs(count)

    def _open_outputs(self, count: int, saved: list | None = None) -> None:
        s = self.settings
        if s.layout != "wenet":
            from shardkit.commands.prep.layout import LayoutOutputShards, output_shard_paths

            self.outputs = LayoutOutputShards(output_shard_paths(s.layout, self.out_dir, count), s.layout,
                                              threads=_writer_threads(), resume=saved)
            return
        self.outputs = OutputShards(output_paths(self.out_dir, count, s.codec), s.codec, s.level,
                                    threads=_writer_threads(), resume=saved)

    # writing
    def _place(self, placed: list[tuple[int, int]]) -> None:
        for seq, shard in placed:
            key, corpus, members, copy = self.pool.pop(seq)
            self._write(shard, key, corpus, members, copy)

    def _name_copy(self, key: str, copy: int) -> str:
        """Record copy ``copy`` of ``key`` (a weighted copy or a pad repeat); refuses a name already a key."""
        new_key = repeat_key(key, copy)
        if new_key in self.keys:
            raise ShardkitError(f"repeat of {key!r} would be named {new_key!r}, which is already a key in the mix")
        self.copy_keys.add(new_key)
        self.next_copy[key] = copy + 1
        return new_key

    def _write(self, shard: int, key: str, corpus: int, members: list[tuple[str, bytes, bytes]], copy: int) -> None:
        new_key = repeat_key(key, copy)
        named = [(new_key + name[len(key):] if copy else name, data, digest) for name, data, digest in members]
        if self.settings.layout != "wenet":  # a whole utterance: the layout's writer makes its members and line
            self.outputs.add_utterance(shard, new_key, named)
        else:
            for name, data, digest in named:  # a member's digest is of its data alone: a repeat keeps it
                self.outputs.add(shard, name, data, digest)
        self.placed_bytes += sum(len(data) for _, data, _ in members)
        self.shard_utts[shard] += 1
        self.shard_corpus[shard, corpus] += 1

    def _write_final(self, final: FinalPlan) -> None:
        self.repeats = []
        for seq, pad, shard in final.placed:
            key, corpus, members, copy = self.pool[seq]
            if pad:  # copy numbers continue per utterance, after the weighted copies (as balance numbers them)
                copy = self.next_copy.get(key, 1)
                self.repeats.append([key, self._name_copy(key, copy)])
            self._write(shard, key, corpus, members, copy)
        self.dropped = [repeat_key(self.pool[seq][0], self.pool[seq][3]) for seq in final.dropped]
        self.pool.clear()

    # reporting
    def _report(self, final: FinalPlan, entries: list[dict], elapsed: float) -> PrepReport:
        from shardkit.planning.partition import plan_figures

        s = self.settings
        secs = final.shard_seconds
        for i, entry in enumerate(entries):
            entry.update({"shard": i, "utterances": int(self.shard_utts[i]), "seconds": round(float(secs[i]), 3),
                          "corpora": [int(x) for x in self.shard_corpus[i]]})
        assert (self.shard_utts == final.utts_per_shard).all(), "an output shard has another count than planned"
        figure_args = {"world_size": s.world_size, "num_workers": s.num_workers, "epochs": s.epochs, "seed": s.seed}
        before = plan_figures([r["accepted"] for r in self.source_rows],
                              [r["accepted_seconds"] for r in self.source_rows], **figure_args)
        after = plan_figures(self.shard_utts, secs, **figure_args)
        fields = self._summary_fields(final, entries, elapsed)
        return PrepReport(self.out_dir, fields, entries, self.source_rows, before, after, self.findings)

    def _summary_fields(self, final: FinalPlan, entries: list[dict], elapsed: float) -> dict:
        """prep.json's ``summary`` (and the JSON report's fields), in one order: the layout, what was read and
        rejected, the plan's balance, what was written."""
        layout = {"layout": self.layout_written} if self.layout_written is not None else {}
        return {**self._layout_fields(final, entries), **self._read_fields(), **_balance_fields(final),
                **self._written_fields(final, entries, elapsed), **layout}

    def _layout_fields(self, final: FinalPlan, entries: list[dict]) -> dict:
        groups = self.settings.world_size * self.settings.num_workers
        return {"world_size": self.settings.world_size, "num_workers": self.settings.num_workers,
                "num_shards": len(entries), "utterances_per_shard": final.utts_per_shard,
                "divides": len(entries) % groups == 0}

    def _read_fields(self) -> dict:
        from collections import Counter

        rows = self.source_rows
        rejected_keys = {(r["shard"], r["key"]) for r in self.rejects if r["key"] is not None}
        return {"sources": len(self.sources), "source_bytes": sum(r["bytes"] or 0 for r in rows),
                "utterances_read": sum(r["utterances"] for r in rows), "accepted": sum(r["accepted"] for r in rows),
                "weighted_copies": self.weighted["copies"], "left_out_by_weight": self.weighted["left_out"],
                "rejected_utterances": len(rejected_keys), "rejected_members": len(self.rejects),
                "findings": len(self.findings),
                "by_check": dict(sorted(Counter(f["check"] for f in self.findings).items())),
                "repeated": len(self.repeats), "dropped": len(self.dropped)}

    def _written_fields(self, final: FinalPlan, entries: list[dict], elapsed: float) -> dict:
        return {"tar_bytes_out": sum(e["tar_bytes"] for e in entries), "bytes_out": sum(e["size"] for e in entries),
                "elapsed_seconds": round(elapsed, 3), "resumed_at_source": self.start or None,
                "notes": ([self.estimate_note] if self.estimate_note else []) + final.notes}

    def _save(self, report: PrepReport, spec: str, final: FinalPlan) -> None:
        """rejects.jsonl, data.list and prep.json (last: its presence says the run finished)."""
        import json

        from shardkit.errors import json_safe
        from shardkit.io.files import atomic_write_json, atomic_write_lines

        atomic_write_lines(os.path.join(self.out_dir, REJECTS),
                           [json.dumps(json_safe(r), sort_keys=True, ensure_ascii=False) for r in self.rejects])
        atomic_write_lines(os.path.join(self.out_dir, "data.list"), [e["path"] for e in report.shards])
        atomic_write_json(os.path.join(self.out_dir, MANIFEST), json_safe({
            "tool": "shardkit", "version": __version__, "command": "prep", "spec": spec,
            "settings": self.settings.recorded(), "options": asdict(self.checks) | {"threads": None},
            "summary": report.summary_fields, "shards": report.shards, "sources": report.sources,
            "plan_before": report.figures_before, "plan_after": report.figures_after,
            "findings": report.findings, "repeat_key_format": "{key}-rep{copy}", "repeats": self.repeats,
            "dropped": self.dropped}))
        resume.remove(self.out_dir)  # after prep.json: the run is finished, nothing is left to resume


def _balance_fields(final: FinalPlan) -> dict:
    """The output shards' seconds and how far the worst is from the mean, against the tolerance."""
    secs = final.shard_seconds
    return {"seconds": round(float(secs.sum()), 3), "mean_shard_seconds": round(float(secs.mean()), 3),
            "min_shard_seconds": round(float(secs.min()), 3), "max_shard_seconds": round(float(secs.max()), 3),
            "max_deviation_seconds": round(final.max_deviation, 3), "tolerance_seconds": round(final.tolerance, 3),
            "balanced": final.balanced}


def weighted_copies(weight: float, seed: int, corpus: int, key: str) -> list[int]:
    """The copy numbers of one utterance under its corpus weight: floor(weight) copies, plus one more for a
    seeded fraction of the utterances (balance's rule). Balance draws that fraction as an exact count
    from all of a corpus's durations; prep writes before it has seen them all, so each utterance is
    drawn alone, by a hash of (seed, corpus, key): the same choice on every run and for any -j, a count
    within sampling error of ``(weight - floor(weight)) x utterances``."""
    whole = int(math.floor(weight))
    copies = list(range(whole))
    fraction = weight - whole
    if fraction > 0:
        digest = hashlib.blake2b(f"{seed}\0{corpus}\0{key}".encode("utf-8", "surrogateescape"), digest_size=8)
        if int.from_bytes(digest.digest(), "big") < fraction * 2.0**64:
            copies.append(whole)
    return copies


def _sizes(sources: list[tuple[str, int]]) -> list[tuple[str, int | None]]:
    from shardkit.io.files import local_size

    return [(path, local_size(path)) for path, _ in sources]


def _writer_threads() -> int:
    """Writer threads of the output shards: one per core (they hash, compress and write outside the GIL)."""
    from shardkit.run.executor import usable_cores

    return max(1, min(usable_cores(), 16))


def _task_options(tasks: list[SourceTask], options: RunOptions) -> dict:
    """``run_tasks`` arguments of the reading: on this machine, each task's decompressor threads and a window
    (:func:`_threads_per_task`), with the reader preloaded in the forkserver; none on Ray."""
    if options.executor != "local":
        return {}
    from shardkit.run.executor import preload_in_forkserver

    extra = _threads_per_task(tasks, options.jobs)
    preload_in_forkserver(["shardkit.commands.prep.read"])
    return extra


def _threads_per_task(tasks: list[SourceTask], jobs: int | None) -> dict:
    """``run_tasks`` arguments giving each task its decompressor threads as it is submitted (threads never
    change what is read): see :func:`decoder_threads`."""
    from dataclasses import replace

    from shardkit.run.executor import usable_cores

    cores = usable_cores()
    jobs_n = max(1, min(jobs or cores, len(tasks) or 1))
    position = {id(task): k for k, task in enumerate(tasks)}

    def prepare(task: SourceTask) -> SourceTask:
        threads = decoder_threads(cores, jobs_n, len(tasks), position[id(task)])
        return replace(task, options=replace(task.options, threads=threads))

    # results come back in list order: a window of twice the jobs keeps every core busy while a slow source
    # holds the ones after it (jobs alone would leave cores idle behind it)
    return {"prepare": prepare, "max_in_flight": 2 * jobs_n}


def decoder_threads(cores: int, jobs: int, tasks: int, k: int) -> int:
    """Decoder threads (indexed_bzip2's parallel mode) of source ``k`` of ``tasks``, ``jobs`` at a time.

    The first ``jobs`` sources start together and share the cores (the spare ones to the first: 15
    sources on 16 cores, or 4 on 16 cores with 4 threads each, leave no core idle and none
    oversubscribed); a later one starts as an earlier one ends, and the last ones, which run while
    fewer than ``jobs`` remain, get the cores the finished jobs left idle.
    """
    from shardkit.commands.convert import task_threads

    if k < jobs:
        return max(1, cores // jobs + (1 if k < cores % jobs else 0))
    return task_threads(cores, jobs, tasks - k)  # convert's rule for a task started while tasks - k wait
