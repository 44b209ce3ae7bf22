"""index and validate on a damaged NeMo tarred dataset or Shar folder: any flipped or cut byte of a manifest, an
audio tar, a cuts file or a recording tar gives a report whose failures or findings name where, or a
ShardkitError naming the input; never a traceback from inside, never an index written over what failed."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit.cli import main
from shardkit.commands.index import build_layout_index
from shardkit.commands.validate import run_validate
from shardkit.commands.validate.options import ValidateOptions
from shardkit.errors import ShardkitError

EXAMPLES = int(os.environ.get("SHARDKIT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from shardkit.io.synth import write_shards
    from support import SMALL_CORPORA, corpus

    root = tmp_path_factory.mktemp("fuzz-layout-inputs")
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


def _index_and_validate(source: str, out: str) -> None:
    if os.path.exists(out):
        os.remove(out)
    try:
        report = build_layout_index([source], out)
    except ShardkitError as err:
        assert source in str(err) or os.path.dirname(source) in str(err)
    else:
        assert (report.path is None) == bool(report.failures) == (not os.path.exists(out))
        assert all(f["shard"] and f["error"] for f in report.failures)
    try:
        validated = run_validate([source], ValidateOptions())
    except ShardkitError as err:
        assert source in str(err) or os.path.dirname(source) in str(err)
    else:
        assert all(f["shard"] and f["check"] and f["message"] for f in validated.findings)


@FUZZ
@given(name=st.sampled_from(["cuts.000000.jsonl.gz", "recording.000001.tar"]), position=st.floats(0, 1),
       value=st.integers(0, 255), cut=st.booleans())
def test_a_damaged_shar_folder_is_reported_where(datasets, name, position, value, cut):
    folder = _damaged(str(datasets / "shar" / "shar"), str(datasets / "shar-damaged"), name, position, value, cut)
    _index_and_validate(folder, str(datasets / "shar.jsonl"))


@FUZZ
@given(name=st.sampled_from(["tarred_audio_manifest.json", "audio_1.tar"]), position=st.floats(0, 1),
       value=st.integers(0, 255), cut=st.booleans())
def test_a_damaged_nemo_dataset_is_reported_where(datasets, name, position, value, cut):
    folder = _damaged(str(datasets / "nemo"), str(datasets / "nemo-damaged"), name, position, value, cut)
    _index_and_validate(os.path.join(folder, "tarred_audio_manifest.json"), str(datasets / "nemo.jsonl"))
