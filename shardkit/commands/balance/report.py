"""What a balance run reports and leaves beside its shards: the report it returns (:class:`BalanceReport`),
the repeats' names (``balance.repeats.jsonl``, read back by :func:`read_repeats`), the sources it records,
and the join of a ``--split`` array's slice reports (:func:`merge_reports`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from shardkit.commands.balance.columns import MixColumns
from shardkit.commands.balance.sources import iter_repeated_keys
from shardkit.planning.balance import BalancePlan
from shardkit.run.split import slice_path

MANIFEST = "balance.json"
# [original key, output key] of every repeat, one JSON array a line: beside balance.json, not in it, so the
# report stays small (a weight of 2 on a 10 M-utterance corpus is 10 M repeats); every slice writes the same
REPEATS = "balance.repeats.jsonl"
WORK_DIR = ".balance"
JOURNAL = ".balance.journal.jsonl"


def shard_table(plan: BalancePlan, paths: Sequence[str] | None) -> list[dict]:
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
    _shards: list[dict] | None  # None (a dry run): the rows are built when first read (:attr:`shards`)
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
    layout: dict | None = None  # --layout nemo|shar: what was written for the whole dataset (manifest, config)

    @property
    def shards(self) -> list[dict]:
        """The rows of the shards this run owns (:func:`shard_table`). A dry run's are built when first read: its
        summary needs none of them (a 20 M-utterance plan's 36 k rows: ~0.15 CPU-s at the run's serial end)."""
        if self._shards is None:
            self._shards = shard_table(self.plan, None)
        return self._shards

    def _named(self, name: str) -> str | None:
        if self.dry_run:
            return None
        path = os.path.join(self.out_dir, name)
        return slice_path(path, self.slice["index"], self.slice["count"]) if self.slice else path

    def summary(self) -> dict:
        """The ``--json`` document: where the outputs are, the plan's figures, what was written this run,
        failures, repeated copies, the ``--wenet-conf`` view when asked, and the elapsed time.
        """
        rows = () if self.dry_run else self.shards  # a dry run writes no shard
        counts = {s: sum(1 for e in rows if e.get("status_this_run") == s) for s in ("ok", "skipped", "failed")}
        return {"command": "balance", "dry_run": self.dry_run, "out_dir": self.out_dir,
                "data_list": self.data_list_path or self._named("data.list"), "manifest": self._named(MANIFEST),
                **({"slice": self.slice} if self.slice else {}), **({"part": self.part} if self.part else {}),
                **self.plan.summary(), "written": counts,
                "this_run": {"done": counts["ok"], "skipped": counts["skipped"], "failed": counts["failed"]},
                "failures": self.failures,
                "plan": self.figures, "repeated_copies": len(self.repeats),
                **({"wenet_conf": self.wenet_conf, "warnings": self.warnings} if self.wenet_conf is not None else {}),
                **({"layout": self.layout} if self.layout is not None else {}),
                "elapsed_seconds": round(self.elapsed, 3)}

    @property
    def exit_code(self) -> int:
        """1 when a shard failed or the plan is not balanced within tolerance, else 0 (the CLI's exit status)."""
        return 1 if self.failures or not self.plan.balanced else 0


def write_repeats(out_dir: str, repeats: Repeats) -> str:
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
    run removes it, and a trainer's layout gets what it writes for the whole dataset (NeMo's manifest,
    joined from the slices' per-shard parts, and config fragment), named in the report and summary
    (``layout``) as a single run names it."""
    import shutil

    from shardkit.run.merge import concatenated, failed_entries, write_merged

    merged = concatenated(slices)
    finished = not failed_entries(merged[slices.entries_key])
    if finished and isinstance(merged.get("sources"), dict):
        merged["sources"] = {name: recorded_index_files(entry, os.path.join(slices.out_dir, WORK_DIR), True)
                             for name, entry in merged["sources"].items()}
    layout = (merged.get("settings") or {}).get("layout", "wenet")
    if finished and layout != "wenet":
        from shardkit.io.layouts import finish_layout

        merged["layout"] = finish_layout(layout, slices.out_dir, [row["path"] for row in merged[slices.entries_key]])
    summary = write_merged(slices, merged)
    if "layout" in merged:
        summary["layout"] = merged["layout"]
    if finished:
        shutil.rmtree(os.path.join(slices.out_dir, WORK_DIR), ignore_errors=True)
    return summary
