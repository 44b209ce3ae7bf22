"""index on audio members above the streaming threshold: a header that tells the length is enough
(RIFF WAV, FLAC with STREAMINFO's total); any other member (Ogg Vorbis, a FLAC of unknown length) is
spooled to a temporary file and probed whole, so its duration is the whole member's.

The threshold (tario.STREAM_MEMBER_BYTES, as index imported it) and the head read from a streamed
member are made small, so real members of a few hundred KB take the large-member path.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile

import numpy as np
import pytest
import soundfile as sf

import shardkit.commands.index as index
from shardkit.commands.index import build_index, flac_total_samples, index_shard, iter_index
from shardkit.errors import ShardkitError
from shardkit.run.options import RunOptions

THRESHOLD = 64 << 10
HEAD = 16 << 10


@pytest.fixture
def small_threshold(monkeypatch, tmp_path):
    """Members above 64 KiB stream, 16 KiB of head; temporary files go to a folder of the test's own."""
    monkeypatch.setattr(index, "STREAM_MEMBER_BYTES", THRESHOLD)
    monkeypatch.setattr(index, "HEAD_BYTES", HEAD)
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    made = []
    real = tempfile.NamedTemporaryFile

    def counting(*args, **kwargs):
        f = real(*args, **kwargs)
        made.append(f.name)
        return f

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", counting)
    return spool, made


def noise(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    return (np.random.default_rng(7).standard_normal((int(seconds * rate), channels)) * 0.1).astype("float32")


def encode(fmt: str, subtype: str, seconds: float, rate: int, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, noise(seconds, rate, channels), rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def unknown_length_flac(seconds: float, rate: int) -> bytes:
    """A FLAC whose STREAMINFO says 0 total samples (unknown), as an encoder writing to a pipe leaves it.

    soundfile cannot write one itself (to a pipe, libsndfile 1.2.2 loses the stream's end), so a
    soundfile FLAC gets its 36-bit total cleared; the frames are untouched.
    """
    data = bytearray(encode("FLAC", "PCM_16", seconds, rate))
    assert flac_total_samples(bytes(data)) == int(seconds * rate)
    data[21] &= 0xF0
    data[22:26] = bytes(4)
    assert flac_total_samples(bytes(data)) == 0
    return bytes(data)


def write_shard(path, members: list[tuple[str, bytes]]) -> str:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def whole_member_facts(data: bytes) -> tuple[int, float]:
    """Frames and duration of the whole member as soundfile reads it (decoding it, for an unknown length)."""
    info = sf.info(io.BytesIO(data))
    frames = info.frames if info.frames < 1 << 62 else decoded_frames(data)
    return frames, frames / info.samplerate


def decoded_frames(data: bytes) -> int:
    class Stream(sf.SoundFile):  # as index.count_frames: no seek past the end of a stream of unknown length
        def seekable(self):
            return False

    total = 0
    with Stream(io.BytesIO(data)) as f:
        block = np.empty((4096, f.channels), np.int16)
        while (got := len(f.read(out=block))) == len(block):
            total += got
    return total + got


def check_record(record: dict, data: bytes, fmt: str):
    frames, duration = whole_member_facts(data)
    assert record["format"] == fmt
    assert abs(record["frames"] - frames) <= 1
    assert record["duration"] == pytest.approx(duration, abs=1 / record["sample_rate"])


def test_a_large_ogg_vorbis_member_is_spooled_and_probed_whole(small_threshold, tmp_path):
    spool, made = small_threshold
    ogg = encode("OGG", "VORBIS", 20, 44100, channels=2)
    assert len(ogg) > 4 * THRESHOLD
    # the head alone gives a wrong length: what the index recorded before
    assert sf.info(io.BytesIO(ogg[:HEAD])).frames != sf.info(io.BytesIO(ogg)).frames
    shard = write_shard(tmp_path / "s.tar", [("u/a.txt", b"hello"), ("u/a.ogg", ogg),
                                             ("u/b.txt", b"small"), ("u/b.wav", encode("WAV", "PCM_16", 1, 16000))])
    records = index_shard(shard, "c")
    assert [r["key"] for r in records] == ["u/a", "u/b"]
    check_record(records[0], ogg, "ogg")
    assert records[0]["duration"] == pytest.approx(20, abs=1 / 44100)
    assert len(made) == 1 and made[0].startswith(str(spool)) and made[0].endswith(".ogg")
    assert os.listdir(spool) == []  # deleted after
    with open(shard, "rb") as f:  # the offset still points at the member's data
        blob = f.read()
    (name, offset, size), = [m for m in records[0]["members"] if m[0] == "u/a.ogg"]
    assert blob[offset:offset + size] == ogg


@pytest.mark.parametrize("codec", ["none", "zst"])
def test_a_large_flac_of_unknown_length_is_counted_whole(small_threshold, tmp_path, codec):
    spool, made = small_threshold
    flac = unknown_length_flac(10, 16000)
    assert len(flac) > 2 * THRESHOLD
    shard = write_shard(tmp_path / "s.tar", [("u/a.txt", b"hello"), ("u/a.flac", flac)])
    if codec == "zst":
        import zstandard

        with open(shard, "rb") as f, open(shard + ".zst", "wb") as out:
            zstandard.ZstdCompressor(level=1).copy_stream(f, out)
        shard += ".zst"
    (record,) = index_shard(shard, "c")
    check_record(record, flac, "flac")
    assert record["frames"] == 160000 and record["duration"] == 10.0
    assert len(made) == 1 and os.listdir(spool) == []


def test_a_small_flac_of_unknown_length_is_counted_too(small_threshold, tmp_path):
    """Below the threshold the member is whole in memory: soundfile's header says SF_COUNT_MAX frames there too."""
    spool, made = small_threshold
    flac = unknown_length_flac(1, 16000)
    assert len(flac) < THRESHOLD
    (record,) = index_shard(write_shard(tmp_path / "s.tar", [("u/a.txt", b"hello"), ("u/a.flac", flac)]), "c")
    assert (record["frames"], record["duration"]) == (16000, 1.0)
    assert made == []


def test_large_wav_and_flac_of_known_length_keep_the_header_probe(small_threshold, tmp_path):
    spool, made = small_threshold
    wav = encode("WAV", "PCM_16", 10, 16000)
    flac = encode("FLAC", "PCM_16", 10, 16000)
    assert min(len(wav), len(flac)) > 2 * THRESHOLD
    shard = write_shard(tmp_path / "s.tar", [("u/a.txt", b"hello"), ("u/a.wav", wav),
                                             ("u/b.txt", b"hello"), ("u/b.flac", flac)])
    out = tmp_path / "i.jsonl"
    report = build_index([shard], str(out), options=RunOptions(jobs=1))
    assert report.exit_code == 0, report.failures
    wav_record, flac_record = iter_index(str(out))
    check_record(wav_record, wav, "wav")
    check_record(flac_record, flac, "flac")
    assert made == [] and os.listdir(spool) == []  # no temporary file


def test_a_large_member_that_does_not_probe_is_named(small_threshold, tmp_path):
    spool, made = small_threshold
    bad = b"OggS" + bytes(range(256)) * 1024  # Ogg magic, then no valid page
    shard = write_shard(tmp_path / "s.tar", [("u/a.txt", b"hello"), ("u/a.ogg", bad)])
    with pytest.raises(ShardkitError) as caught:
        index_shard(shard, "c")
    message = str(caught.value)
    assert shard in message and "u/a.ogg" in message and "cannot read the audio header" in message
    assert len(made) == 1 and os.listdir(spool) == []


def test_no_room_to_spool_is_a_located_error(small_threshold, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    shard = write_shard(tmp_path / "s.tar", [("u/a.txt", b"hello"), ("u/a.ogg", encode("OGG", "VORBIS", 10, 44100))])
    report = build_index([shard], str(tmp_path / "i.jsonl"), options=RunOptions(jobs=1))
    assert report.exit_code == 1 and not (tmp_path / "i.jsonl").exists()
    (failure,) = report.failures
    assert failure["shard"] == shard
    assert "u/a.ogg" in failure["error"] and "cannot spool" in failure["error"] and "missing" in failure["error"]
