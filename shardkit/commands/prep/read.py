"""The reading side of prep: one source shard decompressed once, every utterance checked by validate's
own per-utterance checks, the accepted utterances handed back with their member bytes.

This runs in a worker process. The checks are ``shardkit.commands.validate``'s (the same grouping,
container, text and audio checks, with the same findings and the same rejected members), applied to
the bytes as they stream past: the member bytes that were checked are the bytes that get written,
so nothing is read twice. The cross-shard duplicate check needs the shards before this one and is
done by the parent, in list order (``apply_duplicates``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from shardkit.commands import validate as v
from shardkit.errors import ShardkitError
from shardkit.io.files import member_digest

TRANSCODE = "transcode"  # --audio flac|wav: the re-encoded audio did not decode back to the same samples


@dataclass(frozen=True)
class SourceTask:
    """One source shard to read: its path, its corpus (position in the mix) and the check options
    (``options.threads``: decompressor threads, chosen as the task is submitted)."""

    path: str
    corpus: int
    options: v.ValidateOptions
    audio: str = "keep"  # as convert --audio: keep, flac or wav (lossless), before the checks
    flac_level: int | None = None
    dataset: str | None = None  # a tar of a NeMo tarred dataset (its manifest) or Shar folder: see .datasets


def read_source(task: SourceTask) -> dict:
    """Validate one source shard in full and keep its good utterances; never raises for data problems.

    Returns validate's result dict (``findings``, ``rejected``, ``keys``, ``seconds``...) plus
    ``accepted``: ``[key, seconds, [(name, data, sha256 digest), ...]]`` per utterance without a finding, in shard
    order, and ``corpus``.
    """
    if task.dataset is not None:
        from shardkit.commands.prep.datasets import read_dataset_tar

        return read_dataset_tar(task)
    started = time.perf_counter()
    path, options = task.path, task.options
    result = {"shard": path, "corpus": task.corpus, "bytes": None, "codec": None, "utterances": 0, "members": 0,
              "seconds": 0.0, "sample_rates": {}, "findings": [], "keys": [], "rejected": [], "warnings": [],
              "accepted": []}
    size, codec, problem = v._shard_file_facts(path)
    result["bytes"], result["codec"] = size, codec
    if problem is not None:
        result["findings"].append(v.finding(path, None, None, v.MISSING_FILE, problem))
    else:
        _scan(path, options, result, task.audio, task.flac_level)
    result["elapsed_s"] = round(time.perf_counter() - started, 4)
    return result


def _scan(path: str, options: v.ValidateOptions, result: dict, audio: str = "keep",
          flac_level: int | None = None) -> None:
    """validate's scan (``_scan_shard``), keeping each utterance that earned no rejection and its duration
    (the seconds ``_check_utterance`` adds for it: WeNet's audio member, decoded once)."""
    seen: dict[str, bool] = {}
    state: dict = {}
    accepted = result["accepted"]
    for key, members in v.iter_indexed_groups(path, options, v._unsafe_recorder(path, result), state):
        rejected_before, seconds_before = len(result["rejected"]), result["seconds"]
        problem = None
        if audio != "keep":
            members, problem = _transcoded(members, audio, flac_level)
        result["seconds"] = 0.0
        v._check_utterance(path, key, members, options, seen, result)
        seconds = result["seconds"]
        result["seconds"] = seconds_before + seconds
        if problem is not None and len(result["rejected"]) == rejected_before:  # convert would have failed here
            result["findings"].append(v.finding(path, key, problem.member, TRANSCODE, problem.reason))
            result["rejected"].extend([i, name, key, [TRANSCODE], [f"{TRANSCODE}: {problem.reason}"]]
                                      for i, name, _, _ in members)
        if len(result["rejected"]) == rejected_before:  # digests here, in parallel, not in the writing process
            accepted.append([key, seconds, [(name, data, member_digest(name, data)) for _, name, _, data in members]])
    v._report_scan_end(path, state, result)
    result["seconds"] = round(result["seconds"], 4)


def _transcoded(members: list, audio: str, flac_level: int | None) -> tuple[list, ShardkitError | None]:
    """The utterance's members as ``convert --audio`` writes them (verified lossless), and the error of a
    member whose transcode did not verify (it stays as it was; the utterance is rejected)."""
    from shardkit.io.tar import split_key
    from shardkit.io.transcode import transcode_member

    out, problem = [], None
    for index, name, ext, data in members:
        if data is not None:
            try:
                name, data, _ = transcode_member(name, data, audio, flac_level, True)
                ext = split_key(name)[1]
            except ShardkitError as err:
                problem = problem or err.located(member=name)
        out.append((index, name, ext, data))
    return out, problem


def reject_lines(result: dict) -> list[dict]:
    """rejects.jsonl lines of one source (as validate's quarantine writes them, without ``rejects_shard``:
    prep keeps no rejects shard), a line for a scan error that ended the shard early too."""
    lines = [{"shard": result["shard"], "member": name, "key": key, "checks": checks, "reasons": reasons}
             for _, name, key, checks, reasons in result["rejected"]]
    if result.get("scan_error"):
        why = "; the rest of the shard cannot be read and is not in the output"
        lines.append({"shard": result["shard"], "member": None, "key": None,
                      "checks": [result["scan_error"].split(":", 1)[0]], "reasons": [result["scan_error"] + why]})
    elif any(f["check"] == v.MISSING_FILE for f in result["findings"]):
        f = result["findings"][0]
        lines.append({"shard": result["shard"], "member": None, "key": None, "checks": [f["check"]],
                      "reasons": [f"{f['check']}: {f['message']}; nothing of this shard is in the output"]})
    return lines


def apply_duplicates(result: dict, duplicates: v.DuplicateKeys) -> None:
    """The cross-shard duplicate check, in list order: a key already kept from an earlier shard is
    rejected here (validate's finding, quarantine's rejects line) and leaves ``accepted``."""
    repeated = set(duplicates.check(result, result.pop("keys")))
    if not repeated:
        return
    kept = []
    for utterance in result["accepted"]:
        if utterance[0] in repeated:
            for name, _, _ in utterance[2]:
                result["rejected"].append([None, name, utterance[0], [v.DUPLICATE_KEY],
                                           [f"{v.DUPLICATE_KEY}: key is in an earlier shard"]])
        else:
            kept.append(utterance)
    result["accepted"] = kept


def check_source_path(path: str) -> None:
    """A pipe or standard input cannot be stamped for a rerun's check: refuse it (UsageError)."""
    from shardkit.errors import UsageError
    from shardkit.io.remote import STDIN

    if path == STDIN or path.startswith("pipe:"):
        raise UsageError("prep reads files: standard input and pipe: sources cannot be checked on a rerun", shard=path)


__all__ = ["SourceTask", "apply_duplicates", "check_source_path", "read_source", "reject_lines"]
