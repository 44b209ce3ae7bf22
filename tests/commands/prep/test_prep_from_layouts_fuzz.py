"""prep on a damaged NeMo tarred dataset or Shar folder: any flipped or cut byte of a manifest, an audio tar, a
cuts file or a recording tar gives a run whose rejects lines name the shard and the reason (exit 0 or 1), or
one error naming the input (exit 1 or 2); never a traceback from inside, never a silent skip."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import run_cli

EXAMPLES = int(os.environ.get("SHARDKIT_FUZZ_EXAMPLES", "60")) // 2  # each example is a whole prep run
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from shardkit.io.synth import write_shards
    from support import SMALL_CORPORA, corpus

    root = tmp_path_factory.mktemp("fuzz-prep-layout-inputs")
    write_shards(corpus(SMALL_CORPORA), str(root / "src"), utts_per_shard=7)
    for layout in ("shar", "nemo"):
        made = run_cli("prep", "--corpus", f"mix={root / 'src'}", "--world-size", 1, "--num-workers", 2,
                       "--remainder", "drop", "--layout", layout, "-o", root / layout, "-q", "-j", 1)
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


def _prep(source: str, out) -> None:
    shutil.rmtree(out, ignore_errors=True)
    result = run_cli("prep", "--corpus", f"mix={source}", "--world-size", 1, "--num-workers", 1, "-o", out, "-q",
                     "--json", "-j", 1)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    doc = json.loads(result.stdout)
    assert result.exit_code in (0, 1, 2)
    if "error" in doc:  # a run that wrote nothing names the input it could not use
        folder = source if os.path.isdir(source) else os.path.dirname(source)
        assert folder in doc["error"] or "utterances" in doc["error"], doc["error"]
        return
    rejects = [json.loads(line) for line in open(os.path.join(out, "rejects.jsonl"), encoding="utf-8")]
    assert (result.exit_code == 1) == bool(doc["findings"]) or not doc["balanced"]
    assert all(r["shard"] and r["reasons"] and (r["key"] or r["member"] or "lost" in r["reasons"][0]
                                                or "nothing of this shard" in r["reasons"][0]) for r in rejects)
    assert bool(rejects) == bool(doc["findings"])  # every finding kept something out, and is listed


@FUZZ
@given(name=st.sampled_from(["cuts.000000.jsonl.gz", "recording.000001.tar"]), position=st.floats(0, 1),
       value=st.integers(0, 255), cut=st.booleans())
def test_a_damaged_shar_folder_is_rejected_where(datasets, name, position, value, cut):
    folder = _damaged(str(datasets / "shar" / "shar"), str(datasets / "shar-damaged"), name, position, value, cut)
    _prep(folder, datasets / "out")


@FUZZ
@given(name=st.sampled_from(["tarred_audio_manifest.json", "audio_1.tar"]), position=st.floats(0, 1),
       value=st.integers(0, 255), cut=st.booleans())
def test_a_damaged_nemo_dataset_is_rejected_where(datasets, name, position, value, cut):
    folder = _damaged(str(datasets / "nemo"), str(datasets / "nemo-damaged"), name, position, value, cut)
    _prep(os.path.join(folder, "tarred_audio_manifest.json"), datasets / "out")
