"""Before/after a restructure: the reader, convert and balance of two checkouts, in one run, on the same data.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_house.py --baseline-root /path/to/old/checkout

Every figure is a fresh process started with PYTHONPATH set to one checkout, so both checkouts run
in the same interpreter and venv; rows and checkouts are interleaved round by round, so machine
noise hits them alike; medians and the spread are reported, with the ratio new / old (the issue's
bar: within 5%). The corpus is made once, with the current checkout, through the CLI alone
(demo -> make -> convert), so the script runs against any checkout that has these commands:

- ``reader``: ``shardkit.iter_samples`` over a zst:3 data.list read ``--reader-passes`` times, every
  utterance decoded to float32; the time inside the process after imports (what a training loop pays);
- ``convert``: ``shardkit convert`` bz2 -> zst:3, verified, ``-j 1``; wall time of the process;
- ``balance``: ``shardkit balance`` of the three corpora (plain tar) for 2 ranks x 2 workers,
  ``-j 1``, into a fresh folder; wall time of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import emit_results, machine_info, markdown_table  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPORA = ("aishell", "librispeech", "accented")
READER = r"""
import sys, time
from shardkit import iter_samples
shards = [line.strip() for line in open(sys.argv[1]) if line.strip()] * int(sys.argv[2])
t = time.perf_counter()
n = frames = 0
for sample in iter_samples(shards, decode=True):
    n += 1
    frames += len(sample["audio"])
print(time.perf_counter() - t, n, frames)
"""


def shardkit(root: str, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": root, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "shardkit", *args], env=env, check=True, capture_output=True,
                          text=True)


def make_data(work: str, minutes: float) -> dict[str, str]:
    """Plain, bz2 and zst:3 shards of the demo's three corpora (made once with this checkout, then reused)."""
    marker = os.path.join(work, "data.json")
    if os.path.exists(marker):
        with open(marker) as f:
            saved = json.load(f)
        if saved.get("minutes") == minutes:
            return saved["paths"]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    shardkit(HERE, "demo", "-o", f"{work}/kaldi", "--minutes", str(minutes))
    for name in CORPORA:
        kaldi = f"{work}/kaldi/{name}"
        segments = ["--segments", f"{kaldi}/segments"] if os.path.exists(f"{kaldi}/segments") else []
        shardkit(HERE, "make", "--wav-scp", f"{kaldi}/wav.scp", "--text", f"{kaldi}/text", *segments,
                 "-o", f"{work}/plain/{name}", "--utts-per-shard", "200", "-q")
    lists = [f"{work}/plain/{name}/data.list" for name in CORPORA]
    shardkit(HERE, "convert", *lists, "-o", f"{work}/bz2", "--codec", "bz2", "--keep-tree", "-q")
    shardkit(HERE, "convert", *lists, "-o", f"{work}/zst", "--codec", "zst:3", "--keep-tree", "-q")
    paths = {"plain": {name: f"{work}/plain/{name}" for name in CORPORA},
             "bz2_list": f"{work}/bz2/data.list", "zst_list": f"{work}/zst/data.list"}
    with open(marker, "w") as f:
        json.dump({"minutes": minutes, "paths": paths}, f)
    return paths


def run_row(row: str, root: str, data: dict, work: str) -> float:
    if row == "reader":
        env = {**os.environ, "PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", READER, data["zst_list"], str(data["reader_passes"])], env=env,
                             check=True, capture_output=True, text=True).stdout.split()
        return float(out[0])
    out_dir = os.path.join(work, f"out-{row}")
    shutil.rmtree(out_dir, ignore_errors=True)
    if row == "convert":
        args = ["convert", data["bz2_list"], "-o", out_dir, "--codec", "zst:3", "-j", "1", "-q"]
    else:
        args = ["balance", *[f"--corpus={n}={p}" for n, p in data["plain"].items()], "--world-size", "2",
                "--num-workers", "2", "--shard-duration", "120", "-o", out_dir, "-j", "1", "-q"]
    started = time.perf_counter()
    shardkit(root, *args)
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-root", required=True, help="the other checkout (before)")
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-house")
    p.add_argument("--minutes", type=float, default=40.0, help="minutes of audio in the three corpora")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--reader-passes", type=int, default=10, help="times the reader row reads the list")
    p.add_argument("--rows", default="reader,convert,balance")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    data = {**make_data(args.work_dir, args.minutes), "reader_passes": args.reader_passes}
    roots = {"before": os.path.abspath(args.baseline_root), "after": HERE}
    rows = args.rows.split(",")
    times: dict[str, dict[str, list[float]]] = {row: {k: [] for k in roots} for row in rows}
    for round_ in range(args.repeats):
        for row in rows:
            order = list(roots) if round_ % 2 == 0 else list(reversed(roots))
            for which in order:
                times[row][which].append(run_row(row, roots[which], data, args.work_dir))
    figures = {row: {which: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)}
                     for which, t in by.items()} for row, by in times.items()}
    for row in rows:
        figures[row]["ratio_after_over_before"] = figures[row]["after"]["median_s"] / figures[row]["before"]["median_s"]
    table = markdown_table(["row", "before (median, min-max)", "after (median, min-max)", "after / before"], [
        [row, *[f"{f[w]['median_s']:.3f} s ({f[w]['min_s']:.3f}-{f[w]['max_s']:.3f})" for w in roots],
         f"{f['ratio_after_over_before']:.3f}"] for row, f in figures.items()])
    emit_results({"machine": machine_info(), "minutes": args.minutes, "repeats": args.repeats,
                  "reader_passes": args.reader_passes, "roots": roots,
                  "figures": figures}, args.json, text=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
