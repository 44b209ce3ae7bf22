"""Benchmark: planning a 1.3 M-utterance mix (AISHELL-2 + LibriSpeech + a third corpus) for balance.

Two figures, each repeated, medians reported, correctness checked on every run:

* ``plan``: the pure planner (``plan_balance``) on duration arrays.
* ``dry_run``: ``shardkit balance --dry-run`` end to end from index files (read 1.3 M JSON lines,
  plan, compute the plan figures), in a fresh process so its peak memory (max RSS) is its own.
* ``write_vs_convert``: the writing phase (index the sources, plan, positioned reads, zst:3, verify)
  against ``convert`` to zst:3 on the same ~90 MB of real-audio plain-tar shards, one process each.

Synthetic durations stand in for the corpora (the counts and mean lengths of docs/reference/wenet-format.md):
AISHELL-2 1,000,000 x gamma around 3.6 s, LibriSpeech 281,241 x ~12.3 s, accented 50,000 x 1-15 s.
The index files are written once into --work-dir (about 440 MB) and reused.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_balance.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

CORPORA = (("aishell2", 1_000_000), ("librispeech", 281_241), ("accented", 50_000))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-balance")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--shard-duration", type=float, default=3600.0)
    p.add_argument("--scale", type=float, default=1.0, help="Fraction of the corpus sizes (for a quick run).")
    p.add_argument("--no-write", action="store_true", help="Skip the writing-phase benchmark.")
    return p.parse_args()


def durations(scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2024)
    sizes = {name: int(n * scale) for name, n in CORPORA}
    return {
        "aishell2": np.round(np.clip(rng.gamma(9.0, 0.4, sizes["aishell2"]), 0.8, 20.0), 3),
        "librispeech": np.round(np.clip(rng.normal(12.3, 3.6, sizes["librispeech"]), 1.0, 35.0), 3),
        "accented": np.round(rng.uniform(1.0, 15.0, sizes["accented"]), 3),
    }


def write_index(path: str, name: str, secs: np.ndarray) -> None:
    """Index lines as `shardkit index` writes them (1000 utterances per source shard)."""
    from shardkit.commands.index import dumps_line

    if os.path.exists(path):
        return
    with open(path + ".partial", "wb", buffering=1 << 22) as f:
        for i, s in enumerate(secs.tolist()):
            key = f"{name}/S{i // 300:05d}-U{i:07d}"
            frames = int(round(s * 16000))
            wav = 44 + 2 * frames
            offset = (i % 1000) * 120_000
            f.write(dumps_line({"shard": f"/data/{name}/shards_{i // 1000:09d}.tar", "key": key, "corpus": name,
                                "audio": key + ".wav", "format": "wav", "bytes": wav + 40, "sample_rate": 16000,
                                "channels": 1, "frames": frames, "duration": s, "text_chars": 20,
                                "members": [[key + ".txt", offset + 512, 40], [key + ".wav", offset + 1536, wav]]}))
    os.replace(path + ".partial", path)


def check_plan(plan, total_in: int) -> None:
    secs = plan.shard_seconds
    assert plan.balanced, plan.summary()
    assert plan.num_shards % (plan.world_size * plan.num_workers) == 0
    assert total_in <= len(plan.utt) < total_in + plan.num_shards
    counts = plan.shard_corpus_counts
    assert (counts.max(axis=0) - counts.min(axis=0) <= 1).all()
    assert np.abs(secs - secs.mean()).max() <= plan.tolerance


def main(args) -> None:
    from shardkit.planning.balance import PlanSettings, plan_balance

    os.makedirs(args.work_dir, exist_ok=True)
    data = durations(args.scale)
    total = sum(len(d) for d in data.values())
    paths = {name: os.path.join(args.work_dir, f"{name}-{args.scale:g}.jsonl") for name in data}
    started = time.perf_counter()
    for name, secs in data.items():
        write_index(paths[name], name, secs)
    print(f"# index files ready in {time.perf_counter() - started:.1f} s: "
          f"{sum(os.path.getsize(p) for p in paths.values()) / 1e6:.0f} MB, {total} utterances, "
          f"{sum(d.sum() for d in data.values()) / 3600:.0f} h", file=sys.stderr)
    machine = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
               "processor": platform.processor() or platform.uname().machine, "numpy": np.__version__}
    common = dict(world_size=args.world_size, num_workers=args.num_workers, shard_duration=args.shard_duration)

    plan_times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        plan = plan_balance(list(data.values()), [1.0, 1.0, 1.0], PlanSettings(seed=0, **common), names=list(data))
        plan_times.append(time.perf_counter() - t0)
        check_plan(plan, total)
    print(json.dumps({"bench": "plan", "utterances": total, "shards": plan.num_shards,
                      "utterances_per_shard": plan.utts_per_shard, "max_deviation_s": round(plan.max_deviation, 3),
                      "tolerance_s": round(plan.tolerance, 3), "median_s": round(statistics.median(plan_times), 3),
                      "runs_s": [round(t, 3) for t in plan_times], **common, **machine}))

    # what `plan` shows for the same mix cut the naive way (1000 utterances per shard, corpus by
    # corpus, as WeNet's writer does) against the balanced plan
    from shardkit.planning.partition import plan_figures

    naive_utts, naive_secs = [], []
    for secs in data.values():
        for start in range(0, len(secs), 1000):
            naive_utts.append(len(secs[start:start + 1000]))
            naive_secs.append(float(secs[start:start + 1000].sum()))
    naive = plan_figures(naive_utts, naive_secs, world_size=args.world_size, num_workers=args.num_workers, epochs=3)
    balanced = plan_figures(np.full(plan.num_shards, plan.utts_per_shard), plan.shard_seconds,
                            world_size=args.world_size, num_workers=args.num_workers, epochs=3)
    for name, fig in (("naive_1000_utts", naive), ("balanced", balanced)):
        print(json.dumps({"bench": "rank_spread", "layout": name, "shards": fig["shards"], "divides": fig["divides"],
                          "rank_spread_per_epoch": [e["rank_spread"] for e in fig["epochs"]],
                          "rank_hours_min_max_epoch0": [round(fig["epochs"][0]["rank_seconds_min"] / 3600, 2),
                                                        round(fig["epochs"][0]["rank_seconds_max"] / 3600, 2)]}))

    dry_times, rss = [], []
    corpus_args = [a for name in data for a in ("--corpus", f"{name}={paths[name]}")]
    command = [sys.executable, "-m", "shardkit", "balance", *corpus_args, "--world-size", str(args.world_size),
               "--num-workers", str(args.num_workers), "--shard-duration", str(args.shard_duration),
               "-o", os.path.join(args.work_dir, "out"), "--dry-run", "--json", "-q", "--epochs", "3"]
    for _ in range(args.repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, check=True)
        dry_times.append(time.perf_counter() - t0)
        rss.append(max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024)
        report = json.loads(done.stdout)
        assert report["balanced"] and report["plan"]["divides"] and report["utterances"] >= total
        assert report["plan"]["worst_rank_spread"] < 1.001, report["plan"]["worst_rank_spread"]
    print(json.dumps({"bench": "dry_run_from_index", "utterances": total, "shards": report["num_shards"],
                      "worst_rank_spread": report["plan"]["worst_rank_spread"],
                      "median_s": round(statistics.median(dry_times), 3), "runs_s": [round(t, 3) for t in dry_times],
                      "max_rss_mb": round(max(rss), 1), **common, **machine}))
    if not args.no_write:
        bench_write(args, machine)


def bench_write(args, machine) -> None:
    """The writing phase against `convert` on the same plain-tar sources (both write zst:3, -j 1)."""
    import shutil

    from shardkit.commands.balance import BalanceSettings, CorpusSource, run_balance
    from shardkit.commands.convert import ConvertSettings, run_convert
    from shardkit.run.options import RunOptions
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    root = os.path.join(args.work_dir, "write")
    specs = (CorpusSpec("aishell", 300, 2.0, 6.0, "zh"), CorpusSpec("librispeech", 90, 8.0, 20.0, "en"),
             CorpusSpec("accented", 60, 1.0, 15.0, "mix"))
    if not os.path.exists(os.path.join(root, "ready")):
        shutil.rmtree(root, ignore_errors=True)
        for spec in specs:
            write_shards(corpus_utterances(spec, seed=3), os.path.join(root, spec.name), utts_per_shard=100)
        open(os.path.join(root, "ready"), "w").close()
    sources = [os.path.join(root, spec.name) for spec in specs]
    tar_bytes = sum(os.path.getsize(os.path.join(d, f)) for d in sources for f in os.listdir(d) if f.endswith(".tar"))
    times = {"balance": [], "convert": []}
    for _ in range(args.repeats):
        for name in times:
            out = os.path.join(root, "out-" + name)
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            if name == "balance":
                report = run_balance([CorpusSource(spec.name, (d,)) for spec, d in zip(specs, sources)], out,
                                     BalanceSettings(world_size=2, num_workers=2, shard_duration=600.0),
                                     RunOptions(jobs=1))
                assert report.exit_code == 0 and report.plan.balanced
            else:
                report = run_convert(sources, out, ConvertSettings(codec="zst", level=3), RunOptions(jobs=1), keep_tree=True)
                assert report.exit_code == 0
            times[name].append(time.perf_counter() - t0)
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"bench": "write_vs_convert", "source_mb": round(tar_bytes / 1e6, 1),
                      "balance_median_s": round(medians["balance"], 3), "convert_median_s": round(medians["convert"], 3),
                      "balance_mb_per_s": round(tar_bytes / medians["balance"] / 1e6, 1),
                      "convert_mb_per_s": round(tar_bytes / medians["convert"] / 1e6, 1),
                      "balance_over_convert_time": round(medians["balance"] / medians["convert"], 3),
                      "runs_s": times, **machine}))


if __name__ == "__main__":
    parsed = parse_args()
    main(parsed)
