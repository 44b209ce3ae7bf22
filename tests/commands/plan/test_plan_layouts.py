"""plan --layout nemo|shar on existing datasets: what NeMo's scatter drops (by name, with its seconds) and what
Lhotse's split gives each rank, checked against the datasets' own audio and lhotse's own reader."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
import soundfile as sf
from click.testing import CliRunner

from shardkit.cli import main
import nemo_own_reader
from support import nemo_by_count


def _tar_seconds(path) -> float:
    with tarfile.open(path) as tar:
        return sum(sf.info(io.BytesIO(tar.extractfile(m).read())).duration for m in tar)


def _plan(*args):
    result = CliRunner().invoke(main, ["plan", *map(str, args), "--json", "-q"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_names_the_shards_and_seconds_nemo_scatter_drops(tmp_path):
    manifest = nemo_by_count(tmp_path, 5)
    report = _plan(manifest, "--layout", "nemo", "--world-size", "4", "--num-workers", "2", "--batch-size", "2")
    assert report["rule"] == "nemo-scatter" and not report["divides"] and report["shards"] == 5
    dropped = report["dropped"]
    assert dropped["shards"] == [str(tmp_path / "audio_4.tar")]
    assert dropped["seconds"] == pytest.approx(_tar_seconds(tmp_path / "audio_4.tar"), abs=1e-3)
    assert dropped["utterances"] == 23 // 5
    for rank in report["ranks"]:
        assert rank["seconds"] == pytest.approx(_tar_seconds(tmp_path / f"audio_{rank['rank']}.tar"), abs=1e-3)
        assert rank["steps"] == -(-4 // 2)  # one shard of 4 utterances, read by worker 0 in batches of 2
    assert report["replicate"]["dropped"]["shards"] == [] and report["replicate"]["reads_per_utterance"] == 4


@pytest.mark.timeout(600)
@pytest.mark.skipif(not nemo_own_reader.NEMO_PYTHON, reason=nemo_own_reader.NEEDS_NEMO)
def test_plan_says_what_nemo_own_tarred_dataset_reads_and_drops(tmp_path):
    manifest = nemo_by_count(tmp_path, 5)
    report = _plan(manifest, "--layout", "nemo", "--world-size", "2", "--num-workers", "2", "--batch-size", "2")
    config = tmp_path / "nemo_config.yaml"
    config.write_text(json.dumps({"train_ds": {"tarred_audio_filepaths": str(tmp_path / "audio__OP_0..4_CL_.tar"),
                                               "manifest_filepath": str(manifest), "tarred_shard_strategy": "scatter"}}))
    ranks = nemo_own_reader.read_with_nemo(config, 2, 2, 2, tmp_path)
    read = set()
    for rank, (got, planned) in enumerate(zip(ranks, report["ranks"])):
        lines = [item["line"] for batch in got["batches"] for item in batch]
        assert len(got["batches"]) == planned["steps"] and len(lines) == planned["utterances"]
        assert sum(line["duration"] for line in lines) == pytest.approx(planned["seconds"], abs=1e-3)
        read |= {line["audio_filepath"] for line in lines}
    with open(manifest, encoding="utf-8") as f:
        unread = [json.loads(line) for line in f if json.loads(line)["audio_filepath"] not in read]
    assert [str(tmp_path / f"audio_{k}.tar") for k in sorted({line["shard_id"] for line in unread})] == \
        report["dropped"]["shards"]
    assert len(unread) == report["dropped"]["utterances"]
    assert sum(line["duration"] for line in unread) == pytest.approx(report["dropped"]["seconds"], abs=1e-3)


def test_a_manifest_without_shard_ids_is_placed_by_the_tars_members(tmp_path):
    manifest = nemo_by_count(tmp_path, 5, shard_ids=False, orphan=True)
    by_members = _plan(manifest, "--layout", "nemo", "--tars", tmp_path / "audio__OP_0..4_CL_.tar", "--world-size",
                       "4", "--num-workers", "1")
    assert by_members["dropped"]["shards"] == [str(tmp_path / "audio_4.tar")]
    assert by_members["unsharded"] == {"utterances": 1, "seconds": 1.25}
    missing = CliRunner().invoke(main, ["plan", str(manifest), "--layout", "nemo", "--world-size", "4",
                                        "--num-workers", "1", "-q"])
    assert missing.exit_code == 2 and "--tars" in missing.output


def test_plan_of_a_shar_folder_is_what_lhotse_deals_each_rank(tmp_path, make_shards, monkeypatch):
    from lhotse import CutSet

    source = os.path.dirname(make_shards("none")[0])
    made = CliRunner().invoke(main, ["balance", "--corpus", f"mix={source}", "--world-size", "1", "--num-workers",
                                     "1", "--num-shards", "4", "--layout", "shar", "-o", str(tmp_path / "out"), "-q",
                                     "-j", "1"])
    assert made.exit_code == 0, made.output
    report = _plan(tmp_path / "out" / "shar", "--layout", "shar", "--world-size", "3", "--num-workers", "1")
    assert report["rule"] == "shar" and not report["divides"] and report["dropped"]["shards"] == []
    for rank in range(3):
        for name, value in dict(RANK=rank, WORLD_SIZE=3, WORKER=0, NUM_WORKERS=1).items():
            monkeypatch.setenv(name, str(value))
        cuts = list(CutSet.from_shar(in_dir=tmp_path / "out" / "shar", split_for_dataloading=True))
        assert report["ranks"][rank]["utterances"] == len(cuts)
        assert report["ranks"][rank]["seconds"] == pytest.approx(sum(c.duration for c in cuts), abs=1e-3)
    assert report["rank_spread"] > 1.5  # 4 shards over 3 ranks: rank 0 reads two


def test_plan_layout_refuses_what_it_cannot_read(tmp_path):
    result = CliRunner().invoke(main, ["plan", str(tmp_path), "--layout", "shar", "--world-size", "2",
                                       "--num-workers", "1", "-q"])
    assert result.exit_code == 2 and "cuts" in result.output
    bad = tmp_path / "m.json"
    bad.write_text('{"audio_filepath": "a.wav"}\n')
    result = CliRunner().invoke(main, ["plan", str(bad), "--layout", "nemo", "--world-size", "2", "--num-workers",
                                       "1", "-q"])
    assert result.exit_code == 1 and "line 1" in result.output and str(bad) in result.output
