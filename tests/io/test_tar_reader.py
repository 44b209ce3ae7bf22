import io
import os
import tarfile

import pytest
from support import tar_bytes

from shardkit.errors import CorruptStreamError, TarFormatError, UnsafeMemberError, UsageError
from shardkit.io.codecs import CODECS, detect_codec, iter_decompressed, open_writer, parse_codec_spec
from shardkit.io.tar import ChunkReader, TarWriter, group_samples, iter_shard_members, iter_tar_members, split_key


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_codec_round_trips_and_is_detected_by_magic(tmp_path, codec):
    payload = os.urandom(3000) + b"speech" * 1000
    path = tmp_path / "x.bin"  # the name says nothing: detection reads the magic bytes
    with open(path, "wb") as raw:
        with open_writer(raw, codec) as w:
            w.write(payload)
    head = path.read_bytes()[:16]
    assert detect_codec(head) == codec
    with open(path, "rb") as f:
        assert b"".join(iter_decompressed(f, shard=str(path))) == payload


@pytest.mark.parametrize("codec", ["gz", "bz2", "xz", "zst"])
def test_truncated_stream_is_an_error_naming_the_shard(tmp_path, codec):
    payload = os.urandom(200_000)
    with open(tmp_path / "s", "wb") as raw:
        with open_writer(raw, codec) as w:
            w.write(payload)
    blob = (tmp_path / "s").read_bytes()
    (tmp_path / "t").write_bytes(blob[: len(blob) // 2])
    with open(tmp_path / "t", "rb") as f, pytest.raises(CorruptStreamError) as err:
        b"".join(iter_decompressed(f, shard="shard-t"))
    assert str(err.value).startswith("shard-t: ")


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_reader_matches_tarfile_including_long_names(fmt):
    long = "corpus/" + "very-long-speaker-name-" * 5 + "utt0001"
    members = [("a/b-1.txt", b"hello"), ("a/b-1.wav", os.urandom(1025)), (long + ".txt", b""), (long + ".wav", b"x" * 512)]
    if fmt == tarfile.USTAR_FORMAT:
        members = members[:2]
    blob = tar_bytes(members, fmt)
    assert list(iter_tar_members(io.BytesIO(blob))) == members
    assert list(iter_tar_members(ChunkReader(blob[i:i + 333] for i in range(0, len(blob), 333)))) == members


def test_writer_is_deterministic_and_readable_by_tarfile():
    def write():
        buf = io.BytesIO()
        w = TarWriter(buf)
        w.add("k/1.txt", b"t")
        w.add("k/1.wav", b"w" * 700)
        w.close()
        return buf.getvalue()

    first = write()
    assert first == write()
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        infos = tar.getmembers()
    assert [(i.name, i.size, i.mtime, i.uid, i.uname) for i in infos] == [("k/1.txt", 1, 0, 0, ""), ("k/1.wav", 700, 0, 0, "")]


@pytest.mark.parametrize("name", ["../evil.wav", "/etc/passwd", "a/../../b.txt"])
def test_unsafe_names_are_refused(name):
    blob = tar_bytes([("ok.txt", b"1"), (name, b"2")])
    with pytest.raises(UnsafeMemberError) as err:
        list(iter_tar_members(io.BytesIO(blob), shard="s.tar"))
    assert name in str(err.value) and "s.tar" in str(err.value)


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.DIRTYPE])
def test_links_devices_and_dirs_are_refused_or_skipped_by_policy(kind):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("bad")
        info.type = kind
        info.linkname = "/etc/passwd"
        tar.addfile(info)
        good = tarfile.TarInfo("good.txt")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"ok"))
    with pytest.raises(UnsafeMemberError):
        list(iter_tar_members(io.BytesIO(buf.getvalue())))
    seen = []
    assert list(iter_tar_members(io.BytesIO(buf.getvalue()), on_error=seen.append)) == [("good.txt", b"ok")]
    assert seen[0].member.rstrip("/") == "bad"


def test_damaged_header_and_not_a_tar():
    blob = bytearray(tar_bytes([("a.txt", b"1"), ("b.txt", b"2")]))
    blob[1024 + 10] ^= 0xFF  # second header's name: checksum no longer matches
    with pytest.raises(TarFormatError, match="checksum"):
        list(iter_tar_members(io.BytesIO(bytes(blob))))
    with pytest.raises(TarFormatError, match="not a tar"):
        list(iter_tar_members(io.BytesIO(b"hello world" * 100)))
    with pytest.raises(TarFormatError, match="truncated"):
        list(iter_tar_members(io.BytesIO(tar_bytes([("a.wav", b"x" * 5000)])[:2000])))


def test_grouping_follows_wenet_rule():
    members = [("a/x-1.txt", b"t1"), ("a/x-1.wav", b"w1"), ("a/x.2.txt", b"t2"), ("a/x.2.flac", b"w2")]
    samples = list(group_samples(members, shard="s"))
    assert [s["__key__"] for s in samples] == ["a/x-1", "a/x.2"]
    assert samples[1]["flac"] == b"w2" and samples[1]["txt"] == b"t2"
    assert split_key("noext") == ("noext", "")


def test_codec_spec_parsing():
    assert parse_codec_spec("zst:19") == ("zst", 19)
    assert parse_codec_spec("none") == ("none", None)
    for bad in ("lz4", "zst:99", "none:3", "gz:x"):
        with pytest.raises(UsageError):
            parse_codec_spec(bad)


def test_shard_reader_on_real_shards(make_shards):
    paths = make_shards("zst")
    names = [n for p in paths for n, _ in iter_shard_members(p)]
    assert len(names) == 2 * 14 and names[0].endswith(".txt") and names[1].endswith(".wav")
