"""make from a Lhotse Shar folder or a NeMo tarred dataset: WeNet -> Shar or NeMo (balance --layout) -> WeNet
(make) loses nothing: every utterance comes back with its key, its transcript and its audio bytes; a folder
written by lhotse itself comes back sample-exactly; what cannot be read is reported with where it is."""

from __future__ import annotations

import gzip
import json
import os

from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands import balance
from shardkit.io.tar import group_samples, iter_shard_members
from support import corpus


def _shar(make_shards, out) -> str:
    source = os.path.dirname(make_shards("zst", audio_format="flac")[0])
    made = CliRunner().invoke(main, ["balance", "--corpus", f"mix={source}", "--world-size", "1", "--num-workers", "1",
                                     "--num-shards", "2", "--layout", "shar", "-o", str(out), "-q", "-j", "1"])
    assert made.exit_code == 0, made.output
    return str(out / "shar")


def _make(*args, audio_format="keep"):
    result = CliRunner().invoke(main, ["make", *map(str, args), "--audio-format", audio_format, "-q", "-j", "1",
                                       "--json"])
    return result, json.loads(result.stdout)


def test_wenet_to_shar_and_back_keeps_every_key_text_and_audio_byte(make_shards, tmp_path):
    shar = _shar(make_shards, tmp_path / "balanced")
    result, report = _make(shar, "-o", tmp_path / "back")  # the folder is recognised as Shar
    assert result.exit_code == 0, result.output
    truth = {key: (text, audio) for key, text, audio, _ in corpus(audio_format="flac")}
    originals = {new: old for old, new in balance.read_repeats(str(tmp_path / "balanced"))}
    back = {}
    for shard in open(tmp_path / "back" / "data.list").read().split():
        for sample in group_samples(iter_shard_members(shard), shard=shard):
            back[sample["__key__"]] = (sample["txt"].decode(), sample["flac"])
    assert {originals.get(k, k) for k in back} == set(truth)
    for key, (text, audio) in back.items():
        assert (text, audio) == truth[originals.get(key, key)]
    assert report["skipped_utterances"] == 0


def test_a_cut_without_its_audio_in_place_is_reported_with_the_shard(make_shards, tmp_path):
    shar = _shar(make_shards, tmp_path / "balanced")
    cuts = os.path.join(shar, "cuts.000001.jsonl.gz")
    with gzip.open(cuts, "rt") as f:
        lines = f.readlines()
    with gzip.open(cuts, "wt") as f:  # the second cut now names audio the tar does not hold in its place
        f.writelines([lines[0], lines[1].replace('"id": "', '"id": "moved-', 1)] + lines[2:])
    result, report = _make("--from", "shar", shar, "-o", tmp_path / "back")
    assert result.exit_code == 1
    assert report["skipped_utterances"] >= 1
    text = json.dumps(report)
    assert "recording.000001.tar" in text and "moved-" in text


def test_a_shar_folder_written_by_lhotse_itself_becomes_its_supervisions(tmp_path):
    """lhotse's own SharWriter (re-encoded WAV, a cut with two supervisions): one utterance per supervision,
    cut out sample-exactly."""
    import io

    import numpy as np
    import soundfile as sf
    from lhotse import CutSet, Recording, SupervisionSegment
    from lhotse.cut import MonoCut

    cuts = []
    for i, (key, text, audio, _) in enumerate(corpus()[:5]):
        path = tmp_path / f"rec{i}.wav"
        path.write_bytes(audio)
        rec = Recording.from_file(str(path), recording_id=f"rec{i}")
        sups = [SupervisionSegment(id=f"rec{i}-all", recording_id=rec.id, start=0.0, duration=rec.duration, text=text)]
        if i == 0:  # two halves instead of the whole
            half = rec.num_samples // 2 / rec.sampling_rate
            sups = [SupervisionSegment(id="rec0-a", recording_id=rec.id, start=0.0, duration=half, text="first"),
                    SupervisionSegment(id="rec0-b", recording_id=rec.id, start=half, duration=rec.duration - half,
                                       text="second")]
        cuts.append(MonoCut(id=f"cut{i}", start=0.0, duration=rec.duration, channel=0, recording=rec,
                            supervisions=sups))
    (tmp_path / "shar").mkdir()
    CutSet.from_cuts(cuts).to_shar(tmp_path / "shar", fields={"recording": "wav"}, shard_size=2)
    result, report = _make(tmp_path / "shar", "-o", tmp_path / "back", audio_format="wav")  # segments: cut out
    assert result.exit_code == 0, result.output
    back = {}
    for shard in open(tmp_path / "back" / "data.list").read().split():
        for sample in group_samples(iter_shard_members(shard), shard=shard):
            audio_ext = next(e for e in sample if e in ("wav", "flac"))
            back[sample["__key__"]] = (sample["txt"].decode(), sf.read(io.BytesIO(sample[audio_ext]), dtype="int16")[0])
    assert sorted(back) == ["rec0-a", "rec0-b", "rec1-all", "rec2-all", "rec3-all", "rec4-all"]
    whole = sf.read(io.BytesIO(corpus()[0][2]), dtype="int16")[0]
    half = len(whole) // 2
    assert back["rec0-a"][0] == "first" and np.array_equal(back["rec0-a"][1], whole[:half])
    assert back["rec0-b"][0] == "second" and np.array_equal(back["rec0-b"][1], whole[half:])
    for i, (key, text, audio, _) in enumerate(corpus()[1:5], 1):
        assert back[f"rec{i}-all"][0] == text
        assert np.array_equal(back[f"rec{i}-all"][1], sf.read(io.BytesIO(audio), dtype="int16")[0])


# --- NeMo tarred datasets ---------------------------------------------------------------------------


def test_wenet_to_nemo_and_back_keeps_every_key_text_and_audio_byte(make_shards, tmp_path):
    source = os.path.dirname(make_shards("bz2")[0])
    made = CliRunner().invoke(main, ["balance", "--corpus", f"mix={source}", "--world-size", "2", "--num-workers", "1",
                                     "--num-shards", "2", "--layout", "nemo", "-o", str(tmp_path / "nemo"), "-q",
                                     "-j", "1"])
    assert made.exit_code == 0, made.output
    result, report = _make(tmp_path / "nemo" / "tarred_audio_manifest.json", "-o", tmp_path / "back")  # recognised
    assert result.exit_code == 0, result.output
    truth = {key: (text, audio) for key, text, audio, _ in corpus()}
    originals = {new: old for old, new in balance.read_repeats(str(tmp_path / "nemo"))}
    back = {}
    for shard in open(tmp_path / "back" / "data.list").read().split():
        for sample in group_samples(iter_shard_members(shard), shard=shard):
            back[sample["__key__"]] = (sample["txt"].decode(), sample["wav"])
    assert {originals.get(k, k) for k in back} == set(truth)  # the keys with '/' again, from the lines' key field
    for key, value in back.items():
        assert value == truth[originals.get(key, key)]


def test_a_nemo_dataset_made_by_count_reports_the_line_no_tar_holds(tmp_path):
    from support import NEMO_SPEC, nemo_by_count
    from shardkit.io.synth import corpus_utterances

    manifest = nemo_by_count(tmp_path, 5, orphan=True)
    result, report = _make("--from", "nemo-tarred", manifest, "-o", tmp_path / "back")
    assert result.exit_code == 1  # a skipped line makes it 1
    assert report["utterances"] == 5 * (23 // 5) and report["skipped_utterances"] == 1
    assert report["skipped_by_check"] == {"no_audio": 1}
    (finding,) = json.load(open(tmp_path / "back" / "make.json"))["findings"]
    assert finding["key"] == "gone" and "no tar holds member 'gone'" in finding["reason"]
    kept = {key.replace("/", "_") for key, *_ in list(corpus_utterances(NEMO_SPEC, seed=7))[:20]}
    back = set()
    for shard in open(tmp_path / "back" / "data.list").read().split():
        back |= {s["__key__"] for s in group_samples(iter_shard_members(shard), shard=shard)}
    assert back == kept  # the 3 utterances NeMo's converter discarded are in no tar: not in the manifest either
