"""Job arrays: slice I of N of an input list, per-slice reports, and merging them into one.

A Slurm or PBS job array runs the same command N times with ``--split I/N`` (convert, validate,
index, balance); each job takes the I-th contiguous block of the full, ordered input list
(``select_slice``; for balance, of the planned output shards) and writes its report
under a slice name (``convert.slice-2-of-3.json``, ``data.slice-2-of-3.list``) with a ``slice``
record: I, N, its block, the total input count and a digest of the whole list. ``merge_reports``
checks that every slice is there and that all were cut from the same list with the same
settings, then writes ``convert.json`` and ``data.list`` exactly as one run over the whole list
would have. Planning here is pure; ``shardkit.run.merge.merge_reports`` (a command module above
convert, validate and make) reads the slice reports found here and writes the merged ones.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from typing import Sequence

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.files import load_json, local_size

_SPLIT = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
ENTRIES_KEY = "shards"
FAILED_STATUSES = ("failed", "salvaged")
# Recorded settings that never change output bytes, so slices run on nodes with other core counts
# still merge (the merged report keeps slice 1's value). Dotted paths into the report.
MAY_DIFFER = {"convert": ("settings.threads",),
              # validate: totals and findings are recomputed by the merge; the quarantine folder is checked there
              "validate": ("options.threads", "totals", "findings", "quarantine"),
              # make: the summary and the skipped utterances are recomputed by the merge
              "make": ("summary", "findings")}


def parse_split(text: str) -> tuple[int, int]:
    """``"2/3"`` -> ``(2, 3)``: slice 2 of 3, counting from 1 (Slurm: ``--array=1-3``)."""
    match = _SPLIT.match(str(text))
    if not match:
        raise UsageError(f"--split {text!r} is not I/N (slice I of N, counting from 1, e.g. 2/3)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--split {text}: I must be between 1 and N (slices count from 1)")
    return index, count


def slice_bounds(total: int, index: int, count: int) -> tuple[int, int]:
    """``[start, stop)`` of slice ``index`` of ``count`` over ``total`` items; sizes differ by at most one."""
    if count < 1 or not 1 <= index <= count or total < 0:
        raise ValueError(f"no slice {index} of {count} over {total} items")
    return (index - 1) * total // count, index * total // count


def select_slice(items: Sequence, index: int, count: int) -> list:
    """The items of slice ``index`` of ``count``: contiguous, in order; all slices cover each item once."""
    start, stop = slice_bounds(len(items), index, count)
    return list(items[start:stop])


def inputs_digest(items: Sequence[str]) -> str:
    """sha256 of the whole ordered input list: slices of different lists must not be merged."""
    h = hashlib.sha256()
    for item in items:
        h.update(os.fspath(item).encode("utf-8", "surrogateescape") + b"\n")
    return h.hexdigest()


def slice_record(items: Sequence[str], index: int, count: int) -> dict:
    """What a slice's report records about itself, for ``merge_reports`` to check."""
    start, stop = slice_bounds(len(items), index, count)
    return {"index": index, "count": count, "start": start, "stop": stop, "inputs_total": len(items),
            "inputs_sha256": inputs_digest(items)}


def with_list(record: dict | None, lines: Sequence[str]) -> dict | None:
    """A slice record (``slice_record``) with the list its slice published: ``list`` holds every line in
    order and the shard's size in bytes when it is a local file (None for a URL or a file not there).
    ``merge-reports`` checks the slice's list file against it line by line (``list_mismatch``) and the
    sizes against the shards, so a list edited, cut or reordered after the slice ran is not merged.
    None (a whole run) stays None."""
    if record is None:
        return None
    return {**record, "list": {"lines": list(lines), "sizes": [local_size(line) for line in lines]}}


def _misplaced(number: int, line: str, expected: str, where: dict, seen: dict, found: Sequence[str]) -> str:
    """Why line ``number`` of a slice's list is ``line`` where its report lists ``expected``."""
    if line not in where:
        return f"line {number} is {line!r}, which its report does not list (it lists {expected!r} there)"
    if expected in seen or expected in found[number:]:
        return f"line {number} is {line!r}, which its report lists as line {where[line]} (the order changed)"
    return f"line {number} should be {expected!r} (missing from the list)"


def list_mismatch(found: Sequence[str], reported: Sequence[str]) -> str | None:
    """The first line of a slice's list file (``found``) that differs from what its report lists, said as a
    person would check it (line numbers count from 1), or None when the two agree."""
    where = {}
    for number, line in enumerate(reported, 1):
        where.setdefault(line, number)
    seen: dict[str, int] = {}
    for number, line in enumerate(found, 1):
        if line in seen:
            return f"line {number} repeats line {seen[line]} ({line!r})"
        seen[line] = number
        if number > len(reported):
            return (f"line {number} ({line!r}) is one more than the {len(reported)} its report lists"
                    if line not in where else f"line {number} ({line!r}) is line {where[line]} of its report")
        if line != reported[number - 1]:
            return _misplaced(number, line, reported[number - 1], where, seen, found)
    if len(found) < len(reported):
        return f"line {len(found) + 1} should be {reported[len(found)]!r} (the list stops at {len(found)} lines)"
    return None


def slice_path(path: str, index: int, count: int) -> str:
    """``out/convert.json`` -> ``out/convert.slice-2-of-3.json``; ``data.list`` -> ``data.slice-2-of-3.list``."""
    folder, name = os.path.split(path)
    stem, dot, ext = name.rpartition(".")
    if not stem:  # no extension (or a leading dot only)
        return os.path.join(folder, f"{name}.slice-{index}-of-{count}")
    return os.path.join(folder, f"{stem}.slice-{index}-of-{count}{dot}{ext}")


def _found_slices(out_dir: str, name: str) -> dict[tuple[int, int], str]:
    """``(index, count) -> path`` of every slice file of ``name`` (e.g. ``convert.json``) in out_dir."""
    stem, _, ext = name.rpartition(".")
    pattern = re.compile(rf"{re.escape(stem)}\.slice-(\d+)-of-(\d+)\.{re.escape(ext)}")
    found = {}
    for path in glob.glob(os.path.join(glob.escape(out_dir), f"{glob.escape(stem)}.slice-*-of-*.{ext}")):
        match = pattern.fullmatch(os.path.basename(path))
        if match:
            found[(int(match.group(1)), int(match.group(2)))] = path
    return found


def _load_slice(path: str, index: int, count: int, entries_key: str) -> dict:
    doc = load_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get(entries_key), list):
        raise ShardkitError(f"not a slice report (unreadable JSON or no {entries_key!r} list)", shard=path)
    record = doc.get("slice")
    if not isinstance(record, dict) or (record.get("index"), record.get("count")) != (index, count):
        raise ShardkitError(f"its slice record {record!r} does not match its name (slice {index} of {count})",
                            shard=path)
    total = record.get("inputs_total")
    if not isinstance(total, int) or total < 0:
        raise ShardkitError(f"its slice record has no input count ({record!r})", shard=path)
    start, stop = slice_bounds(total, index, count)
    if (record.get("start"), record.get("stop")) != (start, stop) or len(doc[entries_key]) != stop - start:
        raise ShardkitError(f"holds {len(doc[entries_key])} entries for inputs {record.get('start')}-"
                            f"{record.get('stop')}, but slice {index} of {count} of {record.get('inputs_total')} "
                            f"inputs is {start}-{stop}", shard=path)
    return doc


def _without(doc: dict, paths: tuple[str, ...]) -> dict:
    doc = dict(doc)
    for path in paths:
        head, _, rest = path.partition(".")
        if head in doc:
            if rest and isinstance(doc[head], dict):
                doc[head] = _without(doc[head], (rest,))
            elif not rest:
                del doc[head]
    return doc
