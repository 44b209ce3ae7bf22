"""Hostile shards: every crafted case fails its own shard with a named check, never the run.

A corpus of crafted shards (negative sizes, malformed pax records, zero blocks mid-archive,
cuts in padding and after extension headers, garbage number fields, chained long names, an
old-style directory, non-UTF-8 and NUL-bearing names), each written plain, bz2 and zst, is listed
in one data.list next to good shards and run through validate, convert, index and list check
(balance reads the indexes those produce, so it only ever sees good shards). Each command must
end (pytest-timeout), exit 1 without a traceback, name every bad shard with its reason, and
process the good shards.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from support import REPO, corpus, run_cli

from shardkit.io.codecs import open_writer
from shardkit.io.tar import BLOCK, TarWriter, iter_shard_members

pytestmark = pytest.mark.timeout(300)


def utterances(n=4):
    return [(key, text, audio) for key, text, audio, _ in corpus()[:n]]


def good_members(n=4):
    out = []
    for key, text, audio in utterances(n):
        out += [(f"{key}.txt", text.encode()), (f"{key}.wav", audio)]
    return out


def header(name: bytes, size: int, typeflag: bytes = b"0", *, fields: dict | None = None) -> bytes:
    """A ustar header with raw bytes where asked: ``fields`` maps (start, width) -> raw value."""
    info = tarfile.TarInfo("placeholder")
    info.size = max(size, 0)
    info.type = typeflag
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    block[0:100] = name[:100] + bytes(100 - len(name[:100]))
    for (start, width), value in (fields or {}).items():
        block[start:start + width] = value + bytes(width - len(value))
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


def member(name: bytes, data: bytes, typeflag: bytes = b"0", **kw) -> bytes:
    return header(name, len(data), typeflag, **kw) + data + bytes(-len(data) % BLOCK)


def extension(typeflag: bytes, data: bytes, **kw) -> bytes:
    return member(b"././@LongLink" if typeflag == b"L" else b"././@PaxHeader", data, typeflag, **kw)


def pax_record(keyword: str, value: bytes) -> bytes:
    body = b" " + keyword.encode() + b"=" + value + b"\n"
    length = len(body) + len(str(len(body) + 2))
    return b"%d%s" % (length, body)


def plain(members) -> bytes:
    return b"".join(member(n.encode() if isinstance(n, str) else n, d) for n, d in members)


END = bytes(2 * BLOCK)


def crafted_cases() -> dict[str, tuple[bytes, tuple[str, ...]]]:
    """name -> (tar bytes, acceptable check names) for every hostile case of issue 13."""
    m = good_members()
    head, tail = plain(m[:4]), plain(m[4:])
    wav_name, wav = m[4][0].encode(), m[4][1]
    size_field = (124, 12)
    cases = {
        # 1. negative member sizes
        "neg_base256": (head + header(wav_name, 0, fields={size_field: b"\xff" * 12}) + wav + tail[1024:] + END,
                        ("tar_number_field",)),
        "neg_octal_1": (head + header(wav_name, 0, fields={size_field: b"-1"}) + wav + END, ("tar_number_field",)),
        "neg_octal_1000": (head + header(wav_name, 0, fields={size_field: b"-1000"}) + wav + END,
                           ("tar_number_field",)),
        "neg_longname": (head + header(b"././@LongLink", 0, b"L", fields={size_field: b"-1000"}) + tail + END,
                         ("tar_number_field",)),
        "pax_size_negative": (head + extension(b"x", pax_record("size", b"-1")) + tail + END, ("tar_pax",)),
        # 2. malformed pax records
        "pax_size_not_a_number": (head + extension(b"x", pax_record("size", b"abc")) + tail + END, ("tar_pax",)),
        "pax_missing_equals": (head + extension(b"x", b"20 pathutt-001.flac\n") + tail + END, ("tar_pax",)),
        "pax_missing_newline": (head + extension(b"x", b"22 path=utt-001.flac  ") + tail + END, ("tar_pax",)),
        "pax_wrong_length": (head + extension(b"x", b"23 path=utt-001.flac\n\n") + tail + END, ("tar_pax",)),
        "pax_random_bytes": (head + extension(b"x", bytes(range(1, 200))) + tail + END, ("tar_pax",)),
        # 3. members lost without a word
        "lone_zero_block": (head + bytes(BLOCK) + tail + END, ("tar_zero_block",)),
        "end_marker_mid_archive": (head + END + tail + END, ("tar_zero_block",)),
        "junk_after_end": (head + tail + END + b"junk" * 100, ("tar_zero_block",)),
        "cut_in_padding": ((head + tail)[:len(head) + BLOCK + len(wav) + 7], ("tar",)),
        "ends_after_longname": (head + extension(b"L", b"spk/" + b"x" * 120 + b".wav\x00"), ("tar_name_chain",)),
        "ends_after_pax": (head + extension(b"x", pax_record("path", b"a.wav")), ("tar_name_chain",)),
        # 4. differentials with tarfile
        "garbage_uid": (head + member(wav_name, wav, fields={(108, 8): b"12x45"}) + END, ("tar_number_field",)),
        "garbage_gid": (head + member(wav_name, wav, fields={(116, 8): b"1 2"}) + END,
                        ("tar_number_field",)),
        "garbage_mtime": (head + member(wav_name, wav, fields={(136, 12): b"not-a-time"}) + END,
                          ("tar_number_field",)),
        "garbage_mode": (head + member(wav_name, wav, fields={(100, 8): b"rw-r--r"}) + END, ("tar_number_field",)),
        "garbage_first": (member(m[0][0].encode(), m[0][1], fields={(108, 8): b"zz"}) + tail + END,
                          ("tar_number_field",)),
        "chained_longname": (head + extension(b"L", b"../../evil.wav\x00") + extension(b"L", wav_name + b"\x00")
                             + member(b"short", wav) + END, ("tar_name_chain",)),
        "chained_pax_path": (head + extension(b"x", pax_record("path", b"../../evil.wav"))
                             + extension(b"x", pax_record("path", wav_name)) + member(b"short", wav) + END,
                             ("tar_name_chain",)),
        "old_style_directory": (head + member(wav_name + b"/", wav, b"\x00") + END, ("unsafe_member",)),
        # 7. names
        "non_utf8_name": (head + member(b"spk/utt\xff\xfe.wav", wav) + END, ("tar_name_encoding",)),
        "nul_in_pax_path": (head + extension(b"x", pax_record("path", b"spk/a\x00b.wav")) + member(b"short", wav)
                            + END, ("tar_name_encoding",)),
    }
    return cases


def write(path, blob: bytes, codec: str) -> str:
    with open(path, "wb") as raw:
        with open_writer(raw, codec) as w:
            w.write(blob)
    return str(path)


SUFFIX = {"none": ".tar", "bz2": ".tar.bz2", "zst": ".tar.zst"}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """One folder per codec: good shards around every crafted shard, in one data.list."""
    root = tmp_path_factory.mktemp("hostile")
    good = io.BytesIO()
    w = TarWriter(good)
    for name, data in good_members(4):
        w.add(name, data)
    w.close()
    out = {}
    for codec in ("none", "bz2", "zst"):
        folder = root / codec
        folder.mkdir()
        expected, paths = {}, []
        for i, (case, (blob, checks)) in enumerate(crafted_cases().items()):
            if i % 8 == 0:
                paths.append(write(folder / f"good{i}{SUFFIX[codec]}", good.getvalue(), codec))
            path = write(folder / f"{case}{SUFFIX[codec]}", blob, codec)
            expected[path] = checks
            paths.append(path)
        fifo = folder / "fifo.tar"
        os.mkfifo(fifo)
        paths.append(str(fifo))
        paths.append(write(folder / f"good-last{SUFFIX[codec]}", good.getvalue(), codec))
        (folder / "data.list").write_text("".join(p + "\n" for p in paths))
        out[codec] = (str(folder / "data.list"), paths, expected, str(fifo))
    return out


def test_every_crafted_case_reads_as_intended_through_tarfile_or_fails():
    """The corpus is what it claims: each case fails shardkit, and most of them read differently in tarfile."""
    from shardkit.errors import ShardkitError

    for case, (blob, checks) in crafted_cases().items():
        path = f"/tmp/{os.getpid()}-{case}.tar"
        with open(path, "wb") as f:
            f.write(blob)
        try:
            with pytest.raises(ShardkitError) as err:
                list(iter_shard_members(path))
            assert err.value.check in checks, (case, str(err.value))
            assert str(err.value).startswith(path), case
        finally:
            os.unlink(path)


def run_without_traceback(*args):
    result = run_cli(*args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output
    return result


CODECS = ["none", "bz2", "zst"]


@pytest.mark.parametrize("codec", CODECS)
def test_validate_fails_each_crafted_shard_with_its_check(hostile, codec):
    data_list, paths, expected, fifo = hostile[codec]
    result = run_without_traceback("validate", data_list, "--json", "-j", "1")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    found = {}
    for f in doc["findings"]:
        found.setdefault(f["shard"], set()).add(f["check"])
    for path, checks in expected.items():
        assert found.get(path, set()) & set(checks), (path, found.get(path))
    assert found[fifo] == {"missing_file"}
    goods = [s for s in doc["shards"] if "good" in os.path.basename(s["shard"])]
    assert len(goods) == 5 and all(s["utterances"] == 4 for s in goods)
    # the good shards hold the same utterances: only the cross-shard duplicate check speaks of them
    assert all(found.get(s["shard"], {"duplicate_key"}) == {"duplicate_key"} for s in goods)


@pytest.mark.parametrize("codec", CODECS)
def test_convert_fails_each_crafted_shard_and_converts_the_good_ones(hostile, codec, tmp_path):
    data_list, paths, expected, fifo = hostile[codec]
    result = run_without_traceback("convert", data_list, "-o", tmp_path / "out", "--json", "-j", "1", "-q")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    failed = {f["shard"]: f["error"] for f in doc["failures"]}
    assert set(failed) == set(expected) | {fifo}
    for path, error in failed.items():
        assert error.startswith(path + ": ") and "at byte" in error or path == fifo or "member" in error, error
    assert "FIFO" in failed[fifo]
    assert doc["ok"] == 5
    outputs = [line.strip() for line in open(doc["data_list"])]
    assert [len(list(iter_shard_members(p))) for p in outputs] == [8] * 5


@pytest.mark.parametrize("codec", CODECS)
def test_index_fails_each_crafted_shard(hostile, codec, tmp_path):
    data_list, paths, expected, fifo = hostile[codec]
    result = run_without_traceback("index", data_list, "-o", tmp_path / "all.jsonl", "--json", "-j", "1", "-q")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["shards"] == len(paths)
    assert {f["shard"] for f in doc["failures"]} == set(expected) | {fifo}
    # the good shards alone index cleanly
    goods = [p for p in paths if "good" in os.path.basename(p)]
    result = run_without_traceback("index", *goods, "-o", tmp_path / "good.jsonl", "--json", "-j", "1", "-q")
    assert result.exit_code == 0 and json.loads(result.stdout)["utterances"] == 20


@pytest.mark.parametrize("codec", CODECS)
def test_list_check_reports_each_crafted_shard(hostile, codec):
    data_list, paths, expected, fifo = hostile[codec]
    result = run_without_traceback("list", "check", data_list, "--json", "-j", "1", "-q")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    status = {e["path"]: e for e in doc["entries"]}
    for path in expected:
        assert status[path]["status"] == "bad", (path, status[path])
    assert status[fifo]["status"] == "bad" and "FIFO" in status[fifo]["error"]
    assert doc["ok"] == 5 and doc["utterances"] == 20


def test_non_utf8_shard_path_fails_that_shard_and_json_stays_valid(tmp_path):
    src = os.path.join(os.fsencode(tmp_path), b"src")
    os.mkdir(src)
    good = io.BytesIO()
    w = TarWriter(good)
    for name, data in good_members(2):
        w.add(name, data)
    w.close()
    for name in (b"bad\xff.tar", b"good.tar"):
        with open(os.path.join(src, name), "wb") as f:
            f.write(good.getvalue())
    folder = os.fsdecode(src)
    bad = os.fsdecode(os.path.join(src, b"bad\xff.tar"))
    for args, failures in ((["convert", folder, "-o", tmp_path / "out"], "failures"),
                           (["index", folder, "-o", tmp_path / "i.jsonl"], "failures"),
                           (["validate", folder], "findings")):
        result = run_without_traceback(*args, "--json", "-j", "1")
        assert result.exit_code == 1, args
        doc = json.loads(result.stdout_bytes.decode("utf-8"))  # valid UTF-8, the name escaped
        listed = [f["shard"] for f in doc[failures]]
        assert listed == [bad.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")], args
        assert "not UTF-8" in json.dumps(doc[failures])


def test_quarantine_keeps_names_unchanged_and_survives_a_vanished_source(tmp_path):
    from shardkit.commands.validate import ValidateOptions, run_validate
    from shardkit.run.options import RunOptions

    m = good_members(3)
    names = tmp_path / "names.tar"
    names.write_bytes(plain(m[:2]) + member(b"spk/utt\xff.wav", m[3][1]) + plain(m[2:]) + END)
    gone = tmp_path / "gone.tar"
    gone.write_bytes(plain(m[:2]) + member(b"../evil.wav", b"x") + plain(m[2:]) + END)
    import shardkit.commands.validate as validate

    real = validate.validate_shard

    def then_vanish(path, options):  # the source goes away between validate's two passes
        result = real(path, options)
        if path.endswith("gone.tar"):
            os.unlink(path)
        return result

    validate.validate_shard = then_vanish
    try:
        report = run_validate([str(names), str(gone)], ValidateOptions(), RunOptions(jobs=1),
                              quarantine_dir=str(tmp_path / "q"))
    finally:
        validate.validate_shard = real
    checks = {(os.path.basename(f["shard"]), f["check"]) for f in report.findings}
    assert ("names.tar", "tar_name_encoding") in checks and ("gone.tar", "unsafe_member") in checks
    lines = [json.loads(line) for line in open(tmp_path / "q" / "rejects.jsonl", encoding="utf-8")]
    named = next(line for line in lines if line["shard"] == str(names))
    assert named["member"] == "spk/utt\\xff.wav" and named["rejects_shard"] is None  # not written under another name
    assert [n for n, _ in iter_shard_members(str(tmp_path / "q" / "names.tar"))] == [n for n, _ in m]
    vanished = next(line for line in lines if line["shard"] == str(gone))
    assert "vanished" in vanished["reasons"][0]
    assert str(tmp_path / "q" / "gone.tar") not in open(tmp_path / "q" / "data.list").read()


def without_marks(index, out):
    """The index as an older shardkit wrote it: its records without the completeness-mark lines."""
    with open(index, "rb") as f, open(out, "wb") as g:
        g.writelines(line for line in f if not line.startswith(b'{"shardkit_index"'))


def test_balance_refuses_a_source_whose_header_turned_hostile_after_indexing(tmp_path):
    """balance reads members by the index's offsets; the header before each must still parse (tario)."""
    src = tmp_path / "src"
    src.mkdir()
    shards = []
    for i in range(2):
        path = src / f"s{i}.tar"
        path.write_bytes(plain([(f"c{i}/{n}", d) for n, d in good_members(3)]) + END)
        shards.append(str(path))
    result = run_without_traceback("index", *shards, "-o", tmp_path / "a.jsonl", "-q", "-j", "1")
    assert result.exit_code == 0
    blob = bytearray(open(shards[1], "rb").read())
    second = BLOCK + len(good_members(3)[0][1]) + (-len(good_members(3)[0][1]) % BLOCK)  # header of member 2
    blob[second + 108:second + 116] = b"12x45\x00\x00\x00"  # garbage uid, checksum fixed: tarfile stops here
    blob[second + 148:second + 156] = b" " * 8
    blob[second + 148:second + 156] = b"%06o\x00 " % sum(blob[second:second + BLOCK])
    open(shards[1], "wb").write(bytes(blob))
    args = ["balance", "--corpus", f"a={tmp_path / 'a.jsonl'}", "--world-size", "1", "--num-workers", "1",
            "--num-shards", "1", "--codec", "none", "-q", "-j", "1", "-o", tmp_path / "out"]
    result = run_without_traceback(*args)
    assert result.exit_code == 1  # the index's stamp of s1.tar (its digest) no longer matches: refused up front
    assert "changed since it was indexed" in result.output and "s1.tar" in result.output
    assert not (tmp_path / "out").exists()
    # an index of an older shardkit (no marks, nothing to compare): the parser's own check still refuses
    without_marks(tmp_path / "a.jsonl", tmp_path / "old.jsonl")
    args[2] = f"a={tmp_path / 'old.jsonl'}"
    result = run_without_traceback(*args)
    assert result.exit_code == 1
    assert "member is not where the index says" in result.output and "s1.tar" in result.output


def test_standard_input_is_read_as_a_stream_and_a_fifo_argument_fails_at_once(tmp_path):
    import subprocess
    import sys

    good = io.BytesIO()
    w = TarWriter(good)
    for name, data in good_members(2):
        w.add(name, data)
    w.close()
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-m", "shardkit", "convert", "-", "-o", str(tmp_path / "out"), "--json",
                           "-q"], input=good.getvalue(), capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] == 1 and out["members"] == 4
    os.mkfifo(tmp_path / "ff.tar")  # no writer: opening it for reading the usual way would block forever
    done = subprocess.run([sys.executable, "-m", "shardkit", "convert", str(tmp_path / "ff.tar"), "-o",
                           str(tmp_path / "out2"), "-q"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "is a FIFO, not a regular file" in done.stderr


@pytest.mark.parametrize("codec", ["none", "bz2"])
def test_balance_fails_the_shards_of_a_source_that_vanished_after_indexing(tmp_path, codec):
    src = tmp_path / "src"
    src.mkdir()
    shards = []
    for i in range(2):
        blob = plain([(f"c{i}/{n}", d) for n, d in good_members(3)]) + END
        shards.append(write(src / f"s{i}{SUFFIX[codec]}", blob, codec))
    assert run_without_traceback("index", *shards, "-o", tmp_path / "a.jsonl", "-q", "-j", "1").exit_code == 0
    os.unlink(shards[1])
    args = ["balance", "--corpus", f"a={tmp_path / 'a.jsonl'}", "--world-size", "1", "--num-workers", "1",
            "--num-shards", "1", "--codec", "none", "-q", "-j", "1", "-o", tmp_path / "out", "--json"]
    result = run_without_traceback(*args)
    assert result.exit_code == 1  # the index's stamps are checked first: the missing source is named, nothing written
    assert shards[1] in json.loads(result.stdout)["error"] and not (tmp_path / "out").exists()
    # an index of an older shardkit (no marks): the shard that needs the source fails alone, naming it
    without_marks(tmp_path / "a.jsonl", tmp_path / "old.jsonl")
    args[2] = f"a={tmp_path / 'old.jsonl'}"
    result = run_without_traceback(*args)
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [f["shard"] for f in doc["failures"]] == [str(tmp_path / "out" / "shards_000000000.tar")]
    assert "cannot open source" in doc["failures"][0]["error"] and shards[1] in doc["failures"][0]["error"]
