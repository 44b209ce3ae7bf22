"""validate on a NeMo tarred dataset (its manifest) or a Lhotse Shar folder: every audio member decoded from its
bytes, every line or supervision with its member and a text, the declared duration against the decoded audio;
findings name the tar (or manifest), key, member and reason, as validate's do for shards."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile

from click.testing import CliRunner

from shardkit.cli import main
from support import nemo_by_count


def _validate(*args):
    result = CliRunner().invoke(main, ["validate", *map(str, args), "-q", "--json"])
    return result, json.loads(result.stdout)


def _nemo(tmp_path, **kw):
    (tmp_path / "nemo").mkdir()
    return nemo_by_count(tmp_path / "nemo", 4, **kw)


def _rewrite(manifest, change):
    lines = [json.loads(line) for line in open(manifest, encoding="utf-8")]
    change(lines)
    with open(manifest, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return lines


def test_a_clean_nemo_dataset_has_no_finding(tmp_path):
    manifest = _nemo(tmp_path)
    result, report = _validate(manifest)
    assert result.exit_code == 0, result.output
    totals = report["totals"]
    assert totals["shards"] == 4 and totals["utterances"] == 20 and totals["findings"] == 0
    lines = [json.loads(line) for line in open(manifest, encoding="utf-8")]
    assert abs(totals["audio_seconds"] - sum(line["duration"] for line in lines)) < 1e-3


def test_a_wrong_duration_in_the_manifest_is_a_finding_with_shard_and_key(tmp_path):
    manifest = _nemo(tmp_path)
    lines = _rewrite(manifest, lambda lines: lines[6].update(duration=lines[6]["duration"] + 0.5))
    result, report = _validate(manifest)
    assert result.exit_code == 1
    (found,) = report["findings"]
    key = os.path.splitext(lines[6]["audio_filepath"])[0]
    assert found["check"] == "declared_duration" and found["key"] == key
    assert found["shard"] == str(tmp_path / "nemo" / f"audio_{lines[6]['shard_id']}.tar")
    assert found["member"] == lines[6]["audio_filepath"] and "the audio decodes to" in found["message"]


def test_a_line_no_tar_holds_and_an_empty_text_are_findings(tmp_path):
    manifest = _nemo(tmp_path, orphan=True)
    _rewrite(manifest, lambda lines: lines[0].update(text="   "))
    result, report = _validate(manifest)
    assert result.exit_code == 1
    checks = sorted((f["check"], f["shard"].rsplit("/", 1)[-1]) for f in report["findings"])
    assert checks == [("empty_text", "audio_0.tar"), ("no_audio", "tarred_audio_manifest.json")]


def test_audio_that_does_not_decode_is_named_by_its_member(tmp_path):
    manifest = _nemo(tmp_path)
    tar_path = tmp_path / "nemo" / "audio_2.tar"
    with tarfile.open(tar_path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    broken = members[1][0].name
    with tarfile.open(tar_path, "w") as tar:  # a valid tar whose second member is cut mid-data
        for member, data in members:
            data = data[:len(data) // 2] if member.name == broken else data
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    result, report = _validate(manifest)
    assert result.exit_code == 1
    assert {(f["shard"], f["member"]) for f in report["findings"]} == {(str(tar_path), broken)}
    assert {f["check"] for f in report["findings"]} <= {"truncated", "decode", "audio_header", "declared_duration"}


def test_a_shar_folder_validates_and_a_cut_declaring_the_wrong_duration_is_found(make_shards, tmp_path):
    source = os.path.dirname(make_shards("none", audio_format="flac")[0])
    made = CliRunner().invoke(main, ["balance", "--corpus", f"mix={source}", "--world-size", "1", "--num-workers",
                                     "1", "--num-shards", "2", "--layout", "shar", "-o", str(tmp_path / "b"), "-q"])
    assert made.exit_code == 0, made.output
    shar = tmp_path / "b" / "shar"
    result, report = _validate(shar)
    assert result.exit_code == 0, result.output
    assert report["totals"]["utterances"] == 14 and report["totals"]["mix"]["audio_format"] == {"flac": 14}
    cuts_path = shar / "cuts.000001.jsonl.gz"
    cuts = [json.loads(line) for line in gzip.open(cuts_path, "rt", encoding="utf-8")]
    cuts[2]["duration"] = round(cuts[2]["duration"] * 2, 3)
    with gzip.open(cuts_path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(cut) + "\n" for cut in cuts)
    result, report = _validate(shar)
    assert result.exit_code == 1
    (found,) = report["findings"]
    assert (found["check"], found["key"], found["shard"]) == ("declared_duration", cuts[2]["id"],
                                                              str(shar / "recording.000001.tar"))


def test_shards_and_a_dataset_together_or_with_quarantine_are_refused(tmp_path, make_shards):
    manifest = _nemo(tmp_path)
    mixed = CliRunner().invoke(main, ["validate", str(manifest), make_shards("none")[0]])
    assert mixed.exit_code == 2 and "not both in one run" in mixed.output
    quarantined = CliRunner().invoke(main, ["validate", str(manifest), "--quarantine", str(tmp_path / "q")])
    assert quarantined.exit_code == 2 and "--quarantine" in quarantined.output
