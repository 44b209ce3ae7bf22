"""Where convert's seconds go against `lbzip2 -dc | zstd -3`: a profile by part, and the run's shape (issue 39).

    python benchmarks/bench_convert_profile.py --corpus-mb 330 --shards 5 --repeat 3 \\
        --workdir /tmp/skbench-convert-profile --baseline-root /tmp/shardkit-base

Three parts, on the bz2 corpus of `bench_convert.py` (`benchmarks/common.py:make_corpus`):

1. **By part, one shard, one thread** (CPU seconds, the medians of --repeat rounds, parts interleaved):
   the pipeline's tools (`lbzip2 -dc -n1`, `zstd -3 -T1`, and the two joined by a pipe) against the parts
   convert does on the same shard: bz2 decoding (indexed_bzip2, parallelization 1), the checked tar
   parse, the member digests (sha256), tar writing with zstd -3 in the seekable format, the output
   file's sha256, the read-back (zstd decoding, parse, digests), the index records, fsync; then the
   whole ``convert_shard`` in this process: what it costs beyond the parts is Python glue.
2. **Start-up**: CPU seconds of ``shardkit convert`` on two tiny shards with -j1 (no pool) and -j2
   (forkserver pool), against the pipeline on the same shards: what a run pays before and after its work;
   then the forkserver's preload alone per checkout, and ``import numpy`` with and without OpenBLAS's threads
   (at least 5 rounds).
3. **Shape of the whole machine** (defaults: -j = cores, threads chosen per task): per shard, when its
   task started and ended relative to the run's start, the index assembly after the last one, and the
   run's wall and CPU seconds, against `lbzip2 -dc -nC | zstd -3 -TC` per shard; and this code with -j1
   (one process, no pool: each shard decoded on every core in turn, as lbzip2 does). With --baseline-root
   (another checkout), its run is measured in the same rounds.

Both checkouts are byte-compiled first, as `pip install` does: where PYTHONDONTWRITEBYTECODE is set (as on
the development machine), every process would otherwise compile shardkit's modules again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-mb", type=float, default=330.0)
    p.add_argument("--shards", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", default="/tmp/skbench-convert-profile")
    p.add_argument("--baseline-root", default=None, help="another checkout: its whole-machine run beside this one's")
    p.add_argument("--skip", default="", help="comma list of parts to skip: parts,startup,imports,shape")
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def shell_cpu(script: str) -> tuple[float, float]:
    """(CPU s of every process the script ran, wall s)."""
    before, start = children_cpu(), time.perf_counter()
    subprocess.run(["sh", "-ec", script], check=True)
    return children_cpu() - before, time.perf_counter() - start


def counted_run(cmd: list[str], **kwargs) -> tuple[float | None, float, subprocess.CompletedProcess]:
    """(CPU s, wall s, the process) of ``cmd``; the CPU counted by ``perf stat -e task-clock``, which follows
    every process it starts (forkserver workers, whose parent is not this one, included); None without perf."""
    out = os.path.join(tempfile.gettempdir(), f"bench_convert_profile_perf_{os.getpid()}.txt")
    perf = shutil.which("perf")
    full = ["perf", "stat", "-x", ",", "-e", "task-clock", "-o", out, "--", *cmd] if perf else cmd
    start = time.perf_counter()
    proc = subprocess.run(full, check=True, **kwargs)
    wall = time.perf_counter() - start
    if not perf:
        return None, wall, proc
    with open(out) as f:
        ms = next(float(line.split(",")[0]) for line in f if "task-clock" in line)
    return ms / 1e3, wall, proc


def cpu_of(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


# --- 1. parts ------------------------------------------------------------------------------------------


def part_timers(shard: str, tar: str, work: str) -> dict:
    """name -> a function that does that part of convert alone (CPU measured around it)."""
    import hashlib

    import indexed_bzip2

    from shardkit.commands.convert import ConvertSettings, convert_shard
    from shardkit.io.codecs import open_writer
    from shardkit.io.files import HashingFile
    from shardkit.io.indexfile import ShardRecords
    from shardkit.io.tar import TarWriter, iter_shard_members
    from shardkit.run.lifecycle import member_digests

    members = list(iter_shard_members(tar))
    out_zst = os.path.join(work, "part.tar.zst")

    def decode():
        with indexed_bzip2.open(shard, parallelization=1) as f:
            while f.read(1 << 20):
                pass

    def parse():
        for _ in iter_shard_members(tar):
            pass

    def digests():
        for _, data in members:
            hashlib.sha256(data).digest()

    def write_zst():
        with open(out_zst, "wb") as f:
            out = open_writer(f, "zst", 3)
            w = TarWriter(out)
            for name, data in members:
                w.add(name, data)
            w.close()
            out.close()

    def file_sha():
        h = hashlib.sha256()
        with open(out_zst, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)

    def readback():
        member_digests(out_zst)

    def index_records():
        records = ShardRecords.for_shard(os.path.join(work, "idx.tar.zst"))
        offset = 0
        for name, data in members:
            offset += 512 + len(data) + (-len(data) % 512)
            records.add_written(offset, name, data, len(data))
        records.finish()

    def fsync():
        with open(out_zst, "rb+") as f:
            f.write(f.read(1))
            f.flush()
            os.fsync(f.fileno())

    def whole(verify: bool):
        def run():
            dst = os.path.join(work, f"whole{int(verify)}.tar.zst")
            entry = convert_shard(shard, dst, ConvertSettings(threads=1, verify=verify))
            assert entry["status"] == "ok", entry
        return run

    return {"bz2 decoding (indexed_bzip2, 1 thread)": decode, "tar parse (checked reader, plain tar)": parse,
            "member sha256": digests, "tar writing + zstd -3 (seekable)": write_zst, "output file sha256": file_sha,
            "read-back alone (zstd decode, parse, sha256)": readback, "index records": index_records,
            "fsync": fsync, "convert_shard, verified (one thread)": whole(True),
            "convert_shard, --no-verify (one thread)": whole(False)}


def measure_parts(shard: str, work: str, repeat: int) -> dict:
    tar = os.path.join(work, "shard.tar")
    if not os.path.exists(tar):
        with open(tar + ".tmp", "wb") as out:
            subprocess.run(["lbzip2", "-dc", "-n2", shard], stdout=out, check=True)
        os.replace(tar + ".tmp", tar)
    timers = part_timers(shard, tar, work)
    pipeline = {
        "lbzip2 -dc -n1": f"lbzip2 -dc -n1 '{shard}' > /dev/null",
        "zstd -3 -T1 (of the tar)": f"zstd -3 -T1 -q -c '{tar}' > /dev/null",
        "lbzip2 -dc -n1 | zstd -3 -T1 (the pipeline, per shard)": f"lbzip2 -dc -n1 '{shard}' | zstd -3 -T1 -q -c > '{work}/p.zst'",
    }
    rounds = []
    for _ in range(repeat):
        row = {}
        for name, script in pipeline.items():
            row[name] = shell_cpu(script)[0]
        for name, fn in timers.items():
            row[name] = cpu_of(fn)
        rounds.append(row)
    # the least of the rounds as well: on a busy machine other work only ever adds to a part's CPU seconds
    return {name: {"median": round(statistics.median(r[name] for r in rounds), 3),
                   "least": round(min(r[name] for r in rounds), 3)} for name in rounds[0]}


# --- 2. start-up ---------------------------------------------------------------------------------------


def measure_startup(tiny: list[str], work: str, repeat: int, roots: dict[str, str]) -> dict:
    out = os.path.join(work, "startup-out")
    rows: dict[str, list[float]] = {}
    pipe = "; ".join(f"lbzip2 -dc -n2 '{p}' | zstd -3 -T2 -q -f -o '{work}/t{i}.zst'" for i, p in enumerate(tiny))
    for _ in range(repeat):
        rows.setdefault("pipeline, 2 tiny shards", []).append(shell_cpu(pipe)[0])
        for label, root in roots.items():
            for jobs in (1, 2):
                shutil.rmtree(out, ignore_errors=True)
                env = {**os.environ, "PYTHONPATH": root}
                cpu, _, _ = counted_run([sys.executable, "-m", "shardkit", "convert", *tiny, "-o", out, "-q", "-j",
                                         str(jobs), "--codec", "zst"], env=env, cwd=root, stdout=subprocess.DEVNULL)
                rows.setdefault(f"{label}: shardkit convert -j{jobs}, 2 tiny shards", []).append(cpu or 0.0)
    return {name: round(statistics.median(v), 3) for name, v in rows.items()}


# the forkserver's preload (what every pool worker starts with), and numpy's import with OpenBLAS's threads and
# without them (the CLI asks for one where it has _one_blas_thread): CPU s of a fresh interpreter each
_PRELOAD = ("import shardkit.commands.convert as c, shardkit.run.executor as e; "
            "import importlib; [importlib.import_module(m) for m in [e._DEATHSIG_MODULE, *c.WORKER_MODULES]]")


def measure_imports(repeat: int, roots: dict[str, str]) -> dict:
    """CPU seconds of the forkserver's imports per checkout (with the environment its CLI gives the server),
    and of ``import numpy`` with OpenBLAS's default threads and with one; medians of interleaved rounds."""
    runs = {"import numpy (OpenBLAS: a thread per core)": ("import numpy", roots["this"], {}),
            "import numpy, OPENBLAS_NUM_THREADS=1": ("import numpy", roots["this"], {"OPENBLAS_NUM_THREADS": "1"})}
    for label, root in roots.items():
        blas = subprocess.run([sys.executable, "-c", "import shardkit.cli.convert as c; "
                               "print(int(hasattr(c, '_one_blas_thread')))"], env={**os.environ, "PYTHONPATH": root},
                              cwd=root, capture_output=True, text=True, check=True).stdout.strip() == "1"
        runs[f"{label}: the forkserver's preload"] = (_PRELOAD, root, {"OPENBLAS_NUM_THREADS": "1"} if blas else {})
    rows: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, (code, root, env) in runs.items():
            clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
            before = children_cpu()
            subprocess.run([sys.executable, "-c", code], env={**clean, "PYTHONPATH": root, **env}, cwd=root, check=True)
            rows[name].append(children_cpu() - before)
    return {name: round(statistics.median(v), 3) for name, v in rows.items()}


# --- 3. shape ------------------------------------------------------------------------------------------

_SHAPE = r"""
import json, os, sys, time


def main(out, shards):
    t0 = time.perf_counter()
    marks = {}
    jobs = int(os.environ.get("SHAPE_JOBS") or 0) or None
    try:  # as the CLI does: one OpenBLAS thread, then the pool's forkserver starts before the command's imports
        from shardkit.cli import convert as cli  # (each where the code has it)
        getattr(cli, "_one_blas_thread", lambda: None)()
        cli._start_workers_early("local", jobs)
    except ImportError:
        pass
    from shardkit.commands import convert
    from shardkit.run.options import RunOptions
    marks["imported"] = time.perf_counter() - t0
    index_beside = convert.index_beside

    def timed(*args, **kwargs):
        marks["index start"] = time.perf_counter() - t0
        result = index_beside(*args, **kwargs)
        marks["index end"] = time.perf_counter() - t0
        return result

    convert.index_beside = timed
    tasks = []

    def on_event(event):
        if event.kind == "done" and isinstance(event.result, dict):
            end = time.perf_counter() - t0
            tasks.append({"shard": os.path.basename(event.result["source"]["path"]),
                          "start": round(end - event.result["seconds"], 3), "end": round(end, 3)})

    report = convert.run_convert(shards, out, convert.ConvertSettings(codec="zst", level=3, threads=None),
                                 RunOptions(jobs=jobs, on_event=on_event))
    assert report.exit_code == 0, [e["error"] for e in report.shards]
    marks["returned"] = time.perf_counter() - t0
    print(json.dumps({"marks": {k: round(v, 3) for k, v in marks.items()}, "tasks": tasks}))


if __name__ == "__main__":  # pool workers import this file as __mp_main__: nothing may run then
    main(sys.argv[1], sys.argv[2:])
"""


def measure_shape(shards: list[str], work: str, repeat: int, roots: dict[str, str]) -> dict:
    cores = os.cpu_count() or 1
    script = os.path.join(work, "shape_probe.py")
    with open(script, "w") as f:
        f.write(_SHAPE)
    pipe = "; ".join(f"lbzip2 -dc -n{cores} '{p}' | zstd -3 -T{cores} -q -f -o '{work}/w{i}.zst'"
                     for i, p in enumerate(shards))
    runs: dict[str, list[dict]] = {}
    for _ in range(repeat):
        cpu, wall = shell_cpu(pipe)
        runs.setdefault(f"lbzip2 -dc -n{cores} | zstd -3 -T{cores}", []).append({"wall": wall, "cpu": cpu})
        for label, root, jobs in [(label, root, "") for label, root in roots.items()] + [("this", roots["this"], "1")]:
            out = os.path.join(work, f"shape-out-{label}")
            shutil.rmtree(out, ignore_errors=True)
            env = {**os.environ, "PYTHONPATH": root, "SHAPE_JOBS": jobs}
            cpu, wall, proc = counted_run([sys.executable, script, out, *shards], env=env, capture_output=True,
                                          text=True)
            how = "-j1, threads = cores (no pool)" if jobs else "(defaults)"
            runs.setdefault(f"{label}: shardkit convert {how}", []).append(
                {"wall": wall, "cpu": cpu, **json.loads(proc.stdout.strip().splitlines()[-1])})
    pipe_walls = [r["wall"] for r in runs[f"lbzip2 -dc -n{cores} | zstd -3 -T{cores}"]]
    summary = {}
    for name, rs in runs.items():
        summary[name] = {"wall_median": round(statistics.median(r["wall"] for r in rs), 3),
                         "cpu_median": round(statistics.median(r["cpu"] or 0.0 for r in rs), 3),
                         "vs_pipeline_per_round": sorted(round(p / r["wall"], 3) for p, r in zip(pipe_walls, rs)),
                         "last_round": rs[-1]}
    return summary


def main(args) -> None:
    from common import emit_results, machine_info, make_corpus

    for tool in ("lbzip2", "zstd"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install {tool})")
    skip = set(filter(None, args.skip.split(",")))
    os.makedirs(args.workdir, exist_ok=True)
    shards = make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb, shards=args.shards)
    roots = {"this": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # this checkout's code
    if args.baseline_root:
        roots["baseline"] = os.path.abspath(args.baseline_root)
    for root in roots.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(root, "shardkit")], check=True,
                       stdout=subprocess.DEVNULL)
    results = {"machine": machine_info(), "loadavg_before": open("/proc/loadavg").read().split()[:3],
               "corpus": {"shards": len(shards), "bz2_bytes": sum(os.path.getsize(p) for p in shards)}}
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        if "parts" not in skip:
            results["parts_cpu_s_one_shard"] = measure_parts(shards[0], work, args.repeat)
        if "startup" not in skip:
            tiny = make_corpus(os.path.join(args.workdir, "tiny"), total_mb=2, shards=2)
            results["startup_cpu_s"] = measure_startup(tiny, work, args.repeat, roots)
        if "imports" not in skip:
            results["imports_cpu_s"] = measure_imports(max(args.repeat, 5), roots)
        if "shape" not in skip:
            results["shape"] = measure_shape(shards, work, args.repeat, roots)
    results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    emit_results(results, args.json_out)


if __name__ == "__main__":
    main(parse_args())
