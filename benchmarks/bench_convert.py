"""Benchmark `shardkit convert` against the shell pipeline and the decompressor alone.

    python benchmarks/bench_convert.py --corpus-mb 320 --shards 10 --workdir /tmp/skbench-convert

Measures, on one bz2 corpus in one run (configurations interleaved, medians of --repeat runs):
  - lbzip2 -dc -n1 | zstd -3 -T1 per shard (the shell pipeline users run today);
  - indexed_bzip2 decompression alone (the limit for one core);
  - shardkit convert bz2 -> zst:3 with -j1 (--threads 1 and default threads) and -j2;
  - whole machine against whole machine: `lbzip2 -dc -nC | zstd -3 -TC` per shard (C = cores)
    against `shardkit convert` with its defaults (jobs = cores, threads chosen per task), and the
    same for the code at --baseline-root (another checkout, for before/after in one run);
  - output size ratios per codec, and peak memory converting one ~1 GB shard.
Every shardkit run verifies its output (read back, member digests compared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import emit_results, machine_info, make_corpus  # noqa: E402


def tar_bytes(paths):
    import bz2

    total = 0
    for p in paths:
        with bz2.open(p) as f:
            while chunk := f.read(1 << 22):
                total += len(chunk)
    return total


def run_pipeline(paths, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for p in paths:
        out = os.path.join(out_dir, os.path.basename(p).replace(".bz2", ".zst"))
        subprocess.run(f"lbzip2 -dc -n1 '{p}' | zstd -3 -T1 -q -f -o '{out}'", shell=True, check=True)


def run_decompress_only(paths):
    import indexed_bzip2

    for p in paths:
        with indexed_bzip2.open(p, parallelization=1) as f:
            while f.read(1 << 20):
                pass


CPU_SECONDS: dict[str, list[float]] = {}  # configuration -> CPU seconds of each run, all its processes


def with_cpu_count(cmd: list[str], name: str | None) -> tuple[list[str], callable]:
    """``cmd`` under ``perf stat -e task-clock`` (which counts every process it starts, forkserver
    workers included), and a function that records the run's CPU seconds under ``name``.

    On a shared machine CPU time is the robust figure; wall time is what the user waits."""
    if name is None or not shutil.which("perf"):
        return cmd, lambda: None
    out = f"/tmp/bench_convert_perf_{os.getpid()}.txt"

    def record():
        with open(out) as f:
            ms = next(float(line.split(",")[0]) for line in f if "task-clock" in line)
        CPU_SECONDS.setdefault(name, []).append(ms / 1e3)
    return ["perf", "stat", "-x", ",", "-e", "task-clock", "-o", out, "--", *cmd], record


def run_pipeline_whole(paths, out_dir, cores, name=None):
    os.makedirs(out_dir, exist_ok=True)
    script = "; ".join(f"lbzip2 -dc -n{cores} '{p}' | zstd -3 -T{cores} -q -f -o "
                       f"'{os.path.join(out_dir, os.path.basename(p).replace('.bz2', '.zst'))}'" for p in paths)
    cmd, record = with_cpu_count(["sh", "-ec", script], name)
    subprocess.run(cmd, check=True)
    record()


def run_shardkit(paths, out_dir, *args, root=None, name=None):
    """``shardkit convert`` in a fresh process; ``root``: run that checkout's code instead of this one's."""
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd, record = with_cpu_count([sys.executable, "-m", "shardkit", "convert", *paths, "-o", out_dir, "-q",
                                  "--json", *args], name)
    env = None if root is None else {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root, env=env)
    record()
    report = json.loads(proc.stdout)
    assert report["failed"] == 0 and report["ok"] == len(paths), report
    return report


def peak_memory_mb(src, out_dir, *args):
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [sys.executable, "-c", "import resource,subprocess,sys; subprocess.run(sys.argv[1:], check=True);"
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
           sys.executable, "-m", "shardkit", "convert", src, "-o", out_dir, "-q", "-j", "1", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[-1]
    return int(out) / 1024


def make_big_plain_shard(path, target_bytes):
    """One plain tar of ~target_bytes, built by repeating a few real utterances under new keys."""
    from shardkit.io.synth import encode, speech_like
    from shardkit.io.tar import TarWriter

    if os.path.exists(path) and os.path.getsize(path) >= target_bytes:
        return path
    audio = [encode(speech_like(s, seed=i), 16000) for i, s in enumerate((3.1, 7.7, 12.4, 5.2))]
    with open(path + ".tmp", "wb") as f:
        w = TarWriter(f)
        i = 0
        while w._offset < target_bytes:
            w.add(f"big/u{i:07d}.txt", b"SOME TEXT")
            w.add(f"big/u{i:07d}.wav", audio[i % 4])
            i += 1
        w.close()
    os.replace(path + ".tmp", path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus-mb", type=float, default=320)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--workdir", default="/tmp/skbench-convert")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-shard-mb", type=float, default=1024)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: codecs,memory,j2,one-core,whole")
    ap.add_argument("--baseline-root", default=None,
                    help="another checkout of shardkit: its convert runs beside this one's (whole machine)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    os.makedirs(args.workdir, exist_ok=True)
    t = time.perf_counter()
    paths = make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb, shards=args.shards)
    print(f"corpus ready in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    total_tar = tar_bytes(paths)
    hours = total_tar / 32000 / 3600
    out = os.path.join(args.workdir, "out")
    configs = {}
    if "one-core" not in skip:
        configs = {
            "pipeline lbzip2 -n1 | zstd -3 -T1": lambda: run_pipeline(paths, out + "-pipe"),
            "indexed_bzip2 decompress only (p=1)": lambda: run_decompress_only(paths),
            "shardkit -j1 --threads 1": lambda: run_shardkit(paths, out, "-j", "1", "--threads", "1"),
            "shardkit -j1 (threads=cores)": lambda: run_shardkit(paths, out, "-j", "1"),
        }
        if "j2" not in skip:
            configs["shardkit -j2 --threads 1"] = lambda: run_shardkit(paths, out, "-j", "2", "--threads", "1")
    cores = os.cpu_count() or 1
    whole_pipe = f"whole machine: lbzip2 -n{cores} | zstd -3 -T{cores}"
    if "whole" not in skip:
        configs[whole_pipe] = lambda: run_pipeline_whole(paths, out + "-pipe-whole", cores, name=whole_pipe)
        name_new = "whole machine: shardkit convert (defaults)"
        configs[name_new] = lambda: run_shardkit(paths, out, name=name_new)
        name_nv = "whole machine: shardkit convert --no-verify"
        configs[name_nv] = lambda: run_shardkit(paths, out, "--no-verify", name=name_nv)
        if args.baseline_root:
            name_base = "whole machine: baseline shardkit convert (defaults)"
            configs[name_base] = lambda: run_shardkit(paths, out + "-base", root=os.path.abspath(args.baseline_root),
                                                      name=name_base)
    times = {name: [] for name in configs}
    for _ in range(args.repeat):  # interleaved, so machine noise spreads over every configuration
        for name, fn in configs.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    results = {"machine": machine_info(), "corpus": {"shards": len(paths), "tar_bytes": total_tar,
               "bz2_bytes": sum(os.path.getsize(p) for p in paths), "hours": hours}, "rows": {}}
    for name, ts in times.items():
        med = sorted(ts)[len(ts) // 2]
        results["rows"][name] = {"median_s": med, "runs": ts, "tar_mb_s": total_tar / med / 1e6,
                                 "hours_audio_per_s": hours / med}
    if "one-core" not in skip:
        base = results["rows"]["pipeline lbzip2 -n1 | zstd -3 -T1"]["median_s"]
        j1 = results["rows"]["shardkit -j1 --threads 1"]["median_s"]
        for name, row in results["rows"].items():
            row["vs_pipeline"] = base / row["median_s"]
            row["vs_shardkit_j1"] = j1 / row["median_s"]
    if "whole" not in skip:  # each round's time against the whole-machine pipeline of the same round
        pipe_runs = times[whole_pipe]
        for name, row in results["rows"].items():
            if name.startswith("whole machine"):
                ratios = sorted(p / t for p, t in zip(pipe_runs, times[name]))
                row["vs_whole_pipeline_per_round"] = ratios
                row["vs_whole_pipeline_median"] = ratios[len(ratios) // 2]
                cpu = CPU_SECONDS.get(name)
                if cpu:  # CPU seconds of all processes; pipeline CPU / this CPU, per round
                    row["cpu_s"] = cpu
                    row["cpu_s_median"] = sorted(cpu)[len(cpu) // 2]
                    cpu_ratios = sorted(p / c for p, c in zip(CPU_SECONDS[whole_pipe], cpu))
                    row["cpu_vs_whole_pipeline_median"] = cpu_ratios[len(cpu_ratios) // 2]
    if "codecs" not in skip:
        sizes = {}
        for codec in ("none", "zst:1", "zst:3", "zst:19", "gz", "xz", "bz2"):
            name, _, level = codec.partition(":")
            extra = ["--level", level] if level else []
            t = time.perf_counter()
            rep = run_shardkit(paths[:2], out + "-sizes", "--codec", name, *extra)
            sizes[codec] = {"ratio_to_tar": rep["bytes_out"] / rep["tar_bytes_converted"],
                            "seconds_2_shards": time.perf_counter() - t}
        results["size_ratio"] = sizes
    if "memory" not in skip:
        big = make_big_plain_shard(os.path.join(args.workdir, "big.tar"), int(args.big_shard_mb * 1e6))
        results["peak_rss_mb_1gb_shard"] = {
            "plain->zst:3": peak_memory_mb(big, out + "-big"),
            "size_bytes": os.path.getsize(big),
        }
        shutil.rmtree(out + "-big", ignore_errors=True)
    emit_results(results, args.json_out)


if __name__ == "__main__":
    main()
