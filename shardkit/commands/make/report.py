"""What a make run reports: ``MakeReport`` (the summary printed and kept in make.json, the exit code),
and the join of ``--split`` slice reports into the make.json one whole run would have written."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from shardkit.commands.make.settings import MANIFEST
from shardkit.run.lifecycle import this_run_counts

SHARD_STATUSES = ("ok", "skipped", "failed", "empty")


@dataclass
class MakeReport:
    """What ``make`` did: per-shard entries, the utterances it skipped with why, warnings, the list and manifest."""
    out_dir: str
    data_list: str
    manifest: str
    shards: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    slice: dict | None = None  # with --split: the slice of the planned shards this run wrote
    index: str | None = None  # index.parquet beside data.list (None: see index_note)
    index_note: str | None = None

    @property
    def skipped_utterances(self) -> list[dict]:
        """Every utterance left out: the source-level findings, then those of each shard."""
        return self.findings + [s for e in self.shards for s in e.get("skipped", [])]

    def summary(self) -> dict:
        """The ``--json`` document: shards by status, this run's counts, the listed shards' totals, the
        skipped utterances by check, failures, timing and the index.
        """
        skipped = self.skipped_utterances
        listed = [e for e in self.shards if e["status"] in ("ok", "skipped")]
        return {
            "command": "make",
            "out_dir": self.out_dir,
            "data_list": self.data_list,
            "manifest": self.manifest,
            "shards": len(listed),
            "shard_status": {s: sum(1 for e in self.shards if e["status"] == s) for s in SHARD_STATUSES},
            "this_run": this_run_counts(self.shards),
            **({"slice": self.slice} if self.slice else {}),
            **_listed_totals(listed),
            "skipped_utterances": len(skipped),
            "skipped_by_check": _count_by_check(skipped),
            "findings": skipped,
            "warnings": len(self.warnings),
            "failures": [{"shard": e["planned_path"], "error": e["error"]} for e in self.shards
                         if e["status"] == "failed"],
            "seconds": round(self.seconds, 3),
            "index": self.index, **({"index_note": self.index_note} if self.index_note else {}),
        }

    def recorded_summary(self) -> dict:
        """The summary make.json keeps (findings are listed beside it)."""
        return {k: v for k, v in self.summary().items() if k not in ("findings", "slice", "index", "index_note")}

    @property
    def exit_code(self) -> int:
        """1 when an utterance was skipped or a shard failed, else 0 (the CLI's exit status)."""
        return 1 if self.skipped_utterances or any(e["status"] == "failed" for e in self.shards) else 0


def _listed_totals(listed: list[dict]) -> dict:
    """The utterances, seconds and bytes of the listed shards (ok, or skipped as already done)."""
    return {"utterances": sum(e["utterances"] for e in listed),
            "audio_seconds": round(sum(e["seconds"] for e in listed), 3),
            "bytes_out": sum(e["output"]["size"] for e in listed)}


def _count_by_check(skipped: list[dict]) -> dict[str, int]:
    return {c: sum(1 for s in skipped if s["check"] == c) for c in sorted({s["check"] for s in skipped})}


def merge_slice_reports(docs: list[dict], out_dir: str) -> dict:
    """The make.json one run over every planned shard would have written, from slice reports in order.

    Every slice found the same pairing findings (each put them before its own shards' skipped
    utterances); the summary is recomputed over all shards.
    """
    first = docs[0]
    own = sum(len(e.get("skipped") or []) for e in first["shards"])
    match_findings = first["findings"][:len(first["findings"]) - own]
    shards = [e for doc in docs for e in doc["shards"]]
    report = MakeReport(out_dir=out_dir, data_list=os.path.join(out_dir, "data.list"),
                        manifest=os.path.join(out_dir, MANIFEST), shards=[_as_run(e) for e in shards],
                        findings=match_findings, warnings=first.get("warnings", []),
                        seconds=sum((doc.get("summary") or {}).get("seconds", 0) for doc in docs))
    merged = {k: v for k, v in first.items() if k not in ("slice", "shards")}
    merged["summary"] = report.recorded_summary()
    merged["findings"] = report.skipped_utterances
    merged["shards"] = shards
    return merged


def _as_run(entry: dict) -> dict:
    """A recorded shard entry with the status its run saw (make.json records a skipped shard as ok)."""
    return {**entry, "status": "skipped" if entry.get("this_run") == "skipped" else entry["status"]}


def merge_reports(slices) -> dict:
    """merge-reports for make (``shardkit.run.merge.Slices`` in): the summary and skipped utterances are
    recomputed over every shard; a skipped utterance counts as a problem, as in a single run."""
    from shardkit.run.merge import write_merged

    merged = merge_slice_reports(slices.docs, slices.out_dir)
    return write_merged(slices, merged, skipped=len(merged.get("findings") or []))
