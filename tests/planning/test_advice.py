"""shardkit.planning.advice: loader advice and format evidence as pure functions of the machine's numbers."""

from __future__ import annotations

import pytest

from shardkit.planning.advice import format_evidence, loader_advice, training_decode_rate

ROWS = [{"format": "none", "codec": "none", "audio": "wav", "size_ratio": 1.0, "hours_per_s": 25.0},
        {"format": "none", "codec": "none", "audio": "flac", "size_ratio": 0.66, "hours_per_s": 1.1},
        {"format": "zst:3", "codec": "zst", "audio": "wav", "size_ratio": 0.82, "hours_per_s": 5.0},
        {"format": "bz2", "codec": "bz2", "audio": "wav", "size_ratio": 0.69, "hours_per_s": 0.24}]


def test_two_cores_one_gpu():
    advice = loader_advice(cores=2, gpus_per_node=1, decode_hours_per_s=25.0, num_workers_used=2)
    # 0.42 h/s x (1/25 + 1/0.25) = 1.70 workers; 2 cores for the one GPU
    assert advice["cores_per_gpu"] == 2 and advice["workers_needed"] == pytest.approx(1.697, abs=1e-3)
    assert advice["num_workers"] == 2 and advice["feeds"] and advice["prefetch_factor"] == 13
    assert advice["text"] == (
        "1 GPU per node, 2 cores (2 per GPU); read + decode 25 h/s per core measured on the training shards, "
        "fbank 0.25 h/s per core: one worker supplies 0.248 h/s, one GPU consumes ~0.42 h/s, so it needs 1.7 "
        "workers -> num_workers=2, prefetch_factor=13: the loader keeps up (the --num_workers this list was "
        "balanced for)")


def test_sixteen_cores_eight_gpus_slow_format():
    advice = loader_advice(cores=16, gpus_per_node=8, decode_hours_per_s=0.24, num_workers_used=4,
                           measured_on="bz2 WAV shards")
    # bz2: 0.42 x (1/0.24 + 1/0.25) = 3.43 workers needed, but 16 // 8 = 2 cores per GPU
    assert advice["cores_per_gpu"] == 2 and advice["workers_needed"] == pytest.approx(3.43, abs=1e-2)
    assert advice["num_workers"] == 2 and not advice["feeds"]
    assert "8 GPUs per node, 16 cores (2 per GPU); read + decode 0.24 h/s per core measured on bz2 WAV shards" \
        in advice["text"]
    assert "the loader supplies ~0.245 h/s per GPU, short of 0.42" in advice["text"]
    assert advice["text"].endswith("rerun stage 2 with --num_workers 2 so the shard count stays a multiple of "
                                   "world_size x num_workers")


def test_sixteen_cores_eight_gpus_fast_format_and_fewer_cores_than_gpus():
    fast = loader_advice(cores=16, gpus_per_node=8, decode_hours_per_s=25.0)
    assert (fast["num_workers"], fast["feeds"]) == (2, True)
    starved = loader_advice(cores=2, gpus_per_node=8, decode_hours_per_s=25.0)
    assert starved["num_workers"] == 0 and not starved["feeds"] and starved["prefetch_factor"] is None
    assert "fewer cores than GPUs: num_workers=0" in starved["text"]


def test_unmeasured_rate_is_said_and_bad_counts_refused():
    advice = loader_advice(cores=4, gpus_per_node=1, decode_hours_per_s=None)
    assert "no decode rate measured" in advice["text"] and advice["num_workers"] == 2
    with pytest.raises(ValueError):
        loader_advice(cores=0, gpus_per_node=1, decode_hours_per_s=1.0)


def test_training_rate_and_evidence_come_from_the_matching_rows():
    assert training_decode_rate(ROWS, "none", "keep") == (1.1, "none FLAC shards of the training list")
    assert training_decode_rate(ROWS, "zst", "wav") == (5.0, "zst:3 WAV shards of the training list")
    assert training_decode_rate(ROWS, "gz", "wav") == (None, "nothing")
    lines = format_evidence(ROWS, "none", "wav")
    assert lines[0] == "none WAV: size 1.00 of the WAV tar, 25 h/s per core, no hook <- this list"
    assert lines[2] == "zst:3 WAV: size 0.82 of the WAV tar, 5 h/s per core, needs the zstd hook"
