"""merge-reports: join the per-slice reports of a ``--split I/N`` job array into one.

Above the command modules (it joins validate's and make's reports with their own rules), below
the CLI. ``split`` stays pure planning and imports no command, so no module imports another in a
circle.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

from .errors import ShardkitError, UsageError
from .lifecycle import OutputLock, atomic_write_json, atomic_write_lines
from .split import ENTRIES_KEY, FAILED_STATUSES, MAY_DIFFER, _found_slices, _load_slice, _without, slice_path


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

    with ExitStack() as locks:
        for folder in _written_folders(out_dir, kind, docs):
            locks.enter_context(OutputLock(folder, kind))
        return _write_merged(out_dir, command, kind, docs, count, entries_key)


def _written_folders(out_dir: str, kind: str, docs: list[dict]) -> list[str]:
    """The folders a merge writes into, each locked as an un-sliced run of ``kind`` locks it, so that
    a merge and such a run never write one folder at once: OUT_DIR, and validate's quarantine folder."""
    folders = [out_dir]
    quarantine = next((doc["quarantine"] for doc in docs if doc.get("quarantine")), None)
    if kind == "validate" and quarantine and os.path.isdir(quarantine["dir"]) and \
            os.path.realpath(quarantine["dir"]) != os.path.realpath(out_dir):
        folders.append(quarantine["dir"])
    return folders


def _write_merged(out_dir: str, command: str, kind: str, docs: list[dict], count: int, entries_key: str) -> dict:
    """The writing half of ``merge_reports``, once the slices are checked and the folders locked."""
    report_name = f"{command}.json"
    first = docs[0]
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
    if kind == "make":  # its summary and skipped utterances are recomputed over every shard
        from .make import merge_slice_reports as merge_make

        merged = merge_make(docs, out_dir)
    else:
        merged = {key: value for key, value in first.items() if key not in ("slice", entries_key)}
        merged[entries_key] = entries
    problems = [entry for entry in entries if isinstance(entry, dict)
                and (entry.get("status") in FAILED_STATUSES or entry.get("findings"))]
    skipped = len(merged.get("findings") or []) if kind == "make" else 0  # skipped utterances: a run's exit 1
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
            "entries": len(entries), "statuses": statuses, "problems": len(problems) + skipped,
            **({"skipped_utterances": skipped} if kind == "make" else {}),
            "manifest": manifest, "data_list": data_list, "listed": len(lines) if data_list else None}
