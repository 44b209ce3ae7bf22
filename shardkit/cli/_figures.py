"""The human tables of plan's figures (per epoch, rank and worker), shared by plan and balance."""

from __future__ import annotations


def audio_length(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 3600 else f"{seconds / 3600:.2f} h"


def format_figures(figures: dict) -> str:
    """The human table of plan_figures: per epoch, per rank, with each worker's seconds."""
    lines = [_READER_TITLES[(figures.get("reader", "wenet"), figures.get("mode"))]] if "reader" in figures else []
    lines += [f"{figures['shards']} shards, {figures['utterances']} utterances, {audio_length(figures['seconds'])}; "
             f"world_size {figures['world_size']} x num_workers {figures['num_workers']} = "
             f"{figures['consumers']} consumers; count divides: {'yes' if figures['divides'] else 'NO'}"]
    for epoch in figures["epochs"]:
        spread = epoch["rank_spread"]
        lines.append(f"epoch {epoch['epoch']}: rank spread (max/min seconds) "
                     f"{'inf (a rank gets nothing)' if spread is None else f'{spread:.4f}'}")
        lines.append(f"  {'rank':>4} {'shards':>7} {'utts':>9} {'seconds':>12}   seconds per worker")
        for rank in epoch["ranks"]:
            workers = [w for w in epoch["workers"] if w["rank"] == rank["rank"]]
            lines.append(f"  {rank['rank']:>4} {rank['shards']:>7} {rank['utterances']:>9} {rank['seconds']:>12.1f}   "
                         + " / ".join(f"{w['seconds']:.1f}" for w in workers))
    worst = figures["worst_rank_spread"]
    lines.append(f"worst rank spread over {len(figures['epochs'])} epochs: "
                 f"{'inf' if worst is None else f'{worst:.4f}'}")
    return "\n".join(lines)


_READER_TITLES = {
    ("wenet", None): "WeNet: the list shuffled each epoch (same seed on every rank), line i -> consumer i mod (W x K)",
    ("webdataset", "split_by_node+split_by_worker"): "WebDataset, nodesplitter=wds.split_by_node, "
    "workersplitter=wds.split_by_worker: lines[rank::W][worker::K], the same shards every epoch "
    "(shardshuffle reorders within a worker)",
    ("webdataset", "resampled"): "WebDataset, resampled=True: every (rank, worker) draws shards with replacement "
    "(a typical draw; numpy's RNG, not WebDataset's)",
}
