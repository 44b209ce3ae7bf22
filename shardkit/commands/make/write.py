"""The write side of every make run, whatever the source: planned shards named, claimed and sliced,
earlier results resumed, the rest written through the executor (journaled), then data.list and make.json.

A source side (``from_kaldi.run_make``, ``manifests.run_make_from``) hands ``write_shards`` a
``PlannedShards``: how many shards, the utterances of each (built only when the shard is handed to a
worker) and the findings to record.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Callable

from shardkit import __version__
from shardkit.commands.make.report import MakeReport
from shardkit.commands.make.settings import JOURNAL, MANIFEST, MakeSettings, shard_fingerprint
from shardkit.commands.make.shard import _shard_failed, _shard_task, _still_valid
from shardkit.io.codecs import CODECS
from shardkit.io.files import load_report, publish_list
from shardkit.io.indexfile import index_beside, with_side_parts
from shardkit.io.remote import is_url
from shardkit.run.events import Events
from shardkit.io.files import atomic_write_json
from shardkit.io.files import remove_leftovers
from shardkit.run.lifecycle import Journal, claim_output, claimed_output_dir, this_run
from shardkit.run.options import RunOptions
from shardkit.run.split import inputs_digest, slice_path, slice_record, with_list

SHARD_STAGE = "make"  # the progress stage of the shard writes (the bar's name)


@dataclass
class PlannedShards:
    """What a source side planned: ``count`` shards, ``utterances(i)`` the utterance dicts of shard ``i``,
    the findings and warnings make.json records, ``inputs`` as make.json records them, ``claim_inputs``
    the files no output may be, ``started`` when the run began, ``extra`` more make.json fields (key_map)."""

    count: int
    utterances: Callable[[int], list[dict]]
    findings: list[dict]
    warnings: list[dict]
    inputs: dict
    claim_inputs: list[str]
    started: float
    extra: dict | None = None


def claimed_run(out_dir: str, claim_inputs: list[str], split: tuple[int, int] | None,
                body: Callable[[str, str], MakeReport]) -> MakeReport:
    """``body(out_dir, journal_dir)`` inside ``lifecycle.claimed_output_dir`` (OUT_DIR claimed, created
    and locked; a URL's journal in a local folder)."""
    with claimed_output_dir(out_dir, claim_inputs, "make", split) as (out_dir, journal_dir):
        return body(out_dir, journal_dir)


@dataclass
class _ShardPlan:
    """The shards one run writes and where its records go: ``tasks`` are ``(path, index, settings,
    fingerprint)``; under ``--split`` only this slice's block, with the slice's own report, list and
    journal names, so that slices sharing OUT_DIR never write the same file."""
    tasks: list[tuple]
    manifest_path: str
    data_list: str
    journal_path: str
    reports: list[str]
    slice_info: dict | None = None


def _plan_writes(count: int, shard_utterances: Callable[[int], list[dict]], claim_inputs: list[str], out_dir: str,
                 journal_dir: str, settings: MakeSettings, split: tuple[int, int] | None) -> _ShardPlan:
    """Name every planned shard and claim the names (no input may be overwritten), then narrow to
    this slice: every slice plans the same shards, so each can work out its own block alone."""
    suffix = ".tar" + CODECS[settings.codec].suffix
    join = (lambda name: f"{out_dir}/{name}") if is_url(out_dir) else (lambda name: os.path.join(out_dir, name))
    tasks = [(join(f"{settings.prefix}{i:09d}{suffix}"), i, settings, shard_fingerprint(shard_utterances(i), settings))
             for i in range(count)]
    if not is_url(out_dir):
        claim_output(out_dir, claim_inputs, [t[0] for t in tasks], what="OUT_DIR")
    plan = _ShardPlan(tasks, join(MANIFEST), join("data.list"), os.path.join(journal_dir, JOURNAL), [join(MANIFEST)])
    if split is not None:  # every slice planned the same shards; each writes its own block of them
        paths = [t[0] for t in tasks]
        plan.slice_info = slice_record(paths, *split)
        plan.slice_info["inputs_sha256"] = inputs_digest(paths + [t[3] for t in tasks])
        plan.tasks = tasks[plan.slice_info["start"]:plan.slice_info["stop"]]
        plan.manifest_path, plan.data_list, plan.journal_path = (
            slice_path(p, *split) for p in (plan.manifest_path, plan.data_list, plan.journal_path))
        plan.reports.insert(0, plan.manifest_path)
    return plan


def _previous_entries(plan: _ShardPlan, journal: Journal, overwrite: bool) -> dict[str, dict]:
    """What earlier runs recorded per shard path (their reports, then the journal of a killed run,
    which wins), so a rerun can skip shards still valid; nothing with ``overwrite``."""
    previous: dict[str, dict] = {}
    if not overwrite:
        for entry in [e for path in plan.reports for e in (load_report(path) or {}).get("shards", [])] + journal.load():
            if entry.get("output"):
                previous[entry["output"]["path"]] = entry
    return previous


def _clear_leftovers(tasks: list[tuple], out_dir: str) -> None:
    """Remove the temporary files of a killed run (its lock died with it), and on a store its
    temporary keys, before any shard is written under the same names."""
    remove_leftovers(with_side_parts(t[0] for t in tasks))
    if is_url(out_dir):
        from shardkit.io.files import remove_temporary_keys

        remove_temporary_keys([t[0] for t in tasks])


def _split_done(tasks: list[tuple], previous: dict[str, dict], overwrite: bool,
                events: Events) -> tuple[dict[int, dict], list[tuple[int, tuple]]]:
    """Sort the tasks into shards a previous run finished with the same fingerprint (reported as
    skipped right away, so progress counts them) and ``(index, task)`` pairs still to write."""
    results: dict[int, dict] = {}
    todo = []
    for i, task in enumerate(tasks):
        entry = previous.get(task[0])
        if not overwrite and _still_valid(entry, task[3]):
            results[i] = {**entry, "status": "skipped", "this_run": "skipped", "planned_path": task[0]}
            events.done(results[i])
        else:
            todo.append((i, task))
    return results, todo


def _write_todo(todo: list[tuple[int, tuple]], shard_utterances: Callable[[int], list[dict]], results: dict[int, dict],
                journal: Journal, options: RunOptions, events: Events) -> None:
    """Write the shards left to do through the executor, journaling each result as it arrives so
    that a killed run resumes; the utterances of a shard are built only when it is handed out."""
    def with_members(task):
        return (task[0], shard_utterances(task[1]), *task[2:])

    try:
        for k, entry in options.run_tasks(_shard_task, [task for _, task in todo], prepare=with_members,
                                          on_error=_shard_failed):
            i, task = todo[k]
            entry["planned_path"] = task[0]
            entry["this_run"] = this_run(entry["status"])
            results[i] = entry
            journal.append(entry)
            events.done(entry)
    finally:
        journal.close(remove=False)
        # a task lost with its worker (killed, or stopped by a signal) left its temporary files: none stays
        remove_leftovers(with_side_parts(task[0] for _, task in todo))


def _write_records(plan: _ShardPlan, results: dict[int, dict], planned: PlannedShards, settings: MakeSettings,
                   out_dir: str) -> MakeReport:
    """data.list (the shards that exist, in plan order) and make.json, written last so that a
    finished report always describes complete shards; a skipped shard is recorded as ok."""
    ordered = [results[i] for i in range(len(plan.tasks))]
    report = MakeReport(out_dir=out_dir, data_list=plan.data_list, manifest=plan.manifest_path,
                        shards=ordered, findings=planned.findings, warnings=planned.warnings,
                        seconds=time.perf_counter() - planned.started, slice=plan.slice_info)
    listed = [e["output"]["path"] for e in ordered if e["status"] in ("ok", "skipped")]
    # a failed shard: data.partial.list, so that no list that looks finished lacks a shard
    report.data_list = publish_list(report.data_list, listed,
                                    complete=not any(e["status"] == "failed" for e in ordered))
    report.index, report.index_note = index_beside(report.data_list, listed)
    recorded = [{**e, "status": "ok"} if e["status"] == "skipped" else e for e in ordered]
    atomic_write_json(plan.manifest_path, {
        "tool": "shardkit", "version": __version__, "command": "make",
        "inputs": planned.inputs,
        "settings": asdict(settings),
        **(planned.extra or {}),
        "summary": report.recorded_summary(),
        "findings": report.skipped_utterances,
        "warnings": planned.warnings,
        "shards": recorded,
        **({"slice": with_list(plan.slice_info, listed)} if plan.slice_info else {}),
    })
    return report


def write_shards(planned: PlannedShards, out_dir: str, journal_dir: str, settings: MakeSettings,
                 options: RunOptions) -> MakeReport:
    """Write the planned shards (each shard's utterances built just before the shard is handed to a
    worker, so that only the shards in flight are held), then data.list and make.json.

    Steps: plan (name, claim and slice), resume (earlier records, leftovers, shards still valid),
    write (the rest, journaled), record (data.list, make.json; the journal goes last). Progress: one
    stage, ``make``, with a ``done`` event per shard (its entry; a shard still valid counts at once)."""
    plan = _plan_writes(planned.count, planned.utterances, planned.claim_inputs, out_dir, journal_dir, settings,
                        options.split)
    journal = Journal(plan.journal_path)
    previous = _previous_entries(plan, journal, options.overwrite)
    _clear_leftovers(plan.tasks, out_dir)
    events = options.events
    events.stage(SHARD_STAGE, len(plan.tasks))
    results, todo = _split_done(plan.tasks, previous, options.overwrite, events)
    _write_todo(todo, planned.utterances, results, journal, options, events)
    report = _write_records(plan, results, planned, settings, out_dir)
    journal.close(remove=True)
    return report
