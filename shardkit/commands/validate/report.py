"""What a validate run found: :class:`ValidateReport` (per-shard results, totals, the audio mix, the
JSON document, the exit code) and :func:`format_finding`, the one line a person reads per finding."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from shardkit import __version__
from shardkit.commands.validate.names import CORPUS, MIXED_AUDIO, finding
from shardkit.commands.validate.options import ValidateOptions
from shardkit.errors import json_safe


@dataclass
class ValidateReport:
    """What ``validate`` found: per-shard scans (findings, warnings, counts, the sample rates, channel
    counts and audio formats seen), the quarantine it wrote, and the run's timing.
    """
    options: ValidateOptions
    shards: list[dict] = field(default_factory=list)
    quarantine: dict | None = None
    seconds: float = 0.0
    slice: dict | None = None  # with --split: which slice of the list this report covers
    report_path: str | None = None  # where run_validate wrote the JSON report (with --split, the slice's name)

    @property
    def findings(self) -> list[dict]:
        """Every shard's findings, then (with ``strict``) the corpus-wide mixed-format ones."""
        return [f for s in self.shards for f in s["findings"]] + self.mix_findings()

    def mix(self) -> dict[str, dict[str, int]]:
        """Utterances per sample rate, channel count and audio format over every shard (the audio member
        WeNet trains on), most frequent first: a corpus should have one of each."""
        out = {}
        for name, key in (("sample_rate", "sample_rates"), ("channels", "channel_counts"),
                          ("audio_format", "audio_formats")):
            counts: dict[str, int] = {}
            for s in self.shards:
                for value, n in (s.get(key) or {}).items():
                    counts[value] = counts.get(value, 0) + n
            out[name] = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        return out

    def mixed(self) -> list[str]:
        """One sentence per mixed property, e.g. ``2 sample rates: 16000 Hz 19, 8000 Hz 1``."""
        unit = {"sample_rate": " Hz", "channels": " ch", "audio_format": ""}
        words = {"sample_rate": "sample rates", "channels": "channel counts", "audio_format": "audio formats"}
        return [f"{len(counts)} {words[name]}: " + ", ".join(f"{v}{unit[name]} {n}" for v, n in counts.items())
                for name, counts in self.mix().items() if len(counts) > 1]

    def mix_findings(self) -> list[dict]:
        """With ``strict``: each mixed property is a finding of the whole corpus (``--sample-rate`` and
        ``--channels`` name the utterances, and let quarantine set them apart)."""
        if not self.options.strict:
            return []
        return [finding(CORPUS, None, None, MIXED_AUDIO, f"{text} (--strict: one of each expected)")
                for text in self.mixed()]

    @property
    def warnings(self) -> list[dict]:
        """Warning-level findings (key_dot): in the report, never in the exit code or quarantine."""
        return [w for s in self.shards for w in s.get("warnings", [])]

    def by_check(self) -> dict[str, int]:
        """How many findings each check produced, by check name."""
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f["check"]] = counts.get(f["check"], 0) + 1
        return dict(sorted(counts.items()))

    def totals(self) -> dict:
        """The figures over every shard: shards, utterances, members, audio seconds and hours, bytes,
        findings by check, the format mix, and rates per second of the run.
        """
        audio_seconds = sum(s["seconds"] for s in self.shards)
        utterances = sum(s["utterances"] for s in self.shards)
        return {"shards": len(self.shards),
                "shards_with_findings": sum(1 for s in self.shards if s["findings"]),
                "utterances": utterances,
                "members": sum(s["members"] for s in self.shards),
                "audio_seconds": round(audio_seconds, 3),
                "audio_hours": round(audio_seconds / 3600, 4),
                "bytes": sum(s["bytes"] or 0 for s in self.shards),
                "findings": len(self.findings),
                "by_check": self.by_check(),
                "warnings": len(self.warnings),
                "mix": self.mix(),
                "mixed": self.mixed(),
                "elapsed_s": round(self.seconds, 3),
                "utterances_per_s": round(utterances / self.seconds, 1) if self.seconds > 0 else None,
                "audio_hours_per_s": round(audio_seconds / 3600 / self.seconds, 4) if self.seconds > 0 else None}

    def to_json(self) -> dict:
        """The JSON report (``validate.json``): options, totals, each shard's figures, the findings,
        warnings and quarantine; a ``--split`` slice also keeps what merge-reports needs.
        """
        public = ("shard", "bytes", "codec", "utterances", "members", "seconds", "sample_rates", "channel_counts",
                  "audio_formats", "elapsed_s")
        # a slice report also carries what merge-reports needs to redo the cross-shard checks
        merge_fields = ("own_findings", "keys", "rejected") if self.slice else ()
        shards = [{**{k: s.get(k) for k in public}, "findings": len(s["findings"]),
                   **{k: s[k] for k in merge_fields if s.get(k) is not None}} for s in self.shards]
        doc = {"tool": "shardkit", "version": __version__, "command": "validate", "options": asdict(self.options),
               "totals": self.totals(), "shards": shards, "findings": self.findings, "warnings": self.warnings,
               "quarantine": self.quarantine}
        if self.slice:
            doc["slice"] = self.slice
        return json_safe(doc)  # names escaped where not UTF-8: always valid JSON

    @property
    def exit_code(self) -> int:
        """1 when any shard has a finding or (with strict) the corpus mixes formats, else 0 (the CLI's exit status)."""
        return 1 if any(s["findings"] for s in self.shards) or self.mix_findings() else 0


def format_finding(f: dict) -> str:
    """One line for a person: ``SHARD: key 'K': member 'M': CHECK: MESSAGE`` (absent parts left out)."""
    parts = [f["shard"]]
    if f["key"] is not None:
        parts.append(f"key {f['key']!r}")
    if f["member"] is not None and f["member"] != f["key"]:
        parts.append(f"member {f['member']!r}")
    parts.append(f"{f['check']}: {f['message']}")
    return ": ".join(parts)
