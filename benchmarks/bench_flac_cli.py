"""`shardkit convert --codec none --audio flac -j1` as the user runs it: two checkouts interleaved.

    python benchmarks/bench_flac_cli.py ROUNDS BASELINE_CHECKOUT [WORKDIR]

CPU seconds of the child process (-j1 runs inline, so all of it), medians over ROUNDS; the corpus is
plain WAV tar from common.make_corpus (120 MB asked, 4 shards). Every run must transcode every
audio member.
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import make_corpus

WORK = sys.argv[3] if len(sys.argv) > 3 else "/tmp/skbench-flac-cli"
paths = make_corpus(os.path.join(WORK, "corpus"), total_mb=120, shards=4, codec="none")
PY = sys.executable
roots = {"base": os.path.abspath(sys.argv[2]), "new": os.path.dirname(HERE)}
configs = []
for v in ("verify", "no-verify"):
    for name, root in roots.items():
        configs.append((f"{name} {v}", root, [] if v == "verify" else ["--no-verify"]))
res = {c[0]: [] for c in configs}
for r in range(int(sys.argv[1])):
    for name, root, extra in configs:
        out = os.path.join(WORK, f"out-{name.replace(' ', '-')}")
        shutil.rmtree(out, ignore_errors=True)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN); t = time.perf_counter()
        p = subprocess.run([PY, "-m", "shardkit", "convert", *paths, "-o", out, "--codec", "none", "--audio", "flac",
                            "-j1", "-q", "--json", *extra], cwd=root, env={**os.environ, "PYTHONPATH": root},
                           capture_output=True, text=True, check=True)
        w = time.perf_counter() - t; c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rep = json.loads(p.stdout); assert rep["ok"] == len(paths) and rep["audio"]["kept"] == 0, rep
        cpu = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime
        res[name].append((cpu, w))
        print(f"round {r} {name}: cpu {cpu:.3f} wall {w:.3f}", file=sys.stderr, flush=True)
med = lambda xs: sorted(xs)[len(xs) // 2]
hours = rep["tar_bytes_converted"] / 32000 / 3600
out = {"hours": hours, "tar_bytes": rep["tar_bytes_converted"], "rows": {}}
for n, xs in res.items():
    out["rows"][n] = {"cpu_med": med([c for c, _ in xs]), "wall_med": med([w for _, w in xs]),
                      "cpus": [round(c, 3) for c, _ in xs], "h_per_cpu_s": hours / med([c for c, _ in xs])}
for v in ("verify", "no-verify"):
    out[f"base/new cpu ratio {v}"] = med([b[0] / a[0] for a, b in zip(res[f"new {v}"], res[f"base {v}"])])
print(json.dumps(out, indent=1))
