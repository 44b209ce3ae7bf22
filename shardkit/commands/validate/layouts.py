"""validate on a NeMo tarred dataset (its manifest) or a Lhotse Shar folder: what the trainer would meet there.

Every tar is read once through ``shardkit.io.layouts.sources`` (the same reader make, index and balance use);
per utterance (a manifest line, a supervision) the audio member is decoded in full from its bytes
(``check_audio``, the byte-stream path every shard's audio takes), its text is checked as a ``.txt``
member's would be, and the duration the line or cut declares is compared with the decoded audio's: more
than ``DURATION_TOLERANCE`` apart is a ``declared_duration`` finding (NeMo's samplers and Lhotse's buckets
trust the declared value). What the reader finds (a line no tar holds, a member no line or cut names, a cut
whose audio is not in its place, a damaged tar) is a finding too. Findings and the report are validate's:
one result per tar (the manifest's own findings under the manifest), the cross-shard duplicate-key check,
exit 1 on any finding. Tars are read in order in this process: a NeMo line may lie in any tar.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

from shardkit.commands.validate.members import check_text
from shardkit.commands.validate.names import DECLARED_DURATION, DUPLICATE_KEY, KEY_DOT, MISSING_TXT, finding
from shardkit.commands.validate.options import ValidateOptions
from shardkit.commands.validate.shard import _audio_problems, _count_audio, _new_result, check_key_dot
from shardkit.io.text import key_control_problem

DURATION_TOLERANCE = 0.01  # seconds: a manifest rounded to 10 ms still agrees; one sample is always allowed


def validate_dataset(dataset, options: ValidateOptions) -> Iterator[dict]:
    """One result per tar of ``dataset`` (an ``io.layouts.sources`` NemoTarred or SharFolder), as validate_shard
    returns one per shard, then one under the manifest for its own findings (a line that is not JSON, a line
    no tar holds), if any."""
    from shardkit.io.layouts.sources import NemoTarred

    for tar in dataset.shards:
        yield _validate_tar(dataset, tar, options)
    if isinstance(dataset, NemoTarred):
        own = list(dataset.findings) + list(dataset.unread_lines())
        if own:
            result = _empty_result(dataset.manifest)
            result["findings"] = [finding(dataset.manifest, f.member, None, f.check, f.reason) for f in own]
            yield result


def _empty_result(path: str) -> dict:
    size = os.path.getsize(path) if os.path.isfile(path) else None
    return _new_result(path, size, "none") | {"elapsed_s": 0.0}


def _validate_tar(dataset, tar: str, options: ValidateOptions) -> dict:
    from shardkit.io.layouts.sources import SourceFinding

    started = time.perf_counter()
    result = _empty_result(tar)
    audio: dict = {}  # the member last decoded: (name, problems, facts), shared by the lines that name it
    seen: set[str] = set()
    for item in dataset.read_shard(tar):
        if isinstance(item, SourceFinding):
            result["findings"].append(finding(tar, None, item.member, item.check, item.reason))
            continue
        _check_utterance(item, options, audio, seen, result)
    result["seconds"] = round(result["seconds"], 4)
    result["elapsed_s"] = round(time.perf_counter() - started, 4)
    return result


def _check_utterance(utterance: dict, options: ValidateOptions, audio: dict, seen: set[str], result: dict) -> None:
    """One line's or supervision's checks: its text, its audio member decoded (once per member), the duration
    it declares, its key; findings under the tar, key and member."""
    key, member, tar = utterance["key"], utterance["member"], utterance["shard"]
    result["utterances"] += 1
    if audio.get("name") != member:
        result["members"] += 1
        problems, facts = _audio_problems(member.rsplit(".", 1)[-1].lower(), utterance["data"], options)
        audio.update(name=member, problems=problems, facts=facts)
        if facts is not None:
            _count_audio(facts, member.rsplit(".", 1)[-1].lower(), result)
    problems = list(audio["problems"])
    text = utterance["text"]
    if not isinstance(text, str):
        problems.append((MISSING_TXT, "its manifest line or supervision has no text"))
    else:
        problems.extend(check_text(text.encode("utf-8")))
    if audio["facts"] is not None:
        problems.extend(_duration_problems(utterance, audio["facts"]))
    if key in seen:
        problems.append((DUPLICATE_KEY, "key repeats an earlier utterance in this shard"))
    else:
        seen.add(key)
        result["keys"].append(key)
    if (control := key_control_problem(key)) is not None:
        problems.append(control)
    result["findings"].extend(finding(tar, key, member, check, message) for check, message in problems)
    if (dot := check_key_dot(key)) is not None:
        result["warnings"].append({**finding(tar, key, member, KEY_DOT, dot), "severity": "warning"})


def _duration_problems(utterance: dict, facts: dict) -> list[tuple[str, str]]:
    """The declared duration against the decoded audio: a whole member's (NeMo's ``duration``, Shar's cut
    duration), or a segment that must end within it."""
    seconds, rate = facts["seconds"], facts["sample_rate"] or 1
    tolerance = max(DURATION_TOLERANCE, 1 / rate)
    fields = utterance.get("fields") or {}
    if utterance["duration"] is not None and "supervisions" not in fields:  # a NeMo segment (offset + duration)
        end = utterance["start"] + float(utterance["duration"])
        if end > seconds + tolerance:
            return [(DECLARED_DURATION, f"the segment ends at {end:g} s, after the audio's {seconds:g} s")]
        return []
    declared = fields.get("duration")
    if isinstance(declared, bool) or not isinstance(declared, (int, float)):
        return [(DECLARED_DURATION, f"the line or cut declares no numeric duration (got {declared!r})")]
    if abs(float(declared) - seconds) > tolerance:
        return [(DECLARED_DURATION, f"declares {float(declared):g} s, the audio decodes to {seconds:g} s "
                                    f"({round(seconds * rate)} samples at {rate} Hz)")]
    return []
