"""The Kaldi path's pure steps: transcripts paired with their audio, durations attached, member keys mapped.

Each takes and returns plain values (no file is read here): ``match_utterances`` pairs ``text`` with
``wav.scp`` (and ``segments``), ``attach_durations`` gives each utterance the seconds its probed
recording holds, ``map_member_keys`` renames keys a tar member name cannot carry. What cannot be
paired, read or named becomes a finding (``settings.finding``).
"""

from __future__ import annotations

from shardkit.commands.make.kaldi import Segment, WavEntry
from shardkit.commands.make.settings import finding
from shardkit.io.text import EMPTY_TEXT, key_control_problem, text_problems

# Kaldi's extract-segments accepts a segment ending up to 0.5 s after its recording (--max-overshoot).
MAX_SEGMENT_OVERSHOOT = 0.5


def check_key(key: str) -> str | None:
    """Why a key cannot name tar members (they would be unsafe to every reader), or None."""
    if key.startswith("/") or "\\" in key or ".." in key.split("/"):
        return f"key {key!r} would make an unsafe member name (absolute, backslash or '..')"
    return None


def match_utterances(wav: dict[str, WavEntry], texts: dict[str, str],
                     segments: dict[str, Segment] | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """Pair every transcript with its audio, in transcript order.

    Returns ``(utterances, findings, warnings)``. An utterance is ``{"key", "text", "recording",
    "start", "end"}`` (``start``/``end`` in seconds, None without segments). Findings name each key
    that is skipped and why; a recording no segment uses is only a warning (Kaldi's own
    ``fix_data_dir.sh`` drops those silently).
    """
    utterances: list[dict] = []
    findings: list[dict] = []
    for key, text in texts.items():
        paired = _pair(key, text, wav, segments)
        if isinstance(paired, dict):
            utterances.append(paired)
        else:
            findings += paired
    unpaired, warnings = _unpaired(wav, texts, segments)
    return utterances, findings + unpaired, warnings


def _pair(key: str, text: str, wav: dict[str, WavEntry], segments: dict[str, Segment] | None) -> dict | list[dict]:
    """One transcript's utterance, or the findings that keep it out."""
    recording, start, end = key, None, None
    if segments is not None:
        segment = segments.get(key)
        if segment is None:
            return [finding(key, "no_segment", "in text but not in segments")]
        recording, start, end = segment.recording, segment.start, segment.end
    if recording not in wav:
        where = "in text but not in wav.scp" if segments is None else \
            f"its recording {recording!r} is not in wav.scp"
        return [finding(key, "no_audio", where)]
    problems = text_problems(text)
    control = key_control_problem(key)
    if problems or control is not None:  # an utterance a tokenizer or a list line cannot take is not packed
        return _text_findings(key, text, problems, control)
    unsafe = check_key(key)
    if unsafe:
        return [finding(key, "unsafe_key", unsafe)]
    return {"key": key, "text": text, "recording": recording, "start": start, "end": end}


def _text_findings(key: str, text: str, problems: list[tuple[str, str]], control: tuple[str, str] | None) -> list[dict]:
    """The findings of a transcript a tokenizer cannot take (``text_problems``) or a key a list line cannot."""
    found = [finding(key, "empty_transcript", "empty transcript" if not text.strip() else message)
             if check == EMPTY_TEXT else finding(key, check, message) for check, message in problems]
    if control is not None:
        found.append(finding(key, *control))
    return found


def _unpaired(wav: dict[str, WavEntry], texts: dict[str, str],
              segments: dict[str, Segment] | None) -> tuple[list[dict], list[dict]]:
    """Findings for audio (or segments) without a transcript, and warnings for recordings no segment uses."""
    if segments is None:
        return [finding(key, "no_transcript", "in wav.scp but not in text") for key in wav if key not in texts], []
    findings = [finding(utt, "no_transcript", "in segments but not in text") for utt in segments if utt not in texts]
    used = {s.recording for s in segments.values()}
    warnings = [finding(key, "unused_recording", "in wav.scp but no segment uses it") for key in wav
                if key not in used]
    return findings, warnings


def attach_durations(utterances: list[dict], probes: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """Give each utterance its ``seconds`` and source facts (pure); unreadable or out-of-range ones become findings."""
    kept, findings = [], []
    for utt in utterances:
        info = probes[utt["recording"]]
        if "error" in info:
            findings.append(finding(utt["key"], info.get("check", "unreadable_audio"), info["error"]))
            continue
        seconds = _seconds_within(utt, info["seconds"])
        if isinstance(seconds, dict):
            findings.append(seconds)
            continue
        kept.append({**utt, "seconds": round(seconds, 6), "sample_rate": info["sample_rate"],
                     "source": info["source"]})
    return kept, findings


def _seconds_within(utt: dict, total: float) -> float | dict:
    """The seconds an utterance lasts in a recording of ``total`` seconds, or the finding when its
    segment lies outside the recording (beyond Kaldi's overshoot)."""
    start, end = utt["start"], utt["end"]
    if start is None:
        return total
    stop = total if end is None else end
    if start >= total or stop > total + MAX_SEGMENT_OVERSHOOT:
        return finding(utt["key"], "segment_out_of_range",
                       f"segment {start:g}-{stop:g} s lies outside recording {utt['recording']!r} ({total:.3f} s)")
    return min(stop, total) - start


def map_member_keys(utterances: list[dict]) -> tuple[list[dict], dict[str, str], list[dict]]:
    """Keys with a '.' (or other characters a tar name or WeNet cannot carry) become their
    ``sources.member_key``; returns the utterances, ``{original: mapped}`` and a finding for each
    key that maps onto one already used."""
    from shardkit.commands.make.sources import member_key

    key_map: dict[str, str] = {}
    kept, repeated, seen = [], [], {u["key"] for u in utterances}
    for utt in utterances:
        mapped = member_key(utt["key"])
        if mapped != utt["key"]:
            if mapped in seen:
                repeated.append(finding(utt["key"], "duplicate_key", f"its member key {mapped!r} is already used"))
                continue
            seen.add(mapped)
            key_map[utt["key"]] = mapped
            utt = {**utt, "key": mapped}
        kept.append(utt)
    return kept, key_map, repeated
