"""The Shar and NeMo-tarred readers of make and plan on damaged datasets: any flipped or cut byte of a cuts file,
a recording tar, a manifest or an audio tar gives entries and located skips (make) or a ShardkitError (plan),
never a traceback from inside."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit.cli import main
from shardkit.commands.make.sources import Entry, SourceOptions, Skip
from shardkit.commands.make.sources import nemo_tarred, shar
from shardkit.errors import ShardkitError
from shardkit.io.layouts.read import nemo_sizes, shar_sizes

EXAMPLES = int(os.environ.get("SHARDKIT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from shardkit.io.synth import write_shards
    from support import SMALL_CORPORA, corpus

    root = tmp_path_factory.mktemp("fuzz-layouts")
    write_shards(corpus(SMALL_CORPORA), str(root / "src"), utts_per_shard=7)
    for layout in ("shar", "nemo"):
        made = CliRunner().invoke(main, ["balance", "--corpus", f"mix={root / 'src'}", "--world-size", "1",
                                         "--num-workers", "1", "--num-shards", "2", "--layout", layout, "-o",
                                         str(root / layout), "-q", "-j", "1"])
        assert made.exit_code == 0, made.output
    return root


def _damaged(src: str, dst: str, name: str, position: float, value: int, cut: bool) -> str:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = os.path.join(dst, name)
    data = bytearray(open(path, "rb").read())
    at = int(position * (len(data) - 1))
    data = data[:at] if cut else data[:at] + bytes([value]) + data[at + 1:]
    with open(path, "wb") as f:
        f.write(data)
    return dst


def _drain(entries) -> None:
    for item in entries:
        assert isinstance(item, (Entry, Skip))


@FUZZ
@given(name=st.sampled_from(["cuts.000000.jsonl.gz", "recording.000001.tar"]), position=st.floats(0, 1),
       value=st.integers(0, 255), cut=st.booleans())
def test_a_damaged_shar_folder_gives_entries_and_skips(datasets, name, position, value, cut):
    folder = _damaged(str(datasets / "shar" / "shar"), str(datasets / "shar-damaged"), name, position, value, cut)
    _drain(shar.read([folder], SourceOptions()))
    try:
        shar_sizes(folder)
    except ShardkitError:
        pass


@FUZZ
@given(name=st.sampled_from(["tarred_audio_manifest.json", "audio_1.tar"]), position=st.floats(0, 1),
       value=st.integers(0, 255), cut=st.booleans())
def test_a_damaged_nemo_dataset_gives_entries_and_skips(datasets, name, position, value, cut):
    folder = _damaged(str(datasets / "nemo"), str(datasets / "nemo-damaged"), name, position, value, cut)
    manifest = os.path.join(folder, "tarred_audio_manifest.json")
    try:
        _drain(nemo_tarred.read([manifest], SourceOptions()))
    except ShardkitError as err:  # a manifest left without shard_id: a usage error naming it
        assert manifest in str(err)
    try:
        nemo_sizes(manifest)
    except ShardkitError:
        pass


def test_a_segment_line_with_a_text_offset_is_a_located_skip(datasets, tmp_path):
    import json

    folder = tmp_path / "nemo"
    shutil.copytree(datasets / "nemo", folder)
    manifest = folder / "tarred_audio_manifest.json"
    lines = [json.loads(line) for line in open(manifest)]
    lines[0]["offset"], lines[0]["duration"] = "0.5", "x"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    items = list(nemo_tarred.read([str(manifest)], SourceOptions()))
    skips = [i for i in items if isinstance(i, Skip)]
    assert len(skips) == 1 and skips[0].check == "bad_line" and lines[0]["audio_filepath"] in skips[0].reason
    assert sum(isinstance(i, Entry) for i in items) == len(lines) - 1
