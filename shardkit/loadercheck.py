"""Loader check: read a shard list the way training will, once per rank, and compare the ranks.

For each rank of a simulated world of ``world_size`` ranks, a torch ``DataLoader`` with
``num_workers`` worker processes reads the list through shardkit's dataset (which splits lines
by rank and worker as WeNet does) and batches utterances statically. The check passes when every
rank sees the same number of utterances and of batches: then no rank waits for another at the
end of an epoch (the hang of uneven DDP ranks). Audio is decoded in the workers as in training;
only counts and seconds travel back.
"""

from __future__ import annotations


def _batch_figures(batch: list[dict]) -> tuple[int, float, list[str]]:
    """collate_fn: what a batch holds, without shipping its audio between processes."""
    seconds = sum(len(sample["audio"]) / sample["sample_rate"] for sample in batch)
    return len(batch), seconds, [sample["key"] for sample in batch]


def read_rank(data_list: str, *, rank: int, world_size: int, num_workers: int, batch_size: int, seed: int = 0,
              epoch: int = 0) -> dict:
    """Utterances, batches and seconds one rank reads in one epoch, through a real DataLoader."""
    import torch.utils.data

    from .dataset import ShardDataset

    dataset = ShardDataset(data_list, rank=rank, world_size=world_size, shuffle=True, seed=seed, epoch=epoch)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                         collate_fn=_batch_figures)
    utterances = batches = 0
    seconds = 0.0
    keys: list[str] = []
    for count, batch_seconds, batch_keys in loader:
        utterances += count
        batches += 1
        seconds += batch_seconds
        keys += batch_keys
    return {"rank": rank, "utterances": utterances, "batches": batches, "seconds": round(seconds, 3), "keys": keys}


def compare_ranks(ranks: list[dict]) -> dict:
    """Whether every rank got the same utterances and batches, and the seconds spread (pure)."""
    utts = [r["utterances"] for r in ranks]
    batches = [r["batches"] for r in ranks]
    seconds = [r["seconds"] for r in ranks]
    all_keys = [k for r in ranks for k in r["keys"]]
    return {
        "equal_utterances": len(set(utts)) == 1,
        "equal_batches": len(set(batches)) == 1,
        "rank_seconds_spread": round(max(seconds) / min(seconds), 6) if min(seconds) > 0 else None,
        "utterances": sum(utts),
        "distinct_keys": len(set(all_keys)),
        "ok": len(set(utts)) == 1 and len(set(batches)) == 1 and min(utts) > 0,
    }


def run_loader_check(data_list: str, *, world_size: int, num_workers: int, batch_size: int, seed: int = 0,
                     epoch: int = 0) -> dict:
    ranks = [read_rank(data_list, rank=r, world_size=world_size, num_workers=num_workers, batch_size=batch_size,
                       seed=seed, epoch=epoch) for r in range(world_size)]
    verdict = compare_ranks(ranks)
    return {"command": "loader-check", "data_list": data_list, "world_size": world_size, "num_workers": num_workers,
            "batch_size": batch_size, "seed": seed, "epoch": epoch, **verdict,
            "ranks": [{k: v for k, v in r.items() if k != "keys"} for r in ranks]}
