"""``--split`` for validate: slice reports joined into the report one run over the whole list would have written.

Each slice checked duplicate keys only among its own shards; :func:`merge_slice_reports` redoes the
check over every shard in list order, quarantines again the shards whose duplicates changed, and
rebuilds rejects.jsonl and data.list. :func:`merge_reports` is what ``shardkit merge-reports --command
validate`` runs (found through ``shardkit.commands.report_merger``).
"""

from __future__ import annotations

import os
from typing import Iterator

from shardkit.commands.validate.duplicates import DuplicateKeys
from shardkit.commands.validate.options import ValidateOptions
from shardkit.commands.validate.quarantine import plan_quarantine, quarantine_shard, write_quarantine_lists
from shardkit.commands.validate.report import ValidateReport
from shardkit.errors import ShardkitError


def merge_slice_reports(docs: list[dict]) -> dict:
    """The report one run over the whole list would have written, from slice reports in slice order.

    Each slice checked duplicate keys only among its own shards: the check is redone here over
    every shard in list order. With quarantine, a shard whose duplicate keys changed is
    quarantined again from its source (so the sources must be readable here), and rejects.jsonl
    and data.list are rebuilt from the slices' ``rejects.slice-I-of-N.jsonl``. Raises
    ShardkitError if the slices quarantined into different folders.
    """
    options = ValidateOptions(**docs[0]["options"])
    shards: list[dict] = []
    earlier_repeats: list[list[str]] = []  # per shard: the keys its slice found in an earlier shard
    for doc in docs:
        for shard, repeats in _unpack_slice_shards(doc):
            shards.append(shard)
            earlier_repeats.append(repeats)
    duplicates = DuplicateKeys()
    reject_keys = [duplicates.check(shard, shard.pop("keys")) for shard in shards]
    report = ValidateReport(options=options, shards=shards,
                            seconds=sum(doc["totals"].get("elapsed_s") or 0 for doc in docs))
    quarantines = [doc.get("quarantine") for doc in docs]
    if any(q is not None for q in quarantines):
        report.quarantine = _merge_quarantine(quarantines, shards, reject_keys, earlier_repeats, options)
    for shard in shards:
        shard.pop("rejected", None)
    return report.to_json()


def _unpack_slice_shards(doc: dict) -> Iterator[tuple[dict, list[str]]]:
    """``(shard, earlier_repeats)`` per shard of one slice report, as ``validate_shard`` left it.

    A slice report lists its findings flat, in shard order, each shard's own findings before the
    duplicate-key ones its slice added: those are split off (``earlier_repeats``, their keys) because
    the duplicate check is redone across slices.
    """
    position = 0
    warnings = doc.get("warnings", [])
    for entry in doc["shards"]:
        block = doc["findings"][position:position + entry["findings"]]
        position += entry["findings"]
        own = entry.get("own_findings", len(block))
        shard = {k: v for k, v in entry.items() if k not in ("findings", "own_findings")}
        shard["findings"] = block[:own]
        shard["warnings"] = [w for w in warnings if w["shard"] == shard["shard"]]
        shard.setdefault("keys", [])
        yield shard, [f["key"] for f in block[own:]]


def _merge_quarantine(quarantines: list[dict | None], shards: list[dict], reject_keys: list[list[str]],
                      earlier_repeats: list[list[str]], options: ValidateOptions) -> dict:
    """The quarantine summary of the merged run: the slices' outcomes, shards whose duplicate keys changed
    quarantined again, and rejects.jsonl and data.list written for the whole list."""
    quarantine_dir = _common_quarantine_dir(quarantines)
    paths = [s["shard"] for s in shards]
    keep_tree = quarantines[0].get("keep_tree") if quarantines[0] else None
    stems = plan_quarantine(paths, quarantine_dir, keep_tree)
    outcomes = _slice_outcomes(quarantines)
    _requarantine_changed(shards, reject_keys, earlier_repeats, quarantine_dir, stems, options, outcomes)
    return write_quarantine_lists(quarantine_dir, paths, shards, [outcomes[p] for p in paths if p in outcomes],
                                  keep_tree=keep_tree)


def _common_quarantine_dir(quarantines: list[dict | None]) -> str:
    """The one folder every slice quarantined into: merged lists that mixed folders (or a slice run without
    quarantine) would name outputs that are not there (ShardkitError)."""
    folders = {q["dir"] if q else None for q in quarantines}
    if len(folders) > 1:
        raise ShardkitError(f"slices quarantined into different folders "
                            f"({', '.join(sorted(str(f) for f in folders))}); rerun the odd ones")
    return quarantines[0]["dir"]


def _slice_outcomes(quarantines: list[dict]) -> dict[str, dict]:
    """Quarantine outcome per shard path as the slices wrote them, each with its rejects.jsonl lines back
    in ``lines`` (the slice summaries leave them out) so that the merged rejects.jsonl can be rebuilt."""
    import json

    outcomes: dict[str, dict] = {}
    for q in quarantines:
        lines: dict[str, list] = {}
        with open(q["rejects_jsonl"], encoding="utf-8") as f:
            for text in f:
                if text.strip():
                    line = json.loads(text)
                    lines.setdefault(line["shard"], []).append(line)
        for out in q["shards"]:
            outcomes[out["shard"]] = {**out, "lines": lines.get(out["shard"], [])}
    return outcomes


def _requarantine_changed(shards: list[dict], reject_keys: list[list[str]], earlier_repeats: list[list[str]],
                          quarantine_dir: str, stems: list[str], options: ValidateOptions,
                          outcomes: dict[str, dict]) -> None:
    """Quarantine again, from its source, each shard whose duplicate keys differ across slices from those
    its slice found (its cleaned copy kept or dropped the wrong utterances); updates ``outcomes``."""
    for i, shard in enumerate(shards):
        if reject_keys[i] == earlier_repeats[i] or shard["codec"] is None:
            continue
        before = outcomes.get(shard["shard"])
        redone = quarantine_shard(shard["shard"], quarantine_dir, stems[i], shard.get("rejected") or [],
                                  reject_keys[i], options)
        if before and before["cleaned"] and not redone["cleaned"] and os.path.exists(before["cleaned"]):
            os.unlink(before["cleaned"])  # every utterance it kept is a duplicate now
        outcomes[shard["shard"]] = redone



def merge_reports(slices) -> dict:
    """merge-reports for validate (``shardkit.run.merge.Slices`` in): the report, quarantine lists; a summary."""
    from shardkit.io.files import atomic_write_json

    merged = merge_slice_reports(slices.docs)
    atomic_write_json(slices.report_path, merged)
    quarantine = merged.get("quarantine") or {}
    problems = sum(1 for entry in merged["shards"] if entry["findings"])
    listed = None
    if quarantine:
        with open(quarantine["data_list"], encoding="utf-8") as f:
            listed = sum(1 for line in f if line.strip())
    return {"command": "merge-reports", "report": slices.command, "out_dir": slices.out_dir, "slices": slices.count,
            "entries": len(merged["shards"]), "statuses": {}, "problems": problems,
            "findings": len(merged["findings"]), "manifest": slices.report_path,
            "data_list": quarantine.get("data_list"), "listed": listed}
