"""The DataLoader and the reader as the user runs them: audio per CPU-second, before and after.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_loader.py --corpus-mb 160 \
        --work-dir /tmp/shardkit-bench-loader --baseline /path/to/main/checkout --rounds 3

Two parts, each run in fresh child processes so the allocator starts as a user's would, and
alternated round by round between the code under test (this checkout) and ``--baseline`` (another
checkout of shardkit, e.g. main), so machine noise hits both alike. Figures are medians of the
rounds; CPU seconds (``process_time`` of the process plus its loader workers, read from /proc)
rather than wall time, since the machine is shared.

1. ``iter_samples`` over the plain-WAV corpus as documented (no extra call) and in a process tuned
   with ``reuse_freed_memory()``: hours of audio per CPU-second. Target: as documented >= 0.95x
   of tuned (the branch's documented rate against the baseline's tuned rate too).
2. A torch DataLoader over ``ShardDataset`` + ``collate_padded`` (batch 16, persistent fork
   workers, one warm-up epoch, then --epochs epochs measured), 0 workers and --workers workers,
   float32 and int16 batches, on plain and zst:3 WAV. The trainer's side reads one value per 4 KB
   page of every batch, as a copy to the GPU would touch them. Target: K workers >= 0.8x of
   0 workers per CPU-second.

Every epoch must deliver every utterance and frame of the corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_args(argv=None):
    sys.path.insert(0, HERE)
    from common import corpus_parser

    p = corpus_parser(__doc__, corpus_mb=160.0, work_dir="/tmp/shardkit-bench-loader")
    p.add_argument("--baseline", help="another shardkit checkout to compare with (its root folder)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="measured epochs per loader and round")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Children: run with PYTHONPATH set to the checkout measured


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_iter(spec: dict) -> dict:
    from shardkit.training.reader import iter_samples, reuse_freed_memory

    if spec["tuned"]:
        reuse_freed_memory()
    paths, frames = spec["paths"], 0
    times = []
    for _ in range(spec["repeat"]):
        t = time.process_time()
        frames = sum(len(s["audio"]) for s in iter_samples(paths))
        times.append(time.process_time() - t)
    assert frames == spec["frames"], (frames, spec["frames"])
    return {"cpu_s": statistics.median(times)}


def child_loader(spec: dict) -> dict:
    import torch
    import torch.utils.data

    from shardkit.training.dataset import ShardDataset, collate_padded

    torch.set_num_threads(1)
    out = {}
    for name, cfg in spec["configs"].items():
        ds = ShardDataset(cfg["paths"], rank=0, world_size=1, shuffle=False, dtype=cfg["dtype"])
        workers = cfg["workers"]
        loader = torch.utils.data.DataLoader(ds, batch_size=16, collate_fn=collate_padded, num_workers=workers,
                                             multiprocessing_context="fork" if workers else None,
                                             persistent_workers=workers > 0)
        cpus = []
        for epoch in range(spec["epochs"] + 1):
            iterator = iter(loader)
            pids = [w.pid for w in getattr(iterator, "_workers", [])]
            c0, w0 = time.process_time(), sum(_proc_cpu(p) for p in pids)
            count = frames = 0
            for batch in iterator:
                count += len(batch["key"])
                frames += int(batch["lengths"].sum())
                batch["audio"].reshape(-1)[::2048].sum()
            cpu = time.process_time() - c0 + sum(_proc_cpu(p) for p in pids) - w0
            assert (count, frames) == (cfg["utterances"], cfg["frames"]), (name, count, frames)
            if epoch:  # the first epoch starts the workers and warms up
                cpus.append(cpu)
        del loader, iterator
        out[name] = {"cpu_s": sum(cpus) / len(cpus)}
    return out


def run_child(checkout: str, kind: str, spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps({"kind": kind, **spec})],
                          env=env, capture_output=True, text=True, cwd=checkout)
    if proc.returncode:
        raise SystemExit(f"child failed ({checkout}, {kind}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------


def main(args) -> int:
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child_iter(spec) if spec["kind"] == "iter" else child_loader(spec)))
        return 0
    from common import bench_corpus, bullets, emit_results, machine_info, markdown_table

    totals, layout = bench_corpus(args.work_dir, args.corpus_mb, audio=("wav",), formats=("none", "zst:3"))
    hours = totals["seconds"] / 3600
    checkouts = {"branch": ROOT, **({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})}
    configs = {f"{fmt} {dtype} workers={w}": {"paths": layout[f"{fmt}/wav"], "dtype": dtype, "workers": w,
                                              "utterances": totals["utterances"], "frames": totals["frames"]}
               for fmt in ("none", "zst:3") for dtype in ("float32", "int16") for w in (0, args.workers)}
    iter_cpu: dict = {}
    loader_cpu: dict = {}
    for r in range(args.rounds):
        for label, checkout in checkouts.items():
            for tuned in (False, True):
                res = run_child(checkout, "iter", {"paths": layout["none/wav"], "frames": totals["frames"],
                                                    "tuned": tuned, "repeat": 3})
                iter_cpu.setdefault((label, tuned), []).append(res["cpu_s"])
            res = run_child(checkout, "loader", {"configs": configs, "epochs": args.epochs})
            for name, v in res.items():
                loader_cpu.setdefault((label, name), []).append(v["cpu_s"])
            print(f"round {r + 1} {label} done", file=sys.stderr, flush=True)
    iter_rows = {f"{label} {'tuned' if tuned else 'as documented'}": round(hours / statistics.median(v), 3)
                 for (label, tuned), v in iter_cpu.items()}
    loader_rows = {f"{label} {name}": round(hours / statistics.median(v), 3) for (label, name), v in loader_cpu.items()}
    ratios = {}
    for label in checkouts:
        ratios[f"{label}: iter_samples as documented / tuned"] = round(
            iter_rows[f"{label} as documented"] / iter_rows[f"{label} tuned"], 3)
        for fmt in ("none", "zst:3"):
            for dtype in ("float32", "int16"):
                k = loader_rows[f"{label} {fmt} {dtype} workers={args.workers}"]
                z = loader_rows[f"{label} {fmt} {dtype} workers=0"]
                ratios[f"{label}: {fmt} {dtype} workers={args.workers} / workers=0 per CPU-s"] = round(k / z, 3)
    if "baseline" in checkouts:
        ratios["branch as documented / baseline tuned"] = round(
            iter_rows["branch as documented"] / iter_rows["baseline tuned"], 3)
        for name in configs:
            ratios[f"branch / baseline: {name}"] = round(loader_rows[f"branch {name}"] / loader_rows[f"baseline {name}"], 3)
    result = {"machine": machine_info(), "corpus": totals, "rounds": args.rounds, "epochs": args.epochs,
              "iter_samples_hours_per_cpu_s": iter_rows, "loader_hours_per_cpu_s": loader_rows, "ratios": ratios}
    tables = [markdown_table([title, "h of audio per CPU-s"], [[k, f"{v:.2f}"] for k, v in rows.items()])
              for title, rows in (("iter_samples, plain WAV", iter_rows), ("DataLoader", loader_rows))]
    emit_results(result, args.json, echo=False, text="\n" + "\n\n".join([*tables, bullets(ratios)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
