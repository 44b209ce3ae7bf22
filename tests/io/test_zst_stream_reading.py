"""shardkit.io.codecs reads zst as the standard library's ZstdFile does: a truncated or damaged stream is a
CorruptStreamError naming the shard after every byte decoded before the damage, output is bounded per read
whatever the ratio, and concatenated frames and the seekable format's skippable seek table read as one stream."""

import io
import struct
import tracemalloc

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit.errors import CorruptStreamError
from shardkit.io.codecs import READ_CHUNK, iter_decompressed, open_writer
from shardkit.io.synth import encode, speech_like

# 2.6 MB of WAV: three frames of the seekable writer (1 MiB each) and its seek table
PAYLOAD = b"".join(encode(speech_like(8.0, 16000, seed), 16000) for seed in range(10))


def _seekable(payload: bytes) -> bytes:
    raw = io.BytesIO()
    with open_writer(raw, "zst") as w:
        w.write(payload)
    return raw.getvalue()


SEEKABLE = _seekable(PAYLOAD)


def _read(blob: bytes, shard: str = "s.tar.zst", codec: str | None = None) -> tuple[bytes, CorruptStreamError | None]:
    got = bytearray()
    try:
        for chunk in iter_decompressed(io.BufferedReader(io.BytesIO(blob)), shard=shard, codec=codec):
            got += chunk
    except CorruptStreamError as err:
        return bytes(got), err
    return bytes(got), None


def _whole_frames_before(blob: bytes, cut: int) -> int:
    """Decompressed bytes of the frames that end at or before ``cut`` (from the seekable format's table)."""
    frames, _, _ = struct.unpack("<IBI", blob[-9:])
    table = blob[-9 - 8 * frames:-9]
    compressed = decompressed = 0
    for i in range(frames):
        size_c, size_d = struct.unpack_from("<II", table, 8 * i)
        if compressed + size_c > cut:
            break
        compressed, decompressed = compressed + size_c, decompressed + size_d
    return decompressed


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(min_value=4, max_value=len(SEEKABLE) - 1))  # (shorter than the magic: not zst)
def test_a_truncated_stream_fails_naming_the_shard_after_what_came_before(cut):
    got, err = _read(SEEKABLE[:cut])
    assert err is not None and str(err).startswith("s.tar.zst: ") and "truncated or corrupt" in str(err)
    assert PAYLOAD.startswith(got)  # what came before the cut is exact
    assert len(got) >= _whole_frames_before(SEEKABLE, cut)  # and no whole frame before it is lost


@settings(max_examples=40, deadline=None)
@given(at=st.integers(min_value=8, max_value=len(SEEKABLE) - 64), flip=st.integers(min_value=1, max_value=255))
def test_a_damaged_byte_is_caught(at, flip):
    blob = bytearray(SEEKABLE)
    blob[at] ^= flip
    got, err = _read(bytes(blob))
    if err is None:  # a flip inside a frame's padding or the seek table's unused bits may change nothing read
        assert got == PAYLOAD
    else:
        assert str(err).startswith("s.tar.zst: ")


def test_concatenated_frames_and_the_seek_table_read_as_one_stream():
    frames = b"".join(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(PAYLOAD[i:i + 300_000])
                      for i in range(0, len(PAYLOAD), 300_000))
    skippable = b"\x50\x2a\x4d\x18" + (5).to_bytes(4, "little") + b"hello"  # any skippable frame, mid-stream
    for blob in (SEEKABLE, frames, frames + skippable + frames):
        got, err = _read(blob)
        reference = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob), read_across_frames=True).read()
        assert err is None and got == reference
    assert _read(SEEKABLE)[0] == PAYLOAD


def test_a_gibibyte_of_zeros_in_one_frame_reads_in_bounded_memory(tmp_path):
    path = tmp_path / "zeros.zst"
    zeros = bytes(1 << 20)
    with open(path, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f, closefd=False) as w:
        for _ in range(1024):
            w.write(zeros)
    assert path.stat().st_size < 1 << 20  # about 1000x smaller than what it holds
    tracemalloc.start()
    total = largest = 0
    try:
        with open(path, "rb") as f:
            for chunk in iter_decompressed(f, shard=str(path)):
                total += len(chunk)
                largest = max(largest, len(chunk))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 1 << 30 and largest <= READ_CHUNK
    assert peak < 16 * READ_CHUNK


@pytest.mark.parametrize("cut", [0.3, 0.999])
def test_the_seekable_table_cut_short_is_an_error(cut):
    blob = SEEKABLE[:int(len(SEEKABLE) * cut)] if cut < 0.99 else SEEKABLE[:-5]
    got, err = _read(blob)
    assert err is not None and PAYLOAD.startswith(got)
    assert len(got) == (len(PAYLOAD) if cut > 0.99 else len(got))  # a cut table: every frame was read before


def _zstdfile_read(blob: bytes) -> tuple[bytes, bool]:
    """What the standard library's ZstdFile (Python 3.14, or its backport) reads of ``blob``, and whether it fails."""
    try:
        from compression import zstd
    except ImportError:
        from backports import zstd
    got = bytearray()
    try:
        with zstd.ZstdFile(io.BytesIO(blob)) as f:
            while chunk := f.read1(1 << 20):
                got += chunk
    except (EOFError, zstd.ZstdError):
        return bytes(got), True
    return bytes(got), False


def test_every_odd_stream_reads_as_zstdfile_reads_it():
    frame = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(PAYLOAD[:50_000])
    skippable = b"\x50\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"xyz"
    odd = [frame + bytes(10), frame + b"garbage!", frame + frame, skippable + frame, frame + skippable,
           frame[:-3], frame[:9], SEEKABLE + frame, frame + skippable[:5]]
    for blob in odd:
        got, err = _read(blob, codec="zst")  # (a stream that starts with a skippable frame is not sniffed as zst)
        expected, fails = _zstdfile_read(blob)
        assert (got, err is not None) == (expected, fails)
