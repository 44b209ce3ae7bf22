"""Property tests: shardkit's tar reading equals Python's tarfile's, or shardkit reports the shard.

Generated archives (written by tarfile in its three formats and by shardkit's TarWriter), then
byte-mutated headers, number fields, pax records and archive ends. For each one, either
``iter_tar_members`` yields exactly the (name, bytes) sequence that ``tarfile`` yields in
``r:*`` (WeNet) and ``r|*`` (WebDataset) mode, all regular members, or it raises a
ShardkitError; never a hang, never another exception. The reader's fast path
(``iter_members_fast``) must read every archive exactly as ``iter_tar_members`` does.

Fixed seed (derandomized) and a bounded example count keep CI short; a longer run by hand:
``SHARDKIT_FUZZ_EXAMPLES=20000 pytest tests/io/test_tar_agrees_with_tarfile.py``.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit.errors import ShardkitError
from shardkit.io.tar import BLOCK, ChunkReader, TarWriter, iter_tar_members, parse_number_field
from shardkit.training.reader import iter_members_fast
from shardkit.training.zstd_source import ZstdMemberSource

EXAMPLES = int(os.environ.get("SHARDKIT_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

pytestmark = pytest.mark.timeout(120)

NAME_CHARS = st.sampled_from("abcxyz019-_./")
SEGMENT = st.text(NAME_CHARS.filter(lambda c: c != "/"), min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))
NAME = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join)
LONG_NAME = st.builds(lambda a, b: "spk/" + a * 9 + "/" + b + ".wav", SEGMENT, SEGMENT)
DATA = st.one_of(st.binary(max_size=700), st.integers(0, 3).map(lambda k: bytes(range(256)) * 2 * k))
MEMBERS = st.lists(st.tuples(st.one_of(NAME, NAME, LONG_NAME), DATA), min_size=1, max_size=4)
FORMATS = st.sampled_from(["gnu", "pax", "ustar", "writer"])


def build(members, fmt) -> bytes:
    buf = io.BytesIO()
    if fmt == "writer":
        w = TarWriter(buf)
        for name, data in members:
            w.add(name, data)
        w.close()
        return buf.getvalue()
    tar_format = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT, "ustar": tarfile.USTAR_FORMAT}[fmt]
    with tarfile.open(fileobj=buf, mode="w", format=tar_format) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            try:
                tar.addfile(info, io.BytesIO(data))
            except ValueError:  # ustar: name too long
                return build(members, "gnu")
    return buf.getvalue()


def header_blocks(blob: bytes) -> list[int]:
    """Offsets of every header block (extension headers and their data included) tarfile finds."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
        return [off for m in tar.getmembers() for off in range(m.offset, m.offset_data, BLOCK)]


def fix_checksum(blob: bytearray, at: int) -> None:
    block = blob[at:at + BLOCK]
    block[148:156] = b" " * 8
    blob[at + 148:at + 156] = b"%06o\x00 " % sum(block)


def shardkit_read(blob: bytes, reader=iter_tar_members, source=None):
    """``("ok", members)`` or ``("error", check)``; any other exception fails the test."""
    try:
        return "ok", [(n, bytes(d)) for n, d in reader(source if source is not None else io.BytesIO(blob),
                                                        shard="fuzz.tar")]
    except ShardkitError as err:
        assert str(err).startswith("fuzz.tar: "), err
        return "error", err.check


def tarfile_read(blob: bytes, mode: str):
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode=mode) as tar:
            out = []
            for m in tar:
                if not m.isreg():
                    return "not regular", m.name
                out.append((m.name, tar.extractfile(m).read()))
            return "ok", out
    except Exception as err:  # noqa: BLE001 - any failure of tarfile is the answer here
        return "error", type(err).__name__


def check_agreement(blob: bytes) -> None:
    ours = shardkit_read(blob)
    # the one parser, whatever the source: a file, decompressed chunks, the fast path, zstd's member source
    assert shardkit_read(blob, source=ChunkReader(blob[i:i + 700] for i in range(0, len(blob), 700))) == ours
    assert shardkit_read(blob, reader=iter_members_fast) == ours
    if ours[0] == "ok":
        for mode in ("r:*", "r|*"):
            assert tarfile_read(blob, mode) == ours, mode


def check_zstd_source(blob: bytes) -> None:
    import zstandard

    compressed = zstandard.ZstdCompressor(level=1).compress(blob)
    ours = shardkit_read(blob)
    assert shardkit_read(blob, reader=iter_members_fast, source=ZstdMemberSource(io.BytesIO(compressed), "z")) == ours


@FUZZ
@given(MEMBERS, FORMATS)
def test_generated_archives_read_as_tarfile_reads_them(members, fmt):
    blob = build(members, fmt)
    assert shardkit_read(blob) == ("ok", [(n, d) for n, d in members])
    check_agreement(blob)


@FUZZ
@given(MEMBERS, FORMATS, st.data())
def test_mutated_header_bytes(members, fmt, data):
    blob = bytearray(build(members, fmt))
    blocks = header_blocks(bytes(blob))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.sampled_from(blocks)) + data.draw(st.integers(0, BLOCK - 1))
        blob[at] = data.draw(st.one_of(st.integers(0, 255), st.sampled_from(b"\x00 /.-7\x80\xffxLg0")))
        if data.draw(st.booleans()):
            start = at - at % BLOCK
            if blob[start + 257:start + 262] == b"ustar":  # a header block, not an extension's data
                fix_checksum(blob, start)
    check_agreement(bytes(blob))


FIELDS = {"mode": (100, 8), "uid": (108, 8), "gid": (116, 8), "size": (124, 12), "mtime": (136, 12),
          "devmajor": (329, 8), "devminor": (337, 8), "prefix": (345, 155), "name": (0, 100), "type": (156, 1)}
FIELD_VALUES = st.one_of(
    st.sampled_from([b"-1", b"-1000", b"-0", b"+1", b" 12 ", b"1_0", b"0o17", b"0x1f", b"12a", b"\xd9\xa1",
                     b"\x80" + bytes(10) + b"\x05", b"\xff" * 12, b"\xff" * 11 + b"\x00", b"\t7\x00junk",
                     b"\x0017", b"7" * 12, b"0", b"", b"x.wav/", b"../up", b"a\xffb", b"L", b"x", b"g", b"5", b"\x00"]),
    st.binary(max_size=12))


@FUZZ
@given(MEMBERS, FORMATS, st.data())
def test_mutated_number_and_name_fields(members, fmt, data):
    blob = bytearray(build(members, fmt))
    with tarfile.open(fileobj=io.BytesIO(bytes(blob)), mode="r:") as tar:
        headers = [m.offset_data - BLOCK for m in tar.getmembers()] + [m.offset for m in tar.getmembers()]
    at = data.draw(st.sampled_from(headers))
    start, width = FIELDS[data.draw(st.sampled_from(sorted(FIELDS)))]
    value = data.draw(FIELD_VALUES)[:width]
    blob[at + start:at + start + width] = value + bytes(width - len(value))
    fix_checksum(blob, at)
    check_agreement(bytes(blob))


def pax_member(records: bytes, name: str = "p.wav", data: bytes = b"DATA" * 50, typeflag: bytes = b"x") -> bytes:
    """One pax header with these raw records, then a plain member."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = typeflag
    info.size = len(records)
    head = info.tobuf(tarfile.USTAR_FORMAT)
    member = tarfile.TarInfo(name)
    member.size = len(data)
    return (head + records + bytes(-len(records) % BLOCK) + member.tobuf(tarfile.USTAR_FORMAT) + data
            + bytes(-len(data) % BLOCK))


def record(keyword: bytes, value: bytes, delta: int = 0) -> bytes:
    body = b" " + keyword + b"=" + value + b"\n"
    length = len(body) + 1
    length += len(str(length + len(str(length)))) - 1
    return b"%d%s" % (length + delta, body)


PAX_RECORDS = st.lists(st.one_of(
    st.builds(record, st.sampled_from([b"path", b"size", b"mtime", b"uid", b"comment", b"hdrcharset",
                                       b"GNU.sparse.name", b"linkpath", b"a b"]),
              st.one_of(st.sampled_from([b"evil/../x.wav", b"q.wav", b"-1", b"12", b"abc", b"BINARY", b"q.wav/",
                                         b"a\x00b.wav", b"\xff.wav", b"1.5", b" 7"]), st.binary(max_size=20)),
              st.sampled_from([0, 0, 0, 1, -1, 5, -30])),
    st.binary(max_size=30)), max_size=4).map(b"".join)


@FUZZ
@given(PAX_RECORDS, st.sampled_from([b"x", b"g"]), st.booleans())
def test_pax_records(records, typeflag, twice):
    blob = pax_member(records, typeflag=typeflag)
    if twice:
        blob = pax_member(record(b"path", b"first.wav"), typeflag=b"x")[:1024] + blob
    check_agreement(blob + bytes(1024))


ENDINGS = st.sampled_from([b"", bytes(512), bytes(1024), bytes(10240), bytes(512) + b"\x01", bytes(1024) + b"junk",
                           bytes(300), b"\x00" * 1023 + b"\x01"])


@FUZZ
@given(MEMBERS, FORMATS, st.data())
def test_archive_ends_and_cuts(members, fmt, data):
    blob = build(members, fmt)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
        end = max(m.offset_data + m.size + (-m.size % BLOCK) for m in tar.getmembers())
    body = blob[:end]
    choice = data.draw(st.sampled_from(["ending", "cut", "inserted_zero", "second_archive"]))
    if choice == "ending":
        blob = body + data.draw(ENDINGS)
    elif choice == "cut":
        blob = blob[:data.draw(st.integers(1, len(blob)))]
    elif choice == "inserted_zero":
        cut = data.draw(st.sampled_from(header_blocks(blob)))
        blob = blob[:cut] + bytes(BLOCK * data.draw(st.integers(1, 2))) + blob[cut:]
    else:
        blob = body + build(members, fmt)
    check_agreement(blob)
    check_zstd_source(blob)


def test_number_fields_read_as_tarfile_reads_them():
    nti = getattr(tarfile, "nti", None)
    if nti is None:
        pytest.skip("this Python's tarfile has no nti")
    for field in (b"0000644\x00", b"-1\x00", b" 12 \x00", b"1_0", b"0o17", b"\x80" + bytes(6) + b"\x09",
                  b"\xff" * 8, b"12a", b"\x00garbage", b"\xd9\xa1", b"+7", b"\x1c7"):
        try:
            expected = nti(field)
        except tarfile.HeaderError:
            expected = None
        try:
            got = parse_number_field(field, "f")
        except ShardkitError:
            got = None
        assert got == expected, field


TARFILE_CHILD = r"""
import io, json, sys, tarfile
out = []
for path in sys.stdin.read().split():
    blob = open(path, "rb").read()
    got = {}
    for mode in ("r:*", "r|*"):
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode=mode) as tar:
                members = []
                for m in tar:
                    if not m.isreg():
                        members = "not regular"
                        break
                    members.append([m.name.encode("utf-8", "surrogateescape").hex(), tar.extractfile(m).read().hex()])
            got[mode] = members
        except Exception as err:
            got[mode] = "error " + type(err).__name__
    out.append(got)
print(json.dumps(out))
"""


def test_other_pythons_tarfile_read_what_shardkit_accepts(tmp_path):
    """Python 3.10-3.13 parse pax headers differently: every archive shardkit accepts reads the same in each.

    Runs where ``SHARDKIT_TARFILE_PYTHONS`` names interpreters (e.g. ``python3.10 python3.12
    python3.13``); the archives are this file's mutations, drawn from a fixed seed.
    """
    import random
    import subprocess

    pythons = os.environ.get("SHARDKIT_TARFILE_PYTHONS", "").split()
    if not pythons:
        pytest.skip("set SHARDKIT_TARFILE_PYTHONS to interpreters to compare with")
    rng = random.Random(13)
    accepted = []
    for i in range(min(EXAMPLES * 5, 5000)):
        members = [(f"k{j}/u{rng.randrange(99)}.{rng.choice(['wav', 'txt'])}" + "x" * rng.choice([0, 0, 120]),
                    rng.randbytes(rng.randrange(700))) for j in range(rng.randrange(1, 4))]
        blob = bytearray(build(members, rng.choice(["gnu", "pax", "ustar", "writer"])))
        if i % 3 == 0:
            blob = bytearray(pax_member(b"".join(record(rng.choice([b"path", b"size", b"comment", b"hdrcharset"]),
                                                        rng.choice([b"q.wav", b"12", b"-1", b"BINARY", b"a\xff"]),
                                                        rng.choice([0, 0, 1, -1])) for _ in range(rng.randrange(3))))
                             + bytes(1024))
        blocks = header_blocks(bytes(blob)) if i % 3 else [0, 1024]
        for _ in range(rng.randrange(0, 3)):
            at = rng.choice(blocks) + rng.randrange(BLOCK)
            if at < len(blob):
                blob[at] = rng.randrange(256)
                if rng.random() < 0.7 and blob[at - at % BLOCK + 257:at - at % BLOCK + 262] == b"ustar":
                    fix_checksum(blob, at - at % BLOCK)
        status, ours = shardkit_read(bytes(blob))
        if status == "ok":
            path = tmp_path / f"{i}.tar"
            path.write_bytes(bytes(blob))
            accepted.append((str(path), ours))
    assert len(accepted) > 100
    expected = [[[n.encode("utf-8", "surrogateescape").hex(), d.hex()] for n, d in ours] for _, ours in accepted]
    for python in pythons:
        done = subprocess.run([python, "-c", TARFILE_CHILD], input=" ".join(p for p, _ in accepted), text=True,
                              capture_output=True, check=True, env={k: v for k, v in os.environ.items()
                                                                    if k != "PYTHONPATH"})
        for (path, _), want, got in zip(accepted, expected, json.loads(done.stdout)):
            assert got == {"r:*": want, "r|*": want}, (python, path)
