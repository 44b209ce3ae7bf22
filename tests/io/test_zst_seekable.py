"""zst shards are zstd's seekable format: frames of 1 MiB, each with its checksum, and a seek table.

Shards much larger than a frame, written by convert (the way every zst writer of shardkit writes:
``codecs.open_writer``), must read in full through every reader a trainer or a tool uses (a reader
that stops at the end of the first frame would lose most of the shard), resume inside later frames
by jumping through the seek table, and stay byte-identical across -j, --threads and reruns. Shards
written before (one frame, no table) still read and resume by decompressing.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.io.codecs import ZST_FRAME_BYTES, iter_decompressed, open_writer, zstd_frame_holding
from shardkit.io.synth import CorpusSpec, write_shards
from shardkit.io.tar import iter_shard_members
from shardkit.run.lifecycle import verify_members
from shardkit.training import reader
from shardkit.training.reader import ReadPosition, iter_samples, read_members
from shardkit.training.zstd_source import ZSTD_READ_SIZE
from support import corpus

pyzstd = pytest.importorskip("pyzstd")

# 2 shards of about 3.8 MB of tar each: four frames per shard
SPECS = (CorpusSpec("long", 120, 1.0, 3.0, "en"),)
SEEK_TABLE_MAGIC, SKIPPABLE_MAGIC = 0x8F92EAB1, 0x184D2A5E


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Plain shards, the same converted by convert to zst:3, and to zst:3 as written before (one frame)."""
    utts = corpus(SPECS, seed=3)
    plain = write_shards(utts, str(tmp_path_factory.mktemp("plain")), utts_per_shard=60, codec="none")
    out = tmp_path_factory.mktemp("converted")
    result = CliRunner().invoke(main, ["convert", *plain, "-o", str(out), "--codec", "zst:3", "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    converted = [str(out / (os.path.basename(p) + ".zst")) for p in plain]
    old = tmp_path_factory.mktemp("one-frame")
    one_frame = []
    for p in plain:
        path = str(old / (os.path.basename(p) + ".zst"))
        with open(p, "rb") as src, open(path, "wb") as dst:
            dst.write(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(src.read()))
        one_frame.append(path)
    return {"plain": plain, "zst": converted, "one_frame": one_frame}


def seek_table(data: bytes) -> list[tuple[int, int]]:
    """(compressed, decompressed) size of every frame, read from the table at the end of the file."""
    frames, descriptor, magic = struct.unpack("<IBI", data[-9:])
    assert magic == SEEK_TABLE_MAGIC
    entry = 12 if descriptor & 0x80 else 8
    start = len(data) - (8 + frames * entry + 9)
    skippable, size = struct.unpack("<II", data[start:start + 8])
    assert skippable == SKIPPABLE_MAGIC and size == frames * entry + 9
    return [struct.unpack_from("<II", data, start + 8 + i * entry) for i in range(frames)]


def member_digests_of(members) -> list[tuple[str, str]]:
    return [(name, hashlib.sha256(data).hexdigest()) for name, data in members]


def test_convert_writes_independent_checksummed_frames_of_one_mib_and_a_seek_table(shards):
    for plain, path in zip(shards["plain"], shards["zst"]):
        data = Path(path).read_bytes()
        tar_size = os.path.getsize(plain)
        table = seek_table(data)
        assert len(table) == -(-tar_size // ZST_FRAME_BYTES) >= 4
        assert [d for _, d in table[:-1]] == [ZST_FRAME_BYTES] * (len(table) - 1)
        assert sum(d for _, d in table) == tar_size
        assert sum(c for c, _ in table) + 8 + 8 * len(table) + 9 == len(data)
        offset, whole = 0, Path(plain).read_bytes()
        for compressed, decompressed in table:  # each frame decompresses alone, and checks its checksum
            frame = data[offset:offset + compressed]
            assert zstandard.get_frame_parameters(frame).has_checksum
            chunk = zstandard.ZstdDecompressor().decompress(frame, max_output_size=decompressed)
            assert chunk == whole[:decompressed]
            whole, offset = whole[decompressed:], offset + compressed
        assert pyzstd.SeekableZstdFile.is_seekable_format_file(path)
        assert pyzstd.SeekableZstdFile(path, "r").seek_table_info == (len(table), offset, tar_size)


def test_a_reader_of_the_first_frame_only_would_lose_most_of_the_shard(shards):
    """What the readers below are guarded against: zstandard's decompressobj stops after one frame."""
    data = Path(shards["zst"][0]).read_bytes()
    first = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    assert len(first) == ZST_FRAME_BYTES < os.path.getsize(shards["plain"][0]) // 3


def _tarfile_members(path: str, mode: str):
    with open(path, "rb") as f, tarfile.open(fileobj=f, mode=mode) as archive:
        return [(info.name, archive.extractfile(info).read()) for info in archive]


def _wds_members(url: str):
    wds = pytest.importorskip("webdataset")
    out = []
    for sample in wds.WebDataset([url], shardshuffle=False):
        out += [(f"{sample['__key__']}.{ext}", sample[ext]) for ext in ("txt", "wav")]
    return out


def _shardkit_wds_members(path: str):
    from shardkit.training.wds import tarfile_to_samples

    return [(f"{s['__key__']}.{ext}", s[ext]) for s in tarfile_to_samples(bytes_only=True)(iter([path]))
            for ext in ("txt", "wav")]


READERS = {
    "shardkit reader (fast path)": lambda p: read_members(p),
    "convert's reader (io.tar)": lambda p: iter_shard_members(p),
    "tarfile r:* through the bridge": lambda p: _tarfile_members(p, "r:*"),
    "tarfile r|* through the bridge": lambda p: _tarfile_members(p, "r|*"),
    "webdataset, tarfile through the bridge": lambda p: _wds_members(p),
    "webdataset pipe:zstd -dc": lambda p: _wds_members(f"pipe:zstd -dc < {p}"),
    "shardkit.training.wds.tarfile_to_samples": _shardkit_wds_members,
}


@pytest.mark.parametrize("name", list(READERS))
def test_every_member_reader_reads_a_multi_frame_shard_fully(shards, patched, name):
    if "zstd -dc" in name and shutil.which("zstd") is None:
        pytest.skip("no zstd command")
    for plain, path in zip(shards["plain"], shards["zst"]):
        expected = member_digests_of(iter_shard_members(plain))
        assert member_digests_of(READERS[name](path)) == expected


def _zstandard_stream_reader(f) -> bytes:
    out, scratch = bytearray(), bytearray(1 << 16)
    stream = zstandard.ZstdDecompressor().stream_reader(f, read_size=ZSTD_READ_SIZE)  # defaults
    while n := stream.readinto(scratch):
        out += scratch[:n]
    return bytes(out)


STREAMS = {
    "strict iter_decompressed (ZstdFile)": lambda f, p: b"".join(iter_decompressed(f, shard=p)),
    "zstandard stream_reader, default read_across_frames": lambda f, p: _zstandard_stream_reader(f),
    "pyzstd SeekableZstdFile": lambda f, p: pyzstd.SeekableZstdFile(f, "r").read(),
    "zstd -dc": lambda f, p: subprocess.run(["zstd", "-dc", p], capture_output=True, check=True).stdout,
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_every_decompressor_gives_the_whole_tar_stream(shards, name):
    if name == "zstd -dc" and shutil.which("zstd") is None:
        pytest.skip("no zstd command")
    for plain, path in zip(shards["plain"], shards["zst"]):
        with open(path, "rb") as f:
            assert STREAMS[name](f, path) == Path(plain).read_bytes()


def test_read_back_verification_accepts_the_written_shard_and_notices_a_changed_frame(shards, tmp_path):
    plain, path = shards["plain"][0], shards["zst"][0]
    expected = [(name, hashlib.sha256(data).digest()) for name, data in iter_shard_members(plain)]
    verify_members(expected, shard=path)(path)
    verify_members(expected, shard=path, raw_names=True)(path)
    damaged = tmp_path / "damaged.tar.zst"
    data = bytearray(Path(path).read_bytes())
    second_frame = seek_table(bytes(data))[0][0]
    data[second_frame + 5000] ^= 0xFF  # inside the second frame: its checksum or its blocks fail
    damaged.write_bytes(bytes(data))
    with pytest.raises(Exception, match="corrupt|checksum|truncated|does not read back"):
        verify_members(expected, shard=str(damaged))(str(damaged))


def _positions(paths):
    """(key, shard index, utt_end, finished) after each utterance of an uninterrupted read."""
    position, marks = ReadPosition(), []
    for sample in iter_samples(paths, position=position, decode=False):
        marks.append((sample["key"], position.index, position.utt_end, position.finished))
    return marks


def test_resume_inside_later_frames_jumps_through_the_seek_table(shards, monkeypatch):
    paths = shards["zst"]
    marks = _positions(paths)
    keys = [m[0] for m in marks]
    later = [m for m in marks if not m[3] and m[2] >= 2 * ZST_FRAME_BYTES]
    assert len(later) >= 20  # offsets in the third frame and beyond of both shards
    for _, index, offset, _ in later:  # the frame holding the offset, from the table: where it begins
        with open(paths[index], "rb") as f:
            compressed, decompressed = zstd_frame_holding(f, paths[index], offset)
            data = Path(paths[index]).read_bytes()
        frames = seek_table(data)
        k = offset // ZST_FRAME_BYTES
        assert decompressed == k * ZST_FRAME_BYTES >= 2 * ZST_FRAME_BYTES
        assert compressed == sum(c for c, _ in frames[:k])
    real_skip, skipped = reader._skip_to, []

    def skip_within_the_frame(source, n, path):
        assert n < ZST_FRAME_BYTES, f"skipped {n} bytes by decompressing instead of jumping through the seek table"
        skipped.append(n)
        real_skip(source, n, path)

    monkeypatch.setattr(reader, "_skip_to", skip_within_the_frame)
    for n, (_, index, offset, finished) in enumerate(marks, 1):
        index, offset = (index + 1, 0) if finished else (index, offset)
        assert keys[:n] + [s["key"] for s in iter_samples(paths[index:], start=offset, decode=False)] == keys
    assert len(skipped) == len([m for m in marks if not m[3] and m[2] % ZST_FRAME_BYTES])


def test_shards_written_before_one_frame_still_read_and_resume_by_decompressing(shards):
    paths = shards["one_frame"]
    assert not pyzstd.SeekableZstdFile.is_seekable_format_file(paths[0])
    with open(paths[0], "rb") as f:
        assert zstd_frame_holding(f, paths[0], 2 * ZST_FRAME_BYTES) is None
    marks = _positions(paths)
    keys = [m[0] for m in marks]
    assert keys == [m[0] for m in _positions(shards["zst"])]
    for n, (_, index, offset, finished) in list(enumerate(marks, 1))[::7]:
        index, offset = (index + 1, 0) if finished else (index, offset)
        assert keys[:n] + [s["key"] for s in iter_samples(paths[index:], start=offset, decode=False)] == keys


@pytest.mark.torch
@pytest.mark.parametrize("kind,workers", [("zst", 2), ("zst", 0), ("one_frame", 2)])
def test_stateful_dataloader_restores_inside_later_frames(shards, kind, workers):
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardkit.training.dataset import ShardDataset, collate_padded

    def loader():
        dataset = ShardDataset(shards[kind], seed=5, rank=0, world_size=1)
        return StatefulDataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=collate_padded)

    full = [b["key"] for b in loader()]
    steps = len(full)
    for stop in (steps // 3, steps // 2 + 1, steps - 2):  # with 2 workers each worker stands in a later frame
        first = loader()
        it = iter(first)
        before = [next(it)["key"] for _ in range(stop)]
        state = first.state_dict()
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        assert before + [b["key"] for b in resumed] == full, f"restored at step {stop}"


def test_output_is_byte_identical_across_jobs_threads_and_reruns(shards, tmp_path):
    runs = {"a": ["-j", "1", "--threads", "1"], "b": ["-j", "2", "--threads", "3"], "c": ["-j", "2"]}
    outputs = []
    for name, options in runs.items():
        out = tmp_path / name
        result = CliRunner().invoke(main, ["convert", *shards["plain"], "-o", str(out), "--codec", "zst", *options,
                                           "-q"])
        assert result.exit_code == 0, result.output
        outputs.append([(out / (os.path.basename(p) + ".zst")).read_bytes() for p in shards["plain"]])
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0] == [Path(p).read_bytes() for p in shards["zst"]]


def test_open_writer_frames_do_not_depend_on_write_sizes():
    """A tar writer's writes (512-byte headers, members, padding) or one big write: the same bytes."""
    blob = os.urandom(1 << 16) * 40  # 2.5 MiB: three frames
    outputs = []
    for step in (len(blob), 512, 10_007):
        sink = io.BytesIO()
        with open_writer(sink, "zst", 3) as out:
            for i in range(0, len(blob), step):
                out.write(blob[i:i + step])
        outputs.append(sink.getvalue())
    assert outputs[0] == outputs[1] == outputs[2]
    assert [d for _, d in seek_table(outputs[0])] == [ZST_FRAME_BYTES, ZST_FRAME_BYTES, len(blob) - 2 * ZST_FRAME_BYTES]


@pytest.mark.parametrize("command", ["make", "balance"])
def test_make_and_balance_write_the_seekable_format_too(shards, tmp_path, command):
    out = tmp_path / command
    args = {"make": ["make", "--from", "wds", *shards["plain"], "--utts-per-shard", "60", "--audio-format", "keep"],
            "balance": ["balance", "--corpus", f"long={os.path.dirname(shards['plain'][0])}/", "--world-size", "1",
                        "--num-workers", "2"]}[command]
    result = CliRunner().invoke(main, [*args, "-o", str(out), "--codec", "zst:3", "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    written = sorted(str(p) for p in out.glob("*.tar.zst"))
    assert written
    for path in written:
        assert pyzstd.SeekableZstdFile.is_seekable_format_file(path)
        frames, _, size = pyzstd.SeekableZstdFile(path, "r").seek_table_info
        assert frames == -(-size // ZST_FRAME_BYTES)
        assert len(list(read_members(path))) == len(list(iter_shard_members(path)))
    keys = sorted(name for path in written for name, _ in iter_shard_members(path))
    assert keys == sorted(name for path in shards["plain"] for name, _ in iter_shard_members(path))


@pytest.mark.parametrize("lie", ["a frame's decompressed size", "frame boundaries shifted"])
def test_a_seek_table_that_lies_gives_a_located_error(shards, tmp_path, lie):
    """Hostile or damaged: the table still adds up (pyzstd takes it as the seekable format), but a
    resume through it lands off a frame or off a tar header, and says so, naming the shard."""
    from shardkit.errors import ShardkitError

    path = shards["zst"][0]
    data = bytearray(Path(path).read_bytes())
    frames = len(seek_table(bytes(data)))
    entries = len(data) - 9 - 8 * frames
    changes = {"a frame's decompressed size": [(0, 4, 512)], "frame boundaries shifted": [(1, 0, 1), (2, 0, -1)]}
    for entry, field, delta in changes[lie]:
        at = entries + 8 * entry + field
        struct.pack_into("<I", data, at, struct.unpack_from("<I", data, at)[0] + delta)
    damaged = tmp_path / "lying.tar.zst"
    damaged.write_bytes(bytes(data))
    assert pyzstd.SeekableZstdFile.is_seekable_format_file(str(damaged))
    offset = next(m[2] for m in _positions([path]) if m[2] > 2 * ZST_FRAME_BYTES + 4096)
    with pytest.raises(ShardkitError, match="lying.tar.zst.*(corrupt|damaged tar header)"):
        list(iter_samples([str(damaged)], start=offset, decode=False))
    assert len(list(iter_samples([str(damaged)], decode=False))) == 60  # a whole read needs no table
