import numpy as np
import pytest

from shardkit.planning.partition import consumer_of_line, lines_for, plan_figures, shuffled_order


@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (2, 1), (1, 3), (2, 2), (3, 4), (8, 4)])
def test_consumer_follows_wenet_rule(world_size, num_workers):
    groups = world_size * num_workers
    for i in range(3 * groups + 1):
        rank, worker = consumer_of_line(i, world_size, num_workers)
        assert worker * world_size + rank == i % groups
        assert 0 <= rank < world_size and 0 <= worker < num_workers


@pytest.mark.parametrize("n_lines", [0, 1, 5, 16, 33])
@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (2, 1), (2, 3), (4, 2)])
@pytest.mark.parametrize("epoch_seed", [None, (0, 0), (7, 3)])
def test_lines_for_partitions_the_list_in_reading_order(n_lines, world_size, num_workers, epoch_seed):
    order = np.arange(n_lines) if epoch_seed is None else shuffled_order(n_lines, *epoch_seed)
    seen = []
    for rank in range(world_size):
        for worker in range(num_workers):
            lines = lines_for(rank, worker, n_lines, world_size, num_workers, epoch_seed)
            positions = [p for p in range(n_lines) if consumer_of_line(p, world_size, num_workers) == (rank, worker)]
            assert list(lines) == [int(order[p]) for p in positions]
            seen.extend(lines.tolist())
    assert sorted(seen) == list(range(n_lines))


def test_shuffle_is_seeded_per_epoch():
    assert list(shuffled_order(50, 1, 0)) == list(shuffled_order(50, 1, 0))
    assert list(shuffled_order(50, 1, 0)) != list(shuffled_order(50, 1, 1))
    assert list(shuffled_order(50, 1, 0)) != list(shuffled_order(50, 2, 0))
    assert sorted(shuffled_order(50, 1, 0)) == list(range(50))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="world_size and num_workers must be >= 1"):
        consumer_of_line(0, 0, 1)
    with pytest.raises(ValueError, match="outside"):
        lines_for(2, 0, 10, 2, 1)


@pytest.mark.parametrize("world_size,num_workers,epochs", [(1, 1, 1), (2, 2, 3), (4, 1, 2), (3, 2, 4)])
def test_equal_shards_give_equal_ranks_for_every_epoch(world_size, num_workers, epochs):
    n = 5 * world_size * num_workers
    figures = plan_figures(np.full(n, 10), np.full(n, 36.0), world_size=world_size, num_workers=num_workers,
                           epochs=epochs, seed=3)
    assert figures["divides"] and figures["worst_rank_spread"] == 1.0
    for epoch in figures["epochs"]:
        assert {r["seconds"] for r in epoch["ranks"]} == {36.0 * n / world_size}
        assert {(w["shards"], w["utterances"]) for w in epoch["workers"]} == {(5, 50)}


def test_uneven_shards_show_the_imbalance_and_conserve_totals():
    rng = np.random.default_rng(0)
    secs = np.concatenate([rng.uniform(3000, 3800, 10), rng.uniform(11000, 13000, 7)])  # two corpora, 1000 utts each
    figures = plan_figures(np.full(17, 1000), secs, world_size=4, num_workers=2, epochs=3)
    assert not figures["divides"]
    assert figures["worst_rank_spread"] > 1.3
    for epoch in figures["epochs"]:
        assert sum(r["shards"] for r in epoch["ranks"]) == 17
        assert sum(w["seconds"] for w in epoch["workers"]) == pytest.approx(secs.sum(), abs=0.01)
        assert sorted(r["shards"] for r in epoch["ranks"]) == [4, 4, 4, 5]


def test_a_rank_without_shards_has_no_finite_spread():
    figures = plan_figures([10], [5.0], world_size=2, num_workers=1)
    assert figures["epochs"][0]["rank_spread"] is None and figures["worst_rank_spread"] is None
