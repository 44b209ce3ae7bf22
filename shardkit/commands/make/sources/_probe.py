"""Header facts of audio: bytes in hand (a tar member, a Parquet cell) or a file, URL or command;
never a full decode."""

from __future__ import annotations

import os

from shardkit.errors import AudioError, ShardkitError
from shardkit.io.audio import (
    EMPTY_AUDIO,
    AudioHeaderError,
    HeaderBeyondHead,
    count_frames,
    header_facts,
    probe,
    probe_file,
    sniff_format,
)
from shardkit.io.remote import is_url


class Reason(str):
    """Why audio is not usable, with the check that names it (``unreadable_audio`` unless the header says
    more: shardkit.io.audio's ``audio_header``, ``flac_metadata``, ``truncated``, ...)."""

    check = "unreadable_audio"

    def __new__(cls, text: str, check: str | None = None):
        reason = super().__new__(cls, text)
        if check is not None:
            reason.check = check
        return reason

    def __reduce__(self):  # a str subclass pickles as its text: keep the check across processes
        return (Reason, (str(self), self.check))


def check_of(reason: str) -> str:
    """The check name a probe's reason carries (``unreadable_audio`` for a plain string)."""
    return getattr(reason, "check", "unreadable_audio")


def probe_bytes(data: bytes) -> tuple[float, int, int] | str:
    """``(seconds, sample_rate, channels)``, or the reason (a Reason naming its check) the bytes are not
    usable audio: a header a decoder refuses or reads differently is refused here, not packed."""
    if not data:
        return Reason("empty audio", EMPTY_AUDIO)
    try:
        info = probe(data)
    except AudioHeaderError as err:
        return Reason(err.reason, err.check)
    except AudioError as err:
        facts = probe_torchcodec(data)  # m4a, wma, ...: what libsndfile does not read
        return facts if facts is not None else Reason(err.reason)
    if info["frames_declared"] > info["frames"]:
        return Reason(f"WAV header promises {info['frames_declared']} frames, the data holds {info['frames']} "
                      "(truncated)")
    return info["frames"] / info["sample_rate"], info["sample_rate"], info["channels"]


def probe_member_once(utterance: dict, cache: dict) -> tuple[float, int, int] | str:
    """``probe_bytes`` of a layout utterance's audio member (``io.layouts.sources``), probed once for the lines or
    supervisions that share it (``cache`` holds the last member's answer)."""
    where = (utterance["shard"], utterance["member"])
    if where not in cache:
        cache.clear()
        cache[where] = probe_bytes(utterance["data"])
    return cache[where]


def probe_torchcodec(data: bytes) -> tuple[float, int, int] | None:
    """Header facts through torchcodec/FFmpeg (the torch extra) for containers libsndfile cannot read;
    None when it is not installed or cannot read them either."""
    from shardkit.io.audio import sniff_format

    if sniff_format(data) not in ("m4a", "wma", "mp3", "ogg"):
        return None
    try:
        from torchcodec.decoders import AudioDecoder

        meta = AudioDecoder(data).metadata
    except Exception:  # not installed, or FFmpeg cannot open it: the soundfile reason stands
        return None
    seconds = meta.duration_seconds_from_header
    if not seconds or not meta.sample_rate:
        return None
    return float(seconds), int(meta.sample_rate), int(meta.num_channels or 1)


HEAD_BYTES = 1 << 16  # what planning reads of a file or URL: enough for a WAV header or FLAC's STREAMINFO


def probe_head(head: bytes, size: int, location: str) -> tuple[float, int, int] | str | None:
    """``(seconds, sample_rate, channels)`` from the first bytes of audio whose full length is ``size``,
    the reason (a Reason) it is not usable, or None when the head does not tell (another format, a header
    past the head, a FLAC length only a decode can tell).

    WAV and FLAC by shardkit's own header readers (~30x faster than libsndfile), every fact one the bytes
    can hold: a WAV's frames from the data present, a FLAC's metadata blocks walked to the first frame."""
    if not (head[:4] == b"RIFF" and head[8:12] == b"WAVE" or head[:4] == b"fLaC"):
        return None
    try:
        info = header_facts(head, size)
    except HeaderBeyondHead:
        return None
    except AudioHeaderError as err:
        return Reason(f"{location}: {err.reason}", err.check)
    except AudioError:
        return None  # not a header shardkit reads: libsndfile is asked
    if info["frames_declared"] > info["frames"]:
        return Reason(f"{location}: WAV header promises {info['frames_declared']} frames, the file holds "
                      f"{info['frames']} (truncated)")
    return info["frames"] / info["sample_rate"], info["sample_rate"], info["channels"]


def probe_url(url: str) -> tuple | str:
    """``probe_audio`` for an fsspec URL: the object's size and its first ``HEAD_BYTES`` (a ranged
    read); the rest of the object too only when its head does not tell (another format, a streamed WAV)."""
    from shardkit.io.remote import _describe

    try:
        head, size, facts = _url_head(url)
    except ShardkitError as err:
        return f"cannot read {url} ({err.reason})"
    except Exception as err:  # drivers raise their own families (botocore, aiohttp, OSError)
        return f"cannot read {url} ({_describe(err)})"
    if facts is None:
        if size is None and len(head) <= HEAD_BYTES:  # a length the store does not tell: read it all
            head = _url_bytes(url)
        facts, size = probe_bytes(head), len(head)
    return facts if isinstance(facts, str) else (*facts, size, 0)


def _url_head(url: str) -> tuple[bytes, int | None, tuple[float, int, int] | str | None]:
    """``(bytes read, the object's size or None, probe_head's answer)``: the head, and the whole object
    when the head does not tell and the size is known."""
    from shardkit.io.remote import filesystem

    fs, path = filesystem(url, None)
    size = fs.size(path)
    head = fs.cat_file(path, start=0, end=HEAD_BYTES if size is None else min(size, HEAD_BYTES))
    facts = probe_head(head, size, url) if size is not None else None
    if facts is None and size is not None and len(head) < size:
        rest = fs.cat_file(path, start=len(head), end=size)
        head = rest if len(rest) == size else head + rest  # a server that ignores ranges sends it all
    return head, size, facts


FIRST_READ_BYTES = 4096  # a WAV header or FLAC's STREAMINFO nearly always lies in the first page


def _probe_local_head(f, size: int, location: str) -> tuple[bytes, tuple[float, int, int] | str | None]:
    """``(head, probe_head(head, ...))`` of a local audio file, without the kernel's readahead pulling
    in the rest (planning a cold corpus would otherwise read all of it, one file at a time, before
    packing reads it again): one page, more only when the header reaches past it."""
    try:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
    except (AttributeError, OSError):  # not Linux, or a file system without it: only slower
        pass
    head = f.read(FIRST_READ_BYTES)
    facts = probe_head(head, size, location)
    if facts is None and len(head) < min(size, HEAD_BYTES):
        head += f.read(HEAD_BYTES - len(head))
        facts = probe_head(head, size, location)
    return head, facts


def probe_audio(location: str) -> tuple | str:
    """``(seconds, sample_rate, channels, size, mtime_ns)`` of a file, URL or ``pipe:`` command
    from its header, or the reason it cannot be read. A URL's mtime_ns is 0."""
    try:
        if location.startswith("pipe:"):
            return _probe_pipe(location)
        if is_url(location):
            return probe_url(location)
        return _probe_local(location)
    except ShardkitError as err:
        return err.reason
    except OSError as err:
        return f"cannot read {location} ({err.strerror or err})"


def _probe_pipe(location: str) -> tuple | str:
    """A ``pipe:`` command's output, read whole (its length is only known at its end)."""
    from shardkit.commands.make.kaldi import run_pipe

    data = run_pipe(location[5:], key=location)
    facts = probe_bytes(data)
    return facts if isinstance(facts, str) else (*facts, len(data), 0)


def _probe_local(location: str) -> tuple | str:
    """A local file: its head first, the whole file only when the head does not tell."""
    with open(location, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        _, facts = _probe_local_head(f, st.st_size, location)
    if facts is not None:
        return facts if isinstance(facts, str) else (*facts, st.st_size, st.st_mtime_ns)
    try:
        info = _probe_whole_file(location, st.st_size)  # a header past the head, a length to count
    except AudioHeaderError as err:
        return Reason(f"{location}: {err.reason}", err.check)
    except AudioError as err:  # libsndfile reports every failure as one generic error
        return Reason(f"cannot read the audio header of {location} ({err.reason})")
    if info["frames_declared"] > info["frames"]:
        return Reason(f"{location}: WAV header promises {info['frames_declared']} frames, the file holds "
                      f"{info['frames']} (truncated)")
    return (info["frames"] / info["sample_rate"], info["sample_rate"], info["channels"], st.st_size,
            st.st_mtime_ns)


def _probe_whole_file(location: str, size: int) -> dict:
    """Header facts of a whole local file: WAV and FLAC headers walked through a memory map (the page cache
    holds the file, not this process), other formats by libsndfile."""
    import mmap

    if size == 0:
        raise AudioHeaderError(EMPTY_AUDIO, f"{location} is empty")
    with open(location, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        if sniff_format(view[:16]) not in ("wav", "flac") or view[:4] == b"RF64":
            return probe_file(location)  # a length the header leaves unknown is counted by decoding
        return header_facts(view, size, count=lambda: count_frames(location))


def _url_bytes(url: str) -> bytes:
    from shardkit.io.remote import open_input

    try:
        with open_input(url) as f:
            return f.read()
    except ShardkitError as err:
        raise AudioError(f"cannot read {url} ({err.reason})") from err
    except OSError as err:
        raise AudioError(f"cannot read {url} ({err.strerror or err})") from err
