"""merge-reports: join the per-slice reports of a ``--split I/N`` job array into one.

The job layer's half: find the slices, check that they belong together, lock the folders, and the
generic join (entries concatenated, lists joined) that convert and index reports need. A command
whose report needs more (validate, make, balance) exposes its own ``merge_reports(slices)``, found
through ``shardkit.commands.report_merger``; this module imports no command.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.files import atomic_write_json, os_reason
from shardkit.run.lifecycle import OutputLock
from shardkit.run.split import (
    ENTRIES_KEY,
    FAILED_STATUSES,
    MAY_DIFFER,
    _found_slices,
    _load_slice,
    _without,
    list_mismatch,
    slice_path,
)


@dataclass(frozen=True)
class Slices:
    """The checked slice reports of one job array, handed to a command's report merger."""

    out_dir: str
    command: str  # the report's stem (``--command``)
    kind: str  # the command that wrote the reports
    docs: list[dict]
    count: int
    entries_key: str

    @property
    def report_path(self) -> str:
        """Where the merged report goes: ``OUT_DIR/COMMAND.json``."""
        return os.path.join(self.out_dir, f"{self.command}.json")


Merger = Callable[[Slices], dict]


@dataclass(frozen=True)
class MergeResult:
    """What a merge did: ``summary`` (the ``--json`` document a command's merger returned), the line a
    person reads (``text()``) and the exit status (1 when a merged entry failed or holds a finding)."""

    summary: dict

    @property
    def exit_code(self) -> int:
        """1 when a merged entry failed or holds a finding, else 0 (the CLI's exit status)."""
        return 1 if self.summary["problems"] else 0

    def text(self) -> str:
        """``merged 3 slices of convert: 7 entries (ok 7); report: OUT/convert.json; list: OUT/data.list``."""
        summary = self.summary
        statuses = self._statuses()
        listed = f"; list: {summary['data_list']}" if summary["data_list"] else ""
        listed += f"; index: {summary['index']}" if summary.get("index") else ""
        return (f"merged {summary['slices']} slices of {summary['report']}: {summary['entries']} entries"
                f"{f' ({statuses})' if statuses else ''}; report: {summary['manifest']}{listed}")

    def _statuses(self) -> str:
        summary = self.summary
        statuses = ", ".join(f"{status} {n}" for status, n in sorted(summary["statuses"].items()))
        if "findings" in summary:
            statuses = f"{summary['findings']} findings in {summary['problems']} shards"
        if summary.get("skipped_utterances"):
            statuses += f"{'; ' if statuses else ''}{summary['skipped_utterances']} utterances skipped"
        return statuses


def merge_reports(out_dir: str, command: str = "convert", *, entries_key: str = ENTRIES_KEY,
                  may_differ: tuple[str, ...] | None = None,
                  mergers: Callable[[str], Merger | None] | None = None) -> MergeResult:
    """Merge ``<command>.slice-I-of-N.json`` (and ``data.slice-I-of-N.list``) in ``out_dir`` into one.

    Writes ``<command>.json`` (the slices' entries concatenated in slice order, everything else as
    the slices agree on it, no ``slice`` record: what one run over the whole list writes) and
    ``data.list`` when the slices have lists. Slice files are kept. Missing slices, slices of
    different N, of different input lists or with different settings raise ``ShardkitError``
    naming them; ``may_differ`` (default ``MAY_DIFFER`` of the reports' own ``command``) lists
    settings exempt from the check. ``mergers(kind)`` gives the command's own merger, or None for
    the generic join (``write_merged``). Returns the merger's summary as a :class:`MergeResult`.
    """
    slices = _checked_slices(out_dir, command, entries_key, may_differ)
    merger = (mergers(slices.kind) if mergers is not None else None) or write_merged
    with ExitStack() as locks:
        for folder in _written_folders(slices.out_dir, slices.kind, slices.docs):
            locks.enter_context(OutputLock(folder, slices.kind))
        return MergeResult(merger(slices))


def _checked_slices(out_dir: str, command: str, entries_key: str, may_differ: tuple[str, ...] | None) -> Slices:
    out_dir = os.path.abspath(out_dir)
    if not os.path.isdir(out_dir):
        raise UsageError("no such folder", shard=out_dir)
    report_name = f"{command}.json"
    found = _found_slices(out_dir, report_name)
    if not found:
        raise ShardkitError(f"no slice reports to merge (looked for {command}.slice-I-of-N.json)", shard=out_dir)
    count = _one_slice_count(out_dir, found)
    _refuse_missing(out_dir, report_name, found, count)
    docs = [_load_slice(found[(i, count)], i, count, entries_key) for i in range(1, count + 1)]
    kind = docs[0].get("command") or command  # the report's own command: --report may have named it otherwise
    _check_slices_agree(out_dir, docs, entries_key, MAY_DIFFER.get(kind, ()) if may_differ is None else may_differ)
    return Slices(out_dir, command, kind, docs, count, entries_key)


def _refuse_missing(out_dir: str, report_name: str, found: dict, count: int) -> None:
    """A ShardkitError naming the slices of ``count`` that wrote no report (at most five file names)."""
    missing = [i for i in range(1, count + 1) if (i, count) not in found]
    if missing:
        names = ", ".join(os.path.basename(slice_path(report_name, i, count)) for i in missing[:5])
        names += " ..." if len(missing) > 5 else ""
        raise ShardkitError(f"missing slice{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                            f"of {count} (no {names}); rerun those jobs, then merge again", shard=out_dir)


def _one_slice_count(out_dir: str, found: dict) -> int:
    counts = sorted({count for _, count in found})
    if len(counts) > 1:
        examples = ", ".join(os.path.basename(found[min(k for k in found if k[1] == n)]) for n in counts)
        raise ShardkitError(f"slice reports of different job arrays (N = {', '.join(map(str, counts))}: {examples}); "
                            f"remove the stale ones and merge again", shard=out_dir)
    return counts[0]


def _check_slices_agree(out_dir: str, docs: list[dict], entries_key: str, may_differ: tuple[str, ...]) -> None:
    first = docs[0]
    first_compared = _without(first, may_differ)
    for i, doc in enumerate(docs[1:], start=2):
        compared = _without(doc, may_differ)
        for field in ("inputs_total", "inputs_sha256"):
            if doc["slice"].get(field) != first["slice"].get(field):
                raise ShardkitError(f"slices 1 and {i} were cut from different input lists ({field} differs)",
                                    shard=out_dir)
        for key in sorted((set(first_compared) | set(compared)) - {"slice", entries_key}):
            if first_compared.get(key) != compared.get(key):
                raise ShardkitError(f"slices 1 and {i} disagree on {key!r} (run with other settings or "
                                    f"another shardkit version); rerun the odd one", shard=out_dir)


def _written_folders(out_dir: str, kind: str, docs: list[dict]) -> list[str]:
    """The folders a merge writes into, each locked as an un-sliced run of ``kind`` locks it, so that
    a merge and such a run never write one folder at once: OUT_DIR, and validate's quarantine folder."""
    folders = [out_dir]
    quarantine = next((doc["quarantine"] for doc in docs if doc.get("quarantine")), None)
    if kind == "validate" and quarantine and os.path.isdir(quarantine["dir"]) and \
            os.path.realpath(quarantine["dir"]) != os.path.realpath(out_dir):
        folders.append(quarantine["dir"])
    return folders


def failed_entries(entries: list) -> list[dict]:
    """The entries a merged run counts as problems (failed status or findings)."""
    return [entry for entry in entries if isinstance(entry, dict)
            and (entry.get("status") in FAILED_STATUSES or entry.get("findings"))]


def concatenated(slices: Slices) -> dict:
    """The generic merged report: the first slice's fields, every slice's entries in order."""
    merged = {key: value for key, value in slices.docs[0].items() if key not in ("slice", slices.entries_key)}
    merged[slices.entries_key] = [entry for doc in slices.docs for entry in doc[slices.entries_key]]
    return merged


def _merged_list(slices: Slices) -> tuple[str | None, int | None]:
    """Join ``data.slice-I-of-N.list`` into ``data.list`` when every slice has one; (path, lines). A slice
    that failed a shard has ``data.slice-I-of-N.partial.list``: the joined list is then ``data.partial.list``."""
    from shardkit.io.files import partial_list_path, publish_list

    out_dir, count = slices.out_dir, slices.count
    full_paths = [slice_path(os.path.join(out_dir, "data.list"), i, count) for i in range(1, count + 1)]
    list_paths = [p if os.path.exists(p) or not os.path.exists(partial_list_path(p)) else partial_list_path(p)
                  for p in full_paths]
    if not _every_slice_listed(out_dir, count, list_paths):
        return None, None
    lines = _checked_lines(slices, list_paths)
    data_list = publish_list(os.path.join(out_dir, "data.list"), lines, complete=list_paths == full_paths)
    return data_list, len(lines)


def _checked_lines(slices: Slices, list_paths: list[str]) -> list[str]:
    """The slices' list files joined, each checked against its report (:func:`check_slice_list`), and no
    shard listed by two slices."""
    lines: list[str] = []
    first_slice: dict[str, int] = {}
    for i, path in enumerate(list_paths, start=1):
        with open(path, encoding="utf-8") as f:
            found = [line.rstrip("\n") for line in f if line.strip()]
        check_slice_list(path, i, slices.count, found, slices.docs[i - 1]["slice"].get("list"))
        for number, line in enumerate(found, 1):
            if line in first_slice:  # each slice's list agrees with its report, but two reports name one shard
                raise ShardkitError(f"slice {i} of {slices.count}: line {number} ({line!r}) is listed by slice "
                                    f"{first_slice[line]} too; the merged list would hold it twice", shard=path)
            first_slice[line] = i
        lines.extend(found)
    return lines


def check_slice_list(path: str, index: int, count: int, found: list[str], recorded: dict | None) -> None:
    """A slice's list file (its lines ``found``) against the list its report recorded (``run.split.with_list``):
    a line dropped, repeated, moved or edited, or a listed shard whose size changed since, is a
    ShardkitError naming the slice, the list and the line. Reports of a version that recorded no list
    are taken as they are."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("lines"), list):
        return
    why = list_mismatch(found, recorded["lines"])
    if why is None:
        why = _changed_size(found, recorded.get("sizes") or [])
    if why is not None:
        raise ShardkitError(f"slice {index} of {count}: its list does not match its report: {why}; rerun "
                            f"slice {index} (or restore its list), then merge again", shard=path)


def _changed_size(lines: list[str], sizes: list) -> str | None:
    """The first listed shard whose size is not the one its slice recorded (None: a URL, not checked)."""
    for number, (line, size) in enumerate(zip(lines, sizes), 1):
        if size is None:
            continue
        try:
            now = os.stat(line).st_size
        except OSError as err:
            return f"line {number}: {line} cannot be read ({os_reason(err)})"
        if now != size:
            return f"line {number}: {line} is {now} bytes, its slice wrote {size}"
    return None


def _every_slice_listed(out_dir: str, count: int, list_paths: list[str]) -> bool:
    """Whether every slice wrote its list (False when none did); some but not all is a ShardkitError."""
    have_lists = [os.path.exists(p) for p in list_paths]
    if any(have_lists) and not all(have_lists):
        absent = [str(i) for i, ok in enumerate(have_lists, start=1) if not ok]
        raise ShardkitError(f"slice report{'s' if len(absent) > 1 else ''} {', '.join(absent)} "
                            f"{'have' if len(absent) > 1 else 'has'} no data.slice-I-of-{count}.list beside "
                            f"{'them' if len(absent) > 1 else 'it'}", shard=out_dir)
    return all(have_lists)


def _merged_index(slices: Slices, data_list: str | None) -> tuple[str | None, str | None]:
    """``index.parquet`` beside the merged list from each slice's ``index.slice-I-of-N.parquet`` (what
    convert and make write beside a slice's list), rows in slice order: the index one run writes.
    (path, None), or (None, why not) when some slices wrote one and some did not, (None, None) when none did.
    """
    from shardkit.io.files import partial_list_path
    from shardkit.io.indexfile import concatenate_indexes, index_name_beside

    if data_list is None:
        return None, None
    full = os.path.join(slices.out_dir, "data.list")
    parts = []
    for i in range(1, slices.count + 1):
        names = [index_name_beside(slice_path(full, i, slices.count)),
                 index_name_beside(partial_list_path(slice_path(full, i, slices.count)))]
        parts.append(next((n for n in names if os.path.exists(n)), None))
    if not any(parts):
        return None, None
    if None in parts:
        return None, (f"no index merged: slice {parts.index(None) + 1} wrote no "
                      f"{os.path.basename(index_name_beside(slice_path(full, parts.index(None) + 1, slices.count)))}")
    path = index_name_beside(data_list)
    try:
        concatenate_indexes(path, parts)
    except (ShardkitError, OSError) as err:
        return None, f"no index merged ({err})"
    return path, None


def write_merged(slices: Slices, merged: dict | None = None, *, skipped: int | None = None) -> dict:
    """Write the merged report (``merged``, or the generic concatenation) and ``data.list``; the summary.

    ``skipped``: utterances the slices skipped (make's findings), which count as problems.
    """
    merged = concatenated(slices) if merged is None else merged
    entries = merged[slices.entries_key]
    problems = failed_entries(entries)
    data_list, listed = _merged_list(slices)
    index, index_note = _merged_index(slices, data_list)
    atomic_write_json(slices.report_path, merged)
    statuses: dict[str, int] = {}
    for entry in entries:
        status = entry.get("status") if isinstance(entry, dict) else None
        if status is not None:
            statuses[status] = statuses.get(status, 0) + 1
    return {"command": "merge-reports", "report": slices.command, "out_dir": slices.out_dir, "slices": slices.count,
            "entries": len(entries), "statuses": statuses, "problems": len(problems) + (skipped or 0),
            **({"skipped_utterances": skipped} if skipped is not None else {}),
            "manifest": slices.report_path, "data_list": data_list, "listed": listed,
            **({"index": index} if index else {}), **({"index_note": index_note} if index_note else {})}
