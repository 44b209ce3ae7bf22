"""Benchmark: the recipe's dataset-prep stage (``run.sh --stage 2 --stop_stage 2``, now ``shardkit prep``)
against decoding the sources once (``lbzip2 -dc -n<cores>``, the floor) and against the three-command
chain it replaced (convert, validate --quarantine, balance, then ``shardkit plan`` before and after,
as stage 2 ran them).

A three-corpus bz2 mix is written once into --work-dir (short, long and mixed utterances, five
shards each). Each repeat runs the configurations interleaved (floor, ``shardkit prep`` alone, the
stage, the chain), each into a fresh work folder, sampling that folder's bytes (every file, hidden
ones included) every 50 ms for its peak; the figure is the peak over the bytes of the training
shards data/train/data.list lists at the end. Correctness is checked on every run: prep, the stage
and the chain list the same utterances (keys, repeats aside).

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_prep.py --repeats 3

``--baseline DIR`` (a checkout of earlier code, e.g. ``git archive <commit> | tar -x -C DIR``) adds
"prep@base" and "stage@base" to each repeat, interleaved with the others: before/after in one run.
``--no-chain`` leaves the (slow) three-command chain out, ``--no-stage`` run.sh's stage 2 (prep alone).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W, K = 4, 2


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-prep")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0, help="Fraction of the corpus (1.0: ~1 h of audio, ~120 MB; "
                   "2.75: the issue's 2.9 h, ~340 MB as plain tar).")
    p.add_argument("--baseline", default=None, help="A checkout of earlier code to run as prep@base and stage@base.")
    p.add_argument("--no-chain", action="store_true", help="Leave out the three-command chain.")
    p.add_argument("--no-stage", action="store_true", help="Leave out run.sh's stage 2 (prep alone against the floor).")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                   help="Before each repeat, wait up to S seconds for a second in which the machine is >= 90%% idle "
                        "(a shared VM: other people's jobs); the repeat says whether it found one.")
    return p.parse_args()


def make_corpus(src: str, scale: float) -> dict[str, list[str]]:
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    specs = (CorpusSpec("aishell", int(300 * scale), 2.0, 6.0, "zh"),
             CorpusSpec("librispeech", int(100 * scale), 8.0, 20.0, "en"),
             CorpusSpec("accented", int(150 * scale), 1.0, 15.0, "mix"))
    done = os.path.join(src, "done.json")
    if os.path.exists(done):
        return json.load(open(done))
    corpora = {}
    for spec in specs:
        utts = list(corpus_utterances(spec, seed=7))
        corpora[spec.name] = write_shards(utts, os.path.join(src, spec.name), utts_per_shard=-(-len(utts) // 5),
                                          codec="bz2")
    json.dump(corpora, open(done, "w"))
    return corpora


class PeakBytes:
    """The most bytes a folder held, sampled every ``interval`` s in a thread while the block runs."""

    def __init__(self, folder: str, interval: float = 0.05):
        self.folder, self.interval, self.peak = folder, interval, 0
        self._stop = threading.Event()

    def _size(self) -> int:
        total = 0
        for top, _, files in os.walk(self.folder):
            for name in files:
                try:
                    total += os.lstat(os.path.join(top, name)).st_size
                except OSError:
                    pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._size())
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._size())


def _env(root=ROOT):
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "SHARDKIT_PYTHON": sys.executable}


def run_floor(corpora, cores):
    files = [p for paths in corpora.values() for p in paths]
    subprocess.run(["lbzip2", "-dc", f"-n{cores}", *files], stdout=subprocess.DEVNULL, check=True)


def run_stage(corpora, work, cores, root=ROOT):
    args = ["bash", os.path.join(root, "scripts", "run.sh"), "--workdir", work, "--stage", "2", "--stop_stage", "2",
            "--world_size", str(W), "--num_workers", str(K), "--jobs", str(cores),
            # the preamble would import torch to count GPUs (~2 s before any stage; the loader advice's only use)
            "--gpus_per_node", "1"]
    for name, paths in corpora.items():
        args += ["--corpus", f"{name}={os.path.dirname(paths[0])}/data.list"]
    subprocess.run(args, cwd=root, env=_env(root), check=True, capture_output=True)


def run_prep(corpora, work, cores, root=ROOT):
    """``shardkit prep`` alone, as stage 2 calls it (without run.sh's start-up and report lines)."""
    args = [sys.executable, "-m", "shardkit", "prep", "--world-size", str(W), "--num-workers", str(K), "--codec",
            "none", "--sample-rate", "16000", "--channels", "1", "-o", os.path.join(work, "data", "train"), "-j",
            str(cores), "-q", "--json"]
    for name, paths in corpora.items():
        args += ["--corpus", f"{name}={os.path.dirname(paths[0])}/data.list"]
    subprocess.run(args, cwd=root, env=_env(root), check=True, capture_output=True)


def run_chain(corpora, work, cores):
    """Stage 2 as it was: convert -> validate --quarantine -> balance -> plan before and after."""
    sk = [sys.executable, "-m", "shardkit"]
    common = {"cwd": ROOT, "env": _env(), "check": True, "capture_output": True}
    balance_args, before = [], []
    for name, paths in corpora.items():
        converted = os.path.join(work, "shards", "none", name)
        subprocess.run([*sk, "convert", os.path.dirname(paths[0]) + "/data.list", "-o", converted, "--codec", "none",
                        "-j", str(cores), "-q", "--json"], **common)
        before.append(os.path.join(converted, "data.list"))
        quarantine = os.path.join(work, "quarantine", name)
        subprocess.run([*sk, "validate", before[-1], "--sample-rate", "16000", "--channels", "1", "--quarantine",
                        quarantine, "--report", os.path.join(work, f"validate_{name}.json"), "-j", str(cores), "-q"],
                       **common)
        balance_args += ["--corpus", f"{name}={quarantine}/data.list"]
    train = os.path.join(work, "data", "train")
    subprocess.run([*sk, "balance", *balance_args, "--world-size", str(W), "--num-workers", str(K), "-o", train,
                    "--codec", "none", "-j", str(cores), "-q", "--json"], **common)
    for lists in (before, [os.path.join(train, "data.list")]):
        subprocess.run([*sk, "plan", *lists, "--world-size", str(W), "--num-workers", str(K), "-q", "--json"],
                       **common)


def listed(work: str) -> tuple[int, set[str]]:
    """(bytes of the training shards data/train/data.list lists, their utterance keys without -rep<N>)."""
    from shardkit.io.tar import iter_shard_members

    with open(os.path.join(work, "data", "train", "data.list")) as f:
        shards = f.read().split()
    keys = {re.sub(r"-rep\d+$", "", name.rsplit(".", 1)[0]) for s in shards for name, _ in iter_shard_members(s)}
    return sum(os.path.getsize(s) for s in shards), keys


def shard_digests(work: str) -> list[str]:
    """sha256 of each training shard data/train/data.list lists, in list order."""
    from shardkit.io.files import file_sha256

    with open(os.path.join(work, "data", "train", "data.list")) as f:
        return [file_sha256(s) for s in f.read().split()]


def become_subreaper() -> None:
    """Orphaned descendants (a command's forkserver, which reaps its pool workers, and resource tracker) are
    re-parented to this process, so that reaping them adds their CPU time to RUSAGE_CHILDREN."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def children_cpu() -> float:
    """CPU seconds (user + system) of every descendant reaped so far, after reaping the ones left (10 s at most)."""
    import resource

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _busy_fraction(interval: float = 1.0) -> float:
    def sample():
        with open("/proc/stat") as f:
            values = [int(x) for x in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]

    total, idle = sample()
    time.sleep(interval)
    total2, idle2 = sample()
    return 1 - (idle2 - idle) / max(1, total2 - total)


def wait_quiet(limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if _busy_fraction() <= 0.10:
            return True
    return False


def main(args):
    from shardkit.commands.bench import machine_info

    cores = len(os.sched_getaffinity(0))
    os.makedirs(args.work_dir, exist_ok=True)
    corpora = make_corpus(os.path.join(args.work_dir, "src"), args.scale)
    src_bytes = sum(os.path.getsize(p) for paths in corpora.values() for p in paths)
    base = os.path.abspath(args.baseline) if args.baseline else None
    runners = {"floor": lambda w: run_floor(corpora, cores), "prep": lambda w: run_prep(corpora, w, cores),
               "prep@base": lambda w: run_prep(corpora, w, cores, base),
               "stage": lambda w: run_stage(corpora, w, cores),
               "stage@base": lambda w: run_stage(corpora, w, cores, base),
               "chain": lambda w: run_chain(corpora, w, cores)}
    for name in (["prep@base", "stage@base"] if base is None else []) + (["chain"] if args.no_chain else []) + (
            ["stage", "stage@base"] if args.no_stage else []):
        runners.pop(name, None)
    rows = {name: [] for name in runners}
    peaks = {name: [] for name in runners if name != "floor"}
    quiet = []
    become_subreaper()
    cpu = {name: [] for name in rows}
    for r in range(args.repeats):
        if args.wait_quiet:
            quiet.append(wait_quiet(args.wait_quiet))
            print(f"repeat {r}: quiet before it: {quiet[-1]}", file=sys.stderr)
        for name in rows:
            work = os.path.join(args.work_dir, f"work-{name}")
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            with PeakBytes(work) as peak:
                used = children_cpu()
                t = time.perf_counter()
                runners[name](work)
                rows[name].append(time.perf_counter() - t)
                cpu[name].append(children_cpu() - used)
            if name == "prep@base":  # before and after write the same shards, byte for byte
                assert shard_digests(work) == shard_digests(os.path.join(args.work_dir, "work-prep")), \
                    "prep and prep@base wrote different shards"
            if name != "floor":
                final, keys = listed(work)
                peaks[name].append(peak.peak / final)
                if name == "prep":
                    stage_keys = keys
                else:
                    assert keys == stage_keys, "the chain and the stage list different utterances"
            print(f"repeat {r}: {name} {rows[name][-1]:.2f} s, cpu {cpu[name][-1]:.2f} s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rows.items()}
    best = {k: min(v) for k, v in rows.items()}
    result = {"machine": machine_info(), "cores": cores, "source_bytes": src_bytes,
              "utterances": len(stage_keys), "world_size": W, "num_workers": K,
              "seconds": {k: [round(x, 2) for x in v] for k, v in rows.items()},
              "median_s": {k: round(v, 2) for k, v in med.items()},
              "over_floor_median": {k: round(med[k] / med["floor"], 3) for k in peaks},
              "over_floor_per_repeat": {k: [round(a / b, 3) for a, b in zip(rows[k], rows["floor"])] for k in peaks},
              "over_floor_best": {k: round(best[k] / best["floor"], 3) for k in peaks},
              "load_average": [round(x, 2) for x in os.getloadavg()], "quiet_before_repeat": quiet,
              "peak_over_final": {k: round(max(v), 3) for k, v in peaks.items()},
              # CPU seconds of each configuration's whole process tree (user + system), and over the floor's in the
              # same repeat: on a shared machine, less disturbed by other people's jobs than the wall time
              "cpu_s": {k: [round(x, 2) for x in v] for k, v in cpu.items()},
              "cpu_over_floor_median": {k: round(statistics.median(a / b for a, b in zip(cpu[k], cpu["floor"])), 3)
                                        for k in peaks}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(parse_args())
