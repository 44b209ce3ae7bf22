"""Job arrays: slice I of N of an input list, per-slice reports, and merging them into one.

A Slurm or PBS job array runs the same command N times with ``--split I/N`` (convert, validate,
index, balance); each job takes the I-th contiguous block of the full, ordered input list
(``select_slice``; for balance, of the planned output shards) and writes its report
under a slice name (``convert.slice-2-of-3.json``, ``data.slice-2-of-3.list``) with a ``slice``
record: I, N, its block, the total input count and a digest of the whole list. ``merge_reports``
checks that every slice is there and that all were cut from the same list with the same
settings, then writes ``convert.json`` and ``data.list`` exactly as one run over the whole list
would have. Planning here is pure; only ``merge_reports`` touches files.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from typing import Sequence

from .errors import ShardkitError, UsageError
from .manifest import atomic_write_json, atomic_write_lines, load_json

_SPLIT = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
ENTRIES_KEY = "shards"
FAILED_STATUSES = ("failed", "salvaged")
# Recorded settings that never change output bytes, so slices run on nodes with other core counts
# still merge (the merged report keeps slice 1's value). Dotted paths into the report.
MAY_DIFFER = {"convert": ("settings.threads",),
              # validate: totals and findings are recomputed by the merge; the quarantine folder is checked there
              "validate": ("options.threads", "totals", "findings", "quarantine")}


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


def merge_reports(out_dir: str, command: str = "convert", *, entries_key: str = ENTRIES_KEY,
                  may_differ: tuple[str, ...] | None = None) -> dict:
    """Merge ``<command>.slice-I-of-N.json`` (and ``data.slice-I-of-N.list``) in ``out_dir`` into one.

    Writes ``<command>.json`` (the slices' entries concatenated in slice order, everything else as
    the slices agree on it, no ``slice`` record: what one run over the whole list writes) and
    ``data.list`` when the slices have lists. Slice files are kept. Missing slices, slices of
    different N, of different input lists or with different settings raise ``ShardkitError``
    naming them; ``may_differ`` (default ``MAY_DIFFER`` of the reports' own ``command``) lists
    settings exempt from the check. Returns a summary dict.

    validate reports are joined by ``validate.merge_slice_reports`` (duplicate keys checked again
    across slices, quarantine lists rebuilt in the quarantine folder); balance reports as convert's,
    and the shared ``OUT_DIR/.balance`` indexes are removed once every shard is written.
    """
    out_dir = os.path.abspath(out_dir)
    if not os.path.isdir(out_dir):
        raise UsageError("no such folder", shard=out_dir)
    report_name = f"{command}.json"
    found = _found_slices(out_dir, report_name)
    if not found:
        raise ShardkitError(f"no slice reports to merge (looked for {command}.slice-I-of-N.json)", shard=out_dir)
    counts = sorted({count for _, count in found})
    if len(counts) > 1:
        examples = ", ".join(os.path.basename(found[min(k for k in found if k[1] == n)]) for n in counts)
        raise ShardkitError(f"slice reports of different job arrays (N = {', '.join(map(str, counts))}: {examples}); "
                            f"remove the stale ones and merge again", shard=out_dir)
    count = counts[0]
    missing = [i for i in range(1, count + 1) if (i, count) not in found]
    if missing:
        names = ", ".join(os.path.basename(slice_path(report_name, i, count)) for i in missing[:5])
        names += " ..." if len(missing) > 5 else ""
        raise ShardkitError(f"missing slice{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                            f"of {count} (no {names}); rerun those jobs, then merge again", shard=out_dir)

    docs = [_load_slice(found[(i, count)], i, count, entries_key) for i in range(1, count + 1)]
    first = docs[0]
    kind = first.get("command") or command  # the report's own command: --report may have named it otherwise
    may_differ = MAY_DIFFER.get(kind, ()) if may_differ is None else may_differ
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

    manifest = os.path.join(out_dir, report_name)
    if kind == "validate":
        from .validate import merge_slice_reports

        merged = merge_slice_reports(docs)
        atomic_write_json(manifest, merged)
        quarantine = merged.get("quarantine") or {}
        problems = sum(1 for entry in merged["shards"] if entry["findings"])
        listed = None
        if quarantine:
            with open(quarantine["data_list"], encoding="utf-8") as f:
                listed = sum(1 for line in f if line.strip())
        return {"command": "merge-reports", "report": command, "out_dir": out_dir, "slices": count,
                "entries": len(merged["shards"]), "statuses": {}, "problems": problems,
                "findings": len(merged["findings"]), "manifest": manifest,
                "data_list": quarantine.get("data_list"), "listed": listed}

    list_paths = [slice_path(os.path.join(out_dir, "data.list"), i, count) for i in range(1, count + 1)]
    have_lists = [os.path.exists(p) for p in list_paths]
    if any(have_lists) and not all(have_lists):
        absent = [str(i) for i, ok in enumerate(have_lists, start=1) if not ok]
        raise ShardkitError(f"slice report{'s' if len(absent) > 1 else ''} {', '.join(absent)} "
                            f"{'have' if len(absent) > 1 else 'has'} no data.slice-I-of-{count}.list beside "
                            f"{'them' if len(absent) > 1 else 'it'}", shard=out_dir)

    entries = [entry for doc in docs for entry in doc[entries_key]]
    merged = {key: value for key, value in first.items() if key not in ("slice", entries_key)}
    merged[entries_key] = entries
    problems = [entry for entry in entries if isinstance(entry, dict)
                and (entry.get("status") in FAILED_STATUSES or entry.get("findings"))]
    if kind == "balance" and not problems and isinstance(merged.get("sources"), dict):
        from .balance import WORK_DIR, recorded_index_files  # the indexes go below: the report must not name them

        merged["sources"] = {name: recorded_index_files(entry, os.path.join(out_dir, WORK_DIR), True)
                             for name, entry in merged["sources"].items()}
    data_list = None
    if all(have_lists):
        lines = []
        for path in list_paths:
            with open(path, encoding="utf-8") as f:
                lines.extend(line.rstrip("\n") for line in f if line.strip())
        data_list = os.path.join(out_dir, "data.list")
        atomic_write_lines(data_list, lines)
    atomic_write_json(manifest, merged)

    statuses: dict[str, int] = {}
    for entry in entries:
        status = entry.get("status") if isinstance(entry, dict) else None
        if status is not None:
            statuses[status] = statuses.get(status, 0) + 1
    if kind == "balance" and not problems:  # what a single run removes once every shard is written
        import shutil

        shutil.rmtree(os.path.join(out_dir, ".balance"), ignore_errors=True)
    return {"command": "merge-reports", "report": command, "out_dir": out_dir, "slices": count,
            "entries": len(entries), "statuses": statuses, "problems": len(problems),
            "manifest": manifest, "data_list": data_list, "listed": len(lines) if data_list else None}
