"""validate: find every problem a trainer would meet in a set of shards, in one pass, before training.

``validate_shard`` checks one shard (container, grouping, text, audio decoded in full from
``io.BytesIO(member_bytes)``) and returns a result dict; data problems become findings, never
exceptions. ``run_validate`` spreads shards over processes or a Ray cluster (``shardkit.run.executor``),
adds the cross-shard duplicate-key check in the parent (in shard order, so the first occurrence is
the one kept), and with a quarantine folder writes, per shard with findings:

- ``DIR/<stem>.tar[.ext]`` (``DIR/<folder>/<stem>...`` when shard file names repeat across folders, see
  ``plan_quarantine``): the good utterances, member bytes untouched, in source order, same codec;
- ``DIR/<stem>.rejects.tar[.ext]``: every other member, bytes untouched (unsafe names included:
  never extract it);
- and once for the run ``DIR/rejects.jsonl`` (one line per rejected member, with its reasons) and
  ``DIR/data.list`` (clean sources as they are, cleaned copies in place of the others).

With ``split=(I, N)`` (job arrays) only slice I of N is validated; ``merge_slice_reports`` (run by
``shardkit merge-reports``) joins the slice reports into what one run would have written, redoing
the duplicate check across slices.

An utterance with any finding is rejected whole. Outputs are deterministic (fixed tar headers,
the codec's default level) and written under a temporary name, fsynced and renamed.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import numpy as np

from shardkit import __version__
from shardkit.errors import AudioError, ShardkitError, UsageError, json_safe, printable
from shardkit.io.audio import (
    AUDIO_CHANNELS,
    AUDIO_FORMAT,
    AUDIO_HEADER,
    DECODED_TOO_LONG,
    DEFAULT_MAX_DECODED_SECONDS,
    EXTENSION_FORMATS,
    FLAC_MD5,
    FLAC_METADATA,
    FLAC_STREAMINFO,
    IMPLAUSIBLE_LENGTH,
    UNKNOWN_FRAMES,
    AudioHeaderError,
    PcmMd5,
    header_facts,
    open_soundfile,
    sniff_format,
    stable_message,
)
from shardkit.io.codecs import CODECS, detect_codec, open_writer
from shardkit.io.inputs import expand_shards, plan_output_paths
from shardkit.io.tar import (
    AUDIO_EXTENSIONS,
    DEFAULT_MAX_MEMBER_BYTES,
    TarWriter,
    iter_tar_members,
    open_regular,
    open_shard,
    shard_reader,
    split_key,
)
from shardkit.io.text import EMPTY_TEXT, KEY_CONTROL, TEXT_CONTROL, key_control_problem, text_problems
from shardkit.run.executor import run_tasks
from shardkit.io.files import AtomicFile
from shardkit.run.lifecycle import (
    DigestingTar,
    atomic_write_lines,
    claimed_output_dir,
    fsync_dir,
    remove_leftovers,
    verify_members,
)
from shardkit.run.split import slice_path, slice_record

# Check names, as they appear in findings. Container:
STREAM = "stream"  # compressed stream truncated or damaged
TAR = "tar"  # not a tar, truncated header or member
# Headers that Python's tarfile (what WeNet and WebDataset read with) could read differently:
TAR_CHECKSUM = "tar_checksum"  # a header's checksum does not match: tarfile stops there
TAR_NUMBER_FIELD = "tar_number_field"  # garbage in mode/uid/gid/size/mtime/checksum/device fields, negative size
TAR_PAX = "tar_pax"  # malformed pax records, a pax size that is not a number, GNU sparse, global path/size
TAR_ZERO_BLOCK = "tar_zero_block"  # data after an end-of-archive block: tarfile stops at the first one
TAR_NAME_CHAIN = "tar_name_chain"  # chained long-name/pax headers, or one with no member after it
TAR_NAME_ENCODING = "tar_name_encoding"  # member name not UTF-8, or holding a NUL (shown escaped)
UNSAFE_MEMBER = "unsafe_member"  # '..', absolute, link, device, directory
MEMBER_TOO_LARGE = "member_too_large"
EMPTY_SHARD = "empty_shard"
MISSING_FILE = "missing_file"  # a shard (e.g. a data.list line) that names no readable file
INPUT = "input"  # a URL or pipe: command that could not be read (HTTP status, stalled, closed early, exit status)
TASK = "task"  # the shard's task raised or its worker died: nothing of it was checked
# Grouping (WeNet's rule: prefix before the last '.', members of one utterance adjacent):
MISSING_TXT = "missing_txt"
MISSING_AUDIO = "missing_audio"
MULTIPLE_AUDIO = "multiple_audio"
MULTIPLE_TXT = "multiple_txt"
SPLIT_KEY = "split_key"  # members of one key apart in the shard
DUPLICATE_KEY = "duplicate_key"  # a complete utterance's key again, in this shard or an earlier one
# Text:
TEXT_ENCODING = "text_encoding"
# EMPTY_TEXT: nothing left after removing whitespace and invisible characters (BOM, zero-width);
# TEXT_CONTROL: a NUL or another control character than tab, CR and LF; KEY_CONTROL: a key holding a control
# character (it cannot appear in a list line). Defined in shardkit.io.text, which make shares.
# Audio:
DECODE = "decode"
TRUNCATED = "truncated"
EMPTY_AUDIO = "empty_audio"
NAN = "nan"
SAMPLE_RATE = "sample_rate"
CHANNELS = "channels"
MIXED_AUDIO = "mixed_audio"  # --strict: more than one sample rate, channel count or audio format in the corpus
CORPUS = "(corpus)"  # the shard field of a finding about every shard together
DURATION = "duration"
FORMAT_MISMATCH = "format_mismatch"

CHECK_ERROR = "check_error"  # a check itself failed on the member (an exception nobody foresaw)

# Warnings: reported, never a reason to reject or to exit 1 (see ValidateReport.exit_code).
KEY_DOT = "key_dot"  # a '.' in the key's last path part: WebDataset's key ends at the first '.', WeNet's at the last
WARNINGS = (KEY_DOT,)

# Audio headers a decoder refuses or reads differently (shardkit.io.audio names them for index and make too):
# AUDIO_FORMAT, AUDIO_HEADER, AUDIO_CHANNELS, FLAC_METADATA, FLAC_STREAMINFO, IMPLAUSIBLE_LENGTH; and after the
# decode FLAC_MD5 (a set MD5 signature the samples do not match), DECODED_TOO_LONG (above --max-decoded-seconds).

CHECKS = (STREAM, TAR, TAR_CHECKSUM, TAR_NUMBER_FIELD, TAR_PAX, TAR_ZERO_BLOCK, TAR_NAME_CHAIN, TAR_NAME_ENCODING,
          UNSAFE_MEMBER, MEMBER_TOO_LARGE, EMPTY_SHARD, MISSING_FILE, INPUT, TASK, MISSING_TXT, MISSING_AUDIO,
          MULTIPLE_AUDIO, MULTIPLE_TXT, SPLIT_KEY, DUPLICATE_KEY, TEXT_ENCODING, EMPTY_TEXT, TEXT_CONTROL, KEY_CONTROL,
          DECODE, TRUNCATED, EMPTY_AUDIO, NAN, SAMPLE_RATE, CHANNELS, DURATION, FORMAT_MISMATCH, AUDIO_FORMAT,
          AUDIO_HEADER, AUDIO_CHANNELS, FLAC_METADATA, FLAC_STREAMINFO, IMPLAUSIBLE_LENGTH, FLAC_MD5, DECODED_TOO_LONG,
          CHECK_ERROR)

BACKENDS = ("soundfile", "torchaudio")
REJECTS_JSONL = "rejects.jsonl"
_PARTIAL_BLOCK = 4096


@dataclass(frozen=True)
class ValidateOptions:
    backend: str = "soundfile"
    sample_rate: int | None = None
    channels: int | None = None
    min_duration: float | None = None
    max_duration: float | None = None
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    threads: int = 1  # decompressor threads per task (bz2, gz)
    # longer members are a finding, not decoded; None: no limit for the soundfile backend (it decodes in blocks),
    # DEFAULT_MAX_DECODED_SECONDS for torchaudio (it decodes a member whole)
    max_decoded_seconds: float | None = None
    strict: bool = False  # more than one sample rate, channel count or audio format is a finding, not a warning


def check_options(options: ValidateOptions) -> None:
    """Refuse contradictory options, and the torchaudio backend without torchaudio (UsageError)."""
    if options.backend not in BACKENDS:
        raise UsageError(f"unknown backend {options.backend!r}; choose from {', '.join(BACKENDS)}")
    if options.min_duration is not None and options.max_duration is not None \
            and options.min_duration > options.max_duration:
        raise UsageError(f"--min-duration {options.min_duration} is above --max-duration {options.max_duration}")
    if options.backend == "torchaudio":
        try:
            import torchaudio  # noqa: F401
        except ImportError:
            raise UsageError("--backend torchaudio needs torchaudio, which is not installed: "
                             "pip install 'shardkit[torch]'") from None


def finding(shard: str, key: str | None, member: str | None, check: str, message: str) -> dict:
    return {"shard": shard, "key": key, "member": member, "check": check, "message": message}


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


# ---------------------------------------------------------------------------------------------
# Per-member checks: return (check, message) pairs; pure functions of the bytes and options.

def check_text(data: bytes) -> list[tuple[str, str]]:
    """WeNet reads a transcript as ``data.decode('utf8').strip()``; both steps must give text, and text a
    tokenizer can take (no NUL or other control characters, something left besides invisible ones)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return [(TEXT_ENCODING, f"transcript is not valid UTF-8 ({err.reason} at byte {err.start})")]
    return text_problems(text)


def _partial_frames(data: bytes) -> int:
    """Frames soundfile decodes before it fails: tells a truncated stream from one that never decodes."""
    frames = 0
    try:
        with open_soundfile(io.BytesIO(data)) as f:
            while len(block := f.read(_PARTIAL_BLOCK, dtype="int16")):  # not blocks(): a stream has no length
                frames += len(block)
    except Exception:  # libsndfile raises a generic error; the frames counted so far are the answer
        pass
    return frames


_DECODE_BLOCK = 1 << 18  # frames decoded at a time: memory holds the member, not its decoded copy too


def _decode_soundfile(data: bytes) -> tuple[tuple[int, int, int], int, int, bool, bool]:
    """``((frames, channels, bad), rate, header_frames, is_float, md5_ok)``, decoded in full, block by block.

    ``bad`` counts NaN or infinite samples; integer PCM decodes to int16 (int32 above 16 bits: a FLAC's MD5
    signature is checked on the exact samples), no NaN possible. ``md5_ok`` is False only for a FLAC whose
    MD5 signature is set and differs from its samples'.
    """
    from shardkit.io.audio import flac_bits, flac_md5

    expected = flac_md5(data)
    md5 = PcmMd5(flac_bits(data)) if expected is not None else None
    try:
        with open_soundfile(io.BytesIO(data)) as f:
            is_float = not f.subtype.startswith("PCM")
            frames = bad = 0
            dtype = "float32" if is_float else md5.dtype if md5 is not None else "int16"
            while len(block := f.read(_DECODE_BLOCK, dtype=dtype, always_2d=True)):  # not blocks(): see above
                frames += len(block)
                if is_float:
                    bad += block.size - int(np.count_nonzero(np.isfinite(block)))
                elif md5 is not None:
                    md5.update(block)
            md5_ok = md5 is None or is_float or md5.digest() == expected
            return ((frames, f.channels, bad), f.samplerate, f.frames if f.frames < UNKNOWN_FRAMES else 0, is_float,
                    md5_ok)
    except Exception as err:  # libsndfile reports every failure as a generic error
        # stable_message leaves out the "<_io.BytesIO object at 0x...>" that would make reports differ per run
        raise AudioError(f"soundfile cannot decode it: {stable_message(err)}") from err


def _flac_header_frames(data: bytes) -> int:
    import soundfile as sf

    try:
        frames = sf.info(io.BytesIO(data)).frames
    except Exception:
        return 0
    return frames if frames < UNKNOWN_FRAMES else 0  # 0: the header does not say


def check_audio(ext: str, data: bytes, options: ValidateOptions) -> tuple[list[tuple[str, str]], dict | None]:
    """Decode an audio member in full and check it: ``(problems, facts)``; facts None if it does not decode.

    Steps: the name against the bytes, what a WAV header promises (a damaged one is reported without
    decoding), one full decode, then the problems of the signal and those against the options.
    """
    if not data:
        return [(EMPTY_AUDIO, "zero-length audio member")], None
    content = sniff_format(data)
    problems = _format_problems(ext, content)
    declared, header_problem = _header_facts(content, data, options)
    if header_problem is not None:
        problems.append(header_problem)
        return problems, None
    try:
        counts, rate, is_float, flac_declared, md5_ok = _decode_audio(content, data, options)
    except AudioError as err:
        problems.append(_decode_failure(content, data, err))
        return problems, None
    if flac_declared:  # only a FLAC has one, and then no WAV header was read
        declared = flac_declared
    problems.extend(_signal_problems(counts, rate, declared, is_float))
    if not md5_ok:
        problems.append((FLAC_MD5, "the decoded samples do not match the MD5 signature in STREAMINFO"))
    frames, channels, _ = counts
    seconds = frames / rate if rate else 0.0
    problems.extend(_expectation_problems(rate, channels, seconds, options))
    return problems, {"seconds": seconds, "sample_rate": rate, "channels": channels, "frames": frames}


def _format_problems(ext: str, content: str | None) -> list[tuple[str, str]]:
    """A member whose extension names another format than its bytes: readers that trust the name fail on it."""
    named = EXTENSION_FORMATS.get(ext)
    if content is not None and named is not None and content != named:
        return [(FORMAT_MISMATCH, f"named .{ext} but the bytes are {content.upper()}")]
    return []


def _header_facts(content: str | None, data: bytes,
                  options: ValidateOptions) -> tuple[int | None, tuple[str, str] | None]:
    """``(frames declared, problem)`` from a RIFF WAV or FLAC header, read before decoding: the frames a WAV
    promises tell a truncated file, and a header a decoder refuses or reads differently is a finding under
    its own check (shardkit.io.audio's) that no decoder need be asked about."""
    from shardkit.io.audio import HeaderBeyondHead, flac_total_samples, too_long

    if not (content == "wav" and data[:4] == b"RIFF" or content == "flac"):
        return None, None  # other formats: the decoder reports what is wrong
    try:
        # a FLAC length the header alone does not prove is checked by the full decode below (fewer frames than
        # claimed: truncated), not decoded twice
        facts = header_facts(data, count=lambda: flac_total_samples(data) or 0)
    except AudioHeaderError as err:
        if err.check == EMPTY_AUDIO and content == "flac":
            return None, None  # the decode says how many frames there are
        return None, (err.check, err.reason)
    except AudioError as err:
        return None, (DECODE, f"{content.upper()} header is damaged ({err.reason})")
    except HeaderBeyondHead:  # cannot happen with the whole member in hand
        return None, None
    limit = options.max_decoded_seconds
    if limit is None and options.backend == "torchaudio":
        limit = DEFAULT_MAX_DECODED_SECONDS
    if facts["frames"] and (message := too_long(facts["frames"], facts["sample_rate"], limit)) is not None:
        return None, (DECODED_TOO_LONG, message)
    return (facts["frames_declared"] if content == "wav" else None), None


def _decode_audio(content: str | None, data: bytes,
                  options: ValidateOptions) -> tuple[tuple[int, int, int], int, bool, int | None, bool]:
    """``((frames, channels, bad), rate, is_float, flac_declared, md5_ok)`` from the chosen backend, in full.

    Both backends must answer the same questions, so that a finding never depends on the backend;
    ``flac_declared`` is the frame count a FLAC header promises (0 or None: it does not say).
    Raises AudioError if the member does not decode.
    """
    if options.backend == "torchaudio":
        from shardkit.io.audio import decode_torchaudio

        samples, rate = decode_torchaudio(data)
        counts = (samples.shape[0], samples.shape[1] if samples.ndim == 2 else 1,
                  samples.size - int(np.count_nonzero(np.isfinite(samples))))
        del samples  # the decoded copy can be far larger than the member: free it before the header read
        return counts, rate, True, (_flac_header_frames(data) or None) if content == "flac" else None, True
    counts, rate, header_frames, is_float, md5_ok = _decode_soundfile(data)
    return counts, rate, is_float, header_frames if content == "flac" else None, md5_ok


def _decode_failure(content: str | None, data: bytes, err: AudioError) -> tuple[str, str]:
    """The problem for a member that does not decode: a FLAC that decodes part of what its header promises is
    truncated (a cut copy, worth saying so), anything else a decode error."""
    if content == "flac":
        declared = _flac_header_frames(data)
        if declared:
            got = _partial_frames(data)
            if got < declared:
                return (TRUNCATED, f"decodes {got} of the {declared} frames the header promises, "
                                   f"then fails ({err.reason})")
    return (DECODE, err.reason)


def _signal_problems(counts: tuple[int, int, int], rate: int, declared: int | None,
                     is_float: bool) -> list[tuple[str, str]]:
    """Problems of the decoded signal itself, whatever the options: nothing in it, less than the header
    promised, or samples that turn a training loss into NaN."""
    frames, channels, bad = counts
    problems: list[tuple[str, str]] = []
    if frames == 0:
        problems.append((EMPTY_AUDIO, "decodes to 0 frames"))
    if declared and frames < declared:
        problems.append((TRUNCATED, f"header promises {declared} frames ({declared / rate:.3f} s), "
                                    f"the data holds {frames} ({frames / rate:.3f} s)"))
    if is_float and frames and bad:
        problems.append((NAN, f"{bad} of {frames * channels} samples are NaN or infinite"))
    return problems


def _expectation_problems(rate: int, channels: int, seconds: float,
                          options: ValidateOptions) -> list[tuple[str, str]]:
    """Problems against what the user said the corpus holds (rate, channels, duration bounds)."""
    problems: list[tuple[str, str]] = []
    if options.sample_rate is not None and rate != options.sample_rate:
        problems.append((SAMPLE_RATE, f"sample rate {rate} Hz, expected {options.sample_rate} Hz"))
    if options.channels is not None and channels != options.channels:
        problems.append((CHANNELS, f"{channels} channels, expected {options.channels}"))
    if options.min_duration is not None and seconds < options.min_duration:
        problems.append((DURATION, f"{seconds:.3f} s is below the minimum of {options.min_duration} s"))
    if options.max_duration is not None and seconds > options.max_duration:
        problems.append((DURATION, f"{seconds:.3f} s is above the maximum of {options.max_duration} s"))
    return problems


# ---------------------------------------------------------------------------------------------
# One shard.

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
    result = {"shard": path, "bytes": None, "codec": None, "utterances": 0, "members": 0, "seconds": 0.0,
              "sample_rates": {}, "channel_counts": {}, "audio_formats": {}, "findings": [], "keys": [],
              "rejected": [], "warnings": []}
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
    rates: dict[str, int] = result["sample_rates"]
    for _, name, ext, data in audio:
        if data is None:
            continue
        try:
            audio_problems, facts = check_audio(ext, data, options)
        except Exception as err:  # noqa: BLE001 - a member nobody foresaw is this utterance's finding, not the run's
            audio_problems, facts = [(CHECK_ERROR, f"checking it raised {type(err).__name__}: "
                                                   f"{stable_message(err)}")], None
        problems.extend((name, check, message) for check, message in audio_problems)
        if facts is not None and name == audio[-1][1]:  # WeNet keeps the last audio member
            result["seconds"] += facts["seconds"]
            rate = str(facts["sample_rate"])
            rates[rate] = rates.get(rate, 0) + 1
            for field_name, value in (("channel_counts", str(facts["channels"])), ("audio_formats", ext)):
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


# ---------------------------------------------------------------------------------------------
# Quarantine: one shard in, a cleaned copy and a rejects shard out.

class _TapReader:
    """Passes reads through; can capture the data of a member the tar reader skips (an unsafe one)."""

    def __init__(self, source):
        self._read = source.read
        self.capture_left = 0
        self.captured: list[bytes] = []

    def read(self, n: int) -> bytes:
        data = self._read(n)
        if self.capture_left:
            take = data[:self.capture_left]
            self.captured.append(take)
            self.capture_left -= len(take)
        return data


class _ShardOut:
    """A shard written through ``lifecycle.AtomicFile``; ``finish`` verifies, fsyncs and renames,
    or removes it if empty."""

    def __init__(self, path: str, codec: str, *, raw_names: bool = False):
        self.path = path
        self.raw_names = raw_names
        self._file = AtomicFile(path).__enter__()
        self._out = open_writer(self._file.file, codec, CODECS[codec].default_level)
        self.tar = DigestingTar(TarWriter(self._out))

    def finish(self) -> str | None:
        self.tar.close()
        self._out.close()
        if self.tar.members == 0:
            self._file.discard()
            return None
        self._file.commit(verify_members(self.tar.written, shard=self.path, raw_names=self.raw_names))
        return self.path

    def abort(self) -> None:
        self._file.discard()


def _stamp(path: str) -> list | None:
    """``[size, mtime_ns]`` of a local file, None if it cannot be read: tells a source changed between passes."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_size, st.st_mtime_ns]


def quarantine_shard(src: str, out_dir: str, stem: str, rejected: list[list], reject_keys: list[str],
                     options: ValidateOptions, stamp: list | None = None) -> dict:
    """Split ``src`` into ``<stem>.tar[.ext]`` (kept) and ``<stem>.rejects.tar[.ext]`` in ``out_dir``.

    ``rejected`` comes from ``validate_shard``; ``reject_keys`` are keys found in an earlier shard
    (every member with such a key is rejected). Returns ``{"shard", "cleaned", "rejects",
    "kept_members", "rejected_members", "lines"}``; ``lines`` are the rejects.jsonl entries.
    """
    by_index = {entry[0]: entry for entry in rejected}
    drop_keys = set(reject_keys)
    try:
        if stamp is not None and _stamp(src) != stamp:
            raise ShardkitError("source changed or vanished since it was validated; validate it again", shard=src)
        with open_shard(src) as f:
            codec = detect_codec(f.read(16))
    except ShardkitError as err:  # this shard's quarantine fails; the run goes on
        return {"shard": src, "cleaned": None, "rejects": None, "kept_members": 0, "rejected_members": 0,
                "lines": [{"shard": src, "member": None, "key": None, "checks": [err.check],
                           "reasons": [f"{err.check}: {err.reason}; nothing of this shard was quarantined"],
                           "rejects_shard": None}]}
    suffix = ".tar" + CODECS[codec].suffix
    cleaned = rejects = None
    lines: list[dict] = []
    counts = {"kept": 0, "rejected": 0}
    pending_unsafe: list = []  # [index, err, regular member size or None] while its bytes are being skipped

    def line(member, key, checks, reasons, stored):
        lines.append({"shard": src, "member": member, "key": key, "checks": checks, "reasons": reasons,
                      "rejects_shard": rejects.path if stored else None})

    def flush_unsafe(tap: _TapReader, complete: bool) -> None:
        if not pending_unsafe:
            return
        index, err, size = pending_unsafe
        pending_unsafe.clear()
        data = b"".join(tap.captured)
        if err.check == TAR_NAME_ENCODING:  # err.member is the escaped name: writing it would rename the member
            line(err.member, None, [err.check], [f"{err.check}: {err.reason}",
                                                 "not kept: its name cannot be written unchanged"], False)
        elif size is not None and complete and len(data) == size:
            rejects.tar.add(err.member, data)
            line(err.member, None, [err.check], [f"{err.check}: {err.reason}"], True)
        else:
            why = "no data to keep (not a regular file)" if size is None else "its bytes could not be kept"
            line(err.member, None, [err.check], [f"{err.check}: {err.reason}", why], False)
        counts["rejected"] += 1

    try:
        os.makedirs(os.path.dirname(os.path.join(out_dir, stem)), exist_ok=True)
        cleaned = _ShardOut(os.path.join(out_dir, stem + suffix), codec)
        rejects = _ShardOut(os.path.join(out_dir, stem + ".rejects" + suffix), codec, raw_names=True)
        with open_shard(src) as f:
            tap = _TapReader(shard_reader(f, shard=src, threads=options.threads))
            index_of = iter(range(1 << 62))

            def on_error(err: ShardkitError) -> None:
                flush_unsafe(tap, True)
                # the parser says how many data bytes follow a refused regular member (None: none to keep)
                size = getattr(err, "member_size", None)
                pending_unsafe[:] = [next(index_of), err, size]
                tap.captured = []
                tap.capture_left = size or 0

            try:
                for name, data in iter_tar_members(tap, shard=src, max_member_bytes=options.max_member_bytes,
                                                   on_error=on_error):
                    flush_unsafe(tap, True)
                    index = next(index_of)
                    key = split_key(name)[0]
                    entry = by_index.get(index)
                    if entry is None and key in drop_keys:
                        entry = [index, name, key, [DUPLICATE_KEY], [f"{DUPLICATE_KEY}: key is in an earlier shard"]]
                    if entry is None:
                        cleaned.tar.add(name, data)
                        counts["kept"] += 1
                    else:
                        rejects.tar.add(name, data)
                        line(name, key, entry[3], entry[4], True)
                        counts["rejected"] += 1
                flush_unsafe(tap, True)
            except ShardkitError as err:
                flush_unsafe(tap, False)
                line(None, None, [err.check], [f"{err.check}: {err.reason}; the rest of the shard cannot be read "
                                               f"and is not in either output"], False)
        if stamp is not None and _stamp(src) != stamp:
            raise ShardkitError("source changed while it was quarantined; validate it again", shard=src)
        result = {"shard": src, "cleaned": cleaned.finish(), "rejects": rejects.finish(),
                  "kept_members": counts["kept"], "rejected_members": counts["rejected"], "lines": lines}
        fsync_dir(os.path.dirname(os.path.join(out_dir, stem)))
        return result
    except BaseException as err:
        for out in (cleaned, rejects):
            if out is not None:
                out.abort()
        if isinstance(err, OSError):
            raise ShardkitError(f"cannot write its quarantine outputs in {out_dir} ({err.strerror or err})",
                                shard=src) from err
        if isinstance(err, ShardkitError) and err.reason.startswith("source changed"):
            return {"shard": src, "cleaned": None, "rejects": None, "kept_members": 0, "rejected_members": 0,
                    "lines": [{"shard": src, "member": None, "key": None, "checks": [err.check],
                               "reasons": [f"{err.check}: {err.reason}; nothing of this shard was quarantined"],
                               "rejects_shard": None}]}
        raise


# ---------------------------------------------------------------------------------------------
# Many shards.

@dataclass
class ValidateReport:
    options: ValidateOptions
    shards: list[dict] = field(default_factory=list)
    quarantine: dict | None = None
    seconds: float = 0.0
    slice: dict | None = None  # with --split: which slice of the list this report covers

    @property
    def findings(self) -> list[dict]:
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
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f["check"]] = counts.get(f["check"], 0) + 1
        return dict(sorted(counts.items()))

    def totals(self) -> dict:
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
        return 1 if any(s["findings"] for s in self.shards) or self.mix_findings() else 0


def _validate_task(args):
    path, options = args
    return validate_shard(path, options)


def _validate_failed(task, error: ShardkitError) -> dict:
    """The result of a shard whose task raised (any library's exception) or whose worker died: one finding."""
    path = task[0]
    return {"shard": path, "bytes": None, "codec": None, "utterances": 0, "members": 0, "seconds": 0.0,
            "sample_rates": {}, "keys": [], "rejected": [], "warnings": [], "elapsed_s": 0.0,
            "findings": [finding(path, None, None, error.check if error.check in CHECKS else TASK, error.reason)]}


def _quarantine_failed(task, error: ShardkitError) -> dict:
    src = task[0]
    return {"shard": src, "cleaned": None, "rejects": None, "kept_members": 0, "rejected_members": 0,
            "lines": [{"shard": src, "member": None, "key": None, "checks": [TASK],
                       "reasons": [f"{TASK}: {error.reason}; nothing of this shard was quarantined"],
                       "rejects_shard": None}]}


def _quarantine_task(args):
    return quarantine_shard(*args)


class DuplicateKeys:
    """The cross-shard duplicate check: shards are fed in list order, and a key's first occurrence is kept."""

    def __init__(self):
        self.first: dict[str, str] = {}  # key -> the shard that holds its first occurrence

    def check(self, result: dict, keys: list[str]) -> list[str]:
        """Add a finding to ``result`` for each of its ``keys`` seen in an earlier shard; returns those keys."""
        repeated = []
        for key in keys:
            first = self.first.get(key)
            if first is None:
                self.first[key] = result["shard"]
            else:
                result["findings"].append(finding(result["shard"], key, None, DUPLICATE_KEY, f"key is also in {first}"))
                repeated.append(key)
        return repeated


def plan_quarantine(shards: list[str], out_dir: str, keep_tree: bool | None = None) -> list[str]:
    """Output stem per shard, relative to ``out_dir`` (pure): ``<stem>``, or ``<folder>/<stem>`` when
    the outputs mirror the input folders (see :func:`shardkit.io.inputs.plan_output_paths`)."""
    out_dir = os.path.abspath(out_dir)
    return [os.path.relpath(p, out_dir) for p in plan_output_paths(shards, out_dir, "", keep_tree=keep_tree)]


def quarantine_names(quarantine_dir: str, split: tuple[int, int] | None) -> tuple[str, str]:
    """``(rejects.jsonl, data.list)`` paths of a run, or of slice I of N (merged by merge-reports)."""
    names = (os.path.join(quarantine_dir, REJECTS_JSONL), os.path.join(quarantine_dir, "data.list"))
    return names if split is None else tuple(slice_path(p, *split) for p in names)


def run_validate(shard_args: list[str], options: ValidateOptions, *, jobs: int | None = None,
                 quarantine_dir: str | None = None, on_plan: Callable[[int], None] | None = None,
                 on_result: Callable[[dict], None] | None = None, executor: str = "local",
                 ray_address: str | None = None, split: tuple[int, int] | None = None,
                 keep_tree: bool | None = None) -> ValidateReport:
    """Validate every shard named by ``shard_args``; see the module docstring.

    ``on_result`` sees each shard's result in shard order, cross-shard duplicates included.
    ``executor``/``ray_address``: where the per-shard tasks run (shardkit.run.executor). ``split=(I, N)``:
    only slice I of N of the list; the report carries a ``slice`` record and what
    ``shardkit merge-reports`` needs to redo the duplicate check across slices, and quarantine
    writes ``rejects.slice-I-of-N.jsonl`` and ``data.slice-I-of-N.list``. ``keep_tree``: the layout of the
    quarantine outputs (see :func:`plan_quarantine`; None: mirror the input folders when file names repeat).
    """
    check_options(options)
    shards = expand_shards(shard_args)
    stems = None
    claimed = contextlib.nullcontext((None, None))
    if quarantine_dir is not None:
        stems = plan_quarantine(shards, quarantine_dir, keep_tree)  # over the whole list: slices never collide
        # every output's folder is claimed too: mirrored outputs (--keep-tree) never land beside a source
        claimed = claimed_output_dir(quarantine_dir, shards + [a for a in shard_args if os.path.isfile(a)],
                                     "validate", split, outputs=quarantine_outputs(os.path.abspath(quarantine_dir),
                                                                                   stems),
                                     what="the quarantine folder", urls=False)
    with claimed as (quarantine_dir, _):
        slice_info = None
        if split is not None:
            slice_info = slice_record(shards, *split)
            shards = shards[slice_info["start"]:slice_info["stop"]]
            stems = stems[slice_info["start"]:slice_info["stop"]] if stems else stems
        if stems is not None:  # temporary files a killed run left (its lock died with it)
            remove_leftovers(quarantine_outputs(quarantine_dir, stems))
        return _validate_claimed(shards, options, stems, slice_info, jobs=jobs, quarantine_dir=quarantine_dir,
                                 on_plan=on_plan, on_result=on_result, executor=executor, ray_address=ray_address,
                                 split=split, keep_tree=keep_tree)


def quarantine_outputs(quarantine_dir: str, stems: list[str]) -> list[str]:
    """Every name quarantine may write for these stems (cleaned and rejects shard, in any codec: a
    shard keeps its source's)."""
    return [os.path.join(quarantine_dir, stem + part + ".tar" + codec.suffix) for stem in stems
            for part in ("", ".rejects") for codec in CODECS.values()]


def _validate_claimed(shards, options, stems, slice_info, *, jobs, quarantine_dir, on_plan, on_result, executor,
                      ray_address, split, keep_tree) -> ValidateReport:
    """``run_validate`` once the quarantine folder (if any) is claimed and locked."""
    if on_plan:
        on_plan(len(shards))
    started = time.perf_counter()

    results: list[dict | None] = [None] * len(shards)
    duplicates = DuplicateKeys()
    reject_keys: dict[int, list[str]] = {}
    next_in_order = 0

    def on_done(i: int, result: dict) -> None:
        nonlocal next_in_order
        results[i] = result
        while next_in_order < len(shards) and results[next_in_order] is not None:
            r = results[next_in_order]
            if slice_info:
                r["own_findings"] = len(r["findings"])
            repeated = duplicates.check(r, r["keys"] if slice_info else r.pop("keys"))
            if repeated:
                reject_keys[next_in_order] = repeated
            if on_result:
                on_result(r)
            next_in_order += 1

    for i, result in run_tasks(_validate_task, [(s, options) for s in shards], jobs=jobs, executor=executor,
                               ray_address=ray_address, on_error=_validate_failed):
        on_done(i, result)
    report = ValidateReport(options=options, shards=results, slice=slice_info)

    if quarantine_dir is not None:
        todo = [i for i, r in enumerate(results) if r["findings"] and r["codec"] is not None]
        tasks = [(shards[i], quarantine_dir, stems[i], results[i]["rejected"], reject_keys.get(i, []), options,
                  results[i].get("stamp")) for i in todo]
        try:
            outcome = {todo[j]: r for j, r in run_tasks(_quarantine_task, tasks, jobs=jobs, executor=executor,
                                                         ray_address=ray_address, on_error=_quarantine_failed)}
        finally:  # a task lost with its worker or node left its temporary files
            remove_leftovers(quarantine_outputs(quarantine_dir, stems))
        report.quarantine = write_quarantine_lists(quarantine_dir, shards, results, [outcome[i] for i in todo],
                                                   split=split, keep_tree=keep_tree)
    for r in results:
        r.pop("stamp", None)
        if not (slice_info and quarantine_dir is not None):
            r.pop("rejected", None)
    report.seconds = time.perf_counter() - started
    return report


def write_quarantine_lists(quarantine_dir: str, shards: list[str], results: list[dict], outcomes: list[dict],
                           *, split: tuple[int, int] | None = None, keep_tree: bool | None = None) -> dict:
    """Write rejects.jsonl and data.list for ``outcomes`` (quarantine results, in shard order); the summary."""
    rejects_path, list_path = quarantine_names(quarantine_dir, split)
    atomic_write_lines(rejects_path, [_json_line(line) for out in outcomes for line in out["lines"]])
    by_shard = {out["shard"]: out for out in outcomes}
    data_list = []
    for src, r in zip(shards, results):
        if src in by_shard:
            if by_shard[src]["cleaned"]:
                data_list.append(by_shard[src]["cleaned"])
        elif not r["findings"]:
            data_list.append(src)
    atomic_write_lines(list_path, data_list)
    return {"dir": quarantine_dir, "data_list": list_path, "rejects_jsonl": rejects_path, "keep_tree": keep_tree,
            "shards": [{k: v for k, v in out.items() if k != "lines"} for out in outcomes],
            "kept_members": sum(out["kept_members"] for out in outcomes),
            "rejected_members": sum(out["rejected_members"] for out in outcomes)}


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


def _json_line(obj: dict) -> str:
    import json

    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def format_finding(f: dict) -> str:
    parts = [f["shard"]]
    if f["key"] is not None:
        parts.append(f"key {f['key']!r}")
    if f["member"] is not None and f["member"] != f["key"]:
        parts.append(f"member {f['member']!r}")
    parts.append(f"{f['check']}: {f['message']}")
    return ": ".join(parts)


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
