"""Compact DataLoader batches: int16 + scale, packed lengths, reused shared memory, mixed formats."""

import numpy as np
import pytest
from support import SMALL_CORPORA

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.synth import encode, speech_like, write_shards

torch = pytest.importorskip("torch")

from shardkit.training.dataset import ShardDataset, audio_float, collate_packed, collate_padded, downmix, pad_packed  # noqa: E402


def _loader(paths, *, workers=0, collate=collate_padded, batch_size=4, **kwargs):
    ds = ShardDataset(paths, rank=0, world_size=1, shuffle=False, **kwargs)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, collate_fn=collate, num_workers=workers,
                                       multiprocessing_context="fork" if workers else None)


@pytest.mark.parametrize("workers", [0, 1])
def test_int16_batches_equal_float_batches_after_scaling(make_shards, workers):
    paths = make_shards("zst", utts_per_shard=7)
    floats = list(_loader(paths, workers=workers))
    ints = list(_loader(paths, workers=workers, dtype="int16"))
    assert len(floats) == len(ints) == 4
    for f, i in zip(floats, ints):
        assert i["audio"].dtype == torch.int16 and f["audio"].dtype == torch.float32
        assert set(i) == set(f) >= {"audio", "lengths", "sample_rate", "key", "txt"}
        assert torch.equal(i["lengths"], f["lengths"]) and i["key"] == f["key"] and i["txt"] == f["txt"]
        assert torch.equal(audio_float(i), f["audio"])  # exactly, not approximately
        assert torch.equal(audio_float(f), f["audio"])


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_batches_hold_the_same_frames_without_padding(make_shards, workers):
    paths = make_shards("none", utts_per_shard=7)
    padded = list(_loader(paths, workers=workers))
    packed = list(_loader(paths, workers=workers, collate=collate_packed))
    singles = {s["key"]: s["audio"] for s in ShardDataset(paths, rank=0, world_size=1, shuffle=False)}
    assert [b["key"] for b in padded] == [b["key"] for b in packed]
    got = 0
    for p, q in zip(padded, packed):
        assert q["audio"].shape == (int(q["lengths"].sum()), 1)
        assert q["offsets"].tolist() == [0, *np.cumsum(q["lengths"].tolist())[:-1].tolist()]
        assert torch.equal(pad_packed(q), p["audio"]) and torch.equal(q["lengths"], p["lengths"])
        for key, start, n in zip(q["key"], q["offsets"].tolist(), q["lengths"].tolist()):
            assert torch.equal(q["audio"][start:start + n], singles[key])
        got += len(q["key"])
    assert got == len(singles) == 14


def test_batches_held_by_the_trainer_are_never_overwritten(make_shards):
    # Workers reuse shared-memory segments only once every tensor of a batch is gone: hold them all
    # (and views of them), then compare with what the main process reads on its own.
    paths = make_shards("none", utts_per_shard=2, specs=SMALL_CORPORA * 3)
    expected = list(_loader(paths, batch_size=2))
    held = list(_loader(paths, workers=2, batch_size=2))
    views = [b["audio"][:, :10] for b in held]
    assert len(held) == len(expected) > 8  # more batches than a worker keeps segments
    for b, e, v in zip(held, expected, views):
        assert b["key"] == e["key"] and torch.equal(b["audio"], e["audio"]) and torch.equal(v, e["audio"][:, :10])
    # dropped batches free their segments: a long run reuses them and stays correct
    for _ in range(3):
        for b, e in zip(_loader(paths, workers=2, batch_size=2), expected):
            assert torch.equal(b["audio"], e["audio"]) and torch.equal(b["lengths"], e["lengths"])


def test_persistent_workers_reuse_segments_across_epochs(make_shards):
    paths = make_shards("none", utts_per_shard=7)
    ds = ShardDataset(paths, rank=0, world_size=1, shuffle=False, dtype="int16")
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate_padded, num_workers=1,
                                         multiprocessing_context="fork", persistent_workers=True)
    first = [b["audio"].clone() for b in loader]
    for _ in range(3):
        again = list(loader)
        assert all(torch.equal(a["audio"], f) for a, f in zip(again, first))


@pytest.fixture
def mixed_shards(tmp_path):
    """Mono 16 kHz utterances with one stereo utterance and one at 8 kHz among them."""
    utts = []
    for i in range(6):
        rate, channels = (8000, 1) if i == 4 else (16000, 2) if i == 2 else (16000, 1)
        audio = speech_like(0.5 + 0.1 * i, rate, seed=i, channels=channels)
        utts.append((f"utt{i}", f"text {i}", encode(audio, rate, "wav"), 0.5 + 0.1 * i))
    return write_shards(utts, str(tmp_path / "mixed"), utts_per_shard=3)


def test_mixed_channels_and_rates_are_a_located_error(mixed_shards):
    with pytest.raises(ShardkitError, match=r"utt2.*2 channel\(s\).*channels=1") as err:
        list(_loader(mixed_shards, batch_size=3))
    assert err.value.shard == mixed_shards[0] and err.value.member == "utt2"
    with pytest.raises(ShardkitError, match=r"8000 Hz.*sample_rate=16000") as err:
        list(_loader(mixed_shards, batch_size=3, channels=1))
    assert err.value.shard == mixed_shards[1] and err.value.member == "utt4"
    with pytest.raises(ShardkitError, match="utt2"):  # also from a worker, and for packed batches
        list(_loader(mixed_shards, batch_size=3, workers=1, collate=collate_packed))


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_downmix_and_resample_to_the_training_format(mixed_shards, dtype):
    import soxr

    from shardkit.training.reader import iter_samples

    raw = {s["key"]: s for s in iter_samples(mixed_shards, dtype=dtype)}
    batches = list(_loader(mixed_shards, batch_size=3, channels=1, sample_rate=16000, dtype=dtype))
    samples = {k: (b["audio"][i, :int(b["lengths"][i])], b["sample_rate"][i])
               for b in batches for i, k in enumerate(b["key"])}
    assert set(samples) == set(raw) and all(rate == 16000 for _, rate in samples.values())
    for key in ("utt0", "utt1", "utt3", "utt5"):  # already in the training format: untouched
        assert np.array_equal(samples[key][0].numpy(), raw[key]["audio"])
    stereo = raw["utt2"]["audio"]
    assert stereo.shape[1] == 2 and samples["utt2"][0].shape == (len(stereo), 1)
    assert np.allclose(samples["utt2"][0].numpy()[:, 0].astype(np.float64),
                       stereo.astype(np.float64).mean(axis=1), atol=0.51 if dtype == "int16" else 1e-6)
    low = raw["utt4"]["audio"]
    expected = soxr.resample(low, 8000, 16000, quality="HQ")
    assert samples["utt4"][0].shape == (len(expected), 1) and len(expected) == 2 * len(low)
    assert np.array_equal(samples["utt4"][0].numpy(), expected.reshape(-1, 1))


def test_downmix_keeps_dtype_and_bad_options_are_usage_errors(make_shards):
    x = np.array([[100, -101], [32767, 32767], [-32768, -32767]], np.int16)
    assert downmix(x).dtype == np.int16 and downmix(x)[:, 0].tolist() == [0, 32767, -32768]
    paths = make_shards("none")
    with pytest.raises(UsageError, match="channels"):
        ShardDataset(paths, channels=2)
    with pytest.raises(UsageError, match="sample_rate"):
        ShardDataset(paths, sample_rate=0)


def test_worker_batches_travel_through_a_few_reused_segments(make_shards):
    from shardkit.training import batchshm
    paths = make_shards("none", utts_per_shard=1)  # 14 shards, one batch each
    before = set(batchshm._MAPPINGS)
    ds = ShardDataset(paths, rank=0, world_size=1, shuffle=False, dtype="int16")
    loader = torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=collate_padded, num_workers=1,
                                         multiprocessing_context="fork", persistent_workers=True)
    expected = {b["key"][0]: b["audio"].clone() for b in _loader(paths, batch_size=1, dtype="int16")}
    for _ in range(3):
        for b in loader:  # each batch is dropped before the next arrives
            assert torch.equal(b["audio"], expected[b["key"][0]])
    new = set(batchshm._MAPPINGS) - before
    assert 1 <= len(new) <= batchshm.WorkerArena().max_segments  # 42 batches, a few segments


def test_a_replaced_segment_gets_a_new_serial():
    from shardkit.training.batchshm import WorkerArena

    arena = WorkerArena(max_segments=2)
    a = arena.take(100)
    b = arena.take(5 << 20)
    a.view[0] = b.view[0] = 0  # the trainer released both
    c = arena.take(40 << 20)  # fits neither: a free one makes room
    assert len(arena.segments) == 2 and c.serial not in (a.serial, b.serial) and c.busy
    assert len({s.serial for s in arena.segments}) == 2


def test_segments_replaced_by_size_keep_every_batch_intact(make_shards, monkeypatch):
    # Tiny size classes and two segments per worker: batches of different sizes keep evicting and
    # replacing segments while the trainer still maps the old ones.
    from shardkit.training import batchshm
    monkeypatch.setattr(batchshm, "MIN_SEGMENT", 4096)
    monkeypatch.setattr(batchshm.WorkerArena.__init__, "__defaults__", (2, 512 << 20))
    monkeypatch.setattr(batchshm, "_ARENA", None)
    paths = make_shards("none", utts_per_shard=1)
    expected = {b["key"][0]: b["audio"].clone() for b in _loader(paths, batch_size=1)}
    ds = ShardDataset(paths, rank=0, world_size=1, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=1, collate_fn=collate_padded, num_workers=1,
                                         multiprocessing_context="fork", persistent_workers=True)
    before = set(batchshm._MAPPINGS)
    for _ in range(3):
        for b in loader:
            assert torch.equal(b["audio"], expected[b["key"][0]])
    assert len(set(batchshm._MAPPINGS) - before) > 2  # segments were replaced, under new serials
