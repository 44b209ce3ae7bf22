import os
import pickle

import numpy as np
import pytest

from shardkit.errors import UsageError
from shardkit.planning.partition import shuffled_order

torch = pytest.importorskip("torch")

from shardkit.training.dataset import ShardDataset, collate_padded, resolve_world  # noqa: E402


def _wenet_lines(n, rank, worker, world_size, num_workers, seed, epoch):
    """WeNet's rule spelled out: shuffle with one seed on every rank, position i goes to consumer
    i mod (world_size * num_workers), consumer id = worker * world_size + rank."""
    order = shuffled_order(n, seed, epoch)
    return [int(order[i]) for i in range(n) if i % (world_size * num_workers) == worker * world_size + rank]


@pytest.fixture
def many_shards(make_shards):
    return make_shards("zst", utts_per_shard=1)  # 14 shards of one utterance each


@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2), (4, 4)])
@pytest.mark.parametrize("epoch", [0, 3])
def test_split_follows_wenet_rule(many_shards, world_size, num_workers, epoch):
    seen = []
    for rank in range(world_size):
        ds = ShardDataset(many_shards, rank=rank, world_size=world_size, seed=7, epoch=epoch)
        for worker in range(num_workers):
            got = ds.shards_for(worker, num_workers)
            assert got == [many_shards[i] for i in _wenet_lines(len(many_shards), rank, worker, world_size,
                                                                num_workers, 7, epoch)]
            seen += got
    assert sorted(seen) == sorted(many_shards)  # every shard read once per epoch, by one consumer


def test_unshuffled_split_is_round_robin(many_shards):
    ds = ShardDataset(many_shards, rank=1, world_size=2, shuffle=False)
    assert ds.shards_for(1, 3) == many_shards[3::6]  # consumer 1 * 2 + 1 = 3 of 6


def test_real_dataloader_ranks_and_workers_partition_the_corpus(many_shards):
    keys_per_rank = []
    for rank in range(2):
        ds = ShardDataset(many_shards, rank=rank, world_size=2, seed=1)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        samples = list(loader)
        assert all(isinstance(s["audio"], torch.Tensor) and s["audio"].dtype == torch.float32 for s in samples)
        assert all(s["sample_rate"] == 16000 and s["audio"].shape[1] == 1 for s in samples)
        shards = {s["shard"] for s in samples}
        assert shards == set(ds.shards_for(0, 2)) | set(ds.shards_for(1, 2))
        keys_per_rank.append([s["key"] for s in samples])
    a, b = keys_per_rank
    assert not set(a) & set(b) and len(a) + len(b) == 14 and len(a) == 7


def test_spawn_workers_read_the_same_as_the_main_process(make_shards):
    paths = make_shards("none", utts_per_shard=7)
    ds = ShardDataset(paths, rank=0, world_size=1, shuffle=False)
    assert pickle.loads(pickle.dumps(ds)).shards_for(0, 1) == paths
    main = {s["key"]: s["audio"].numpy() for s in ds}
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    spawned = {s["key"]: s["audio"].numpy() for s in loader}
    assert spawned.keys() == main.keys() and len(main) == 14
    assert all(np.array_equal(spawned[k], main[k]) for k in main)


def test_epochs_reshuffle_and_consecutive_iterations_count_as_epochs(many_shards):
    ds = ShardDataset(many_shards, rank=0, world_size=1, seed=3)
    first = [s["shard"] for s in ds]
    second = [s["shard"] for s in ds]  # a persistent worker's copy sees consecutive iterations
    assert first == ds.shards_for(0, 1, epoch=0) and second == ds.shards_for(0, 1, epoch=1)
    assert first != second and sorted(first) == sorted(second)
    ds.set_epoch(1)
    assert [s["shard"] for s in ds] == second


def test_data_list_numpy_output_and_int16(make_shards):
    paths = make_shards("bz2")
    data_list = os.path.join(os.path.dirname(paths[0]), "data.list")
    ds = ShardDataset(data_list, rank=0, world_size=1, dtype="int16", as_tensor=False)
    samples = list(ds)
    assert len(samples) == 14 and all(s["audio"].dtype == np.int16 for s in samples)


def test_world_comes_from_arguments_or_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert resolve_world(None, None) == (3, 4)
    assert resolve_world(1, 2) == (1, 2)
    with pytest.raises(UsageError, match="rank 5 is outside world_size 4"):
        resolve_world(5, None)


def test_padded_batches_keep_true_lengths(make_shards):
    paths = make_shards("none", utts_per_shard=14)
    ds = ShardDataset(paths, rank=0, world_size=1, shuffle=False)
    singles = list(ds)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate_padded, num_workers=1,
                                         multiprocessing_context="fork")
    batches = list(loader)
    assert [len(b["key"]) for b in batches] == [4, 4, 4, 2]
    for b in batches:
        assert b["audio"].shape == (len(b["key"]), int(b["lengths"].max()), 1)
    first = batches[0]
    for i, sample in enumerate(singles[:4]):
        n = int(first["lengths"][i])
        assert first["key"][i] == sample["key"] and n == sample["audio"].shape[0]
        assert torch.equal(first["audio"][i, :n], sample["audio"]) and not first["audio"][i, n:].any()
