"""shardkit make from WeNet raw lists, NeMo, Lhotse, Parquet and WebDataset sources.

Fixtures are written by the real libraries (lhotse writes its manifests, pyarrow the Parquet,
webdataset's TarWriter the tars), with real audio from soundfile and a bad entry of each kind.
Shards are read back the way WeNet reads them: tarfile, members grouped by the last '.'.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands.make.sources import detect_format, member_key
from shardkit.io.synth import encode, speech_like

RATE = 16000


def write_audio(path, seconds, seed, fmt="wav", channels=1):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    samples = speech_like(seconds, RATE, seed=seed, channels=channels)
    with open(path, "wb") as f:
        f.write(encode(samples, RATE, fmt))
    return samples


def make(*args):
    return CliRunner().invoke(main, ["make", "-j", "1", "-q", *map(str, args)])


def wenet_read(out) -> dict:
    """key -> {ext: bytes} for every sample of every shard in data.list, as WeNet groups them."""
    samples = {}
    with open(os.path.join(out, "data.list")) as f:
        shards = [line.strip() for line in f]
    for shard in shards:
        with tarfile.open(shard, "r:*") as tar:
            previous = None
            for member in tar:
                key, ext = member.name.rsplit(".", 1)
                assert key == previous or key not in samples, f"members of {key} are not adjacent"
                samples.setdefault(key, {})[ext] = tar.extractfile(member).read()
                previous = key
    return samples


def int16(data: bytes) -> np.ndarray:
    samples, _ = sf.read(io.BytesIO(data), dtype="int16", always_2d=True)
    return samples


def manifest(out) -> dict:
    with open(os.path.join(out, "make.json")) as f:
        return json.load(f)


def findings(out) -> dict:
    return {f["key"]: f["check"] for f in manifest(out)["findings"]}


# ------------------------------------------------------------ keys

@pytest.mark.parametrize("key,expected", [
    ("corpus/spk1-utt1", "corpus/spk1-utt1"), ("a.b.c", "a_b_c"), ("/abs/x", "abs/x"),
    ("../up/x", "__/up/x"), ("win\\path", "win/path"), ("tab\tkey", "tab_key"), ("x//y/", "x/y"),
])
def test_member_key_changes_only_what_a_tar_name_or_wenet_cannot_carry(key, expected):
    assert member_key(key) == expected


# ------------------------------------------------------------ wenet-raw

def test_wenet_raw_list_keeps_bytes_and_reports_bad_entries(tmp_path):
    audio = {}
    lines = []
    for i, (key, text, seconds, fmt) in enumerate([("spk1/utt1", "HELLO", 1.0, "wav"), ("spk1/utt2", "你好", 0.5, "flac"),
                                                   ("spk2.utt3", "DOT KEY", 0.7, "wav")]):
        path = tmp_path / "wav" / f"{i}.{fmt}"
        write_audio(str(path), seconds, i, fmt)
        audio[key] = path.read_bytes()
        lines.append({"key": key, "wav": str(path), "txt": text})
    (tmp_path / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    lines += [{"key": "gone", "wav": str(tmp_path / "gone.wav"), "txt": "X"},
              {"key": "broken", "wav": str(tmp_path / "broken.wav"), "txt": "X"},
              {"key": "notext", "wav": str(tmp_path / "wav" / "0.wav")}]
    data_list = tmp_path / "data.list"
    data_list.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines) + "{not json\n")
    assert detect_format([str(data_list)]) == "wenet-raw"
    result = make(data_list, "-o", tmp_path / "out", "--codec", "none")
    assert result.exit_code == 1, result.output
    got = wenet_read(tmp_path / "out")
    assert sorted(got) == ["spk1/utt1", "spk1/utt2", "spk2_utt3"]
    assert got["spk1/utt2"]["flac"] == audio["spk1/utt2"] and got["spk1/utt1"]["wav"] == audio["spk1/utt1"]
    assert got["spk2_utt3"]["txt"].decode() == "DOT KEY"
    assert manifest(tmp_path / "out")["key_map"] == {"spk2.utt3": "spk2_utt3"}
    assert findings(tmp_path / "out") == {"gone": "unreadable_audio", "broken": "unreadable_audio",
                                          "notext": "no_transcript", f"{data_list}:7": "bad_line"}
    reasons = {f["key"]: f["reason"] for f in manifest(tmp_path / "out")["findings"]}
    assert reasons["gone"] == f"cannot read {tmp_path}/gone.wav (No such file or directory)"


# ------------------------------------------------------------ nemo

def test_nemo_manifest_segments_are_cut_sample_exactly(tmp_path):
    long = write_audio(str(tmp_path / "audio" / "long.flac"), 3.0, 1, "flac")
    short = write_audio(str(tmp_path / "audio" / "short.wav"), 1.2, 2)
    lines = [{"audio_filepath": "audio/long.flac", "offset": 0.25, "duration": 1.0, "text": "first"},
             {"audio_filepath": "audio/long.flac", "offset": 1.5, "duration": 1.5, "text": "second"},
             {"audio_filepath": "audio/short.wav", "duration": 1.2, "text": "whole"},
             {"audio_filepath": "audio/missing.wav", "duration": 1.0, "text": "gone"},
             {"audio_filepath": "audio/short.wav", "offset": 0.5, "duration": 2.0, "text": "too long"},
             {"audio_filepath": "audio/short.wav", "offset": 2.5, "duration": 0.5, "text": "past the end"},
             {"audio_filepath": "audio/long.flac", "offset": 0.0, "duration": 0.5}]
    nemo = tmp_path / "manifests" / "train_manifest.json"
    nemo.parent.mkdir()
    nemo.write_text("".join(json.dumps(x) + "\n" for x in lines))
    # relative paths resolve against the manifest's folder, not the working directory
    for line in lines:
        line["audio_filepath"] = "../" + line["audio_filepath"]
    nemo.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = make(nemo, "-o", tmp_path / "out", "--codec", "none")
    assert result.exit_code == 1, result.output
    got = wenet_read(tmp_path / "out")
    assert sorted(got) == ["long-1500", "long-250", "short"]  # stem, plus the offset in ms for a segment
    assert np.array_equal(int16(got["long-250"]["wav"])[:, 0], long[4000:20000])
    assert np.array_equal(int16(got["long-1500"]["wav"])[:, 0], long[24000:48000])
    assert np.array_equal(int16(got["short"]["wav"])[:, 0], short)
    assert got["long-1500"]["txt"].decode() == "second"
    assert findings(tmp_path / "out") == {"missing": "unreadable_audio", "short-500": "short_audio",
                                          "short-2500": "segment_out_of_range", "long-0": "no_transcript"}
    reasons = {f["key"]: f["reason"] for f in manifest(tmp_path / "out")["findings"]}
    assert reasons["short-500"] == "audio holds 0.700 s from 0.5 s, shorter than the stated 2 s"
    assert manifest(tmp_path / "out")["summary"]["audio_seconds"] == pytest.approx(3.7)


def test_nemo_whole_files_keep_their_bytes_and_key_field(tmp_path):
    lines = []
    for i in range(3):
        write_audio(str(tmp_path / f"u{i}.flac"), 0.5 + i * 0.25, i, "flac")
        lines.append({"audio_filepath": f"u{i}.flac", "duration": 0.5 + i * 0.25, "text": f"t{i}", "utt": f"id.{i}"})
    (tmp_path / "m.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = make("--from", "nemo", tmp_path / "m.json", "-o", tmp_path / "out", "--codec", "none",
                  "--key-field", "utt")
    assert result.exit_code == 0, result.output
    got = wenet_read(tmp_path / "out")
    assert sorted(got) == ["id_0", "id_1", "id_2"]
    assert got["id_1"]["flac"] == (tmp_path / "u1.flac").read_bytes()
    assert manifest(tmp_path / "out")["key_map"] == {"id.0": "id_0", "id.1": "id_1", "id.2": "id_2"}


# ------------------------------------------------------------ lhotse

def _lhotse_fixture(tmp_path):
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    mono = write_audio(str(tmp_path / "rec" / "mono.wav"), 2.0, 1)
    stereo = write_audio(str(tmp_path / "rec" / "stereo.flac"), 1.5, 2, "flac", channels=2)
    write_audio(str(tmp_path / "rec" / "cut-short.wav"), 1.0, 3)
    recordings = [Recording.from_file(str(tmp_path / "rec" / "mono.wav"), recording_id="mono"),
                  Recording.from_file(str(tmp_path / "rec" / "stereo.flac"), recording_id="stereo"),
                  Recording.from_file(str(tmp_path / "rec" / "cut-short.wav"), recording_id="cutshort")]
    # the file is shortened after the manifest was written: the recording states 1.0 s, holds 0.5 s
    write_audio(str(tmp_path / "rec" / "cut-short.wav"), 0.5, 3)
    gone = Recording.from_file(str(tmp_path / "rec" / "mono.wav"), recording_id="gone")
    gone.sources[0].source = str(tmp_path / "rec" / "gone.wav")
    recordings.append(gone)
    sups = [SupervisionSegment("mono-a", "mono", 0.1, 0.8, channel=0, text="MONO A"),
            SupervisionSegment("mono-b", "mono", 1.0, 1.0, channel=0, text="MONO B"),
            SupervisionSegment("stereo-right", "stereo", 0.5, 0.5, channel=1, text="RIGHT"),
            SupervisionSegment("short-sup", "cutshort", 0.0, 1.0, channel=0, text="SHORT"),
            SupervisionSegment("gone-sup", "gone", 0.0, 1.0, channel=0, text="GONE"),
            SupervisionSegment("no-text", "mono", 0.0, 0.5, channel=0)]
    return RecordingSet.from_recordings(recordings), SupervisionSet.from_segments(sups), mono, stereo


def _check_lhotse_output(out, mono, stereo):
    got = wenet_read(out)
    assert sorted(got) == ["mono-a", "mono-b", "stereo-right"]
    assert np.array_equal(int16(got["mono-a"]["wav"])[:, 0], mono[1600:14400])
    assert np.array_equal(int16(got["mono-b"]["wav"])[:, 0], mono[16000:32000])
    right = int16(got["stereo-right"]["wav"])
    assert right.shape[1] == 1 and np.array_equal(right[:, 0], stereo[8000:16000, 1])
    assert got["mono-b"]["txt"].decode() == "MONO B"
    assert findings(out) == {"short-sup": "short_audio", "gone-sup": "unreadable_audio", "no-text": "no_transcript"}


def test_lhotse_recordings_with_supervisions(tmp_path):
    pytest.importorskip("lhotse")
    recordings, supervisions, mono, stereo = _lhotse_fixture(tmp_path)
    recordings.to_file(str(tmp_path / "recordings.jsonl.gz"))
    supervisions.to_file(str(tmp_path / "supervisions.jsonl.gz"))
    result = make(tmp_path / "supervisions.jsonl.gz", tmp_path / "recordings.jsonl.gz", "-o", tmp_path / "out",
                  "--codec", "none")
    assert result.exit_code == 1, result.output
    _check_lhotse_output(tmp_path / "out", mono, stereo)


def test_lhotse_cutset_trimmed_to_supervisions(tmp_path):
    pytest.importorskip("lhotse")
    from lhotse import CutSet

    recordings, supervisions, mono, stereo = _lhotse_fixture(tmp_path)
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    # cuts that start inside their recording: the utterance starts at cut.start + supervision.start
    cuts.trim_to_supervisions(keep_overlapping=False).to_file(str(tmp_path / "cuts.jsonl.gz"))
    assert detect_format([str(tmp_path / "cuts.jsonl.gz")]) == "lhotse"
    result = make("--from", "lhotse", tmp_path / "cuts.jsonl.gz", "-o", tmp_path / "out", "--codec", "none")
    assert result.exit_code == 1, result.output
    _check_lhotse_output(tmp_path / "out", mono, stereo)

    left = make("--from", "lhotse", tmp_path / "cuts.jsonl.gz", "-o", tmp_path / "left", "--codec", "none",
                "--channel", "0", "--audio-format", "flac")
    got = wenet_read(tmp_path / "left")
    assert np.array_equal(int16(got["stereo-right"]["flac"])[:, 0], stereo[8000:16000, 0])
    assert left.exit_code == 1


# ------------------------------------------------------------ parquet

def _parquet_fixture(tmp_path, name="train.parquet"):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i in range(5):
        fmt = "flac" if i % 2 else "wav"
        rows.append({"id": f"utt{i}", "text": f"text {i}", "audio": {
            "bytes": encode(speech_like(0.4 + 0.1 * i, RATE, seed=i), RATE, fmt), "path": f"utt{i}.{fmt}"}})
    rows[3]["id"] = "spk.3"
    rows.append({"id": "garbage", "text": "x", "audio": {"bytes": b"not audio at all", "path": "g.wav"}})
    rows.append({"id": "notext", "text": None, "audio": rows[0]["audio"]})
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, str(tmp_path / name), row_group_size=2)
    return rows


def test_parquet_rows_stream_by_row_group_and_keep_bytes(tmp_path):
    pytest.importorskip("pyarrow")
    rows = _parquet_fixture(tmp_path)
    assert detect_format([str(tmp_path / "train.parquet")]) == "parquet"
    result = make(tmp_path / "train.parquet", "-o", tmp_path / "out", "--codec", "none", "--utts-per-shard", "2")
    assert result.exit_code == 1, result.output
    got = wenet_read(tmp_path / "out")
    assert sorted(got) == ["spk_3", "utt0", "utt1", "utt2", "utt4"]
    for row in rows[:5]:
        key = member_key(row["id"])
        ext = row["audio"]["path"].rsplit(".", 1)[1]
        assert got[key][ext] == row["audio"]["bytes"] and got[key]["txt"].decode() == row["text"]
    assert findings(tmp_path / "out") == {"garbage": "unreadable_audio", "notext": "no_transcript"}
    assert manifest(tmp_path / "out")["key_map"] == {"spk.3": "spk_3"}
    assert len(manifest(tmp_path / "out")["shards"]) == 3


# ------------------------------------------------------------ wds

def _wds_fixture(tmp_path):
    import webdataset as wds

    made = {}
    os.makedirs(tmp_path / "wds", exist_ok=True)
    for shard in range(2):
        with wds.TarWriter(str(tmp_path / "wds" / f"train-{shard:06d}.tar")) as sink:
            for i in range(3):
                key = f"s{shard}u{i}"
                fmt = "flac" if i == 1 else "wav"
                audio = encode(speech_like(0.5 + 0.2 * i, RATE, seed=10 * shard + i), RATE, fmt)
                sample = {"__key__": key, fmt: audio}
                if i == 2:
                    sample["txt"] = f"plain {key}"
                else:
                    sample["json"] = {"text": f"json {key}", "speaker": "x"}
                sink.write(sample)
                made[key] = (fmt, audio, sample.get("txt") or f"json {key}")
            if shard == 1:
                sink.write({"__key__": "notext", "wav": made["s0u0"][1]})
                sink.write({"__key__": "badaudio", "wav": b"RIFF junk", "txt": "x"})
    return made


def test_wds_tars_with_json_or_txt_transcripts(tmp_path):
    pytest.importorskip("webdataset")
    made = _wds_fixture(tmp_path)
    assert detect_format([str(tmp_path / "wds")]) == "wds"
    result = make(tmp_path / "wds", "-o", tmp_path / "out", "--codec", "none", "--json")
    assert result.exit_code == 1, result.output
    got = wenet_read(tmp_path / "out")
    assert sorted(got) == sorted(made)
    for key, (fmt, audio, text) in made.items():
        assert got[key][fmt] == audio and got[key]["txt"].decode() == text
    assert findings(tmp_path / "out") == {"notext": "no_transcript", "badaudio": "unreadable_audio"}


def test_wds_compressed_tar_and_hostile_member(tmp_path):
    pytest.importorskip("webdataset")
    made = _wds_fixture(tmp_path)
    import gzip

    # a tar with a symlink member, and a gzip-compressed copy of a good tar
    src = tmp_path / "wds" / "train-000000.tar"
    (tmp_path / "wds" / "train-000000.tar.gz").write_bytes(gzip.compress(src.read_bytes()))
    src.unlink()
    with tarfile.open(tmp_path / "wds" / "train-000001.tar", "a") as tar:
        link = tarfile.TarInfo("evil.wav")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    result = make("--from", "wds", tmp_path / "wds", "-o", tmp_path / "out", "--audio-format", "wav", "--codec", "none",
                  "--utts-per-shard", "2")
    assert result.exit_code == 1, result.output
    got = wenet_read(tmp_path / "out")
    assert sorted(got) == sorted(made)
    for key, (fmt, audio, text) in made.items():
        assert np.array_equal(int16(got[key]["wav"]), int16(audio))
    assert findings(tmp_path / "out") == {"notext": "no_transcript", "badaudio": "unreadable_audio",
                                          "evil.wav": "unsafe_member"}


def test_wds_mp3_kept_as_is(tmp_path):
    pytest.importorskip("webdataset")
    import webdataset as wds

    buf = io.BytesIO()
    sf.write(buf, speech_like(1.0, RATE, seed=4).astype(np.float32) / 32768, RATE, format="MP3")
    mp3 = buf.getvalue()
    with wds.TarWriter(str(tmp_path / "mp3.tar")) as sink:
        sink.write({"__key__": "song", "mp3": mp3, "json": {"text": "la la"}})
    result = make(tmp_path / "mp3.tar", "-o", tmp_path / "keep", "--codec", "none")
    assert result.exit_code == 0, result.output
    assert wenet_read(tmp_path / "keep")["song"]["mp3"] == mp3
    result = make(tmp_path / "mp3.tar", "-o", tmp_path / "wav", "--codec", "none", "--audio-format", "wav")
    assert result.exit_code == 0, result.output
    decoded = int16(wenet_read(tmp_path / "wav")["song"]["wav"])
    assert abs(len(decoded) - RATE) < 0.1 * RATE


# ------------------------------------------------------------ balance, resume, kaldi folder

def test_durations_balanced_like_kaldi_make(tmp_path):
    lines = []
    for i, seconds in enumerate([0.5, 2.0, 0.5, 0.5, 2.0, 0.5] * 2):
        write_audio(str(tmp_path / f"u{i:02d}.wav"), seconds, i)
        lines.append({"audio_filepath": f"u{i:02d}.wav", "duration": seconds, "text": "WORD"})
    (tmp_path / "m.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = make(tmp_path / "m.json", "-o", tmp_path / "out", "--shard-duration", "3")
    assert result.exit_code == 0, result.output
    shards = manifest(tmp_path / "out")["shards"]
    assert [s["seconds"] for s in shards] == [3.0, 3.0, 3.0, 3.0]
    assert [s["keys"] for s in shards][:2] == [["u00", "u01", "u02"], ["u03", "u04", "u05"]]


@pytest.mark.parametrize("source", ["wds", "parquet"])
def test_resumed_run_is_byte_identical(tmp_path, source):
    pytest.importorskip("webdataset" if source == "wds" else "pyarrow")
    if source == "wds":
        _wds_fixture(tmp_path)
        src = tmp_path / "wds"
    else:
        _parquet_fixture(tmp_path)
        src = tmp_path / "train.parquet"
    first = make(src, "-o", tmp_path / "a", "--utts-per-shard", "2")
    assert first.exit_code == 1
    again = make(src, "-o", tmp_path / "b", "--utts-per-shard", "2", "-j", "2")
    names = sorted(p.name for p in (tmp_path / "a").glob("*.tar"))
    assert len(names) >= 2 and again.exit_code == 1
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)
    (tmp_path / "a" / names[1]).unlink()
    rerun = CliRunner().invoke(main, ["make", str(src), "-o", str(tmp_path / "a"), "--utts-per-shard", "2",
                                      "-j", "1", "--json"])
    assert rerun.exit_code == 1
    assert json.loads(rerun.stdout)["shard_status"] == {"ok": 1, "skipped": len(names) - 1, "failed": 0, "empty": 0}
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)


def test_kaldi_folder_as_source_and_dotted_keys(tmp_path):
    root = tmp_path / "data"
    write_audio(str(root / "a.wav"), 0.5, 1)
    write_audio(str(root / "b.wav"), 0.5, 2)
    (root / "wav.scp").write_text(f"utt.1 {root}/a.wav\nutt_1 {root}/b.wav\nutt.2 {root}/b.wav\n")
    (root / "text").write_text("utt.1 ONE\nutt_1 CLASH\nutt.2 TWO\n")
    result = make(root, "-o", tmp_path / "out", "--codec", "none")
    assert result.exit_code == 1, result.output
    assert sorted(wenet_read(tmp_path / "out")) == ["utt_1", "utt_2"]
    assert manifest(tmp_path / "out")["key_map"] == {"utt.2": "utt_2"}
    assert findings(tmp_path / "out") == {"utt.1": "duplicate_key"}


def test_usage_errors(tmp_path):
    (tmp_path / "x.json").write_text('{"something": 1}\n')
    result = make(tmp_path / "x.json", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert "cannot tell the format of this file" in result.stderr
    assert make("-o", tmp_path / "out").exit_code == 2
    both = make(tmp_path / "x.json", "--wav-scp", "w", "--text", "t", "-o", tmp_path / "out")
    assert both.exit_code == 2 and "without SOURCE" in both.stderr


def test_wds_m4a_probed_and_decoded_through_ffmpeg(tmp_path):
    pytest.importorskip("webdataset")
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchcodec")
    import webdataset as wds
    from torchcodec.encoders import AudioEncoder

    signal = torch.from_numpy(speech_like(1.5, RATE, seed=3).astype(np.float32) / 32768)[None]
    m4a = bytes(AudioEncoder(signal, sample_rate=RATE).to_tensor(format="ipod").numpy())
    with wds.TarWriter(str(tmp_path / "m4a.tar")) as sink:
        sink.write({"__key__": "aac", "m4a": m4a, "txt": "advanced audio"})
    keep = make(tmp_path / "m4a.tar", "-o", tmp_path / "keep", "--codec", "none")
    assert keep.exit_code == 0, keep.output
    assert wenet_read(tmp_path / "keep")["aac"]["m4a"] == m4a
    assert manifest(tmp_path / "keep")["summary"]["audio_seconds"] == pytest.approx(1.5, abs=0.1)
    wav = make(tmp_path / "m4a.tar", "-o", tmp_path / "wav", "--codec", "none", "--audio-format", "wav")
    assert wav.exit_code == 0, wav.output
    assert abs(len(int16(wenet_read(tmp_path / "wav")["aac"]["wav"])) - 1.5 * RATE) < 0.1 * RATE


def test_channel_choice_applies_to_every_source(tmp_path):
    stereo = write_audio(str(tmp_path / "st.wav"), 0.5, 9, channels=2)
    write_audio(str(tmp_path / "mono.wav"), 0.5, 8)
    (tmp_path / "m.json").write_text(json.dumps({"audio_filepath": "st.wav", "duration": 0.5, "text": "two"}) + "\n"
                                     + json.dumps({"audio_filepath": "mono.wav", "duration": 0.5, "text": "one"}) + "\n")
    result = make(tmp_path / "m.json", "-o", tmp_path / "out", "--codec", "none", "--channel", "1")
    assert result.exit_code == 1, result.output
    got = wenet_read(tmp_path / "out")
    assert list(got) == ["st"] and np.array_equal(int16(got["st"]["wav"])[:, 0], stereo[:, 1])
    assert findings(tmp_path / "out") == {"mono": "no_such_channel"}


def test_keys_that_map_onto_one_another_keep_the_first(tmp_path):
    write_audio(str(tmp_path / "a.wav"), 0.3, 1)
    lines = [{"key": "x.1", "wav": str(tmp_path / "a.wav"), "txt": "first"},
             {"key": "x_1", "wav": str(tmp_path / "a.wav"), "txt": "second"},
             {"key": "x.1", "wav": str(tmp_path / "a.wav"), "txt": "third"}]
    (tmp_path / "data.list").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = make("--from", "wenet-raw", tmp_path / "data.list", "-o", tmp_path / "out", "--codec", "none", "--json")
    assert result.exit_code == 1
    got = wenet_read(tmp_path / "out")
    assert list(got) == ["x_1"] and got["x_1"]["txt"] == b"first"
    assert [(f["key"], f["check"], f["reason"]) for f in json.loads(result.stdout)["findings"]] == [
        ("x_1", "duplicate_key", "key 'x_1' already names entry 1 ('x.1')"),
        ("x.1", "duplicate_key", "key 'x_1' already names entry 1 ('x.1')")]


def test_parquet_folder_with_other_column_names(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "hf").mkdir()
    audio = encode(speech_like(0.5, RATE, seed=1), RATE, "flac")
    for part in range(2):
        pq.write_table(pa.Table.from_pylist([{"clip": {"bytes": audio, "path": f"c{part}.flac"},
                                              "sentence": f"part {part}", "uid": f"p{part}"}]),
                       str(tmp_path / "hf" / f"train-{part:05d}.parquet"))
    result = make("--from", "parquet", tmp_path / "hf", "-o", tmp_path / "out", "--codec", "none",
                  "--audio-field", "clip", "--text-field", "sentence", "--key-field", "uid")
    assert result.exit_code == 0, result.output
    got = wenet_read(tmp_path / "out")
    assert {k: v["txt"].decode() for k, v in got.items()} == {"p0": "part 0", "p1": "part 1"}
    assert got["p1"]["flac"] == audio
    wrong = make("--from", "parquet", tmp_path / "hf", "-o", tmp_path / "x", "--audio-field", "clip",
                 "--text-field", "transcript")
    assert wrong.exit_code == 2
    assert "has no 'transcript' column (columns: clip, sentence, uid)" in wrong.stderr


def test_resample_turns_keep_into_wav(tmp_path):
    pytest.importorskip("webdataset")
    made = _wds_fixture(tmp_path)
    result = make(tmp_path / "wds" / "train-000000.tar", "-o", tmp_path / "out", "--codec", "none",
                  "--resample", "8000")
    assert result.exit_code == 0, result.output
    got = wenet_read(tmp_path / "out")
    assert sorted(got) == ["s0u0", "s0u1", "s0u2"]
    for key in got:
        samples, rate = sf.read(io.BytesIO(got[key]["wav"]), dtype="int16")
        assert rate == 8000 and len(samples) == len(int16(made[key][1])) // 2
    refused = make(tmp_path / "wds", "-o", tmp_path / "x", "--audio-format", "keep", "--resample", "8000")
    assert refused.exit_code == 2 and "cannot --resample" in refused.stderr


def test_glob_patterns_expand_like_every_other_command(tmp_path):
    pytest.importorskip("webdataset")
    made = _wds_fixture(tmp_path)
    result = make(str(tmp_path / "wds" / "train-*.tar"), "-o", tmp_path / "out", "--codec", "none")
    assert result.exit_code == 1, result.output  # the planted bad entries, nothing else
    assert sorted(wenet_read(tmp_path / "out")) == sorted(made)
    assert findings(tmp_path / "out") == {"notext": "no_transcript", "badaudio": "unreadable_audio"}
    nothing = make("--from", "wds", str(tmp_path / "wds" / "none-*.tar"), "-o", tmp_path / "out2")
    assert nothing.exit_code == 2
    assert "glob pattern matches no file" in nothing.output
