"""Benchmark: the trainer-batch simulation inside ``balance --dry-run --wenet-conf`` (one process per checkout).

Runs balance in-process from ``--checkout`` (default: this one) on the ``bench_plan_scale.py`` indexes,
the conf of ``bench_wenet_conf_read.py``, 64 ranks x 4 workers, 3,600-s shards, and prints the seconds
of ``MixFilter.report`` (the simulation of the trainer's batches, 3 epochs) and the process's peak RSS
before, during and after it (/proc/self/statm sampled every 20 ms by a thread). Run once per checkout,
alternating, for a before/after:

    for co in /tmp/sim1-base .; do flock /tmp/shardkit-bench.lock .venv/bin/python \\
        benchmarks/bench_wenet_conf_sim.py --checkout $co --size 20; done
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time

CORPORA = ("mandarin", "english", "accented")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkout", default=os.getcwd(), help="The shardkit checkout to import.")
    p.add_argument("--size", default="20", help="Millions of utterances (the indexes must exist).")
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-plan-scale", help="Where the indexes are.")
    p.add_argument("--out-dir", default="/tmp/shardkit-bench-wenet-conf-sim")
    return p.parse_args()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main(args) -> None:
    sys.path.insert(0, os.path.abspath(args.checkout))
    sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
    import bench_wenet_conf_read  # the conf

    try:
        import shardkit.wenet_conf.mix as trainer_commands
    except ImportError:  # a checkout from before the wenet_conf package
        import shardkit.commands.trainer as trainer_commands
    from shardkit.cli import main as cli_main

    os.makedirs(args.out_dir, exist_ok=True)
    conf = os.path.join(args.out_dir, "train.yaml")
    with open(conf, "w") as f:
        f.write(bench_wenet_conf_read.CONF)
    state = {"phase": "before", "peaks": {}, "sim_seconds": None, "rss_at_sim_start_MB": None}

    def sample() -> None:
        while True:
            peaks = state["peaks"]
            peaks[state["phase"]] = max(peaks.get(state["phase"], 0.0), rss_mb())
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    report = trainer_commands.MixFilter.report

    def timed_report(self, *a, **k):
        state["rss_at_sim_start_MB"], state["phase"] = round(rss_mb()), "simulation"
        start = time.perf_counter()
        try:
            return report(self, *a, **k)
        finally:
            state["sim_seconds"], state["phase"] = round(time.perf_counter() - start, 2), "after"

    trainer_commands.MixFilter.report = timed_report
    files = [os.path.join(args.work_dir, f"{args.size}M-{c}.parquet") for c in CORPORA]
    sys.argv = ["shardkit", "balance", "--world-size", "64", "--num-workers", "4", "--shard-duration", "3600", "-o",
                os.path.join(args.out_dir, "o"), "--dry-run", "--json", "-q", "--wenet-conf", conf,
                "--dropped-keys", os.path.join(args.out_dir, "dropped.txt")]
    sys.argv += [a for c, f in zip(CORPORA, files) for a in ("--corpus", f"{c}={f}")]
    start = time.perf_counter()
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # balance's --json document
        try:
            cli_main()
        except SystemExit:
            pass
    print(json.dumps({"checkout": args.checkout, "utterances_M": float(args.size),
                      "balance_seconds": round(time.perf_counter() - start, 2),
                      "simulation_seconds": state["sim_seconds"], "rss_at_sim_start_MB": state["rss_at_sim_start_MB"],
                      "peak_rss_MB": {k: round(v) for k, v in state["peaks"].items()}}))


if __name__ == "__main__":
    main(parse_args())
