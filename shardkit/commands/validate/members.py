"""Per-member checks: a transcript's text and an audio member's bytes, each a list of ``(check, message)``.

Pure functions of the member's bytes and :class:`~shardkit.commands.validate.options.ValidateOptions`:
the shard scan (``shard.py``) calls them once per member, and prep calls them through it. An audio
member is decoded in full from ``io.BytesIO(member_bytes)``, by soundfile in blocks or by torchaudio
whole (the call WeNet makes); both backends answer the same questions, so a finding never depends on
the backend.
"""

from __future__ import annotations

import io

import numpy as np

from shardkit.commands.validate.names import (
    CHANNELS,
    DECODE,
    DURATION,
    EMPTY_AUDIO,
    FORMAT_MISMATCH,
    NAN,
    SAMPLE_RATE,
    TEXT_ENCODING,
    TRUNCATED,
)
from shardkit.commands.validate.options import ValidateOptions
from shardkit.errors import AudioError
from shardkit.io.audio import (
    DECODED_TOO_LONG,
    DEFAULT_MAX_DECODED_SECONDS,
    EXTENSION_FORMATS,
    FLAC_MD5,
    UNKNOWN_FRAMES,
    AudioHeaderError,
    PcmMd5,
    header_facts,
    open_soundfile,
    sniff_format,
    stable_message,
)
from shardkit.io.text import text_problems

_PARTIAL_BLOCK = 4096


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
            frames, bad = _read_blocks(f, is_float, md5)
            md5_ok = md5 is None or is_float or md5.digest() == expected
            return ((frames, f.channels, bad), f.samplerate, f.frames if f.frames < UNKNOWN_FRAMES else 0, is_float,
                    md5_ok)
    except Exception as err:  # libsndfile reports every failure as a generic error
        # stable_message leaves out the "<_io.BytesIO object at 0x...>" that would make reports differ per run
        raise AudioError(f"soundfile cannot decode it: {stable_message(err)}") from err


def _read_blocks(f, is_float: bool, md5: PcmMd5 | None) -> tuple[int, int]:
    """``(frames, bad)`` of an open soundfile, read to its end block by block: float samples are counted
    when NaN or infinite, integer ones fed to ``md5`` (a FLAC's signature) when there is one."""
    frames = bad = 0
    dtype = "float32" if is_float else md5.dtype if md5 is not None else "int16"
    while len(block := f.read(_DECODE_BLOCK, dtype=dtype, always_2d=True)):  # not blocks(): a stream has no length
        frames += len(block)
        if is_float:
            bad += block.size - int(np.count_nonzero(np.isfinite(block)))
        elif md5 is not None:
            md5.update(block)
    return frames, bad


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
    from shardkit.io.audio import too_long

    if not (content == "wav" and data[:4] == b"RIFF" or content == "flac"):
        return None, None  # other formats: the decoder reports what is wrong
    facts, problem = _read_header(content, data)
    if facts is None:
        return None, problem
    limit = _decode_limit(options)
    if facts["frames"] and (message := too_long(facts["frames"], facts["sample_rate"], limit)) is not None:
        return None, (DECODED_TOO_LONG, message)
    return (facts["frames_declared"] if content == "wav" else None), None


def _read_header(content: str, data: bytes) -> tuple[dict | None, tuple[str, str] | None]:
    """``(facts, None)`` from a WAV or FLAC header, else ``(None, problem)``, or ``(None, None)`` when the
    decode must say (a FLAC that declares no frames)."""
    from shardkit.io.audio import HeaderBeyondHead, flac_total_samples

    try:
        # a FLAC length the header alone does not prove is checked by the full decode below (fewer frames than
        # claimed: truncated), not decoded twice
        return header_facts(data, count=lambda: flac_total_samples(data) or 0), None
    except AudioHeaderError as err:
        if err.check == EMPTY_AUDIO and content == "flac":
            return None, None  # the decode says how many frames there are
        return None, (err.check, err.reason)
    except AudioError as err:
        return None, (DECODE, f"{content.upper()} header is damaged ({err.reason})")
    except HeaderBeyondHead:  # cannot happen with the whole member in hand
        return None, None


def _decode_limit(options: ValidateOptions) -> float | None:
    """The longest decode allowed: --max-decoded-seconds, else none for soundfile (it decodes in blocks)
    and DEFAULT_MAX_DECODED_SECONDS for torchaudio (it decodes a member whole)."""
    if options.max_decoded_seconds is None and options.backend == "torchaudio":
        return DEFAULT_MAX_DECODED_SECONDS
    return options.max_decoded_seconds


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

