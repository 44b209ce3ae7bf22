"""One shard, in one pass: :func:`validate_shard` reads it member by member, groups the members by
WeNet's rule (the name up to its last '.', members of one utterance adjacent) and checks each
utterance: grouping, transcript and audio (``members.py``), key. Data problems become findings in the
result dict, never exceptions; the members quarantine must set apart are listed as ``rejected``.

prep runs the same scan on its sources (``iter_indexed_groups``, ``_check_utterance`` and the other
helpers below), so both commands find the same problems.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterator

from shardkit.commands.validate.members import check_audio, check_text
from shardkit.commands.validate.names import (
    CHECK_ERROR,
    DUPLICATE_KEY,
    EMPTY_SHARD,
    KEY_DOT,
    MEMBER_TOO_LARGE,
    MISSING_AUDIO,
    MISSING_FILE,
    MISSING_TXT,
    MULTIPLE_AUDIO,
    MULTIPLE_TXT,
    SPLIT_KEY,
    TAR,
    finding,
)
from shardkit.commands.validate.options import ValidateOptions
from shardkit.errors import ShardkitError, printable
from shardkit.io.audio import stable_message
from shardkit.io.codecs import detect_codec
from shardkit.io.tar import AUDIO_EXTENSIONS, iter_tar_members, open_regular, open_shard, shard_reader, split_key
from shardkit.io.text import key_control_problem


def check_key_dot(key: str) -> str | None:
    """The key_dot warning's message for a key that WebDataset and WeNet split differently, else None.

    WeNet takes the key up to the member name's last '.', WebDataset up to the first '.' after the
    last '/': ``a/b.c.wav`` is key ``a/b.c`` to WeNet, key ``a/b`` with a field ``c.wav`` to WebDataset.
    """
    if "." not in key[key.rfind("/") + 1:]:
        return None
    from shardkit.training.wds import webdataset_key

    wds_key = webdataset_key(key + ".txt")[0]
    reads = "skips its members" if wds_key is None else f"reads its members as key {wds_key!r}"
    return f"key holds a '.': WebDataset {reads} (it splits a name at the first '.', WeNet at the last)"


def iter_indexed_groups(path: str, options: ValidateOptions, on_unsafe: Callable[[int, ShardkitError], None],
                        state: dict) -> Iterator[tuple[str, list[tuple[int, str, str, bytes]]]]:
    """Yield ``(key, [(member_index, name, ext, data), ...])`` per utterance, grouped by WeNet's rule.

    Unlike ``tario.group_samples`` this keeps every member (a repeated extension too) and its
    index in the shard, counting the unsafe members passed to ``on_unsafe``, so that quarantine
    can route each member. A container error ends the scan: it is stored in ``state["error"]``
    and the utterance it cut is left in ``state["cut"]`` (not yielded: it may be incomplete).
    Memory holds one utterance: once its members together pass ``options.max_member_bytes``, the
    data of the next ones is not kept (``None``; validate_shard reports it).
    """
    counter = iter(range(1 << 62))

    def on_error(err: ShardkitError) -> None:
        on_unsafe(next(counter), err)

    group: list[tuple[int, str, str, bytes | None]] = []
    key = None
    held = 0  # bytes of the group's members held
    try:
        with open_shard(path) as f:
            state["codec"] = detect_codec(f.peek(16)[:16])  # a stream (URL, pipe:) is known only once open
            state["size"] = getattr(getattr(f, "raw", None), "size", None)
            members = iter_tar_members(shard_reader(f, shard=path, threads=options.threads), shard=path,
                                       max_member_bytes=options.max_member_bytes, on_error=on_error)
            for name, data in members:
                index = next(counter)
                member_key, ext = split_key(name)
                if group and member_key != key:
                    yield key, group
                    group, held = [], 0
                key = member_key
                held += len(data)
                group.append((index, name, ext, data if held <= options.max_member_bytes or len(group) == 0 else None))
    except ShardkitError as err:
        state["error"] = err
        state["cut"] = (key, group)
        return
    if group:
        yield key, group


def _file_facts(path: str) -> tuple[int | None, str | None, str | None]:
    """``(size, codec, problem)`` of a shard file, without reading more than its head. A URL or ``pipe:``
    input is opened once, by the scan, through the input layer: (None, None, None) here."""
    from shardkit.io.remote import is_local

    if not is_local(path):
        return None, None, None
    try:
        size = os.stat(path).st_size
        if not os.path.isfile(path):
            return None, None, "is not a regular file"
        with os.fdopen(open_regular(path), "rb") as f:
            return size, detect_codec(f.read(16)), None
    except FileNotFoundError:
        return None, None, "no such file"
    except ShardkitError as err:
        return None, None, err.reason
    except OSError as err:
        return None, None, f"cannot read it ({err.strerror or err})"


def validate_shard(path: str, options: ValidateOptions) -> dict:
    """Check one shard in full; never raises for data problems.

    Returns ``{"shard", "bytes", "codec", "utterances", "members", "seconds", "sample_rates",
    "findings", "keys", "rejected", "elapsed_s"}``. ``keys`` (keys of complete utterances, first
    occurrence in the shard) feeds the cross-shard duplicate check; ``rejected`` lists
    ``[member_index, name, key, [checks], [messages]]`` per member that quarantine must set apart.
    """
    started = time.perf_counter()
    result = _new_result(path)
    result["stamp"] = _stamp(path)  # before reading: quarantine's second pass checks the source is the same
    size, codec, problem = _shard_file_facts(path)
    result["bytes"], result["codec"] = size, codec
    if problem is not None:
        result["findings"].append(finding(path, None, None, MISSING_FILE, problem))
    else:
        _scan_shard(path, options, result)
    result["elapsed_s"] = round(time.perf_counter() - started, 4)
    return result


def _shard_file_facts(path: str) -> tuple[int | None, str | None, str | None]:
    """``(size, codec, problem)`` as ``_file_facts``, and a problem too for a path data.list cannot name:
    a shard that no trainer could be pointed at is as missing as one that is not there."""
    size, codec, problem = _file_facts(path)
    if problem is None and printable(path) != path:
        return None, None, ("shard path is not UTF-8: WeNet reads data.list as UTF-8 text and cannot name it; "
                            "rename the file")
    return size, codec, problem


def _scan_shard(path: str, options: ValidateOptions, result: dict) -> None:
    """Check every utterance of a readable shard in its one pass over the data, then say how the pass ended."""
    seen: dict[str, bool] = {}  # key -> whether that utterance was complete (one txt, one audio)
    state: dict = {}
    for key, members in iter_indexed_groups(path, options, _unsafe_recorder(path, result), state):
        _check_utterance(path, key, members, options, seen, result)
    result["codec"] = result["codec"] or state.get("codec")
    result["bytes"] = result["bytes"] if result["bytes"] is not None else state.get("size")
    _report_scan_end(path, state, result)
    result["seconds"] = round(result["seconds"], 4)


def _unsafe_recorder(path: str, result: dict) -> Callable[[int, ShardkitError], None]:
    """The ``on_unsafe`` callback: a member the tar reader refuses is still a member, and quarantine must
    route it to the rejects shard, so it is counted, reported and listed as rejected where it occurs."""
    findings, rejected = result["findings"], result["rejected"]

    def on_unsafe(index: int, err: ShardkitError) -> None:
        result["members"] += 1
        findings.append(finding(path, split_key(err.member or "")[0] or None, err.member, err.check, err.reason))
        rejected.append([index, err.member, None, [err.check], [err.reason]])

    return on_unsafe


def _check_utterance(path: str, key: str, members: list[tuple[int, str, str, bytes | None]],
                     options: ValidateOptions, seen: dict[str, bool], result: dict) -> None:
    """All checks of one utterance, in the order its findings are reported: grouping, contents, key."""
    result["utterances"] += 1
    result["members"] += len(members)
    txt = [m for m in members if m[2] == "txt"]
    audio = [m for m in members if m[2] in AUDIO_EXTENSIONS]
    problems = _grouping_problems(members, txt, audio, options)  # (member, check, message)
    _check_contents(txt, audio, options, problems, result)
    key_problem = _key_problem(key, members[0][1], len(txt) == 1 and len(audio) == 1, seen, result["keys"])
    if key_problem is not None:
        problems.append(key_problem)
    if (control := key_control_problem(key)) is not None:
        problems.append((members[0][1], *control))
    _record_utterance(path, key, members, problems, result)


def _grouping_problems(members: list[tuple[int, str, str, bytes | None]], txt: list, audio: list,
                       options: ValidateOptions) -> list[tuple[str | None, str, str]]:
    """Problems of the utterance's shape: WeNet pairs exactly one txt with one audio member per key, and
    members dropped for size were never checked, so the utterance cannot be vouched for."""
    problems: list[tuple[str | None, str, str]] = []
    names = ", ".join(m[1] for m in members)
    if not audio:
        problems.append((members[0][1], MISSING_AUDIO, f"utterance has no audio member (members: {names})"))
    elif len(audio) > 1:
        problems.append((audio[1][1], MULTIPLE_AUDIO, f"utterance has {len(audio)} audio members ({names})"))
    if not txt:
        problems.append((members[0][1], MISSING_TXT, f"utterance has no txt member (members: {names})"))
    elif len(txt) > 1:
        problems.append((txt[1][1], MULTIPLE_TXT, f"utterance has {len(txt)} txt members"))
    dropped = [m[1] for m in members if m[3] is None]
    if dropped:
        problems.append((dropped[0], MEMBER_TOO_LARGE, f"the utterance's members together exceed the limit of "
                                                       f"{options.max_member_bytes} bytes ({len(dropped)} not "
                                                       "checked)"))
    return problems


def _check_contents(txt: list, audio: list, options: ValidateOptions, problems: list, result: dict) -> None:
    """Append the text and audio problems of the members whose bytes were kept, and add the audio WeNet
    would train on (its last audio member) to the shard's seconds and sample-rate counts."""
    for _, name, _, data in txt:
        if data is not None:
            problems.extend((name, check, message) for check, message in check_text(data))
    for _, name, ext, data in audio:
        if data is None:
            continue
        audio_problems, facts = _audio_problems(ext, data, options)
        problems.extend((name, check, message) for check, message in audio_problems)
        if facts is not None and name == audio[-1][1]:  # WeNet keeps the last audio member
            _count_audio(facts, ext, result)


def _audio_problems(ext: str, data: bytes, options: ValidateOptions) -> tuple[list[tuple[str, str]], dict | None]:
    """``check_audio``'s answer, or a check_error problem when the check itself raised."""
    try:
        return check_audio(ext, data, options)
    except Exception as err:  # noqa: BLE001 - a member nobody foresaw is this utterance's finding, not the run's
        return [(CHECK_ERROR, f"checking it raised {type(err).__name__}: {stable_message(err)}")], None


def _count_audio(facts: dict, ext: str, result: dict) -> None:
    """Add one utterance's audio to the shard's seconds and its sample-rate, channel and format counts."""
    result["seconds"] += facts["seconds"]
    for field_name, value in (("sample_rates", str(facts["sample_rate"])), ("channel_counts", str(facts["channels"])),
                              ("audio_formats", ext)):
        counts = result.setdefault(field_name, {})
        counts[value] = counts.get(value, 0) + 1


def _key_problem(key: str, first_member: str, complete: bool, seen: dict[str, bool],
                 keys: list[str]) -> tuple[str, str, str] | None:
    """The problem of a key met before in this shard, else None after noting the key: a repeat of a complete
    utterance is a duplicate, anything else means its members were not adjacent. Only the first occurrence
    of a complete utterance goes to ``keys``, for the cross-shard duplicate check."""
    if key in seen:
        if complete and seen[key]:
            return (first_member, DUPLICATE_KEY, "key repeats an earlier utterance in this shard")
        return (first_member, SPLIT_KEY, "members of this key are not adjacent in the shard "
                                         "(WeNet reads them as separate utterances)")
    seen[key] = complete
    if complete:
        keys.append(key)
    return None


def _record_utterance(path: str, key: str, members: list[tuple[int, str, str, bytes | None]],
                      problems: list[tuple[str | None, str, str]], result: dict) -> None:
    """Turn one utterance's problems into findings, its key_dot warning, and (an utterance with any problem
    is rejected whole) a rejected entry for each of its members."""
    findings = result["findings"]
    for member, check, message in problems:
        findings.append(finding(path, key, member, check, message))
    if (dot := check_key_dot(key)) is not None:
        result["warnings"].append({**finding(path, key, members[0][1], KEY_DOT, dot), "severity": "warning"})
    if problems:
        checks = sorted({p[1] for p in problems})
        messages = [f"{p[1]}: {p[2]}" for p in problems]
        result["rejected"].extend([index, name, key, checks, messages] for index, name, _, _ in members)


def _report_scan_end(path: str, state: dict, result: dict) -> None:
    """Report a container error that ended the scan (rejecting the utterance it cut, which may be
    incomplete), or a shard that ended cleanly without a single utterance."""
    error = state.get("error")
    if error is None:
        if result["utterances"] == 0:
            result["findings"].append(finding(path, None, None, EMPTY_SHARD, "shard holds no utterance"))
        return
    cut_key, cut = state["cut"]
    check = EMPTY_SHARD if (error.check == TAR and error.reason.startswith("empty")) else error.check
    message = error.reason
    if cut:
        message += f" (utterance {cut_key!r} cut; nothing after it can be read)"
    elif result["utterances"] or result["members"]:
        message += " (nothing after this point can be read)"
    result["findings"].append(finding(path, cut_key if cut else None, error.member, check, message))
    result["members"] += len(cut)
    result["rejected"].extend([index, name, cut_key, [check], [f"{check}: {message}"]] for index, name, _, _ in cut)
    result["scan_error"] = f"{check}: {message}"



def _new_result(path: str, size: int | None = None, codec: str | None = None) -> dict:
    """A shard's result before anything was read: the keys every validate result carries, each count at zero."""
    return {"shard": path, "bytes": size, "codec": codec, "utterances": 0, "members": 0, "seconds": 0.0,
            "sample_rates": {}, "channel_counts": {}, "audio_formats": {}, "findings": [], "keys": [],
            "rejected": [], "warnings": []}


def _stamp(path: str) -> list | None:
    """``[size, mtime_ns]`` of a local file, None if it cannot be read: tells a source changed between passes."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_size, st.st_mtime_ns]
