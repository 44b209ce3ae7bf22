"""shardkit.planning.bench: bench's corpus plan, DataLoader grid and recommendation as pure functions,
held over grids of inputs; and the module's imports (no I/O, nothing above planning)."""

from __future__ import annotations

import ast
import itertools
import math
import os

import pytest

from shardkit.planning import bench as planning
from shardkit.planning.bench import (
    BENCH_SHARDS,
    LOADER_DTYPE,
    batch_advice,
    corpus_shards,
    loader_grid,
    recommend,
    webdataset_gains,
    webdataset_recommendation,
    workers_needed,
)


@pytest.mark.parametrize("corpus_bytes", [1e3, 4e5, 3.9e6, 4e6, 9e6, 32e6, 33e6, 1e9])
def test_corpus_shards_alternate_short_and_long_and_hold_an_utterance_each(corpus_bytes):
    shards = corpus_shards(corpus_bytes)
    assert len(shards) == max(2, min(BENCH_SHARDS, int(corpus_bytes // 2_000_000)))
    for i, (name, utterances, low, high, lang) in enumerate(shards):
        kind = "short" if i % 2 == 0 else "long"
        assert name == f"bench-{kind}{i:02d}" and utterances >= 1
        assert (low, high, lang) == ((2.0, 6.0, "zh") if kind == "short" else (8.0, 20.0, "en"))
    if corpus_bytes >= 4e6:  # big enough that rounding to whole utterances stays within a few percent
        wav = sum(u * (low + high) / 2 * 32000 for _, u, low, high, _ in shards)
        assert wav == pytest.approx(corpus_bytes, rel=0.15)
    assert corpus_shards(corpus_bytes) == shards


@pytest.mark.parametrize("workers,contexts", [((0,), ("fork",)), ((0, 1, 2, 4), ("fork", "spawn", "forkserver")),
                                              ((2, 1), ("spawn",)), ((1, 0, 4), ("forkserver", "fork")),
                                              ((3,), ("spawn", "fork"))])
def test_loader_grid_measures_every_setting_and_float32_at_the_ends(workers, contexts):
    grid = loader_grid(workers, contexts)
    compact = [(w, c) for w, c, dtype in grid if dtype == LOADER_DTYPE]
    assert compact == [(w, None) if w == 0 else (w, c) for w in workers for c in ((None,) if w == 0 else contexts)]
    full = [(w, c) for w, c, dtype in grid if dtype == "float32"]
    assert full == [(w, c) for w, c in compact if w in (0, max(workers)) and c in (None, contexts[0])]
    assert grid == [(w, c, LOADER_DTYPE) for w, c in compact] + [(w, c, "float32") for w, c in full]


def _row(fmt, audio, size, hps, write=None):
    return {"format": fmt, "audio": audio, "size_ratio": size, "decode": {"shardkit": {"hours_per_s": hps}},
            "write": {"mb_per_s": write}}


ROWS = [_row("none", "wav", 1.0, 20.0, 300.0), _row("zst:3", "wav", 0.8, 5.0, 90.0), _row("bz2", "wav", 0.7, 0.2, 8.0),
        _row("none", "flac", 0.65, 1.0, 12.0), _row("xz", "wav", 0.68, 0.05)]


@pytest.mark.parametrize("cores,gpus,target", list(itertools.product([1, 2, 8, 24, 64, 128], [1, 2, 8],
                                                                       [0.1, 0.42, 3.4])))
def test_recommendation_over_a_grid_of_nodes(cores, gpus, target):
    rec = recommend(ROWS, [], cores=cores, gpus_per_node=gpus, target_hps=target, fbank_hps=0.25)
    per_gpu = cores // gpus
    assert rec["cores_per_gpu"] == per_gpu and rec["rule"] and rec["batches"] is None and rec["start_method"] is None
    needs = {(r["format"], r["audio"]): workers_needed(target, r["decode"]["shardkit"]["hours_per_s"], 0.25)
             for r in ROWS}
    feeding = [r for r in ROWS if needs[(r["format"], r["audio"])] <= per_gpu]
    chosen = next(r for r in ROWS if (r["format"], r["audio"]) == (rec["format"], rec["audio"]))
    if feeding:  # the smallest that the cores feed
        assert chosen["size_ratio"] == min(r["size_ratio"] for r in feeding)
        assert rec["why"].startswith("smallest on disk")
    else:  # none fits: the fastest to decode
        assert chosen["decode"]["shardkit"]["hours_per_s"] == max(r["decode"]["shardkit"]["hours_per_s"] for r in ROWS)
    assert rec["num_workers"] == min(per_gpu, max(1, math.ceil(round(needs[(rec["format"], rec["audio"])], 2))))
    assert (rec["prefetch"] is None) == (rec["num_workers"] == 0) and rec["persistent_workers"] == (per_gpu > 0)
    assert [c["feeds"] for c in rec["candidates"]] == [needs[(r["format"], r["audio"])] <= per_gpu for r in ROWS]


def test_no_decode_figures_no_recommendation():
    rows = [{"format": "none", "audio": "wav", "size_ratio": 1.0, "decode": {"soundfile": {"hours_per_s": 1.0}}}]
    assert recommend(rows, [], cores=8, gpus_per_node=1, target_hps=0.42, fbank_hps=0.25) == {
        "format": None, "reason": "no shardkit decode figures to choose from"}


def _loader(workers, context, dtype, per_cpu, startup=0.5):
    return {"workers": workers, "mp_context": context, "dtype": dtype, "hours_per_cpu_s": per_cpu,
            "startup_s": startup, "per_cpu_vs_main": 1.0}


@pytest.mark.parametrize("int16,float32,expected", [(2.0, 2.0, "int16"), (1.9, 2.0, "int16"), (1.8, 2.0, "float32"),
                                                    (1.0, None, "int16")])
def test_batches_leave_the_workers_as_int16_unless_measured_dearer(int16, float32, expected):
    rows = [_loader(0, "main", "int16", 9.0), _loader(2, "fork", "int16", int16, 0.3),
            _loader(2, "spawn", "int16", int16 / 2, 0.2)]
    if float32:
        rows.append(_loader(2, "fork", "float32", float32, 0.1))
    advice = batch_advice(rows)
    assert advice["dtype"] == expected and advice["workers"] == 2
    assert advice["bytes_per_hour"] == 16000 * 2 * 3600 * (2 if expected == "float32" else 1)
    # the start method: fastest to its first batch among int16 rows with workers (main and float32 rows aside)
    rec = recommend(ROWS, rows, cores=8, gpus_per_node=1, target_hps=0.42, fbank_hps=0.25)
    assert rec["start_method"]["mp_context"] == "spawn" and rec["batches"] == advice
    assert batch_advice([_loader(0, "main", "int16", 9.0)]) is None


def test_webdataset_gains_and_what_a_user_is_told():
    def stat(seconds):
        return {"median_s": seconds}

    loaders = {"wds+soundfile": stat(4.0), "wds+torchaudio": stat(40.0), "wds+shardkit": stat(1.0),
               "shardkit.training.wds.WebDataset": stat(0.5), "shardkit reader": stat(0.4)}
    gains = webdataset_gains(loaders)
    assert (gains["stage_vs_soundfile"], gains["dropin_vs_soundfile"], gains["stage_vs_torchaudio"]) == (4.0, 8.0, 40.0)
    assert gains["vs_shardkit_reader"] == {"wds+soundfile": 0.1, "wds+torchaudio": 0.01, "wds+shardkit": 0.4,
                                           "shardkit.training.wds.WebDataset": 0.8}
    without = webdataset_gains({"wds+soundfile": stat(4.0), "shardkit reader": stat(0.4)})
    assert without["stage_vs_soundfile"] is None and without["vs_shardkit_reader"] == {"wds+soundfile": 0.1}
    rows = [{"format": "none", "audio": "wav", "gains": gains}, {"format": "none", "audio": "flac", "gains": without}]
    advice = webdataset_recommendation(rows)
    assert advice["summary"] == "none/wav: 4.0x with the stage, 8.0x with the drop-in (40x over wds.torch_audio)"
    assert advice["how"].startswith("replace .decode(<audio handler>) with .map(shardkit.training.wds.decode_audio())")
    assert webdataset_recommendation([]) is None


def test_the_planner_reads_no_file_and_imports_nothing_above_planning():
    with open(planning.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {node.module if isinstance(node, ast.ImportFrom) else alias.name for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert imported <= {"__future__", "math", "dataclasses", "shardkit.planning.advice"}, imported
    assert "open" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert os.path.basename(os.path.dirname(planning.__file__)) == "planning"
