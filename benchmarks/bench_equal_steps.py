"""Per-step cost of ``equal_steps`` against the bare loader, in real torch.distributed ranks (gloo, CPU).

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_equal_steps.py --json /tmp/equal_steps.json

Two ranks (forked processes, one gloo group) run rounds of, interleaved so machine noise hits all rows
alike:

- **pass-through** (this process, no group): equal_steps minus the bare loop, its own work per step.
- **synthetic**: ``--steps`` in-memory WeNet-style batches (``{"pcm_length": tensor}``): the loader
  costs nothing, so the difference is the wrapper alone (its one int32 all-reduce, the seconds it
  reads from each batch, the generator). Rows: the bare loop; the bare loop plus one tiny all-reduce
  per step (what the wrapper's collective costs by itself); equal_steps; and equal_steps with a
  4-float all-reduce per step standing for DDP's gradient sync, against the bare loop with it.
- **ShardDataset**: a real ``DataLoader(ShardDataset(...), batch_size=--batch, collate_padded,
  num_workers=--workers, persistent_workers=True)`` over equal shards written here (plain WAV tar,
  the same utterance count per shard and a shard count that divides by 2 ranks x workers, so both
  ranks take the same steps and nothing is drained): a whole epoch bare and wrapped.

Figures are rank 0's, per step, median of ``--rounds`` rounds (spread beside). Every wrapped run is
checked: the same number of steps on both ranks as the bare loader gives, and the report left
nothing out. These machines are shared and noisy: compare within a run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_info  # noqa: E402

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shards(out_dir: str, shards: int, utts: int) -> list[str]:
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    spec = CorpusSpec("bench", shards * utts, 1.0, 3.0, "zh")
    return write_shards(corpus_utterances(spec), out_dir, utts_per_shard=utts, codec="none")


def _time_loop(iterable, per_step=None) -> tuple[float, int]:
    start, steps = time.perf_counter(), 0
    for batch in iterable:
        if per_step is not None:
            per_step(batch)
        steps += 1
    return time.perf_counter() - start, steps


def _synthetic_rows(torch, dist, equal_steps, steps: int) -> dict:
    batches = [{"pcm_length": torch.tensor([16000 + i % 7, 24000], dtype=torch.int32)} for i in range(steps)]
    flag, grad = torch.ones(1, dtype=torch.int32), torch.zeros(4)

    def collective(_):
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)

    def sync(_):
        dist.all_reduce(grad)

    rows = {"bare": lambda: _time_loop(batches),
            "bare + one int32 all_reduce": lambda: _time_loop(batches, collective),
            "equal_steps": lambda: _time_loop(equal_steps(batches)),
            "bare + grad all_reduce": lambda: _time_loop(batches, sync),
            "equal_steps + grad all_reduce": lambda: _time_loop(equal_steps(batches), sync),
            "equal_steps(overlap=True) + grad all_reduce": lambda: _time_loop(equal_steps(batches, overlap=True),
                                                                               sync)}
    return rows


def _loader_rows(torch, equal_steps, paths: list[str], batch: int, workers: int) -> dict:
    from shardkit.training.dataset import ShardDataset, collate_padded

    ds = ShardDataset(paths, shuffle=False, dtype="int16")
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, collate_fn=collate_padded, num_workers=workers,
                                         persistent_workers=workers > 0, multiprocessing_context="fork")
    _time_loop(loader)  # start the workers
    wrapped = equal_steps(loader)

    def checked():
        took, steps = _time_loop(wrapped)
        report = wrapped.last_epoch_report
        assert report["left_out_batches"] == [0] * WORLD and report["steps"] == steps, report
        return took, steps

    overlapped = equal_steps(loader, overlap=True)
    return {"ShardDataset loader": lambda: _time_loop(loader), "ShardDataset loader + equal_steps": checked,
            "ShardDataset loader + equal_steps(overlap=True)": lambda: _time_loop(overlapped)}


def _passthrough_row(torch, steps: int, rounds: int) -> dict:
    """equal_steps without a process group, in this process: the wrapper's own work per step (the
    generator and the seconds it reads from each batch), without its collective."""
    from shardkit import equal_steps

    torch.set_num_threads(1)
    batches = [{"pcm_length": torch.tensor([16000 + i % 7, 24000], dtype=torch.int32)} for i in range(steps)]
    bare, wrapped = [], []
    for _ in range(rounds):
        bare.append(_time_loop(batches)[0])
        wrapped.append(_time_loop(equal_steps(batches))[0])
    per_step = [(w - b) / steps * 1e6 for w, b in zip(wrapped, bare)]
    return {"row": "equal_steps without a process group, minus bare (its own work)", "steps": steps,
            "us_per_step": statistics.median(per_step), "spread_us": (max(per_step) - min(per_step)) / 2,
            "rounds": rounds}


def _rank(rank: int, port: int, args, paths: list[str], out: str) -> None:
    import torch
    import torch.distributed as dist

    from shardkit import equal_steps

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    groups = {"synthetic": _synthetic_rows(torch, dist, equal_steps, args.steps),
              "shards": _loader_rows(torch, equal_steps, paths, args.batch, args.workers)}
    times: dict[str, list[float]] = {}
    steps: dict[str, int] = {}
    for _ in range(args.rounds):
        for rows in groups.values():
            for name, run in rows.items():
                dist.barrier()
                took, n = run()
                times.setdefault(name, []).append(took)
                assert steps.setdefault(name, n) == n, (name, n, steps[name])
    dist.barrier()
    with open(out, "w") as f:
        json.dump({"times": times, "steps": steps}, f)
    dist.destroy_process_group()


def _summary(results: list[dict]) -> list[dict]:
    rank0 = results[0]
    rows = []
    for name, times in rank0["times"].items():
        n = rank0["steps"][name]
        assert all(r["steps"][name] == n for r in results), f"{name}: ranks took different steps"
        per_step = [t / n * 1e6 for t in times]
        rows.append({"row": name, "steps": n, "us_per_step": statistics.median(per_step),
                     "spread_us": (max(per_step) - min(per_step)) / 2, "rounds": len(times)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5000, help="synthetic batches per epoch")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shards", type=int, default=8, help="a multiple of 2 x --workers")
    p.add_argument("--utts", type=int, default=96, help="utterances per shard")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    import torch  # imported once here: the forked ranks share it

    passthrough = _passthrough_row(torch, args.steps, args.rounds)

    with tempfile.TemporaryDirectory(prefix="shardkit-bench-steps-") as work:
        paths = _shards(os.path.join(work, "shards"), args.shards, args.utts)
        ctx = multiprocessing.get_context("fork")
        port = _free_port()
        outs = [os.path.join(work, f"rank{r}.json") for r in range(WORLD)]
        procs = [ctx.Process(target=_rank, args=(r, port, args, paths, outs[r])) for r in range(WORLD)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        if any(proc.exitcode != 0 for proc in procs):
            print(f"a rank failed: exit codes {[proc.exitcode for proc in procs]}", file=sys.stderr)
            return 1
        results = []
        for path in outs:
            with open(path) as f:
                results.append(json.load(f))
    rows = [passthrough, *_summary(results)]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "machine": machine_info()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
