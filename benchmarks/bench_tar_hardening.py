"""The hardened tar parser against the one before it: reader, strict parser and convert, one run.

    git archive BASE_COMMIT shardkit | tar -x -C /tmp/shardkit-base
    python benchmarks/bench_tar_hardening.py --base /tmp/shardkit-base --corpus-mb 160 --repeat 5

Every row runs in a fresh child process with either the base checkout or this one first on the
path, rows and versions interleaved round by round (machine noise hits both alike); each row
must read the same number of members and bytes in both versions. Times are the child's CPU
time (``time.process_time``: on a shared machine, less disturbed by other processes than wall
time), over ``--passes`` passes of the corpus; the figure per row is the fastest round (the
least disturbed), the median beside it. Rows: the sample reader
(``iter_samples``, read + decode to float32) on plain WAV tar and zst:3; the strict parser
(``tario.iter_shard_members``, what validate, convert, index and list check read with) on
both; ``convert_shard`` plain -> zst:3 with read-back verification. MB/s are of the plain tar.
Reports medians, and new/base ratios (the issue's bound: within 5%).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine_info  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
row, paths, passes = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
from shardkit.training.reader import iter_samples, reuse_freed_memory
from shardkit.io.tar import iter_shard_members
reuse_freed_memory()
wall, cpu = time.perf_counter(), time.process_time()
count = 0
for _ in range(passes):
    if row == "reader":
        for s in iter_samples(paths):
            count += s["audio"].shape[0]
    elif row == "parser":
        for p in paths:
            for name, data in iter_shard_members(p):
                count += len(data)
    elif row == "convert":
        from shardkit.commands.convert import ConvertSettings, convert_shard
        with tempfile.TemporaryDirectory() as out:
            for i, p in enumerate(paths):
                entry = convert_shard(p, os.path.join(out, f"{i}.tar.zst"), ConvertSettings(codec="zst", level=3))
                assert entry["status"] == "ok", entry
                count += entry["members"]
print(json.dumps({"seconds": time.process_time() - cpu, "wall": time.perf_counter() - wall, "count": count}))
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="folder holding the base version's shardkit package")
    p.add_argument("--corpus-mb", type=float, default=160.0)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-tar-hardening")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--passes", type=int, default=3, help="passes over the corpus per child (convert: 1)")
    p.add_argument("--json", help="also write the figures here")
    return p.parse_args()


def corpus(work: str, corpus_mb: float) -> dict[str, list[str]]:
    from shardkit.commands.bench import BenchSettings, build_formats, generate_corpus

    marker = os.path.join(work, "corpus.json")
    if os.path.exists(marker):
        with open(marker) as f:
            saved = json.load(f)
        if saved["corpus_mb"] == corpus_mb:
            return saved["layout"]
    os.makedirs(work, exist_ok=True)
    settings = BenchSettings(corpus_mb=corpus_mb, audio=("wav",), formats=("none", "zst:3"))
    generate_corpus(work, settings, jobs=os.cpu_count() or 1)
    layout = {spec: paths for (spec, _), paths in build_formats(work, settings, os.cpu_count() or 1).items()}
    with open(marker, "w") as f:
        json.dump({"corpus_mb": corpus_mb, "layout": layout}, f)
    return layout


def main(args) -> dict:
    layout = corpus(args.work_dir, args.corpus_mb)
    tar_bytes = sum(os.path.getsize(p) for p in layout["none"])
    rows = [("reader", "none"), ("reader", "zst:3"), ("parser", "none"), ("parser", "zst:3"), ("convert", "none")]
    versions = {"base": os.path.abspath(args.base), "new": HERE}
    times: dict[tuple, list[float]] = {}
    counts: dict[tuple, set] = {}
    for _ in range(args.repeat):
        for row, spec in rows:
            for version, root in versions.items():
                passes = 1 if row == "convert" else args.passes
                out = subprocess.run([sys.executable, "-c", CHILD, root, row, json.dumps(layout[spec]), str(passes)],
                                     check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root})
                got = json.loads(out.stdout)
                times.setdefault((row, spec, version), []).append(got["seconds"])
                counts.setdefault((row, spec), set()).add(got["count"])
    for key, seen in counts.items():
        assert len(seen) == 1, f"{key}: the versions read different amounts {seen}"
    figures = []
    for row, spec in rows:
        volume = tar_bytes * (1 if row == "convert" else args.passes)
        base, new = min(times[(row, spec, "base")]), min(times[(row, spec, "new")])
        base_med, new_med = statistics.median(times[(row, spec, "base")]), statistics.median(times[(row, spec, "new")])
        figures.append({"row": row, "format": spec, "base_mb_s": round(volume / base / 1e6, 1),
                        "new_mb_s": round(volume / new / 1e6, 1), "new_over_base": round(base / new, 3),
                        "new_over_base_median": round(base_med / new_med, 3),
                        "base_runs_s": [round(t, 3) for t in times[(row, spec, "base")]],
                        "new_runs_s": [round(t, 3) for t in times[(row, spec, "new")]]})
    doc = {"machine": machine_info(), "tar_mb": round(tar_bytes / 1e6, 1), "repeat": args.repeat, "rows": figures}
    print(json.dumps(doc, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return doc


if __name__ == "__main__":
    main(parse_args())
