"""validate: find every problem a trainer would meet in a set of shards, in one pass, before training.

``validate_shard`` checks one shard (container, grouping, text, audio decoded in full from
``io.BytesIO(member_bytes)``) and returns a result dict; data problems become findings, never
exceptions. ``run_validate`` spreads shards over processes or a Ray cluster (``shardkit.run.executor``),
adds the cross-shard duplicate-key check in the parent (in shard order, so the first occurrence is
the one kept), and with a quarantine folder writes, per shard with findings:

- ``DIR/<stem>.tar[.ext]`` (``DIR/<folder>/<stem>...`` when shard file names repeat across folders, see
  ``plan_quarantine``): the good utterances, member bytes untouched, in source order, same codec;
- ``DIR/<stem>.rejects.tar[.ext]``: every other member, bytes untouched (unsafe names included:
  never extract it);
- and once for the run ``DIR/rejects.jsonl`` (one line per rejected member, with its reasons) and
  ``DIR/data.list`` (clean sources as they are, cleaned copies in place of the others).

With ``split=(I, N)`` (job arrays) only slice I of N is validated; ``merge_slice_reports`` (run by
``shardkit merge-reports``) joins the slice reports into what one run would have written, redoing
the duplicate check across slices.

An utterance with any finding is rejected whole. Outputs are deterministic (fixed tar headers,
the codec's default level) and written under a temporary name, fsynced and renamed.

The package, by seam: ``names`` (check names, ``finding``), ``options`` (:class:`ValidateOptions`),
``members`` (text and audio checks of one member), ``shard`` (one shard's scan), ``duplicates``
(the cross-shard check), ``quarantine`` (cleaned and rejects shards, the run's lists), ``report``
(:class:`ValidateReport`), ``merge`` (``--split`` slices joined); this module runs them over a list.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from shardkit.commands.validate.duplicates import DuplicateKeys
from shardkit.commands.validate.layouts import DURATION_TOLERANCE, validate_dataset  # noqa: F401
from shardkit.commands.validate.members import check_audio, check_text  # noqa: F401
from shardkit.commands.validate.merge import merge_reports, merge_slice_reports  # noqa: F401
from shardkit.commands.validate.names import (  # noqa: F401
    CHANNELS,
    CHECK_ERROR,
    CHECKS,
    CORPUS,
    DECODE,
    DUPLICATE_KEY,
    DURATION,
    EMPTY_AUDIO,
    EMPTY_SHARD,
    FORMAT_MISMATCH,
    INPUT,
    KEY_DOT,
    MEMBER_TOO_LARGE,
    MISSING_AUDIO,
    MISSING_FILE,
    MISSING_TXT,
    MIXED_AUDIO,
    MULTIPLE_AUDIO,
    MULTIPLE_TXT,
    NAN,
    SAMPLE_RATE,
    SPLIT_KEY,
    STREAM,
    TAR,
    TAR_CHECKSUM,
    TAR_NAME_CHAIN,
    TAR_NAME_ENCODING,
    TAR_NUMBER_FIELD,
    TAR_PAX,
    TAR_ZERO_BLOCK,
    TASK,
    TEXT_ENCODING,
    TRUNCATED,
    UNSAFE_MEMBER,
    WARNINGS,
    finding,
)
from shardkit.commands.validate.options import BACKENDS, ValidateOptions, check_options  # noqa: F401
from shardkit.commands.validate.quarantine import (  # noqa: F401
    REJECTS_JSONL,
    _quarantine_failed,
    _quarantine_task,
    plan_quarantine,
    quarantine_names,
    quarantine_outputs,
    quarantine_shard,
    write_quarantine_lists,
)
from shardkit.commands.validate.report import ValidateReport, format_finding  # noqa: F401
from shardkit.commands.validate.shard import (  # noqa: F401 - prep runs the same scan through these
    _check_utterance,
    _report_scan_end,
    _shard_file_facts,
    _unsafe_recorder,
    check_key_dot,
    iter_indexed_groups,
    validate_shard,
)
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.audio import (  # noqa: F401 - check names findings carry, importable from here as before
    AUDIO_CHANNELS,
    AUDIO_FORMAT,
    AUDIO_HEADER,
    DECODED_TOO_LONG,
    FLAC_MD5,
    FLAC_METADATA,
    FLAC_STREAMINFO,
    IMPLAUSIBLE_LENGTH,
)
from shardkit.io.inputs import expand_shards
from shardkit.io.text import EMPTY_TEXT, KEY_CONTROL, TEXT_CONTROL  # noqa: F401 - check names, as above
from shardkit.run.events import Events
from shardkit.io.files import remove_leftovers
from shardkit.run.lifecycle import claimed_output_dir
from shardkit.run.options import RunOptions
from shardkit.run.split import slice_record


def run_validate(shard_args: list[str], settings: ValidateOptions, options: RunOptions | None = None, *,
                 quarantine_dir: str | None = None, keep_tree: bool | None = None,
                 report_path: str | None = None) -> ValidateReport:
    """Validate every shard named by ``shard_args``; see the module docstring.

    ``options`` (:class:`~shardkit.run.options.RunOptions`): jobs, executor and Ray address (where the
    per-shard tasks run), progress (one stage, "validate", a ``done`` event per shard with its result,
    in shard order, cross-shard duplicates included), and ``split=(I, N)``: only slice I of N of the
    list; the report carries a ``slice`` record and what ``shardkit merge-reports`` needs to redo the
    duplicate check across slices, and quarantine writes ``rejects.slice-I-of-N.jsonl`` and
    ``data.slice-I-of-N.list``. ``settings.threads`` None: chosen from the cores and ``options.jobs``.
    ``keep_tree``: the layout of the quarantine outputs (see :func:`plan_quarantine`; None: mirror the
    input folders when file names repeat). ``report_path``: write the JSON report there (its slice's
    name with ``split``; refused when it is an input, its folder made), named in ``report.report_path``.
    """
    options = options or RunOptions()
    if report_path is not None:
        report_path = _claim_report(report_path, shard_args, options.split)
    check_options(settings)
    settings = settings.with_threads(options.jobs, options.executor)
    if _datasets_given(shard_args, quarantine_dir, options.split):
        report = _validate_datasets(list(shard_args), settings, options)
        return _reported(report, report_path)
    shards = expand_shards(shard_args)
    # over the whole list: slices never collide
    stems = plan_quarantine(shards, quarantine_dir, keep_tree) if quarantine_dir is not None else None
    with _claimed_quarantine(shard_args, shards, quarantine_dir, stems, options.split) as (quarantine_dir, _):
        work = _Work.of_slice(shards, stems, quarantine_dir, keep_tree, options.split)
        if work.stems is not None:  # temporary files a killed run left (its lock died with it)
            remove_leftovers(quarantine_outputs(quarantine_dir, work.stems))
        report = _validate_claimed(work, settings, options)
    return _reported(report, report_path)


def _reported(report: ValidateReport, report_path: str | None) -> ValidateReport:
    report.report_path = report_path
    if report_path is not None:
        from shardkit.io.files import atomic_write_json

        atomic_write_json(report_path, report.to_json())
    return report


def _datasets_given(shard_args: list[str], quarantine_dir: str | None, split) -> bool:
    """Whether the arguments are NeMo tarred datasets (manifests) and Shar folders (``validate.layouts``), not
    shards; refused mixed, with --quarantine or with --split (a NeMo line may lie in any of its tars)."""
    from shardkit.io.layouts.sources import is_dataset

    given = [is_dataset(arg) for arg in shard_args]
    if not any(given):
        return False
    if not all(given):
        raise UsageError("validate either NeMo tarred datasets and Shar folders, or shards: not both in one run")
    if quarantine_dir is not None or split is not None:
        raise UsageError("--quarantine and --split take shards, not a NeMo tarred dataset or Shar folder")
    return True


def _validate_datasets(datasets: list[str], settings: ValidateOptions, options: RunOptions) -> ValidateReport:
    """Each dataset's tars validated in order (``validate.layouts``), through the same cross-shard duplicate
    check and progress as shards: a stage "validate" of the tars, a ``done`` per tar (and per manifest with
    findings of its own)."""
    from shardkit.io.layouts.sources import open_dataset

    started = time.perf_counter()
    opened = [open_dataset(dataset) for dataset in datasets]
    options.events.stage("validate", sum(len(dataset.shards) for dataset in opened))
    duplicates = DuplicateKeys()
    results = []
    for dataset in opened:
        for result in validate_dataset(dataset, settings):
            duplicates.check(result, result.pop("keys"))
            result.pop("rejected", None)
            results.append(result)
            options.events.done(result)
    report = ValidateReport(options=settings, shards=results)
    report.seconds = time.perf_counter() - started
    return report


def _claim_report(report_path: str, shard_args: list[str], split: tuple[int, int] | None) -> str:
    """The report's path (its slice's with ``split``), refused if it is an input or a folder; its folder made,
    as `index -o` makes its own: the job array of docs/guides/large-corpora.md writes into a fresh /shared/v."""
    from shardkit.run.lifecycle import claim_output_file
    from shardkit.run.split import slice_path

    if split:
        report_path = slice_path(report_path, *split)
    claim_output_file(report_path, list(shard_args))
    try:
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create the report's folder: {err.strerror}", shard=report_path) from None
    return report_path


def _claimed_quarantine(shard_args: list[str], shards: list[str], quarantine_dir: str | None,
                        stems: list[str] | None, split: tuple[int, int] | None):
    """The quarantine folder claimed and locked for this run (or slice), as ``(folder, journal)``; without
    quarantine, ``(None, None)``."""
    if quarantine_dir is None:
        return contextlib.nullcontext((None, None))
    # every output's folder is claimed too: mirrored outputs (--keep-tree) never land beside a source
    return claimed_output_dir(quarantine_dir, shards + [a for a in shard_args if os.path.isfile(a)], "validate",
                              split, outputs=quarantine_outputs(os.path.abspath(quarantine_dir), stems),
                              what="the quarantine folder", urls=False)


@dataclass(frozen=True)
class _Work:
    """What a run checks once its folder is claimed: this slice's shards and quarantine stems, the slice
    record (None without ``split``), the claimed quarantine folder and its layout."""

    shards: list[str]
    stems: list[str] | None
    slice_info: dict | None
    quarantine_dir: str | None
    keep_tree: bool | None

    @classmethod
    def of_slice(cls, shards: list[str], stems: list[str] | None, quarantine_dir: str | None,
                 keep_tree: bool | None, split: tuple[int, int] | None) -> _Work:
        if split is None:
            return cls(shards, stems, None, quarantine_dir, keep_tree)
        slice_info = slice_record(shards, *split)
        start, stop = slice_info["start"], slice_info["stop"]
        return cls(shards[start:stop], stems[start:stop] if stems else stems, slice_info, quarantine_dir, keep_tree)


def _validate_task(args):
    path, options = args
    return validate_shard(path, options)


def _validate_failed(task, error: ShardkitError) -> dict:
    """The result of a shard whose task raised (any library's exception) or whose worker died: one finding."""
    path = task[0]
    return {"shard": path, "bytes": None, "codec": None, "utterances": 0, "members": 0, "seconds": 0.0,
            "sample_rates": {}, "keys": [], "rejected": [], "warnings": [], "elapsed_s": 0.0,
            "findings": [finding(path, None, None, error.check if error.check in CHECKS else TASK, error.reason)]}


def _validate_claimed(work: _Work, settings: ValidateOptions, options: RunOptions) -> ValidateReport:
    """``run_validate`` once the quarantine folder (if any) is claimed and locked."""
    options.events.stage("validate", len(work.shards))
    started = time.perf_counter()
    in_order = _InOrder(len(work.shards), work.slice_info, options.events)
    for i, result in options.run_tasks(_validate_task, [(s, settings) for s in work.shards],
                                       on_error=_validate_failed):
        in_order.add(i, result)
    results = in_order.results
    report = ValidateReport(options=settings, shards=results, slice=work.slice_info)
    if work.quarantine_dir is not None:
        report.quarantine = _quarantine(work, results, in_order.reject_keys, settings, options)
    keep_rejected = work.slice_info is not None and work.quarantine_dir is not None  # merge-reports requarantines
    for r in results:
        r.pop("stamp", None)
        if not keep_rejected:
            r.pop("rejected", None)
    report.seconds = time.perf_counter() - started
    return report


class _InOrder:
    """Shard results as tasks finish them (any order), handed on in shard order: the cross-shard duplicate
    check keeps each key's first occurrence in the list, and progress sees shards as the list names them."""

    def __init__(self, count: int, slice_info: dict | None, events: Events):
        self.results: list[dict | None] = [None] * count
        self.slice_info, self.events = slice_info, events
        self.duplicates = DuplicateKeys()
        self.reject_keys: dict[int, list[str]] = {}  # shard index -> its keys found in an earlier shard
        self.next = 0

    def add(self, i: int, result: dict) -> None:
        self.results[i] = result
        while self.next < len(self.results) and self.results[self.next] is not None:
            self._hand_on(self.next, self.results[self.next])
            self.next += 1

    def _hand_on(self, i: int, r: dict) -> None:
        if self.slice_info:  # a slice keeps its keys and own findings for merge-reports' check across slices
            r["own_findings"] = len(r["findings"])
        repeated = self.duplicates.check(r, r["keys"] if self.slice_info else r.pop("keys"))
        if repeated:
            self.reject_keys[i] = repeated
        self.events.done(r)


def _quarantine(work: _Work, results: list[dict], reject_keys: dict[int, list[str]], settings: ValidateOptions,
                options: RunOptions) -> dict:
    """Quarantine every readable shard with findings (a task each), then write the run's lists; the summary."""
    todo = [i for i, r in enumerate(results) if r["findings"] and r["codec"] is not None]
    tasks = [(work.shards[i], work.quarantine_dir, work.stems[i], results[i]["rejected"], reject_keys.get(i, []),
              settings, results[i].get("stamp")) for i in todo]
    try:
        outcome = {todo[j]: r for j, r in options.run_tasks(_quarantine_task, tasks, on_error=_quarantine_failed)}
    finally:  # a task lost with its worker or node left its temporary files
        remove_leftovers(quarantine_outputs(work.quarantine_dir, work.stems))
    return write_quarantine_lists(work.quarantine_dir, work.shards, results, [outcome[i] for i in todo],
                                  split=options.split, keep_tree=work.keep_tree)
