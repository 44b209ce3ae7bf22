"""Benchmark the executors of shardkit.run.executor.run_tasks: per-task overhead and real conversions.

    flock /tmp/shardkit-bench.lock python benchmarks/bench_executor.py --workdir /tmp/skbench-executor

Measures, in one run on one corpus (configurations interleaved, medians of --repeat runs):
  - --tasks trivial tasks (``abs``): wall time per task for inline (-j1), the forkserver pool
    (-j N, pool start included) and Ray (a local instance, started once and timed separately),
    and the fixed cost of a 2-task run, so the marginal cost per task is (t(N) - t(2)) / (N - 2);
  - --shards real bz2 -> zst:3 shard conversions (convert's task) on each executor; every run's
    outputs are checked: all ok, and the same sha256 per shard on every executor.
With --scaling, Ray conversions are also timed on fresh local instances of each CPU count (the
device machine: --scaling 1,2,4,8,16 --shards 64 --corpus-mb 400).
Prints one JSON line per configuration, then a markdown table. Figures are noisy on shared
machines; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import machine_info, make_corpus  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/skbench-executor")
    p.add_argument("--tasks", type=int, default=200, help="trivial tasks per run")
    p.add_argument("--shards", type=int, default=20, help="real shard conversions per run")
    p.add_argument("--corpus-mb", type=float, default=60.0, help="uncompressed tar MB of the shard corpus")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="local pool processes (Ray: all its CPUs)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ray-address", default=None, help="an existing cluster [default: start a local instance]")
    p.add_argument("--scaling", default=None, metavar="CPUS",
                   help="also time Ray conversions on local instances of these CPU counts, e.g. 1,2,4,8,16")
    return p.parse_args()


def trivial_run(executor, jobs, tasks, ray_address):
    from shardkit.run.executor import run_tasks

    results = dict(run_tasks(abs, [-i for i in range(tasks)], jobs=jobs, executor=executor,
                             ray_address=ray_address))
    assert results == {i: i for i in range(tasks)}, "wrong results"


def convert_run(executor, jobs, sources, out_dir, ray_address):
    from shardkit.commands.convert import ConvertSettings, _task
    from shardkit.io.inputs import plan_output_paths
    from shardkit.run.executor import run_tasks

    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    settings = ConvertSettings(codec="zst", level=3, threads=1)
    outputs = plan_output_paths(sources, out_dir, ".tar.zst")
    tasks = [(src, dst, settings) for src, dst in zip(sources, outputs)]
    entries = dict(run_tasks(_task, tasks, jobs=jobs, executor=executor, ray_address=ray_address))
    assert all(e["status"] == "ok" for e in entries.values()), [e["error"] for e in entries.values()]
    return [entries[i]["output"]["sha256"] for i in range(len(tasks))], sum(e["tar_bytes"] for e in entries.values())


def main(args):
    os.makedirs(args.workdir, exist_ok=True)
    sources = make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb, shards=args.shards,
                          codec="bz2")
    from shardkit.run.executor import connect_ray

    started = time.perf_counter()
    ray = connect_ray(args.ray_address)
    ray_start_s = time.perf_counter() - started
    ray_cpus = int(ray.cluster_resources().get("CPU", 0))
    info = {**machine_info(), "ray": ray.__version__, "ray_cpus": ray_cpus, "ray_start_s": round(ray_start_s, 2)}
    print(json.dumps({"machine": info}), flush=True)

    configs = [("inline (-j1)", "local", 1), (f"process pool (-j{args.jobs})", "local", args.jobs),
               (f"ray ({ray_cpus} CPUs)", "ray", None)]
    # one warm-up each (Ray starts its worker processes on first use; forkserver its server)
    for _, executor, jobs in configs:
        trivial_run(executor, jobs, min(args.tasks, 20), args.ray_address)

    trivial = {name: [] for name, _, _ in configs}
    # two tasks: the fixed cost (pool start, first scheduling); two, since one task runs inline
    fixed = {name: [] for name, _, _ in configs}
    convert = {name: [] for name, _, _ in configs}
    digests, tar_bytes = {}, 0
    for _ in range(args.repeat):
        for name, executor, jobs in configs:  # interleaved, so drift hits every configuration alike
            t = time.perf_counter()
            trivial_run(executor, jobs, args.tasks, args.ray_address)
            trivial[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            trivial_run(executor, jobs, 2, args.ray_address)
            fixed[name].append(time.perf_counter() - t)
            t = time.perf_counter()
            digests[name], tar_bytes = convert_run(executor, jobs, sources, os.path.join(args.workdir, "out"),
                                                   args.ray_address)
            convert[name].append(time.perf_counter() - t)
    assert len({tuple(d) for d in digests.values()}) == 1, "executors wrote different bytes"

    rows = []
    base = statistics.median(convert[configs[0][0]])
    for name, _, _ in configs:
        trivial_s, convert_s = statistics.median(trivial[name]), statistics.median(convert[name])
        fixed_s = statistics.median(fixed[name])
        row = {"executor": name, "trivial_tasks": args.tasks, "trivial_median_s": round(trivial_s, 3),
               "ms_per_task": round(trivial_s / args.tasks * 1000, 3),
               "two_tasks_ms": round(fixed_s * 1000, 1),
               "marginal_ms_per_task": round(max(0.0, trivial_s - fixed_s) / max(1, args.tasks - 2) * 1000, 3),
               "shards": len(sources),
               "convert_median_s": round(convert_s, 3), "convert_tar_mb_per_s": round(tar_bytes / convert_s / 1e6, 1),
               "speedup_vs_inline": round(base / convert_s, 2), "runs": args.repeat}
        rows.append(row)
        print(json.dumps(row), flush=True)

    print(f"\n{args.tasks} trivial tasks and {len(sources)} bz2 -> zst:3 conversions "
          f"({tar_bytes / 1e6:.0f} MB of tar), "
          f"median of {args.repeat}; Ray local instance start {ray_start_s:.1f} s (not included)\n")
    print("| executor | 2 trivial tasks: ms | trivial: ms per task | marginal ms per task | convert: s "
          "| convert: MB/s | speed-up vs inline |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['executor']} | {r['two_tasks_ms']:.1f} | {r['ms_per_task']:.3f} | {r['marginal_ms_per_task']:.3f} "
              f"| {r['convert_median_s']:.2f} | "
              f"{r['convert_tar_mb_per_s']:.1f} | {r['speedup_vs_inline']:.2f} |")
    if args.scaling:
        scaling(args, sources, [int(c) for c in args.scaling.split(",")])


def scaling(args, sources, cpu_counts):
    """Ray conversion time on a fresh local instance of each CPU count (same corpus, same outputs)."""
    import logging

    import ray

    rows, reference = [], None
    for cpus in cpu_counts:
        ray.shutdown()
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
        convert_run("ray", None, sources[: max(2, cpus)], os.path.join(args.workdir, "out"), None)  # warm workers
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            digests, tar_bytes = convert_run("ray", None, sources, os.path.join(args.workdir, "out"), None)
            times.append(time.perf_counter() - t)
            reference = reference or digests
            assert digests == reference, "Ray wrote different bytes with another worker count"
        median = statistics.median(times)
        rows.append({"ray_cpus": cpus, "convert_median_s": round(median, 3),
                     "convert_tar_mb_per_s": round(tar_bytes / median / 1e6, 1), "runs": args.repeat})
        print(json.dumps(rows[-1]), flush=True)
    print("\n| Ray CPUs | convert: s | MB/s | speed-up vs 1st |\n|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['ray_cpus']} | {r['convert_median_s']:.2f} | {r['convert_tar_mb_per_s']:.1f} | "
              f"{rows[0]['convert_median_s'] / r['convert_median_s']:.2f} |")


if __name__ == "__main__":
    main(parse_args())
