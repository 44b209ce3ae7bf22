"""io.layouts.sources: a NeMo tarred dataset and a Shar folder read as shards of utterances (plain dicts with
the member's offset, size and bytes, and the source line), and every thing that cannot be one reported as a
located SourceFinding: nothing skipped silently."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from shardkit.io.layouts.sources import NemoTarred, SharFolder, SourceFinding, open_dataset
from support import nemo_by_count


@pytest.fixture
def nemo(tmp_path):
    (tmp_path / "nemo").mkdir()
    return str(nemo_by_count(tmp_path / "nemo", 4))


def test_each_line_is_an_utterance_with_its_member_bytes_and_offset(nemo):
    dataset = open_dataset(nemo)
    assert isinstance(dataset, NemoTarred) and len(dataset.shards) == 4
    lines = [json.loads(line) for line in open(nemo, encoding="utf-8")]
    items = list(dataset)
    assert len(items) == len(lines) and not [i for i in items if isinstance(i, SourceFinding)]
    for item, line in zip(items, lines):
        assert item["fields"] == line and item["text"] == line["text"] and item["member"] == line["audio_filepath"]
        assert item["shard"].endswith(f"audio_{line['shard_id']}.tar") and not item["compressed"]
        with tarfile.open(item["shard"]) as tar:
            assert item["data"] == tar.extractfile(item["member"]).read()
        with open(item["shard"], "rb") as f:
            f.seek(item["offset"])
            assert f.read(item["size"]) == item["data"]


def test_a_truncated_tar_reports_where_and_that_the_rest_is_lost(nemo):
    tar = os.path.join(os.path.dirname(nemo), "audio_1.tar")
    data = open(tar, "rb").read()
    with open(tar, "wb") as f:
        f.write(data[:len(data) // 2])
    items = list(NemoTarred(nemo))
    findings = [i for i in items if isinstance(i, SourceFinding)]
    assert findings and findings[0].shard == tar and "lost" in findings[0].reason
    # the lines of the members after the break are reported too, not dropped
    read = {i["key"] for i in items if isinstance(i, dict)}
    unread = {f.member for f in findings if f.check == "no_audio"}
    assert len(read) + len(unread) == 20 and not read & unread


def test_a_line_that_is_not_json_is_a_finding_with_its_line(nemo):
    with open(nemo, "a", encoding="utf-8") as f:
        f.write("{not json\n")
    dataset = NemoTarred(nemo)
    (finding,) = dataset.findings
    assert finding.check == "bad_line" and finding.member == f"{os.path.abspath(nemo)}:21"


def test_a_shar_folder_pairs_cuts_and_members_and_reports_a_stray_member(make_shards, tmp_path):
    from click.testing import CliRunner

    from shardkit.cli import main

    source = os.path.dirname(make_shards("none")[0])
    assert CliRunner().invoke(main, ["balance", "--corpus", f"m={source}", "--world-size", "1", "--num-workers", "1",
                                     "--num-shards", "1", "--layout", "shar", "-o", str(tmp_path / "b"),
                                     "-q"]).exit_code == 0
    folder = tmp_path / "b" / "shar"
    items = list(SharFolder(str(folder)))
    assert len(items) == 14 and all(isinstance(i, dict) and i["text"] for i in items)
    with tarfile.open(folder / "recording.000000.tar", "a") as tar:  # a member no cut names
        info = tarfile.TarInfo("stray.wav")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"RIFF"))
    findings = [i for i in SharFolder(str(folder)) if isinstance(i, SourceFinding)]
    assert [(f.check, f.member) for f in findings] == [("no_line", "stray.wav")]


def test_a_shard_id_beyond_the_lines_is_refused_not_a_billion_tars(nemo):
    from shardkit.errors import UsageError

    lines = open(nemo, encoding="utf-8").readlines()
    line = json.loads(lines[0])
    line["shard_id"] = 10 ** 12
    with open(nemo, "w", encoding="utf-8") as f:
        f.writelines([json.dumps(line) + "\n"] + lines[1:])
    with pytest.raises(UsageError, match="shard_id 1000000000000 names more tars than the manifest has lines"):
        NemoTarred(nemo)
