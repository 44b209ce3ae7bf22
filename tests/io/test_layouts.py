"""shardkit.io.layouts: a layout shard's files appear whole or not at all, and what a layout cannot carry is refused
with the shard and member named (balance's end-to-end tests read the outputs with the trainers' readers)."""

from __future__ import annotations

import gzip
import json
import os
import tarfile

import pytest

from shardkit.errors import ShardkitError
from shardkit.io.layouts import nemo, open_layout_shard, shard_paths
from shardkit.io.synth import encode, speech_like


def _record(key: str, frames: int = 8000) -> dict:
    return {"key": key, "audio": f"{key}.wav", "frames": frames, "sample_rate": 16000, "channels": 1}


def _wav(frames: int = 8000) -> bytes:
    return encode(speech_like(frames / 16000, 16000, seed=1), 16000, "wav")


def test_a_shar_shard_is_a_recording_tar_and_its_cuts_with_exact_durations(tmp_path):
    dst = shard_paths("shar", str(tmp_path), 1)[0]
    audio = _wav(8001)
    with open_layout_shard("shar", dst) as shard:
        shard.add("spk/u1", _record("spk/u1", 8001), [("spk/u1.txt", "hello\n".encode()), ("spk/u1.wav", audio),
                                                      ("spk/u1.lang", b"en")])
        entry = shard.commit(None)
    assert sorted(os.listdir(tmp_path / "shar")) == ["cuts.000000.jsonl.gz", "recording.000000.tar"]
    with tarfile.open(dst) as tar:
        assert tar.getnames() == ["spk/u1.wav", "spk/u1.json"] and tar.extractfile("spk/u1.wav").read() == audio
        recording = json.loads(tar.extractfile("spk/u1.json").read())
    assert recording["num_samples"] == 8001 and recording["duration"] == 8001 / 16000
    with gzip.open(tmp_path / "shar" / "cuts.000000.jsonl.gz", "rt") as f:
        (cut,) = [json.loads(line) for line in f]
    assert cut["supervisions"][0]["text"] == "hello" and cut["custom"] == {"lang": "en"}
    assert entry["members"] == 2 and entry["size"] == os.path.getsize(dst)


@pytest.mark.parametrize("layout", ["shar", "nemo"])
def test_what_a_layout_cannot_carry_is_refused_and_leaves_no_file(tmp_path, layout):
    dst = shard_paths(layout, str(tmp_path), 1)[0]
    with pytest.raises(ShardkitError) as err:
        with open_layout_shard(layout, dst) as shard:
            shard.add("u1", _record("u1"), [("u1.wav", _wav())])  # no transcript
    assert "u1.txt" in str(err.value) and dst in str(err.value)
    with pytest.raises(ShardkitError) as err:
        with open_layout_shard(layout, dst) as shard:
            shard.add("u1", _record("u1"), [("u1.txt", b"hi"), ("u1.wav", _wav()), ("u1.npy", b"\x93NUMPY\xff")])
    assert "u1.npy" in str(err.value) and "UTF-8" in str(err.value)
    left = [name for _, _, files in os.walk(tmp_path) for name in files]
    assert left == []  # no shard, no companion, no temporary file


def test_a_killed_runs_temporary_files_are_removed_before_a_shard_is_written(tmp_path):
    dst = shard_paths("shar", str(tmp_path), 1)[0]
    os.makedirs(tmp_path / "shar")
    stale = tmp_path / "shar" / ".cuts.000000.jsonl.gz.0123456789ab.partial"
    stale.write_bytes(b"half")
    with open_layout_shard("shar", dst) as shard:
        shard.add("u1", _record("u1"), [("u1.txt", b"hi"), ("u1.wav", _wav())])
        shard.commit(None)
    assert not stale.exists()  # lhotse would take it for a field of the folder


def test_nemo_members_are_flat_and_a_file_id_twice_is_refused(tmp_path):
    paths = shard_paths("nemo", str(tmp_path), 2)
    for dst, key in zip(paths, ["spk/u1", "spk.u1"]):  # flattened (WebDataset cuts at a dot), both are spk_u1
        with open_layout_shard("nemo", dst) as shard:
            shard.add(key, _record(key), [(f"{key}.txt", b"hi"), (f"{key}.wav", _wav())])
            shard.commit(None)
    for path in paths:
        with tarfile.open(path) as tar:
            assert tar.getnames() == ["spk_u1.wav"]
    with pytest.raises(ShardkitError) as err:
        nemo.finish(str(tmp_path), paths)
    assert "spk_u1" in str(err.value) and paths[1] in str(err.value)
    assert not (tmp_path / nemo.MANIFEST).exists()
