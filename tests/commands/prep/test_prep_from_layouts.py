"""prep takes a NeMo tarred dataset (its manifest) and a Lhotse Shar folder as corpus sources: every tar is a
source, every line or supervision is checked by validate's own checks of these inputs and written as KEY.txt +
KEY.EXT, in WeNet's, NeMo's or Shar's layout. Every utterance comes out once with its text and audio bytes; a
bad line or member is a rejects line naming the shard, the key and the reason; a killed run resumes."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile

import pytest

from support import corpus, run_cli
from shardkit.io.synth import CorpusSpec, write_shards
from shardkit.io.tar import group_samples, iter_shard_members

MANIFEST = "tarred_audio_manifest.json"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """A NeMo tarred dataset (WAV) and a Shar folder (FLAC), both written by prep --layout, and the truth: what
    they hold (``--remainder drop``: no pad copy ``KEY-repN``, a name a pad copy of the next prep would take)."""
    root = tmp_path_factory.mktemp("prep-from-layouts")
    source = {}
    for name, spec, fmt, layout in (("a", CorpusSpec("a", 24, 0.4, 1.6, "en"), "wav", "nemo"),
                                    ("b", CorpusSpec("b", 18, 0.4, 1.6, "zh"), "flac", "shar")):
        utts = list(corpus((spec,), seed=5, audio_format=fmt))
        write_shards(utts, str(root / "src" / name), utts_per_shard=5, codec="zst", audio_format=fmt)
        result = run_cli("prep", "--corpus", f"{name}={root / 'src' / name}", "--world-size", 2, "--num-workers", 2,
                         "--layout", layout, "--remainder", "drop", "-o", root / layout, "-q", "-j", 1)
        assert result.exit_code == 0, result.output
        source.update({key: (text, audio) for key, text, audio, _ in utts})
    assert len(os.listdir(root / "shar" / "shar")) == 8  # 4 shards: tars to read, more than one per corpus
    truth = _read_nemo(root / "nemo") | _read_shar(root / "shar")
    assert all(value == source[key] for key, value in truth.items())
    return {"nemo": root / "nemo" / MANIFEST, "shar": root / "shar" / "shar", "truth": truth, "source": source,
            "raw_b": root / "src" / "b"}


def _args(nemo, shar, out, layout="wenet", *extra) -> list:
    return ["prep", "--corpus", f"x={nemo}", "--corpus", f"y={shar}", "--world-size", 2, "--num-workers", 1,
            "--layout", layout, "-o", out, "-q", "--json", *extra]


def _originals(out) -> dict[str, str]:
    return {new: old for old, new in json.load(open(out / "prep.json"))["repeats"]}


def _read_wenet(out) -> dict:
    back = {}
    for shard in (out / "data.list").read_text().split():
        for sample in group_samples(iter_shard_members(shard), shard=shard):
            key = sample["__key__"]
            audio = next(e for e in ("wav", "flac") if e in sample)
            assert sample["__members__"] == [f"{key}.txt", f"{key}.{audio}"]
            assert key not in back
            back[key] = (sample["txt"].decode("utf-8"), sample[audio])
    return back


def _read_nemo(out) -> dict:
    members = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("audio_") and name.endswith(".tar"):
            members.update(iter_shard_members(str(out / name)))
    back = {}
    for line in open(out / MANIFEST, encoding="utf-8"):
        entry = json.loads(line)
        key = entry.get("key", os.path.splitext(entry["audio_filepath"])[0])
        assert key not in back
        back[key] = (entry["text"], members.pop(entry["audio_filepath"]))
    assert not members  # every member has its line
    return back


def _read_shar(out) -> dict:
    back = {}
    folder = out / "shar"
    for name in sorted(os.listdir(folder)):
        if name.startswith("cuts."):
            tar = dict(iter_shard_members(str(folder / name.replace("cuts.", "recording.").replace(".jsonl.gz",
                                                                                                  ".tar"))))
            for line in gzip.open(folder / name, "rt", encoding="utf-8"):
                cut = json.loads(line)
                (sup,) = cut["supervisions"]
                audio = next(v for k, v in tar.items() if k.startswith(cut["id"] + ".") and not k.endswith(".json"))
                assert sup["id"] not in back
                back[sup["id"]] = (sup["text"], audio)
    return back


READERS = {"wenet": _read_wenet, "nemo": _read_nemo, "shar": _read_shar}


@pytest.mark.parametrize("layout,jobs", [("wenet", 1), ("nemo", 2), ("shar", 1)])
def test_every_utterance_once_with_its_text_and_audio_bytes(datasets, tmp_path, layout, jobs):
    out = tmp_path / "out"
    result = run_cli(*_args(datasets["nemo"], datasets["shar"], out, layout, "-j", jobs))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    truth = datasets["truth"]
    assert report["findings"] == 0 and report["accepted"] == report["utterances_read"] == len(truth)
    assert report["balanced"] and report["divides"]
    back, originals = READERS[layout](out), _originals(out)
    assert {originals.get(k, k) for k in back} == set(truth)
    for key, value in back.items():  # a pad copy holds the bytes and text of the utterance it repeats
        assert value == truth[originals.get(key, key)], key
    # the sources are every tar of both datasets, in order
    sources = [s["shard"] for s in json.load(open(out / "prep.json"))["sources"]]
    nemo_tars = sorted(str(p) for p in datasets["nemo"].parent.glob("audio_*.tar"))
    shar_tars = sorted(str(p) for p in datasets["shar"].glob("recording.*.tar"))
    assert sources == sorted(nemo_tars, key=lambda p: int(p.rsplit("_", 1)[1][:-4])) + shar_tars


def test_raw_shards_and_a_manifest_in_one_corpus(datasets, tmp_path):
    """One corpus of zst WeNet shards and a NeMo tarred dataset: both read, in argument order, all written."""
    out = tmp_path / "out"
    result = run_cli("prep", "--corpus", f"x={datasets['raw_b']},{datasets['nemo']}", "--world-size", 2,
                     "--num-workers", 1, "-o", out, "-q", "--json", "-j", 2)
    assert result.exit_code == 0, result.output
    truth = {k: v for k, v in datasets["source"].items() if k.startswith("b/")} | \
        {k: v for k, v in datasets["truth"].items() if k.startswith("a/")}
    back, originals = _read_wenet(out), _originals(out)
    assert {originals.get(k, k) for k in back} == set(truth)
    assert all(value == truth[originals.get(key, key)] for key, value in back.items())
    sources = [s["shard"] for s in json.load(open(out / "prep.json"))["sources"]]
    raw = len(list(datasets["raw_b"].glob("*.tar.zst")))
    tars = len(list(datasets["nemo"].parent.glob("audio_*.tar")))
    assert [os.path.dirname(p) for p in sources] == [str(datasets["raw_b"])] * raw + [str(datasets["nemo"].parent)] * tars


def test_a_rerun_skips_and_a_changed_manifest_or_cuts_file_redoes_the_run(datasets, tmp_path):
    src, shar = tmp_path / "nemo", tmp_path / "shar"
    shutil.copytree(datasets["nemo"].parent, src)
    shutil.copytree(datasets["shar"], shar)
    out = tmp_path / "out"
    args = _args(src / MANIFEST, shar, out)
    assert json.loads(run_cli(*args).stdout)["this_run"] == "done"
    assert json.loads(run_cli(*args).stdout)["this_run"] == "skipped"
    lines = (src / MANIFEST).read_text().splitlines()
    first = json.loads(lines[0])
    first["text"] = "a changed transcript"
    (src / MANIFEST).write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    redo = run_cli(*args)
    assert json.loads(redo.stdout)["this_run"] == "done"
    key = first.get("key", os.path.splitext(first["audio_filepath"])[0])
    assert _read_wenet(out)[key][0] == "a changed transcript"
    assert json.loads(run_cli(*args).stdout)["this_run"] == "skipped"
    no_text = _damage_shar(shar)  # the cuts file alone changes (its recording tar is as it was)
    again = json.loads(run_cli(*args).stdout)
    assert again["this_run"] == "done" and again["by_check"] == {"missing_txt": 1} and no_text not in _read_wenet(out)


def _damage_nemo(folder) -> dict:
    """A line whose declared duration is wrong, a line no tar holds, a member no line names: what each should say."""
    lines = [json.loads(line) for line in open(folder / MANIFEST, encoding="utf-8")]
    lines[1]["duration"] += 0.5
    del lines[2]["text"]
    lines.append({"audio_filepath": "gone.wav", "duration": 1.0, "text": "x", "shard_id": 0})
    (folder / MANIFEST).write_text("".join(json.dumps(line) + "\n" for line in lines))
    tar_path = folder / "audio_1.tar"
    with tarfile.open(tar_path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    stray = tarfile.TarInfo("stray.wav")
    stray.size = len(members[0][1])
    with tarfile.open(tar_path, "w") as tar:
        for info, data in members + [(stray, members[0][1])]:
            tar.addfile(info, __import__("io").BytesIO(data))
    return {"duration": lines[1].get("key", os.path.splitext(lines[1]["audio_filepath"])[0]),
            "no_text": lines[2].get("key", os.path.splitext(lines[2]["audio_filepath"])[0])}


def _damage_shar(folder) -> str:
    """The first cut's supervision loses its text."""
    path = folder / "cuts.000000.jsonl.gz"
    cuts = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    del cuts[0]["supervisions"][0]["text"]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(cut) + "\n" for cut in cuts)
    return cuts[0]["supervisions"][0]["id"]


def test_a_bad_line_or_member_is_rejected_naming_shard_key_and_reason(datasets, tmp_path):
    nemo, shar = tmp_path / "nemo", tmp_path / "shar"
    shutil.copytree(datasets["nemo"].parent, nemo)
    shutil.copytree(datasets["shar"], shar)
    keys = _damage_nemo(nemo)
    no_text = _damage_shar(shar)
    out = tmp_path / "out"
    result = run_cli(*_args(nemo / MANIFEST, shar, out))
    assert result.exit_code == 1, result.output
    rejects = [json.loads(line) for line in open(out / "rejects.jsonl", encoding="utf-8")]
    by_key = {r["key"]: r for r in rejects}
    assert set(by_key) == {keys["duration"], keys["no_text"], "gone", "stray", no_text}
    assert by_key[keys["no_text"]]["checks"] == ["no_transcript"] and "/" in keys["no_text"]  # the line's own key
    assert by_key["gone"]["shard"] == str(nemo / MANIFEST) and by_key["gone"]["checks"] == ["no_audio"]
    assert "no tar holds member 'gone'" in by_key["gone"]["reasons"][0]
    assert by_key["stray"]["shard"] == str(nemo / "audio_1.tar") and by_key["stray"]["member"] == "stray.wav"
    assert by_key["stray"]["checks"] == ["no_line"]
    assert by_key[keys["duration"]]["checks"] == ["declared_duration"]
    assert "declares" in by_key[keys["duration"]]["reasons"][0]
    assert by_key[no_text]["shard"] == str(shar / "recording.000000.tar") and by_key[no_text]["checks"] == ["missing_txt"]
    # everything else is written, once, unchanged
    back, originals = _read_wenet(out), _originals(out)
    truth = datasets["truth"]
    assert {originals.get(k, k) for k in back} == set(truth) - {keys["duration"], keys["no_text"], no_text}
    assert all(value == truth[originals.get(key, key)] for key, value in back.items())
    report = json.loads(result.stdout)
    assert report["findings"] == 5 and report["by_check"] == {"declared_duration": 1, "missing_txt": 1,
                                                              "no_audio": 1, "no_line": 1, "no_transcript": 1}


def test_a_segment_is_rejected_prep_writes_whole_members(datasets, tmp_path):
    """A NeMo line with an offset, and a Shar cut with two supervisions (each a part of the recording)."""
    nemo, shar = tmp_path / "nemo", tmp_path / "shar"
    shutil.copytree(datasets["nemo"].parent, nemo)
    shutil.copytree(datasets["shar"], shar)
    lines = [json.loads(line) for line in open(nemo / MANIFEST, encoding="utf-8")]
    lines[0].update(offset=0.1, duration=0.2)
    (nemo / MANIFEST).write_text("".join(json.dumps(line) + "\n" for line in lines))
    cuts_path = shar / "cuts.000001.jsonl.gz"
    cuts = [json.loads(line) for line in gzip.open(cuts_path, "rt", encoding="utf-8")]
    (sup,) = cuts[0]["supervisions"]
    half = sup["duration"] / 2
    cuts[0]["supervisions"] = [{**sup, "id": "part-1", "duration": half},
                               {**sup, "id": "part-2", "start": half, "duration": half}]
    with gzip.open(cuts_path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(cut) + "\n" for cut in cuts)
    result = run_cli(*_args(nemo / MANIFEST, shar, tmp_path / "out"))
    assert result.exit_code == 1, result.output
    rejects = {r["key"]: r for r in map(json.loads, open(tmp_path / "out" / "rejects.jsonl", encoding="utf-8"))}
    first = lines[0].get("key", os.path.splitext(lines[0]["audio_filepath"])[0])
    assert set(rejects) == {first, "part-1", "part-2"}
    assert all(r["checks"] == ["segment"] and "make --from" in r["reasons"][0] for r in rejects.values())
    assert rejects["part-2"]["shard"] == str(shar / "recording.000001.tar")


_KILL_AFTER_RESUME_POINT = """
import os, signal, sys
import shardkit.commands.prep.resume as resume
import shardkit.commands.prep.write as write
from shardkit.cli import main

resume.POOL_FACTOR = 0  # resume points as often as --checkpoint-mb allows, so that this small corpus has several
saved, added = [], [0]
save, add = resume.save, write.OutputShards.add

def counting_save(out_dir, state):
    save(out_dir, state)
    saved.append(state["next_source"])

def add_then_die(self, *args):
    add(self, *args)
    if saved:
        added[0] += 1
        if added[0] == 7:  # killed mid-writing: members past the resume point, some still queued
            os.kill(os.getpid(), signal.SIGKILL)

resume.save, write.OutputShards.add = counting_save, add_then_die
main(sys.argv[1:])
"""


def test_kill_9_after_a_resume_point_then_rerun_continues_and_reports_the_same(tmp_path):
    """A NeMo source of 12 tars (one line no tar holds): the rerun continues from the resume point and reports
    the unread line once, and no line read before the kill as unread."""
    utts = list(corpus((CorpusSpec("long", 60, 2.0, 4.0, "en"),)))
    write_shards(utts, str(tmp_path / "src"), utts_per_shard=6, codec="none")
    made = run_cli("prep", "--corpus", f"long={tmp_path / 'src'}", "--world-size", 2, "--num-workers", 1,
                   "--num-shards", 12, "--layout", "nemo", "-o", tmp_path / "nemo", "-q", "-j", 1)
    assert made.exit_code == 0, made.output
    manifest = tmp_path / "nemo" / MANIFEST
    with open(manifest, "a", encoding="utf-8") as f:
        f.write(json.dumps({"audio_filepath": "gone.wav", "duration": 1.0, "text": "x", "shard_id": 3}) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}

    def args(out):
        return [str(a) for a in ["prep", "--corpus", f"long={manifest}", "--world-size", 2, "--num-workers", 2,
                                 "-o", out, "-j", 1, "--pool-mb", 1, "-q"]]

    reference, out = tmp_path / "reference", tmp_path / "out"
    assert subprocess.run([sys.executable, "-m", "shardkit", *args(reference)], env=env).returncode == 1
    killed = subprocess.run([sys.executable, "-c", _KILL_AFTER_RESUME_POINT, *args(out), "--checkpoint-mb", "1"],
                            env=env)
    assert killed.returncode == -signal.SIGKILL
    from shardkit.commands.prep import resume

    state = resume._PlainUnpickler(open(out / resume.RESUME, "rb")).load()
    assert state["lines_read"][str(manifest)]  # the lines of the tars read before the kill
    rerun = subprocess.run([sys.executable, "-m", "shardkit", *args(out), "--json"], env=env, capture_output=True,
                           text=True)
    assert rerun.returncode == 1, rerun.stderr
    assert json.loads(rerun.stdout)["resumed_at_source"] == state["next_source"] > 0
    for name in ["rejects.jsonl"] + [f"shards_{k:09d}.tar" for k in range(4)]:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    (gone,) = [json.loads(line) for line in open(out / "rejects.jsonl", encoding="utf-8")]
    assert gone["key"] == "gone" and gone["shard"] == str(manifest)
    assert not any(".partial" in name for name in os.listdir(out)) and not (out / resume.RESUME).exists()


def test_a_manifest_without_shard_id_is_a_usage_error_saying_why(datasets, tmp_path):
    """prep finds a tarred dataset's tars by shard_id; a manifest without it is not read as a list of shards."""
    nemo = tmp_path / "nemo"
    shutil.copytree(datasets["nemo"].parent, nemo)
    lines = [json.loads(line) for line in open(nemo / MANIFEST, encoding="utf-8")]
    (nemo / MANIFEST).write_text("".join(json.dumps({k: v for k, v in line.items() if k != "shard_id"}) + "\n"
                                         for line in lines))
    result = run_cli(*_args(nemo / MANIFEST, datasets["shar"], tmp_path / "out"))
    assert result.exit_code == 2
    assert "no shard_id on its first line" in result.output and str(nemo / MANIFEST) in result.output
    assert "make --from nemo" in result.output and not (tmp_path / "out").exists()


def test_a_missing_tar_is_one_rejects_line_and_its_lines_are_named_under_the_manifest(datasets, tmp_path):
    nemo = tmp_path / "nemo"
    shutil.copytree(datasets["nemo"].parent, nemo)
    lost = {os.path.splitext(name)[0] for name, _ in iter_shard_members(str(nemo / "audio_1.tar"))}
    os.unlink(nemo / "audio_1.tar")
    result = run_cli(*_args(nemo / MANIFEST, datasets["shar"], tmp_path / "out"))
    assert result.exit_code == 1, result.output
    rejects = [json.loads(line) for line in open(tmp_path / "out" / "rejects.jsonl", encoding="utf-8")]
    (missing,) = [r for r in rejects if r["shard"] == str(nemo / "audio_1.tar")]
    assert missing["checks"] == ["missing_file"] and "nothing of this shard is in the output" in missing["reasons"][0]
    unread = [r for r in rejects if r["shard"] == str(nemo / MANIFEST)]
    assert len(unread) == len(lost) == len(rejects) - 1 and all(r["checks"] == ["no_audio"] for r in unread)
    assert {r["key"].replace("/", "_") for r in unread} == lost
