"""Profile of ``shardkit prep`` against ``lbzip2 -dc``: where every CPU second goes, and which thread does what when.

Runs the bench's three-corpus bz2 mix (``bench_prep.make_corpus``, the same files) once per configuration:

* **floor**: ``lbzip2 -dc -n<cores>`` over the sources, to /dev/null;
* **prep** (this checkout) and, with ``--baseline DIR``, **prep@base** (an earlier checkout), each as
  ``run_prep`` called in a fresh interpreter with the options stage 2 gives it (W=4 x K=2, plain tar, ``-j``
  cores), its events (a source read, the closing note) time-stamped.

Two views of each run:

* **CPU by part** (``perf record`` of the whole process tree, when ``perf`` is installed): samples by the
  library or kernel path they fall in: bz2 decoding (indexed_bzip2, lbzip2), sha256 (libcrypto), audio checks
  (libsndfile, numpy), Python (tar parsing, checks, planning, pickling), copies (libc memmove), the kernel's
  write path into the page cache, its read and pipe copies, and the rest (scheduling, page faults).
* **Timeline**: every thread's CPU (``/proc/PID/task/TID/stat``, sampled every 50 ms) summed per role per
  half second: the main thread, the writer threads, the reader threads, indexed_bzip2's decoder threads, pool
  worker processes; with the phases: the first source read, the last, the closing (write the held-back pool,
  verify, fsync, rename) and the end.

    python benchmarks/profile_prep.py --work-dir /tmp/shardkit-bench-prep --scale 2.75 --baseline BASE

where BASE is a checkout of the code to compare (``git archive <commit> | tar -x -C BASE``). Prints a JSON
document (``--out FILE`` too) and the tables in markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))

# run in a fresh interpreter whose PYTHONPATH is the checkout under test: run_prep with an event recorder and a
# sampler of every thread's CPU (this process and its children: the pool's forkserver and workers)
DRIVER = r'''
import json, os, sys, threading, time
T0 = time.perf_counter()
args = json.loads(sys.argv[1])
TICK = os.sysconf("SC_CLK_TCK")
samples, events, names = [], [], {}

def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            kids = []
        out.extend(kids)
        todo.extend(kids)
    return out

def cpu_of(pid):
    rows = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return rows
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            rows[(pid, int(tid))] = (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            pass
    return rows

stop = threading.Event()
def sample():
    me = os.getpid()
    while not stop.is_set():
        for t in threading.enumerate():
            if t.native_id is not None:
                names[t.native_id] = t.name
        row = cpu_of(me)
        for kid in descendants(me):
            row.update(cpu_of(kid))
        samples.append((time.perf_counter() - T0, {f"{p}:{t}": c for (p, t), c in row.items()}))
        stop.wait(0.05)

threading.Thread(target=sample, name="profile-sampler", daemon=True).start()
from shardkit.commands.prep import PrepSettings, run_prep
from shardkit.commands.validate.options import ValidateOptions
from shardkit.io.mix import CorpusSource
from shardkit.run.options import RunOptions

def on_event(event):
    events.append((time.perf_counter() - T0, event.kind, event.text or event.stage))

corpora = [CorpusSource(name, (os.path.join(os.path.dirname(paths[0]), "data.list"),))
           for name, paths in args["corpora"].items()]
options = RunOptions(jobs=args["cores"], on_event=on_event)
started = time.perf_counter() - T0
report = run_prep(corpora, args["out"], PrepSettings(world_size=4, num_workers=2, codec="none", level=None),
                  ValidateOptions(sample_rate=16000, channels=1), options)
ended = time.perf_counter() - T0
stop.set()
json.dump({"started": started, "ended": ended, "events": events, "samples": samples, "names": names,
           "main_pid": os.getpid(), "summary": report.summary()}, open(args["trace"], "w"))
'''

PARTS = [  # (part, how a perf sample is recognised: dso substring, symbol substrings or None for any)
    ("bz2 decoding (indexed_bzip2 / lbzip2)", ("indexed_bzip2", "lbzip2"), None),
    ("sha256 (libcrypto)", ("libcrypto",), None),
    ("audio checks (libsndfile, numpy, cffi)", ("libsndfile", "_multiarray", "_cffi", "openblas", "libFLAC"), None),
    ("Python (tar parsing, checks, planning, pickling)", ("libpython", "_pickle", "_struct", "unicodedata",
                                                          "python3"), None),
    ("copies in user space (libc memmove/memset)", ("libc.so",), ("memmove", "memcpy", "memset")),
    ("kernel: writes into the page cache", ("kernel",), ("copy_folio_from_iter", "clear_page", "_copy_from_iter",
                                                        "filemap", "ext4", "xfs", "folio")),
    ("kernel: reads and pipe copies", ("kernel",), ("_copy_to_iter", "pipe", "copy_page_to_iter")),
]


def part_of(dso: str, symbol: str) -> str:
    for part, dsos, symbols in PARTS:
        if any(d in dso for d in dsos) and (symbols is None or any(s in symbol for s in symbols)):
            return part
    return "kernel: other (scheduling, faults, syscalls)" if "kernel" in dso else "other user space (libc, loader)"


def perf_parts(data: str) -> dict[str, float]:
    """CPU seconds per part from a ``perf record -F FREQ`` file (samples x period)."""
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,sym", "--stdio", "-g", "none",
                          "-F", "period,dso,sym", "--field-separator", "\t"], capture_output=True, text=True).stdout
    parts: dict[str, float] = {}
    for line in out.splitlines():
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 3 or not fields[0].strip().isdigit():
            continue
        period, dso, symbol = int(fields[0]), fields[1].strip(), fields[2].strip()
        parts[part_of(dso, symbol)] = parts.get(part_of(dso, symbol), 0.0) + period / 1e9  # task-clock: ns
    return {k: round(v, 2) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}


def _perf(cmd: list[str], data: str, env=None) -> list[str]:
    if shutil.which("perf") is None:
        return cmd
    return ["perf", "record", "-q", "-e", "task-clock", "-F", "499", "-o", data, "--", *cmd]


def role(key: str, names: dict, main_pid: int) -> str:
    pid, tid = (int(x) for x in key.split(":"))
    if pid != main_pid:
        return "pool workers (other processes)"
    if tid == main_pid:
        return "main thread"
    name = names.get(str(tid), names.get(tid, ""))
    for prefix, label in (("prep-writer", "writer threads"), ("prep-reader", "reader threads"),
                          ("profile-sampler", "profiler")):
        if name.startswith(prefix):
            return label
    return "other threads (bz2 block decoders, fsync)"


def timeline(trace: dict, step: float = 0.5) -> dict:
    """Cores busy per role per ``step`` seconds, and the phase times."""
    samples, names, main_pid = trace["samples"], trace["names"], trace["main_pid"]
    bins: dict[str, dict[int, float]] = {}
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        for key, cpu in b.items():
            used = cpu - a.get(key, cpu if key not in a and t0 > 0.2 else 0.0)
            if used > 0:
                r = role(key, names, main_pid)
                slot = int(t1 // step)
                bins.setdefault(r, {})[slot] = bins.setdefault(r, {}).get(slot, 0.0) + used
    reads = [t for t, kind, _ in trace["events"] if kind == "done"]
    closing = next((t for t, _, detail in trace["events"] if detail and detail.startswith("closing")), None)
    totals = {r: round(sum(v.values()), 2) for r, v in bins.items()}
    slots = int(trace["ended"] // step) + 1
    return {"step_s": step, "phases": {"run_prep called": round(trace["started"], 2),
                                       "first source read": round(reads[0], 2) if reads else None,
                                       "last source read": round(reads[-1], 2) if reads else None,
                                       "closing (pool written, verify, fsync, rename)": closing and round(closing, 2),
                                       "end": round(trace["ended"], 2)},
            "cpu_s_by_role": totals,
            "cores_busy": {r: [round(v.get(i, 0.0) / step, 2) for i in range(slots)] for r, v in bins.items()}}


def run_prep_profiled(corpora: dict, work: str, cores: int, root: str, name: str) -> dict:
    out, trace, data = os.path.join(work, name), os.path.join(work, f"{name}.trace.json"), os.path.join(
        work, f"{name}.perf")
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": root}
    args = json.dumps({"corpora": corpora, "cores": cores, "out": out, "trace": trace})
    # cwd = the checkout: ``python -c`` puts the working folder first on sys.path
    subprocess.run(_perf([sys.executable, "-c", DRIVER, args], data), env=env, check=True, cwd=root)
    with open(trace) as f:
        doc = json.load(f)
    result = {"timeline": timeline(doc), "elapsed_s": round(doc["ended"], 2)}
    if os.path.exists(data):
        result["cpu_by_part"] = perf_parts(data)
        result["cpu_s"] = round(sum(result["cpu_by_part"].values()), 2)
    return result


def run_floor_profiled(corpora: dict, work: str, cores: int) -> dict:
    import time

    files = [p for paths in corpora.values() for p in paths]
    data = os.path.join(work, "floor.perf")
    t = time.perf_counter()
    subprocess.run(_perf(["lbzip2", "-dc", f"-n{cores}", *files], data), stdout=subprocess.DEVNULL, check=True)
    result = {"elapsed_s": round(time.perf_counter() - t, 2)}
    if os.path.exists(data):
        result["cpu_by_part"] = perf_parts(data)
        result["cpu_s"] = round(sum(result["cpu_by_part"].values()), 2)
    return result


def markdown(results: dict) -> str:
    names = list(results)
    parts = sorted({p for r in results.values() for p in r.get("cpu_by_part", {})},
                   key=lambda p: -max(r.get("cpu_by_part", {}).get(p, 0) for r in results.values()))
    lines = ["| CPU seconds by part | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for p in parts:
        lines.append(f"| {p} | " + " | ".join(str(results[n].get("cpu_by_part", {}).get(p, 0)) for n in names) + " |")
    lines.append("| **total CPU s** | " + " | ".join(str(results[n].get("cpu_s", "")) for n in names) + " |")
    lines.append("| wall s | " + " | ".join(str(results[n]["elapsed_s"]) for n in names) + " |")
    for n in names:
        tl = results[n].get("timeline")
        if not tl:
            continue
        lines += ["", f"{n}: phases (s from the interpreter's start): " +
                  ", ".join(f"{k} {v}" for k, v in tl["phases"].items()),
                  f"{n}: CPU s by role: " + ", ".join(f"{k} {v}" for k, v in tl["cpu_s_by_role"].items()), "",
                  f"| {n}: cores busy, one character per {tl['step_s']:g} s (. idle, 1-9 tenths, # one or more) "
                  f"| 0 to {tl['phases']['end']} s |", "|---|---|"]
        for r, row in tl["cores_busy"].items():
            lines.append(f"| {r} | " + " ".join(_bar(x) for x in row) + " |")
    return "\n".join(lines)


def _bar(x: float) -> str:
    """One character per half second: . idle, then 1..9 tenths of a core, # a core or more."""
    if x < 0.05:
        return "."
    return "#" if x >= 0.95 else str(int(x * 10 + 0.5))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-prep")
    p.add_argument("--scale", type=float, default=2.75)
    p.add_argument("--baseline", default=None, help="A checkout of earlier code, profiled as prep@base.")
    p.add_argument("--out", default=None, help="Also write the JSON document here.")
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    from bench_prep import make_corpus

    cores = len(os.sched_getaffinity(0))
    corpora = make_corpus(os.path.join(args.work_dir, "src"), args.scale)
    work = tempfile.mkdtemp(prefix="profile-", dir=args.work_dir)
    results = {"floor": run_floor_profiled(corpora, work, cores),
               "prep": run_prep_profiled(corpora, work, cores, os.path.dirname(ROOT), "prep")}
    if args.baseline:
        results["prep@base"] = run_prep_profiled(corpora, work, cores, os.path.abspath(args.baseline), "prep@base")
    doc = {"cores": cores, "load_average": [round(x, 2) for x in os.getloadavg()], "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(json.dumps({k: v for k, v in doc.items() if k != "results"}))
    print(markdown(results))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
