"""index on a NeMo tarred dataset (its manifest) or a Lhotse Shar folder: one record per utterance with its text
inline and its audio member alone in ``members`` (offset and size where the bytes really are); JSON lines and
Parquet hold the same records; a line no tar holds, a member no line names and a segment are failures naming
where, and then no index is written."""

from __future__ import annotations

import gzip
import json
import os
import tarfile

from click.testing import CliRunner

from shardkit.cli import main
from shardkit.io.indexfile import iter_index
from support import nemo_by_count


def _index(*args):
    result = CliRunner().invoke(main, ["index", *map(str, args), "-q", "--json"])
    return result, json.loads(result.stdout)


def _nemo(tmp_path, **kw):
    (tmp_path / "nemo").mkdir()
    return nemo_by_count(tmp_path / "nemo", 5, **kw)


def test_a_nemo_manifest_is_indexed_with_its_text_inline(tmp_path):
    manifest = _nemo(tmp_path)
    result, report = _index(manifest, "-o", tmp_path / "i.jsonl")
    assert result.exit_code == 0, result.output
    records = list(iter_index(str(tmp_path / "i.jsonl")))
    lines = [json.loads(line) for line in open(manifest, encoding="utf-8")]
    assert report["utterances"] == len(records) == len(lines) == 20 and report["shards"] == 5
    for record, line in zip(records, lines):
        assert record["key"] == os.path.splitext(line["audio_filepath"])[0] and record["text"] == line["text"]
        assert record["shard"] == str(tmp_path / "nemo" / f"audio_{line['shard_id']}.tar")
        assert record["corpus"] == "nemo" and record["text_chars"] == len(line["text"])
        ((name, offset, size),) = record["members"]
        assert name == record["audio"] == line["audio_filepath"]
        with open(record["shard"], "rb") as f:  # the offset is where the member's bytes lie
            f.seek(offset)
            data = f.read(size)
        with tarfile.open(record["shard"]) as tar:
            assert data == tar.extractfile(name).read()
        assert abs(record["duration"] - line["duration"]) < 1e-6


def test_parquet_holds_the_same_records_and_an_old_index_still_reads(tmp_path, make_shards):
    manifest = _nemo(tmp_path)
    assert _index(manifest, "-o", tmp_path / "i.jsonl")[0].exit_code == 0
    assert _index(manifest, "-o", tmp_path / "i.parquet")[0].exit_code == 0
    assert list(iter_index(str(tmp_path / "i.jsonl"))) == list(iter_index(str(tmp_path / "i.parquet")))
    shards = make_shards("none")
    assert _index(*shards, "-o", tmp_path / "w.parquet")[0].exit_code == 0
    assert all("text" not in record for record in iter_index(str(tmp_path / "w.parquet")))  # null: no text


def test_a_line_no_tar_holds_fails_the_index_naming_it(tmp_path):
    manifest = _nemo(tmp_path, orphan=True)
    result, report = _index(manifest, "-o", tmp_path / "i.jsonl")
    assert result.exit_code == 1 and report["index"] is None
    assert not os.path.exists(tmp_path / "i.jsonl")
    (failure,) = report["failures"]
    assert failure["shard"] == str(manifest) and "member 'gone': no tar holds member 'gone'" in failure["error"]


def test_a_member_no_line_names_fails_the_index_naming_it(tmp_path):
    manifest = _nemo(tmp_path)
    lines = open(manifest, encoding="utf-8").readlines()
    dropped = json.loads(lines[5])
    with open(manifest, "w", encoding="utf-8") as f:
        f.writelines(lines[:5] + lines[6:])
    result, report = _index(manifest, "-o", tmp_path / "i.jsonl")
    assert result.exit_code == 1
    (failure,) = report["failures"]
    tar = str(tmp_path / "nemo" / f"audio_{dropped['shard_id']}.tar")
    assert failure["shard"] == tar
    assert failure["error"] == f"{tar}: member {dropped['audio_filepath']!r}: no manifest line names this member " \
                               "(NeMo never reads it)"


def test_a_segment_line_is_a_failure_not_a_silent_whole(tmp_path):
    manifest = _nemo(tmp_path)
    lines = [json.loads(line) for line in open(manifest, encoding="utf-8")]
    lines[0].update(offset=0.25, duration=0.5)
    with open(manifest, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    result, report = _index(manifest, "-o", tmp_path / "i.jsonl")
    assert result.exit_code == 1
    (failure,) = report["failures"]
    assert "is a segment of its member" in failure["error"] and lines[0]["audio_filepath"] in failure["error"]


def test_a_shar_folder_is_indexed_with_its_supervision_text(make_shards, tmp_path):
    source = os.path.dirname(make_shards("none", audio_format="flac")[0])
    made = CliRunner().invoke(main, ["balance", "--corpus", f"mix={source}", "--world-size", "1", "--num-workers",
                                     "1", "--num-shards", "2", "--layout", "shar", "-o", str(tmp_path / "b"), "-q"])
    assert made.exit_code == 0, made.output
    shar = tmp_path / "b" / "shar"
    result, report = _index(shar, "-o", tmp_path / "i.parquet")
    assert result.exit_code == 0, result.output
    records = list(iter_index(str(tmp_path / "i.parquet")))
    cuts = [json.loads(line) for name in sorted(os.listdir(shar)) if name.startswith("cuts.")
            for line in gzip.open(shar / name, "rt", encoding="utf-8")]
    assert [(r["key"], r["text"], r["frames"]) for r in records] == \
        [(c["id"], c["supervisions"][0]["text"], c["recording"]["num_samples"]) for c in cuts]
    assert all(r["format"] == "flac" and r["audio"] == r["key"] + ".flac" for r in records)


def test_shards_and_a_layout_in_one_index_are_refused(tmp_path, make_shards):
    manifest = _nemo(tmp_path)
    result = CliRunner().invoke(main, ["index", str(manifest), make_shards("none")[0], "-o", str(tmp_path / "i.jsonl")])
    assert result.exit_code == 2 and "not both in one index" in result.output


def test_a_key_no_tar_member_can_carry_is_refused(tmp_path):
    manifest = _nemo(tmp_path)
    lines = [json.loads(line) for line in open(manifest, encoding="utf-8")]
    lines[3]["key"] = "../../etc/passwd"
    with open(manifest, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    result, report = _index(manifest, "-o", tmp_path / "i.jsonl")
    assert result.exit_code == 1 and not os.path.exists(tmp_path / "i.jsonl")
    (failure,) = report["failures"]
    assert "key '../../etc/passwd' is not a relative name" in failure["error"]
    assert lines[3]["audio_filepath"] in failure["error"]


def test_a_lhotse_cut_with_two_supervisions_is_named_as_segments(tmp_path):
    """lhotse's own SharWriter: a cut split into two supervisions cannot be copied whole; index says where."""
    from lhotse import CutSet, Recording, SupervisionSegment
    from lhotse.cut import MonoCut

    from support import corpus

    cuts = []
    for i, (key, text, audio, _) in enumerate(corpus()[:3]):
        path = tmp_path / f"rec{i}.wav"
        path.write_bytes(audio)
        rec = Recording.from_file(str(path), recording_id=f"rec{i}")
        sups = [SupervisionSegment(id=f"rec{i}-all", recording_id=rec.id, start=0.0, duration=rec.duration,
                                   text=text)]
        if i == 1:
            half = rec.num_samples // 2 / rec.sampling_rate
            sups = [SupervisionSegment(id="rec1-a", recording_id=rec.id, start=0.0, duration=half, text="first"),
                    SupervisionSegment(id="rec1-b", recording_id=rec.id, start=half, duration=rec.duration - half,
                                       text="second")]
        cuts.append(MonoCut(id=f"cut{i}", start=0.0, duration=rec.duration, channel=0, recording=rec,
                            supervisions=sups))
    (tmp_path / "shar").mkdir()
    CutSet.from_cuts(cuts).to_shar(tmp_path / "shar", fields={"recording": "wav"}, shard_size=10)
    result, report = _index(tmp_path / "shar", "-o", tmp_path / "i.jsonl")
    assert result.exit_code == 1
    (failure,) = report["failures"]
    assert failure["shard"] == str(tmp_path / "shar" / "recording.000000.tar")
    assert "'rec1-a' is a segment" in failure["error"] and "'rec1-b' is a segment" in failure["error"]
