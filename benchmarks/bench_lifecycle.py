"""What the run lifecycle costs: two source trees (before/after) timed in turns on one corpus.

    flock /tmp/shardkit-bench.lock python benchmarks/bench_lifecycle.py --trees /tmp/base,. \
        --workdir /tmp/skbench-lifecycle --repeat 7

For each tree, in interleaved turns (so drift and other load hit both alike), each measured in a
fresh process with that tree first on ``sys.path`` (imports not timed):
  - ``pool``: ``run_tasks`` of 200 and of 2 trivial tasks on the forkserver pool (-j2): fixed and
    marginal cost per task (the new tree adds a worker initializer: PR_SET_PDEATHSIG, a watchdog);
  - ``tiny``: ``run_convert`` (the whole command: claim, lock, journal, atomic verified writes,
    reports) of --tiny-shards plain-tar shards of ~25 KB each, -j1: per-shard overhead;
  - ``convert``: ``run_convert`` bz2 -> zst:3 of a small corpus (--corpus-mb, --shards), -j1.
Wall time and CPU time (user + system of the process) are both kept: on a loaded machine the
CPU time moves far less with other people's work.
Every run checks that all shards converted and that both trees wrote the same bytes. Prints one
JSON line per measurement, then medians and after/before ratios.
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

sys.path.insert(0, os.path.dirname(__file__))
from common import machine_info, make_corpus  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default=None, help="BEFORE,AFTER source trees (folders holding shardkit/)")
    p.add_argument("--workdir", default="/tmp/skbench-lifecycle")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--corpus-mb", type=float, default=40.0)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--tiny-shards", type=int, default=200)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--sources", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


# --- one measurement, in a fresh process whose sys.path starts with the tree under test -----------


def worker(args) -> dict:
    if args.worker == "pool":
        from shardkit.run.executor import run_tasks

        dict(run_tasks(abs, [-1, -2], jobs=2))  # start the forkserver (the same in both trees)
        times = {}
        for n in (2, 200):
            t = time.perf_counter()
            assert dict(run_tasks(abs, [-i for i in range(n)], jobs=2)) == {i: i for i in range(n)}
            times[n] = time.perf_counter() - t
        return {"fixed_ms": times[2] * 1000, "marginal_ms": (times[200] - times[2]) / 198 * 1000}
    from shardkit.commands.convert import ConvertSettings, run_convert
    from shardkit.run.options import RunOptions

    with open(args.sources) as f:
        sources = f.read().split()
    shutil.rmtree(args.out, ignore_errors=True)
    t, cpu = time.perf_counter(), os.times()
    report = run_convert(sources, args.out, ConvertSettings(codec="zst", level=3, threads=1), RunOptions(jobs=1))
    seconds = time.perf_counter() - t
    cpu_s = sum(os.times()[:2]) - sum(cpu[:2])  # user + system: what load from others changes least
    assert all(e["status"] == "ok" for e in report.shards), [e["error"] for e in report.shards]
    import hashlib

    digest = hashlib.sha256(b"".join(bytes.fromhex(e["output"]["sha256"]) for e in report.shards)).hexdigest()
    return {"seconds": seconds, "cpu_s": cpu_s, "ms_per_shard": seconds / len(sources) * 1000,
            "cpu_ms_per_shard": cpu_s / len(sources) * 1000, "outputs_sha256": digest,
            "tar_mb_per_s": sum(e["tar_bytes"] for e in report.shards) / seconds / 1e6}


def measure(tree, mode, sources=None, out=None) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode]
    if sources:
        cmd += ["--sources", sources, "--out", out]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def tiny_corpus(folder: str, count: int) -> list[str]:
    """``count`` plain-tar shards of two short utterances each (~25 KB): the work is all overhead."""
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    utts = corpus_utterances(CorpusSpec("tiny", 2 * count, 0.3, 0.5, "en"), seed=0)
    return write_shards(utts, folder, utts_per_shard=2, codec="none")


def main(args):
    if args.worker:
        print(json.dumps(worker(args)))
        return
    before, after = args.trees.split(",")
    trees = {"before": before, "after": after}
    os.makedirs(args.workdir, exist_ok=True)
    lists = {}
    sources = make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb, shards=args.shards,
                          codec="bz2")
    tiny = tiny_corpus(os.path.join(args.workdir, "tiny"), args.tiny_shards)
    for name, paths in (("convert", sources), ("tiny", tiny)):
        lists[name] = os.path.join(args.workdir, f"{name}.txt")
        with open(lists[name], "w") as f:
            f.write("\n".join(paths) + "\n")
    print(json.dumps({"machine": machine_info(), "trees": trees}), flush=True)
    results = {(mode, label): [] for mode in ("pool", "tiny", "convert") for label in trees}
    digests = {}
    for turn in range(args.repeat):
        order = list(trees.items()) if turn % 2 == 0 else list(trees.items())[::-1]
        for mode in ("pool", "tiny", "convert"):
            for label, tree in order:
                if mode == "pool":
                    row = measure(tree, mode)
                else:
                    row = measure(tree, mode, lists[mode], os.path.join(args.workdir, f"out-{label}"))
                    digests.setdefault(mode, set()).add(row.pop("outputs_sha256"))
                results[(mode, label)].append(row)
                print(json.dumps({"turn": turn, "mode": mode, "tree": label, **row}), flush=True)
    assert all(len(d) == 1 for d in digests.values()), "the two trees wrote different bytes"

    def med(mode, label, key):
        return statistics.median(r[key] for r in results[(mode, label)])

    print(f"\nmedians of {args.repeat} interleaved turns; ratio = after / before\n")
    print("| measurement | before | after | ratio |")
    print("|---|---:|---:|---:|")
    for mode, key, unit in (("pool", "fixed_ms", "ms"), ("pool", "marginal_ms", "ms per task"),
                            ("tiny", "ms_per_shard", f"ms per shard ({args.tiny_shards} tiny shards, run_convert -j1)"),
                            ("tiny", "cpu_ms_per_shard", "CPU ms per shard"),
                            ("convert", "seconds", f"s ({args.shards} bz2 shards -> zst:3, -j1)"),
                            ("convert", "cpu_s", "CPU s"),
                            ("convert", "tar_mb_per_s", "MB/s of tar")):
        b, a = med(mode, "before", key), med(mode, "after", key)
        print(f"| {mode}: {unit} ({key}) | {b:.3f} | {a:.3f} | {a / b:.3f} |")


if __name__ == "__main__":
    main(parse_args())
