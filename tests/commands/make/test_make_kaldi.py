"""shardkit make: Kaldi data directories (WAV/FLAC files, segments, broken entries) into shards."""

from __future__ import annotations

import json
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands.make import plan_shards, to_int16
from shardkit.commands.make.kaldi import parse_segments, parse_text, parse_wav_scp
from shardkit.errors import UsageError
from shardkit.io.audio import decode
from shardkit.io.synth import encode, speech_like
from shardkit.io.tar import group_samples, iter_shard_members

RATE = 16000


def write_dir(root, utts, *, segments=None, extra_wav=(), extra_text=()):
    """A Kaldi data dir: utts is [(key, text, seconds, fmt)]; audio files written with soundfile."""
    root = str(root)
    os.makedirs(os.path.join(root, "wav"), exist_ok=True)
    wav_lines, text_lines, sources = [], [], {}
    for i, (key, text, seconds, fmt) in enumerate(utts):
        path = os.path.join(root, "wav", f"{key.replace('/', '_')}.{fmt}")
        with open(path, "wb") as f:
            f.write(encode(speech_like(seconds, RATE, seed=i), RATE, fmt))
        sources[key] = path
        wav_lines.append(f"{key} {path}\n")
        text_lines.append(f"{key} {text}\n")
    wav_lines += [f"{line}\n" for line in extra_wav]
    text_lines += [f"{line}\n" for line in extra_text]
    with open(os.path.join(root, "wav.scp"), "w") as f:
        f.writelines(wav_lines)
    with open(os.path.join(root, "text"), "w") as f:
        f.writelines(text_lines)
    if segments is not None:
        with open(os.path.join(root, "segments"), "w") as f:
            f.writelines(f"{line}\n" for line in segments)
    return sources


def run_make(root, out, *args):
    root = str(root)
    argv = ["make", "--wav-scp", os.path.join(root, "wav.scp"), "--text", os.path.join(root, "text"),
            "-o", str(out), "-j", "1", "-q", *args]
    if os.path.exists(os.path.join(root, "segments")) and "--segments" not in args:
        argv += ["--segments", os.path.join(root, "segments")]
    return CliRunner().invoke(main, argv)


def shard_members(out):
    with open(os.path.join(out, "data.list")) as f:
        shards = [line.strip() for line in f]
    return shards, [m for s in shards for m in iter_shard_members(s)]


MIXED = [("corpus/spk1-utt1", "HELLO WORLD", 1.0, "wav"), ("corpus/spk1-utt2", "你好 世界", 0.6, "flac"),
         ("corpus/spk2-utt1", "GOOD MORNING", 1.4, "wav"), ("corpus/spk2-utt2", "THANKS", 0.3, "flac")]


# ------------------------------------------------------------ planning and parsing (pure)

@pytest.mark.parametrize("durations,target", [
    ([1.0] * 10, 2.5), ([5, 1, 1, 1, 1, 5, 1, 1], 4.0), ([30.0, 1, 1], 10.0), ([2.0] * 7, 100.0),
    (list(np.random.default_rng(0).uniform(1, 20, 500)), 300.0), ([1.0, 1.0], 0.5)])
def test_plan_by_duration_cuts_in_order_into_near_equal_shards(durations, target):
    plan = plan_shards(durations, shard_duration=target)
    assert [i for shard in plan for i in shard] == list(range(len(durations)))  # every one, in order
    assert all(shard for shard in plan)
    total = sum(durations)
    assert len(plan) == min(len(durations), max(1, int(np.ceil(total / target - 1e-9))))
    per_shard = [sum(durations[i] for i in shard) for shard in plan]
    longest = max(durations)
    assert max(per_shard) - min(per_shard) <= 2 * longest  # no small leftover shard
    assert all(s <= total / len(plan) + longest for s in per_shard)


def test_plan_by_count_is_wenets_rule():
    assert plan_shards([1.0] * 7, utts_per_shard=3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert plan_shards([], shard_duration=10) == []


def test_parsers_read_kaldi_tables():
    wav = parse_wav_scp(["a /data/a.wav\n", "b sox /data/b.sph -t wav - |\n", "\n", "c  /path with space.wav\n"])
    assert (wav["a"].location, wav["a"].is_pipe) == ("/data/a.wav", False)
    assert (wav["b"].location, wav["b"].is_pipe) == ("sox /data/b.sph -t wav -", True)
    assert wav["c"].location == "/path with space.wav"
    assert parse_text(["a  hello world \n", "b\n"]) == {"a": "hello world", "b": ""}
    segs = parse_segments(["u1 rec 0.5 1.25\n", "u2 rec 1.5 -1\n"])
    assert (segs["u1"].start, segs["u1"].end, segs["u2"].end) == (0.5, 1.25, None)


@pytest.mark.parametrize("parser,lines,message", [
    (parse_wav_scp, ["a x.wav", "a y.wav"], "wav.scp: line 2: key 'a' appears twice (first on line 1)"),
    (parse_wav_scp, ["a"], "wav.scp: line 1: key 'a' has no path"),
    (parse_segments, ["u rec 1.0"], "segments: line 1: expected 'utt recording start end', got 3 fields"),
    (parse_segments, ["u rec 2.0 1.0"], "segments: line 1: segment 'u' ends (1.0) before it starts (2.0)"),
    (parse_segments, ["u rec a b"], "segments: line 1: start/end 'a' 'b' are not numbers"),
])
def test_parsers_name_file_and_line_of_bad_input(parser, lines, message):
    with pytest.raises(UsageError) as err:
        parser(lines)
    assert str(err.value) == message


def test_to_int16_clips_instead_of_wrapping():
    assert to_int16(np.array([1.0, 1.2, -1.0, -1.5, 0.5, 32767 / 32768])).tolist() == \
        [32767, 32767, -32768, -32768, 16384, 32767]


# ------------------------------------------------------------ the command

def test_make_keeps_wav_and_flac_bytes_and_writes_wenet_layout(tmp_path):
    sources = write_dir(tmp_path / "d", MIXED)
    result = run_make(tmp_path / "d", tmp_path / "out", "--codec", "none", "--utts-per-shard", "3")
    assert result.exit_code == 0, result.output
    shards, members = shard_members(tmp_path / "out")
    assert [os.path.basename(s) for s in shards] == ["shards_000000000.tar", "shards_000000001.tar"]
    assert [name for name, _ in members] == [
        "corpus/spk1-utt1.txt", "corpus/spk1-utt1.wav", "corpus/spk1-utt2.txt", "corpus/spk1-utt2.flac",
        "corpus/spk2-utt1.txt", "corpus/spk2-utt1.wav", "corpus/spk2-utt2.txt", "corpus/spk2-utt2.flac"]
    data = dict(members)
    for key, text, _, fmt in MIXED:
        assert data[f"{key}.txt"].decode() == text
        with open(sources[key], "rb") as f:
            assert data[f"{key}.{fmt}"] == f.read()  # keep: bytes untouched
    # WeNet opens shards with tarfile and groups by the prefix before the last '.'
    with tarfile.open(shards[0], "r:*") as tar:
        assert [m.name for m in tar.getmembers()][:2] == ["corpus/spk1-utt1.txt", "corpus/spk1-utt1.wav"]
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    samples = list(group_samples(members))
    assert [s["__key__"] for s in samples] == [k for k, *_ in MIXED]
    manifest = json.loads((tmp_path / "out" / "make.json").read_text())
    assert manifest["findings"] == [] and manifest["summary"]["utterances"] == 4
    assert manifest["summary"]["audio_seconds"] == pytest.approx(3.3, abs=1e-3)


def test_make_is_deterministic_and_resumable(tmp_path):
    write_dir(tmp_path / "d", MIXED)
    assert run_make(tmp_path / "d", tmp_path / "a", "--utts-per-shard", "2").exit_code == 0
    assert run_make(tmp_path / "d", tmp_path / "b", "--utts-per-shard", "2", "-j", "2").exit_code == 0
    names = sorted(p.name for p in (tmp_path / "a").glob("*.tar"))
    assert len(names) == 2
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)

    (tmp_path / "a" / names[1]).unlink()
    (tmp_path / "a" / f".{names[0]}.partial").write_bytes(b"left by a killed run")
    rerun = CliRunner().invoke(main, ["make", "--wav-scp", str(tmp_path / "d" / "wav.scp"), "--text",
                                      str(tmp_path / "d" / "text"), "-o", str(tmp_path / "a"),
                                      "--utts-per-shard", "2", "-j", "1", "--json"])
    assert rerun.exit_code == 0, rerun.output
    summary = json.loads(rerun.stdout)
    assert summary["shard_status"] == {"ok": 1, "skipped": 1, "failed": 0, "empty": 0}
    assert (tmp_path / "a" / names[1]).read_bytes() == (tmp_path / "b" / names[1]).read_bytes()
    assert not list((tmp_path / "a").glob(".*partial"))


def test_shards_are_packed_by_duration(tmp_path):
    utts = [(f"u{i:02d}", "WORD", seconds, "wav") for i, seconds in enumerate([0.5, 2.0, 0.5, 0.5, 2.0, 0.5] * 2)]
    write_dir(tmp_path / "d", utts)
    result = run_make(tmp_path / "d", tmp_path / "out", "--shard-duration", "3", "--json")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "make.json").read_text())
    assert [s["seconds"] for s in manifest["shards"]] == [3.0, 3.0, 3.0, 3.0]
    assert [s["keys"] for s in manifest["shards"]][:2] == [["u00", "u01", "u02"], ["u03", "u04", "u05"]]
    single = run_make(tmp_path / "d", tmp_path / "default")  # 3600 s per shard: all in one
    assert single.exit_code == 0 and len((tmp_path / "default" / "data.list").read_text().splitlines()) == 1


def test_segments_are_cut_from_recordings(tmp_path):
    root = tmp_path / "d"
    sources = write_dir(root, [("rec1", "", 3.0, "flac"), ("rec2", "", 2.0, "wav")],
                        segments=["rec1-a rec1 0.25 1.0", "rec1-b rec1 1.5 -1", "rec2-a rec2 0 0.5"])
    (root / "text").write_text("rec1-a FIRST\nrec1-b SECOND\nrec2-a THIRD\n")
    result = run_make(root, tmp_path / "out", "--audio-format", "flac", "--codec", "none")
    assert result.exit_code == 0, result.output
    _, members = shard_members(tmp_path / "out")
    data = dict(members)
    assert [n for n, _ in members] == ["rec1-a.txt", "rec1-a.flac", "rec1-b.txt", "rec1-b.flac",
                                       "rec2-a.txt", "rec2-a.flac"]
    rec1, _ = sf.read(sources["rec1"], dtype="int16")
    rec2, _ = sf.read(sources["rec2"], dtype="int16")
    for name, expected in [("rec1-a", rec1[4000:16000]), ("rec1-b", rec1[24000:]), ("rec2-a", rec2[:8000])]:
        samples, rate = decode(data[f"{name}.flac"], "int16")
        assert rate == RATE and np.array_equal(samples[:, 0], expected)
    manifest = json.loads((tmp_path / "out" / "make.json").read_text())
    assert manifest["warnings"] == [] and manifest["summary"]["audio_seconds"] == pytest.approx(2.75)


def test_keep_with_segments_is_refused(tmp_path):
    write_dir(tmp_path / "d", [("rec1", "X", 1.0, "wav")], segments=["u rec1 0 0.5"])
    result = run_make(tmp_path / "d", tmp_path / "out", "--audio-format", "keep")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "Error: --audio-format keep copies whole source files, but with --segments each utterance is cut from "
        "its recording and must be re-encoded: use --audio-format wav or flac")


def test_mismatched_keys_empty_text_and_unreadable_audio_are_skipped_and_listed(tmp_path):
    root = tmp_path / "d"
    write_dir(root, MIXED[:2], extra_wav=["only-in-wav /nowhere/x.wav", f"broken {tmp_path}/broken.wav",
                                          f"gone {tmp_path}/gone.wav"],
              extra_text=["only-in-text HELLO", "broken HELLO", "gone HELLO", "silent-text"])
    (tmp_path / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    (root / "wav.scp").write_text((root / "wav.scp").read_text() + "silent-text /nowhere/s.wav\n")
    result = run_make(root, tmp_path / "out", "--json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    by_key = {f["key"]: f for f in summary["findings"]}
    assert {k: f["check"] for k, f in by_key.items()} == {
        "only-in-text": "no_audio", "only-in-wav": "no_transcript", "silent-text": "empty_transcript",
        "broken": "unreadable_audio", "gone": "unreadable_audio"}
    assert by_key["only-in-text"]["reason"] == "in text but not in wav.scp"
    assert by_key["only-in-wav"]["reason"] == "in wav.scp but not in text"
    assert by_key["gone"]["reason"] == f"cannot read {tmp_path}/gone.wav (No such file or directory)"
    assert summary["utterances"] == 2
    _, members = shard_members(tmp_path / "out")
    assert [n for n, _ in members] == ["corpus/spk1-utt1.txt", "corpus/spk1-utt1.wav",
                                       "corpus/spk1-utt2.txt", "corpus/spk1-utt2.flac"]
    manifest = json.loads((tmp_path / "out" / "make.json").read_text())
    assert {f["key"] for f in manifest["findings"]} == set(by_key)


def test_segments_without_text_audio_or_in_range_are_findings(tmp_path):
    root = tmp_path / "d"
    write_dir(root, [("rec1", "", 1.0, "wav"), ("spare", "", 0.2, "wav")],
              segments=["a rec1 0 0.5", "b nosuchrec 0 1", "c rec1 2.0 3.0", "no-text rec1 0 0.1"])
    (root / "text").write_text("a ONE\nb TWO\nc THREE\nd FOUR\n")
    result = run_make(root, tmp_path / "out", "--json")
    assert result.exit_code == 1
    findings = {f["key"]: (f["check"], f["reason"]) for f in json.loads(result.stdout)["findings"]}
    assert findings == {
        "b": ("no_audio", "its recording 'nosuchrec' is not in wav.scp"),
        "c": ("segment_out_of_range", "segment 2-3 s lies outside recording 'rec1' (1.000 s)"),
        "d": ("no_segment", "in text but not in segments"),
        "no-text": ("no_transcript", "in segments but not in text")}
    manifest = json.loads((tmp_path / "out" / "make.json").read_text())
    assert [w["key"] for w in manifest["warnings"]] == ["spare"]


def test_pipe_entries_are_refused_unless_allowed(tmp_path):
    root = tmp_path / "d"
    sources = write_dir(root, MIXED[:1], extra_wav=[], extra_text=["piped PIPED TEXT"])
    with open(root / "wav.scp", "a") as f:
        f.write(f"piped cat {sources['corpus/spk1-utt1']} |\n")
    refused = run_make(root, tmp_path / "out")
    assert refused.exit_code == 2
    assert refused.stderr.strip() == (
        f"Error: {root}/wav.scp: line 2: key 'piped' is a command pipe (cat {sources['corpus/spk1-utt1']} |); "
        "shardkit make reads audio files only unless --allow-pipes lets it run these commands")
    assert not (tmp_path / "out").exists()
    allowed = run_make(root, tmp_path / "out", "--allow-pipes", "--codec", "none")
    assert allowed.exit_code == 0, allowed.output
    data = dict(shard_members(tmp_path / "out")[1])
    assert data["piped.wav"] == data["corpus/spk1-utt1.wav"]


def test_failing_pipe_is_an_unreadable_utterance(tmp_path):
    root = tmp_path / "d"
    write_dir(root, MIXED[:1], extra_wav=["bad exit 3 |"], extra_text=["bad TEXT"])
    result = run_make(root, tmp_path / "out", "--allow-pipes", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["findings"] == [
        {"key": "bad", "check": "unreadable_audio", "reason": "command exited 3: exit 3 ()"}]


def _full_scale_float_wav(path):
    """A float WAV of a clipped sine: flat tops at exactly +1.0 and -1.0 (full scale)."""
    t = np.arange(RATE) / RATE
    signal = np.clip(1.3 * np.sin(2 * np.pi * 440 * t), -1.0, 1.0)
    sf.write(path, signal.astype(np.float32), RATE, subtype="FLOAT")
    return signal


@pytest.mark.parametrize("extra", [[], ["--resample", "8000"], ["--resample", "22050"]])
def test_full_scale_samples_clip_instead_of_wrapping(tmp_path, extra):
    root = tmp_path / "d"
    root.mkdir()
    signal = _full_scale_float_wav(root / "loud.wav")
    (root / "wav.scp").write_text(f"loud {root}/loud.wav\n")
    (root / "text").write_text("loud LOUD\n")
    result = run_make(root, tmp_path / "out", "--audio-format", "wav", "--codec", "none", *extra)
    assert result.exit_code == 0, result.output
    data = dict(shard_members(tmp_path / "out")[1])["loud.wav"]
    pcm, rate = decode(data, "int16")
    pcm = pcm[:, 0].astype(np.int32)
    assert rate == (int(extra[1]) if extra else RATE)
    assert pcm.max() == 32767 and pcm.min() == -32768
    # a wrapped sample jumps by ~65535 between neighbours; a 440 Hz tone never moves more than ~1/3 of the range
    assert np.abs(np.diff(pcm)).max() < 40000
    if not extra:
        assert pcm[9] == 32767  # +1.0, which a plain cast turns into -32768
        reference = np.clip(np.rint(signal * 32768), -32768, 32767)
        assert np.array_equal(pcm, reference)


def test_resample_changes_rate_and_keeps_duration(tmp_path):
    write_dir(tmp_path / "d", MIXED[:2])
    result = run_make(tmp_path / "d", tmp_path / "out", "--resample", "8000", "--codec", "none")
    assert result.exit_code == 0, result.output
    data = dict(shard_members(tmp_path / "out")[1])
    assert set(data) == {"corpus/spk1-utt1.txt", "corpus/spk1-utt1.wav", "corpus/spk1-utt2.txt",
                         "corpus/spk1-utt2.wav"}
    samples, rate = decode(data["corpus/spk1-utt2.wav"], "int16")
    assert rate == 8000 and len(samples) == 4800


def test_usage_errors(tmp_path):
    write_dir(tmp_path / "d", MIXED[:1])
    both = run_make(tmp_path / "d", tmp_path / "out", "--shard-duration", "10", "--utts-per-shard", "2")
    assert both.exit_code == 2
    assert both.stderr.strip() == "Error: give --shard-duration or --utts-per-shard, not both"
    missing = CliRunner().invoke(main, ["make", "--wav-scp", str(tmp_path / "nope.scp"), "--text",
                                        str(tmp_path / "d" / "text"), "-o", str(tmp_path / "out")])
    assert missing.exit_code == 2
    assert missing.stderr.strip() == f"Error: {tmp_path}/nope.scp: no such file"
    keep = run_make(tmp_path / "d", tmp_path / "out", "--audio-format", "keep", "--resample", "8000")
    assert keep.exit_code == 2 and "cannot --resample" in keep.stderr


def test_demo_dirs_make_cleanly(tmp_path):
    from shardkit.commands.demo import write_demo

    corpora = write_demo(str(tmp_path / "kaldi"), minutes=0.3)
    assert [c["name"] for c in corpora] == ["aishell", "librispeech", "accented"]
    for c in corpora:
        out = tmp_path / "shards" / c["name"]
        result = run_make(c["dir"], out, "--codec", "bz2", "--utts-per-shard", "2", "--json")
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["utterances"] == c["utterances"]
        assert summary["audio_seconds"] == pytest.approx(c["seconds"], abs=0.01)
    assert os.path.exists(tmp_path / "kaldi" / "accented" / "segments")
