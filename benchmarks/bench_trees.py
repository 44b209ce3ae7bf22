"""The reader and convert of two source trees of shardkit, side by side in one run on the same data.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_trees.py \
        --before /tmp/base --after . --corpus-mb 160 --repeat 5

For a change that must not cost speed (the move into layer packages, issue 22): each round runs every
row once for each tree, the trees alternating, in fresh processes (``PYTHONPATH=TREE``), so noise and
the page cache hit both alike. Rows: ``iter_samples`` over plain-tar and zst:3 WAV shards (read,
group, decode to float32; every utterance counted), and ``shardkit convert`` bz2 -> zst:3 and
plain -> zst:3 (``-j 1``, whole process, start-up included; every shard converted). Reports medians
and after/before ratios of speed (>1 is faster after).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bench_corpus, corpus_parser, emit_results, machine_info, markdown_table  # noqa: E402

READ = """
import sys, time
from shardkit import iter_samples
t = time.perf_counter(); n = 0
for sample in iter_samples(sys.argv[1], dtype="float32"):
    n += 1
print(n, time.perf_counter() - t)
"""


def read_row(tree: str, data_list: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run([sys.executable, "-c", READ, data_list], env=env, capture_output=True, text=True, check=True)
    n, seconds = out.stdout.split()
    return int(n), float(seconds)


def convert_row(tree: str, shards: list[str], out_dir: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "shardkit", "convert", *shards, "-o", out_dir, "-j", "1", "--codec",
                          "zst", "--level", "3", "-q", "--json", "--overwrite"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"convert failed in {tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)["ok"], seconds


def main(argv=None) -> None:
    p = corpus_parser(__doc__, corpus_mb=160, work_dir="/tmp/skbench-trees")
    p.add_argument("--before", required=True, help="the source tree before the change (a checkout's root)")
    p.add_argument("--after", default=".", help="the source tree after it")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    totals, layout = bench_corpus(args.work_dir, args.corpus_mb, formats=("none", "zst:3", "bz2"))
    lists = {}
    for spec in ("none", "zst:3"):
        lists[spec] = os.path.join(args.work_dir, f"{spec.replace(':', '')}.list")
        with open(lists[spec], "w") as f:
            f.writelines(path + "\n" for path in layout[f"{spec}/wav"])
    rows = {"iter_samples plain": lambda tree: read_row(tree, lists["none"]),
            "iter_samples zst:3": lambda tree: read_row(tree, lists["zst:3"]),
            "convert bz2 -> zst:3 -j1": lambda tree: convert_row(tree, layout["bz2/wav"], out_dir),
            "convert plain -> zst:3 -j1": lambda tree: convert_row(tree, layout["none/wav"], out_dir)}
    expected = {"iter_samples plain": totals["utterances"], "iter_samples zst:3": totals["utterances"],
                "convert bz2 -> zst:3 -j1": len(layout["bz2/wav"]), "convert plain -> zst:3 -j1": len(layout["none/wav"])}
    seconds: dict[str, dict[str, list[float]]] = {row: {"before": [], "after": []} for row in rows}
    with tempfile.TemporaryDirectory(dir=args.work_dir) as out_dir:
        for round_ in range(args.repeat):
            for row, fn in rows.items():
                order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                for which in order:
                    count, took = fn(getattr(args, which))
                    assert count == expected[row], (row, which, count, expected[row])
                    seconds[row][which].append(took)
    results = {"machine": machine_info(), "corpus": totals, "repeat": args.repeat, "rows": {}}
    table = []
    for row, runs in seconds.items():
        before, after = statistics.median(runs["before"]), statistics.median(runs["after"])
        results["rows"][row] = {"before_s": before, "after_s": after, "speed_ratio": before / after, "runs": runs}
        table.append([row, f"{before:.3f}", f"{after:.3f}", f"{before / after:.3f}x"])
    text = markdown_table(["row", "before s (median)", "after s (median)", "after / before speed"], table)
    emit_results(results, args.json, text=text)


if __name__ == "__main__":
    main()
