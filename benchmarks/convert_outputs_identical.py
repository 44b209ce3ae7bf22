"""Whether `shardkit convert` of this checkout writes the same outputs as another checkout's (issue 39: every
output byte unchanged), and the CPU each run took, interleaved.

    python benchmarks/convert_outputs_identical.py --baseline /tmp/start39-base --rounds 3 \\
        '/tmp/flac39b/corpus/part00*/*.tar' -- --codec none --audio flac -j1

Both checkouts convert the same shards (the glob) into the same output folder in turn, with the convert options
after ``--``. Compared: every file the run leaves (the shards, data.list, the index parts), index.parquet by its
rows (its metadata stamps the run's output files), and convert.json less each shard's ``seconds``. CPU seconds
are this process's children's (resource.getrusage): exact with -j1; a pool's workers are the forkserver's
children and are not all counted (bench_convert_profile.py counts them with perf).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def snapshot(out: str) -> dict[str, str]:
    """A digest per output (see the module docstring)."""
    import pyarrow.parquet as pq

    digests = {}
    for path in sorted(glob.glob(os.path.join(out, "**"), recursive=True) + glob.glob(os.path.join(out, ".*", "*"))):
        name = os.path.relpath(path, out)
        if name == "index.parquet":
            digests[name + " (rows)"] = hashlib.sha256(repr(pq.read_table(path).to_pylist()).encode()).hexdigest()
        elif os.path.isfile(path) and name != "convert.json":
            with open(path, "rb") as f:
                digests[name] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out, "convert.json")) as f:
        manifest = json.load(f)
    for entry in manifest["shards"]:
        entry.pop("seconds", None)
    digests["convert.json (less seconds)"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return digests


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="another checkout (e.g. git archive of main)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="/tmp/convert-outputs-identical")
    p.add_argument("shards", help="a glob of the shards to convert")
    p.add_argument("convert_args", nargs=argparse.REMAINDER, help="-- then convert's options")
    args = p.parse_args(argv)
    shards = sorted(glob.glob(args.shards))
    if not shards:
        raise SystemExit(f"no shard matches {args.shards}")
    extra = [a for a in args.convert_args if a != "--"]
    roots = {"baseline": os.path.abspath(args.baseline),
             "this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    for root in roots.values():  # as pip install does (PYTHONDONTWRITEBYTECODE would compile every run again)
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(root, "shardkit")], check=True,
                       stdout=subprocess.DEVNULL)
    cpu: dict[str, list[float]] = {label: [] for label in roots}
    digests: dict[str, dict] = {}
    for _ in range(args.rounds):
        for label, root in roots.items():
            shutil.rmtree(args.out, ignore_errors=True)
            before = children_cpu()
            subprocess.run([sys.executable, "-m", "shardkit", "convert", *shards, "-o", args.out, "-q", *extra],
                           cwd=root, env={**os.environ, "PYTHONPATH": root}, check=True)
            cpu[label].append(children_cpu() - before)
            digests.setdefault(label, snapshot(args.out))
    differ = sorted(k for k in set(digests["baseline"]) | set(digests["this"])
                    if digests["baseline"].get(k) != digests["this"].get(k))
    per_round = sorted(b / t for b, t in zip(cpu["baseline"], cpu["this"]))
    print(json.dumps({"outputs": len(digests["this"]), "identical": not differ, "differ": differ,
                      "cpu_s": {k: sorted(v)[len(v) // 2] for k, v in cpu.items()},
                      "baseline_cpu_over_this_per_round_median": round(per_round[len(per_round) // 2], 3),
                      "loadavg": open("/proc/loadavg").read().split()[:3]}, indent=2))
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
