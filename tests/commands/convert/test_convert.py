import bz2
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from shardkit.io.codecs import CODECS, detect_codec
from shardkit.io.tar import iter_shard_members
from support import run_cli

CODEC_NAMES = list(CODECS)


def members_of(paths):
    return [m for p in paths for m in iter_shard_members(p)]


def listed(out_dir, name="data.list"):
    with open(os.path.join(out_dir, name)) as f:
        return [line.strip() for line in f]


@pytest.mark.parametrize("src_codec", CODEC_NAMES)
def test_every_codec_to_every_codec_keeps_members(make_shards, tmp_path, src_codec):
    sources = make_shards(src_codec)
    expected = members_of(sources)
    for dst_codec in CODEC_NAMES:
        out = tmp_path / dst_codec
        result = run_cli("convert", *sources, "-o", out, "--codec", dst_codec, "-j", "1", "-q")
        assert result.exit_code == 0, result.output
        outputs = listed(out)
        assert len(outputs) == len(sources)
        assert all(p.endswith(".tar" + CODECS[dst_codec].suffix) for p in outputs)
        assert all(detect_codec(open(p, "rb").read(16)) == dst_codec for p in outputs)
        assert members_of(outputs) == expected


def test_output_is_deterministic_and_independent_of_jobs(make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=3)
    digests = []
    for name, jobs in (("a", 1), ("b", 1), ("c", 2)):
        assert run_cli("convert", *sources, "-o", tmp_path / name, "-j", jobs, "-q").exit_code == 0
        digests.append([open(p, "rb").read() for p in listed(tmp_path / name)])
    assert digests[0] == digests[1] == digests[2]


def test_manifest_records_sources_outputs_and_digests(make_shards, tmp_path):
    sources = make_shards("gz")
    result = run_cli("convert", *sources, "-o", tmp_path / "o", "--json", "-q")
    assert result.exit_code == 0
    report = json.loads(result.stdout)  # stdout holds the JSON report and nothing else
    assert report["ok"] == len(sources) and report["failed"] == 0 and report["samples"] == 14
    manifest = json.loads((tmp_path / "o" / "convert.json").read_text())
    entry = manifest["shards"][0]
    assert entry["source"]["path"] == sources[0] and entry["source"]["size"] == os.path.getsize(sources[0])
    assert entry["output"]["size"] == os.path.getsize(entry["output"]["path"])
    assert entry["status"] == "ok" and entry["members"] == 2 * entry["samples"]
    assert len(entry["members_digest"]) == 64
    assert not (tmp_path / "o" / ".convert.journal.jsonl").exists()


def test_rerun_skips_finished_and_redoes_stale(make_shards, tmp_path):
    sources = make_shards("bz2")
    out = tmp_path / "o"
    assert run_cli("convert", *sources, "-o", out, "-q").exit_code == 0
    outputs = listed(out)
    before = open(outputs[1], "rb").read()
    with open(outputs[1], "r+b") as f:  # damage one output: the rerun must notice and redo it
        f.seek(100)
        f.write(b"\0" * 10)
    report = json.loads(run_cli("convert", *sources, "-o", out, "--json", "-q").stdout)
    assert report["skipped"] == len(sources) - 1 and report["ok"] == 1
    assert open(outputs[1], "rb").read() == before
    report = json.loads(run_cli("convert", *sources, "-o", out, "--json", "-q", "--overwrite").stdout)
    assert report["ok"] == len(sources)
    # other settings produce other bytes: nothing is skipped
    report = json.loads(run_cli("convert", *sources, "-o", out, "--json", "-q", "--codec", "zst",
                                "--level", "5").stdout)
    assert report["ok"] == len(sources)


def test_resume_after_kill_matches_uninterrupted_run(make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=1)
    reference = tmp_path / "ref"
    assert run_cli("convert", *sources, "-o", reference, "-q", "-j", "1").exit_code == 0
    out = tmp_path / "killed"
    # a slow codec so the process is still working when it is killed
    cmd = [sys.executable, "-m", "shardkit", "convert", *sources, "-o", str(out), "-j", "1", "-q", "--codec", "xz",
           "--level", "9"]
    proc = subprocess.Popen(cmd)
    deadline = time.time() + 60
    while time.time() < deadline and len([p for p in os.listdir(out)] if out.exists() else []) < 3:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    done_before = [p for p in os.listdir(out) if p.endswith(".tar.xz")]
    assert 0 < len(done_before) < len(sources), "the kill should land part-way"
    result = run_cli("convert", *sources, "-o", out, "-q", "-j", "2", "--codec", "xz", "--level", "9", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["skipped"] >= len(done_before) - 1
    assert report["ok"] + report["skipped"] == len(sources)
    assert not [p for p in os.listdir(out) if p.endswith(".partial")]
    ref = [open(p, "rb").read() for p in listed(reference)]
    run_cli("convert", *sources, "-o", tmp_path / "xzref", "-q", "--codec", "xz", "--level", "9")
    assert [open(p, "rb").read() for p in listed(out)] == [open(p, "rb").read() for p in listed(tmp_path / "xzref")]
    assert members_of(listed(out)) == members_of(listed(reference)) and ref


def _write_bytes(path, data):
    path.write_bytes(data)
    return str(path)


def _tar(members, **kinds):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if not isinstance(data, tuple):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = data[1]
                info.linkname = "target.wav"
                tar.addfile(info)
    return buf.getvalue()


@pytest.fixture
def bad_inputs(make_shards, tmp_path):
    """One good shard and one shard per kind of damage; returns {kind: path}."""
    good = make_shards("bz2", utts_per_shard=20, level=1)[0]  # 100 kB bz2 blocks: damage is mid-stream
    blob = open(good, "rb").read()
    raw = bz2.decompress(blob)
    bad = tmp_path / "bad"
    bad.mkdir()
    corrupt = bytearray(blob)
    corrupt[len(blob) // 2] ^= 0xFF
    header_damaged = bytearray(raw)
    # damage the name in the header of the third member: find it by walking sizes
    offset, seen = 0, 0
    while seen < 2:
        size = int(raw[offset + 124:offset + 136].strip(b"\0 ") or b"0", 8)
        offset += 512 + size + (-size % 512)
        seen += 1
    header_damaged[offset + 20] ^= 0x55
    return {
        "good": good,
        "truncated": _write_bytes(bad / "truncated.tar.bz2", blob[: len(blob) * 2 // 3]),
        "corrupt": _write_bytes(bad / "corrupt.tar.bz2", bytes(corrupt)),
        "header": _write_bytes(bad / "header.tar", bytes(header_damaged)),
        "traversal": _write_bytes(bad / "traversal.tar", _tar([("a.txt", b"x"), ("../../etc/evil.wav", b"y")])),
        "absolute": _write_bytes(bad / "absolute.tar", _tar([("/etc/evil.txt", b"x")])),
        "symlink": _write_bytes(bad / "symlink.tar", _tar([("a.txt", b"x"), ("a.wav", ("special", tarfile.SYMTYPE))])),
        "hardlink": _write_bytes(bad / "hardlink.tar", _tar([("a.txt", b"x"), ("a.wav", ("special", tarfile.LNKTYPE))])),
        "device": _write_bytes(bad / "device.tar", _tar([("a.txt", b"x"), ("a.wav", ("special", tarfile.CHRTYPE))])),
        "nottar": _write_bytes(bad / "nottar.tar", b"this is not a tar archive\n" * 100),
        "big": _write_bytes(bad / "big.tar", _tar([("k.txt", b"x"), ("k.wav", b"\1" * 5000)])),
    }


EXPECTED_ERRORS = {
    "truncated": "bz2 stream is truncated or corrupt",
    "corrupt": "bz2 stream is truncated or corrupt",
    "header": "damaged tar header",
    "traversal": "member '../../etc/evil.wav': member name with '..' (path traversal)",
    "absolute": "member '/etc/evil.txt': absolute member name",
    "symlink": "member 'a.wav': symbolic link member refused",
    "hardlink": "member 'a.wav': hard link member refused",
    "device": "member 'a.wav': character device member refused",
    "nottar": "not a tar archive",
    "big": "member 'k.wav': member of 5000 bytes exceeds the limit of 4096 bytes",
}


def test_each_bad_input_fails_alone_with_a_located_one_line_error(bad_inputs, tmp_path):
    out = tmp_path / "out"
    result = run_cli("convert", *bad_inputs.values(), "-o", out, "--json", "-q", "-j", "2", "--codec", "zst")
    big = run_cli("convert", bad_inputs["big"], "-o", out / "small-limit", "--max-member-bytes", "4096", "--json", "-q",
                  "--codec", "zst")
    assert result.exit_code == 1 and big.exit_code == 1
    report = json.loads(result.stdout)
    assert report["ok"] == 2 and report["failed"] == len(bad_inputs) - 2  # the good one and "big" converted
    failures = report["failures"] + json.loads(big.stdout)["failures"]
    errors = {os.path.basename(f["shard"]).split(".")[0]: f["error"] for f in failures}
    for kind, expected in EXPECTED_ERRORS.items():
        assert expected in errors[kind], (kind, errors[kind])
        assert errors[kind].startswith(bad_inputs[kind]) and "\n" not in errors[kind]
    finals = set(os.listdir(out)) | set(os.listdir(out / "small-limit"))
    for kind in set(EXPECTED_ERRORS) - {"big"}:  # nothing under a final name, no temp left behind
        assert not any(name.startswith(kind + ".") for name in finals), kind
    assert not [n for n in finals if n.endswith(".partial")]
    assert not os.path.exists(out / "small-limit" / "big.tar.zst")
    assert not (out / "data.list").exists()  # a failed shard: the list says it lacks shards by its name
    assert listed(out, "data.partial.list") == [str(out / "shards_000000000.tar.zst"), str(out / "big.tar.zst")]
    assert members_of([out / "shards_000000000.tar.zst"]) == members_of([bad_inputs["good"]])


def test_missing_file_in_data_list_fails_that_shard_only(make_shards, tmp_path):
    sources = make_shards("gz")
    lst = tmp_path / "data.list"
    lst.write_text(sources[0] + "\n" + "missing/shard_9.tar.gz\n" + sources[1] + "\n")
    result = run_cli("convert", lst, "-o", tmp_path / "o", "--json", "-q")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and report["ok"] == 2
    assert report["failures"] == [{"shard": str(tmp_path / "missing/shard_9.tar.gz"),
                                   "error": f"{tmp_path / 'missing/shard_9.tar.gz'}: no such file"}]


def test_usage_errors_exit_2(make_shards, tmp_path):
    sources = make_shards("none")
    result = run_cli("convert", tmp_path / "nope.tar", "-o", tmp_path / "o")
    assert result.exit_code == 2 and "nope.tar: no such file, folder or glob match" in result.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run_cli("convert", *sources, "-o", blocker / "sub")
    assert result.exit_code == 2 and "output folder is not writable" in result.stderr
    result = run_cli("convert", *sources, "-o", tmp_path / "o", "--codec", "lz4")
    assert result.exit_code == 2
    result = run_cli("convert", *sources, "-o", tmp_path / "o", "--codec", "zst", "--level", "42")
    assert result.exit_code == 2 and "zst level must be in -7..22 (got 42)" in result.stderr
    other = tmp_path / "other"
    other.mkdir()
    twin = other / os.path.basename(sources[0])
    twin.write_bytes(open(sources[0], "rb").read())
    result = run_cli("convert", sources[0], str(twin), "-o", tmp_path / "o", "--flat")
    assert result.exit_code == 2 and "would both write" in result.stderr
    result = run_cli("convert", sources[0], str(twin), "-o", tmp_path / "tree", "-q")  # names repeat: mirrored
    assert result.exit_code == 0 and len(listed(tmp_path / "tree")) == 2


def test_salvage_keeps_complete_utterances_before_damage(bad_inputs, tmp_path):
    out = tmp_path / "o"
    result = run_cli("convert", bad_inputs["truncated"], "-o", out, "--salvage", "--json", "-q", "--codec", "none")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["salvaged"] == 1
    lost = report["salvaged_shards"][0]
    assert "truncated or corrupt" in lost["error"]
    kept = members_of(listed(out))
    assert kept and len(kept) % 2 == 0
    assert kept == members_of([bad_inputs["good"]])[: len(kept)]
    assert [n for n, _ in kept][-1] == lost["after_member"]


def test_inputs_are_never_modified(make_shards, tmp_path):
    sources = make_shards("xz")
    before = {p: (open(p, "rb").read(), os.stat(p).st_mtime_ns) for p in sources}
    run_cli("convert", os.path.dirname(sources[0]), "-o", tmp_path / "o", "-q")
    assert {p: (open(p, "rb").read(), os.stat(p).st_mtime_ns) for p in sources} == before


def test_help_has_an_example_and_module_entry_point():
    result = run_cli("convert", "--help")
    assert result.exit_code == 0 and "Examples:" in result.output and "shardkit convert" in result.output
    proc = subprocess.run([sys.executable, "-m", "shardkit", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("shardkit, version ")
