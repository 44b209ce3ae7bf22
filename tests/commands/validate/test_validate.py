import bz2
import hashlib
import io
import json
import os
import sys
import tarfile

import numpy as np
import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands.validate import ValidateOptions, run_validate, validate_shard
from shardkit.io.codecs import open_writer
from shardkit.io.synth import CorpusSpec, corpus_utterances, encode, speech_like
from shardkit.io.tar import TarWriter
from shardkit.run.options import RunOptions

RATE = 16000
STRICT = ValidateOptions(sample_rate=RATE, channels=1)
ANY_KEY = object()


def _good(n, seed, audio_format="wav"):
    """n real speech-like utterances as (key, txt bytes, audio ext, audio bytes)."""
    spec = CorpusSpec(f"good{seed}", n, 0.3, 0.8, "mix")
    return [(key, text.encode(), audio_format, audio)
            for key, text, audio, _ in corpus_utterances(spec, seed=seed, audio_format=audio_format)]


def _members(utts):
    for key, text, ext, audio in utts:
        if text is not None:
            yield f"{key}.txt", text
        if audio is not None:
            yield f"{key}.{ext}", audio


def _write(path, members, codec="none"):
    with open(path, "wb") as raw, open_writer(raw, codec) as out:
        tar = TarWriter(out)
        for name, data in members:
            tar.add(name, data)
        tar.close()
    return str(path)


def _traversal_tar(members):
    """A tar holding a '..' member, written by tarfile (TarWriter would write it too, but say it plainly)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """One shard per planted fault, each fault between good utterances; returns (paths, expected findings).

    Expected findings are (shard file name, key, check); every finding must be expected (no false positives).
    """
    out = tmp_path_factory.mktemp("faults")
    pcm = speech_like(1.0, RATE, seed=7)
    wav, flac = encode(pcm, RATE, "wav"), encode(pcm, RATE, "flac")
    nan_pcm = (pcm / 32768).astype(np.float32)
    nan_pcm[100:110] = np.nan
    txt = "HELLO WORLD".encode()
    paths, expected = [], []

    def shard(name, bad_utts, checks, *, codec="none", seed=None, raw_members=None):
        before, after = _good(2, seed=len(paths) * 2 + 1), _good(1, seed=len(paths) * 2 + 2)
        members = list(_members(before)) + (raw_members or list(_members(bad_utts))) + list(_members(after))
        path = _write(out / name, members, codec)
        paths.append(path)
        expected.extend((name, key, check) for key, check in checks)
        return path, members

    shard("truncated-wav.tar", [("bad/trunc-wav", txt, "wav", wav[: len(wav) // 2])], [("bad/trunc-wav", "truncated")])
    shard("truncated-flac.tar", [("bad/trunc-flac", txt, "flac", flac[: len(flac) // 2])],
          [("bad/trunc-flac", "truncated")])
    shard("garbage.tar", [("bad/garbage", txt, "wav", b"\x00not audio at all\xff" * 300)], [("bad/garbage", "decode")])
    shard("flac-named-wav.tar", [("bad/flac-as-wav", txt, "wav", flac)], [("bad/flac-as-wav", "format_mismatch")])
    shard("zero-audio.tar", [("bad/zero", txt, "wav", b"")], [("bad/zero", "empty_audio")])
    shard("nan.tar", [("bad/nan", txt, "wav", encode(nan_pcm, RATE, "wav", subtype="FLOAT"))], [("bad/nan", "nan")])
    shard("rate.tar", [("bad/rate", txt, "wav", encode(pcm[::2], RATE // 2, "wav"))], [("bad/rate", "sample_rate")])
    shard("stereo.tar", [("bad/stereo", txt, "wav", encode(np.stack([pcm, pcm], 1), RATE, "wav"))],
          [("bad/stereo", "channels")])
    shard("missing-txt.tar", [("bad/no-txt", None, "wav", wav)], [("bad/no-txt", "missing_txt")])
    shard("missing-audio.tar", [("bad/no-audio", txt, "wav", None)], [("bad/no-audio", "missing_audio")])
    shard("empty-txt.tar", [("bad/empty-txt", b" \n", "wav", wav)], [("bad/empty-txt", "empty_text")])
    shard("latin1-txt.tar", [("bad/latin1", "café".encode("latin-1"), "wav", wav)], [("bad/latin1", "text_encoding")])
    # WeNet sees two utterances for a split key: one without audio, one without text
    shard("split-key.tar", None, [("bad/split", "missing_audio"), ("bad/split", "missing_txt"), ("bad/split", "split_key")],
          raw_members=[("bad/split.txt", txt), ("bad/between.txt", txt), ("bad/between.wav", wav),
                       ("bad/split.wav", wav)])
    shard("duplicate-key.tar", [("bad/dup", txt, "wav", wav), ("bad/other", txt, "wav", wav), ("bad/dup", txt, "wav", wav)],
          [("bad/dup", "duplicate_key")])
    # the traversal member is refused (and set apart); the utterances around it are fine
    name = "traversal.tar"
    members = list(_members(_good(2, seed=101))) + [("../evil.wav", wav)] + list(_members(_good(1, seed=102)))
    (out / name).write_bytes(_traversal_tar(members))
    paths.append(str(out / name))
    expected.append((name, "../evil", "unsafe_member"))
    # truncated bz2: the stream ends in the middle; which utterance it cuts depends on bz2 blocks
    name = "truncated.tar.bz2"
    whole = bz2.compress(b"".join(_tar_of(_members(_good(20, seed=103)))), compresslevel=1)  # 100 kB blocks
    (out / name).write_bytes(whole[: len(whole) * 2 // 3])
    paths.append(str(out / name))
    expected.append((name, ANY_KEY, "stream"))
    return paths, expected


def _tar_of(members):
    buf = io.BytesIO()
    tar = TarWriter(buf)
    for name, data in members:
        tar.add(name, data)
    tar.close()
    yield buf.getvalue()


def _found(report):
    return [(os.path.basename(f["shard"]), f["key"], f["check"]) for f in report.findings]


def _matches(found, expected):
    remaining = list(found)
    for name, key, check in expected:
        hit = next((f for f in remaining if f[0] == name and f[2] == check and (key is ANY_KEY or f[1] == key)), None)
        assert hit is not None, f"not found: {(name, key, check)}; found {found}"
        remaining.remove(hit)
    assert remaining == [], f"unexpected findings (false positives): {remaining}"


def test_every_planted_fault_is_found_with_its_key_and_check_and_nothing_else(faults):
    paths, expected = faults
    report = run_validate(paths, STRICT, RunOptions(jobs=1))
    _matches(_found(report), expected)
    assert report.exit_code == 1
    by_name = {os.path.basename(s["shard"]): s for s in report.shards}
    # the scan goes on after a problem: the good utterance after each fault is counted
    assert by_name["garbage.tar"]["utterances"] == 4
    assert by_name["traversal.tar"]["utterances"] == 3
    # a damaged stream ends the scan, but what was read before it is checked and counted
    assert 0 < by_name["truncated.tar.bz2"]["utterances"] < 20
    assert by_name["rate.tar"]["sample_rates"] == {"16000": 3, "8000": 1}


def test_finding_messages_say_what_is_wrong(faults):
    paths, _ = faults
    result = validate_shard(next(p for p in paths if p.endswith("truncated-wav.tar")), STRICT)
    (f,) = result["findings"]
    assert f["member"] == "bad/trunc-wav.wav"
    assert f["message"] == "header promises 16000 frames (1.000 s), the data holds 7989 (0.499 s)"
    mismatch = validate_shard(next(p for p in paths if p.endswith("flac-named-wav.tar")), STRICT)["findings"]
    assert [f["message"] for f in mismatch] == ["named .wav but the bytes are FLAC"]
    garbage = validate_shard(next(p for p in paths if p.endswith("garbage.tar")), STRICT)["findings"]
    assert [f["message"] for f in garbage] == ["soundfile cannot decode it: Format not recognised."]
    flac = validate_shard(next(p for p in paths if p.endswith("truncated-flac.tar")), STRICT)["findings"]
    assert flac[0]["message"].startswith("decodes ") and " of the 16000 frames the header promises, then fails (" \
        in flac[0]["message"]


@pytest.mark.parametrize("codec,audio_format", [("none", "wav"), ("zst", "flac"), ("bz2", "wav"), ("gz", "flac")])
def test_a_clean_corpus_gives_no_finding(make_shards, codec, audio_format):
    paths = make_shards(codec, audio_format=audio_format)
    report = run_validate(paths, ValidateOptions(sample_rate=RATE, channels=1, min_duration=0.2, max_duration=30))
    assert report.findings == []
    assert report.exit_code == 0
    totals = report.totals()
    assert totals["utterances"] == 14 and totals["shards"] == 3
    assert 14 < totals["audio_seconds"] < 30


def test_torchaudio_backend_finds_the_same_faults(faults):
    pytest.importorskip("torchaudio")
    paths, expected = faults
    wanted = ("truncated-wav.tar", "truncated-flac.tar", "garbage.tar", "nan.tar", "stereo.tar", "flac-named-wav.tar")
    chosen = [p for p in paths if os.path.basename(p) in wanted]
    report = run_validate(chosen, ValidateOptions(backend="torchaudio", sample_rate=RATE, channels=1),
                          RunOptions(jobs=1))
    _matches(_found(report), [e for e in expected if e[0] in wanted])


def test_duplicate_key_across_shards_is_reported_in_the_later_shard(tmp_path):
    utts = _good(3, seed=5)
    a = _write(tmp_path / "a.tar", _members(utts[:2]))
    b = _write(tmp_path / "b.tar", _members(utts[1:]), codec="zst")
    report = run_validate([b, a], STRICT, RunOptions(jobs=1))  # shard order decides which occurrence is first
    assert [(os.path.basename(f["shard"]), f["key"], f["check"]) for f in report.findings] == [
        ("a.tar", utts[1][0], "duplicate_key")]
    assert report.findings[0]["message"] == f"key is also in {b}"
    q = run_validate([b, a], STRICT, RunOptions(jobs=1), quarantine_dir=str(tmp_path / "q")).quarantine
    (out,) = q["shards"]
    assert [n for n, _ in _tar_members(out["rejects"])] == [f"{utts[1][0]}.txt", f"{utts[1][0]}.wav"]
    assert [n for n, _ in _tar_members(out["cleaned"])] == [f"{utts[0][0]}.txt", f"{utts[0][0]}.wav"]
    assert open(q["data_list"]).read().splitlines() == [b, out["cleaned"]]


def test_parallel_run_reports_the_same_as_one_process(faults):
    paths, _ = faults
    one = run_validate(paths, STRICT, RunOptions(jobs=1))
    two = run_validate(paths, STRICT, RunOptions(jobs=2))
    assert _found(two) == _found(one)
    assert [s["utterances"] for s in two.shards] == [s["utterances"] for s in one.shards]


def test_container_problems_missing_file_empty_shard(tmp_path):
    (tmp_path / "zero.tar").write_bytes(b"")
    (tmp_path / "ends.tar").write_bytes(bytes(10240))
    lst = tmp_path / "data.list"
    lst.write_text(f"{tmp_path / 'gone.tar'}\n{tmp_path / 'zero.tar'}\n{tmp_path / 'ends.tar'}\n")
    report = run_validate([str(lst)], STRICT, RunOptions(jobs=1))
    assert [(os.path.basename(f["shard"]), f["check"], f["message"]) for f in report.findings] == [
        ("gone.tar", "missing_file", "no such file"),
        ("zero.tar", "empty_shard", "empty stream: not a tar archive"),
        ("ends.tar", "empty_shard", "empty tar archive (no members)")]


def _tar_members(path):
    """Every member of a tar (any compression tarfile reads) as (name, bytes), via tarfile itself."""
    with tarfile.open(path, mode="r:*") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_quarantine_keeps_every_member_and_the_cleaned_copies_validate_clean(faults, tmp_path):
    paths, _ = faults
    readable = [p for p in paths if not p.endswith(".bz2")]
    before = {p: _sha(p) for p in paths}
    report = run_validate(paths, STRICT, RunOptions(jobs=1), quarantine_dir=str(tmp_path / "q"))
    assert {p: _sha(p) for p in paths} == before  # sources are never modified
    q = report.quarantine
    outs = {os.path.basename(s["shard"]): s for s in q["shards"]}
    assert len(outs) == len(paths)  # every fault shard has findings
    for src in readable:
        out = outs[os.path.basename(src)]
        cleaned = _tar_members(out["cleaned"])
        rejects = _tar_members(out["rejects"])
        assert sorted(cleaned + rejects) == sorted(_tar_members(src)), src  # nothing is lost
        assert out["cleaned"].endswith(os.path.basename(src)) and out["rejects"].endswith(".rejects.tar")
    # the good utterances (3 around each fault) survive, and validate clean
    assert run_validate([outs[os.path.basename(p)]["cleaned"] for p in paths], STRICT).findings == []
    trav = outs["traversal.tar"]
    assert [n for n, _ in _tar_members(trav["rejects"])] == ["../evil.wav"]
    lines = [json.loads(line) for line in open(q["rejects_jsonl"])]
    assert {"shard": paths[-2], "member": "../evil.wav", "key": None,
            "checks": ["unsafe_member"], "reasons": ["unsafe_member: member name with '..' (path traversal)"],
            "rejects_shard": trav["rejects"]} in lines
    assert sum(1 for line in lines if line["shard"] == paths[-2]) == 1
    # the truncated bz2 shard: cleaned copy (same codec) holds what was readable and good
    bz = outs["truncated.tar.bz2"]
    assert bz["cleaned"].endswith("truncated.tar.bz2") and bz["kept_members"] > 0
    assert any(line["member"] is None and line["checks"] == ["stream"] for line in lines)
    assert open(q["data_list"]).read().splitlines() == [outs[os.path.basename(p)]["cleaned"] for p in paths]


def test_quarantine_is_deterministic_and_reruns_give_identical_bytes(faults, tmp_path):
    paths, _ = faults
    chosen = [p for p in paths if p.endswith(("duplicate-key.tar", "truncated.tar.bz2", "nan.tar"))]
    first = run_validate(chosen, STRICT, quarantine_dir=str(tmp_path / "one")).quarantine
    second = run_validate(chosen, STRICT, quarantine_dir=str(tmp_path / "two")).quarantine
    for a, b in zip(first["shards"], second["shards"]):
        assert _sha(a["cleaned"]) == _sha(b["cleaned"]) and _sha(a["rejects"]) == _sha(b["rejects"])
    dup = next(s for s in first["shards"] if s["shard"].endswith("duplicate-key.tar"))
    # the first occurrence of the duplicate key stays, the second is set apart
    assert [n for n, _ in _tar_members(dup["rejects"])] == ["bad/dup.txt", "bad/dup.wav"]
    assert "bad/dup.wav" in [n for n, _ in _tar_members(dup["cleaned"])]


def test_quarantine_refuses_the_sources_folder(faults):
    paths, _ = faults
    result = CliRunner().invoke(main, ["validate", paths[0], "--quarantine", os.path.dirname(paths[0])])
    assert result.exit_code == 2
    folder = os.path.dirname(paths[0])
    assert result.output.strip() == (f"Error: {folder}: the quarantine folder holds input {paths[0]} (both are "
                                      f"{os.path.realpath(folder)} by real path), so outputs could overwrite inputs; "
                                      "choose another folder")


# ---- the command line ----------------------------------------------------------------------

def test_cli_exit_0_on_a_clean_corpus_with_a_summary(make_shards):
    paths = make_shards("zst")
    result = CliRunner().invoke(main, ["validate", os.path.join(os.path.dirname(paths[0]), "data.list"),
                                       "--sample-rate", "16000", "--channels", "1", "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "validated 3 shards: 14 utterances" in result.stderr
    assert result.stderr.rstrip().endswith("no findings")
    assert result.stdout == ""


def test_cli_exit_1_with_json_and_report(faults, tmp_path):
    paths, expected = faults
    report_file = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["validate", *paths, "--sample-rate", "16000", "--channels", "1", "-j", "1",
                                       "--json", "--report", str(report_file)])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)  # exactly one JSON document on stdout
    assert doc == json.loads(report_file.read_text())
    assert doc["totals"]["findings"] == len(expected) == len(doc["findings"])
    assert set(doc["findings"][0]) == {"shard", "key", "member", "check", "message"}
    assert doc["totals"]["by_check"]["truncated"] == 2
    shard = next(s for s in doc["shards"] if s["shard"].endswith("rate.tar"))
    assert shard["utterances"] == 4 and shard["sample_rates"] == {"16000": 3, "8000": 1} and shard["bytes"] > 0
    assert f"{len(expected)} findings in {len(paths)} of {len(paths)} shards:" in result.stderr
    assert f"{paths[0]}: key 'bad/trunc-wav': member 'bad/trunc-wav.wav': truncated: header promises" in result.stderr


@pytest.mark.parametrize("args,message", [
    (["nope.tar"], "Error: nope.tar: no such file, folder or glob match"),
    (["X", "--min-duration", "5", "--max-duration", "1"], "Error: --min-duration 5.0 is above --max-duration 1.0"),
])
def test_cli_exit_2_on_usage_errors(make_shards, args, message):
    if args[0] == "X":
        args = [make_shards("none")[0], *args[1:]]
    result = CliRunner().invoke(main, ["validate", *args])
    assert result.exit_code == 2
    assert result.output.strip() == message


def test_cli_bad_option_value_is_exit_2(make_shards):
    result = CliRunner().invoke(main, ["validate", make_shards("none")[0], "--sample-rate", "0"])
    assert result.exit_code == 2 and "Invalid value for '--sample-rate'" in result.output


def test_cli_torchaudio_backend_says_it_needs_the_torch_extra(make_shards, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchaudio", None)  # import torchaudio now fails
    result = CliRunner().invoke(main, ["validate", make_shards("none")[0], "--backend", "torchaudio"])
    assert result.exit_code == 2
    assert result.output.strip() == ("Error: --backend torchaudio needs torchaudio, which is not installed: "
                                     "pip install 'shardkit[torch]'")


def test_duration_bounds_and_multiple_audio(tmp_path):
    utts = _good(6, seed=9)  # 0.3 to 0.8 s each
    pcm = speech_like(0.5, RATE, seed=3)
    members = list(_members(utts)) + [("x/two.txt", b"TWO"), ("x/two.wav", encode(pcm, RATE, "wav")),
                                      ("x/two.flac", encode(pcm, RATE, "flac"))]
    path = _write(tmp_path / "d.tar", members)
    seconds = {key: len(sf_read(audio)) / RATE for key, _, _, audio in utts}
    report = run_validate([path], ValidateOptions(min_duration=0.45, max_duration=0.7), RunOptions(jobs=1))
    wanted = sorted([(k, "duration") for k, s in seconds.items() if not 0.45 <= s <= 0.7] + [("x/two", "multiple_audio")])
    assert 0 < len(wanted) - 1 < 6
    assert sorted((f["key"], f["check"]) for f in report.findings) == wanted
    short = next(f for f in report.findings if f["check"] == "duration" and seconds[f["key"]] < 0.45)
    assert short["message"] == f"{seconds[short['key']]:.3f} s is below the minimum of 0.45 s"


def sf_read(data):
    import soundfile

    return soundfile.read(io.BytesIO(data))[0]
