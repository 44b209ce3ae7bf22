import json
import os
import tarfile

import pytest
from click.testing import CliRunner
from support import SMALL_CORPORA, corpus

from shardkit.cli import main
from shardkit.commands.index import build_index, index_shard, iter_index
from shardkit.commands.plan import shard_sizes
from shardkit.io.indexmarks import stamp_file
from shardkit.io.tar import iter_shard_members
from shardkit.run.options import RunOptions


def _expected():
    return {key: (text, audio, seconds) for key, text, audio, seconds in corpus(SMALL_CORPORA)}


@pytest.mark.parametrize("codec", ["none", "zst", "bz2"])
def test_index_records_every_utterance_from_headers(make_shards, tmp_path, codec):
    shards = make_shards(codec)
    result = CliRunner().invoke(main, ["index", *shards, "-o", str(tmp_path / "i.jsonl"), "--corpus", "mix", "-j", "1",
                                       "-q"])
    assert result.exit_code == 0, result.output
    records = list(iter_index(str(tmp_path / "i.jsonl")))
    expected = _expected()
    assert [r["key"] for r in records] == list(expected)
    for r in records:
        text, audio, seconds = expected[r["key"]]
        assert r["corpus"] == "mix" and r["shard"] in shards
        assert (r["audio"], r["format"], r["sample_rate"], r["channels"]) == (r["key"] + ".wav", "wav", 16000, 1)
        assert r["frames"] == round(seconds * 16000) and r["duration"] == pytest.approx(seconds, abs=1e-4)
        assert r["text_chars"] == len(text)
        assert [m[0] for m in r["members"]] == [r["key"] + ".txt", r["key"] + ".wav"]
        assert r["bytes"] == len(text.encode()) + len(audio)


def test_offsets_point_at_member_data_in_the_decompressed_tar(make_shards):
    plain = make_shards("none")
    compressed = make_shards("xz")
    for p, c in zip(plain, compressed):
        plain_records, compressed_records = index_shard(p), index_shard(c)
        assert [r["members"] for r in plain_records] == [r["members"] for r in compressed_records]
        with tarfile.open(p) as tar, open(p, "rb") as raw:
            blob = raw.read()
            for r in plain_records:
                for name, offset, size in r["members"]:
                    assert blob[offset:offset + size] == tar.extractfile(name).read()


def test_flac_members_are_probed_without_decoding(make_shards):
    records = index_shard(make_shards("none", audio_format="flac")[0], "x")
    assert {r["format"] for r in records} == {"flac"}
    assert all(r["frames"] > 0 and r["audio"].endswith(".flac") for r in records)


def test_default_corpus_is_the_shard_folder(make_shards):
    shard = make_shards("none", name="aishell-src")[0]
    assert {r["corpus"] for r in index_shard(shard)} == {os.path.basename(os.path.dirname(shard))}


def test_a_damaged_shard_fails_the_index_and_writes_nothing(make_shards, tmp_path):
    shards = make_shards("zst")
    blob = open(shards[1], "rb").read()
    with open(shards[1], "wb") as f:
        f.write(blob[: len(blob) // 2])
    out = tmp_path / "i.jsonl"
    result = CliRunner().invoke(main, ["index", *shards, "-o", str(out), "-j", "1", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["index"] is None and [f["shard"] for f in report["failures"]] == [shards[1]]
    error = report["failures"][0]["error"]
    assert error.startswith(f"{shards[1]}: ") and "truncated" in error
    assert not out.exists() and os.listdir(tmp_path) == []


def test_an_utterance_without_audio_is_named(tmp_path):
    from shardkit.io.tar import TarWriter

    path = tmp_path / "bad.tar"
    with open(path, "wb") as f:
        w = TarWriter(f)
        w.add("spk/u1.txt", b"hello")
        w.close()
    report = build_index([str(path)], str(tmp_path / "i.jsonl"))
    assert report.failures == [{"shard": str(path), "error": f"{path}: utterance 'spk/u1' has no audio member "
                                                             f"(members: spk/u1.txt)"}]


def test_parallel_index_equals_serial(make_shards, tmp_path):
    shards = make_shards("none")
    build_index(shards, str(tmp_path / "a.jsonl"), "c", RunOptions(jobs=1))
    build_index(shards, str(tmp_path / "b.jsonl"), "c", RunOptions(jobs=2))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_shard_sizes_from_index_match_reading(make_shards, tmp_path):
    shards = make_shards("none")
    build_index(shards, str(tmp_path / "i.jsonl"), "c")
    read = shard_sizes(shards)
    indexed = shard_sizes(shards, index_files=[str(tmp_path / "i.jsonl")])
    assert read[0].tolist() == indexed[0].tolist() == [5, 5, 4]
    assert read[1].tolist() == pytest.approx(indexed[1].tolist())
    assert sum(len(list(iter_shard_members(s))) for s in shards) == 2 * 14


def test_plan_reads_sizes_from_an_index_or_the_shards_alike(make_shards, tmp_path):
    shards = make_shards("zst")
    build_index(shards, str(tmp_path / "i.jsonl"), "c")
    runner = CliRunner()
    base = ["plan", *shards, "--world-size", "2", "--num-workers", "1", "--json", "-q", "-j", "1"]
    read = runner.invoke(main, base)
    indexed = runner.invoke(main, [*base, "--index", str(tmp_path / "i.jsonl")])
    assert read.exit_code == indexed.exit_code == 0
    from_index = json.loads(indexed.stdout)
    # the index adds the stamps of the shards it checked (taken when they were indexed)
    assert from_index.pop("source_stamps") == {s: stamp_file(s) for s in shards}
    assert json.loads(read.stdout) == from_index
    other = make_shards("none", name="other")[0]
    missing = runner.invoke(main, [*base, other, "--index", str(tmp_path / "i.jsonl")])
    assert missing.exit_code == 2
    assert missing.output.splitlines()[-1] == \
        f"Error: 1 listed shards are in no index given with --index (first: {other})"
