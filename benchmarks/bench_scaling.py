"""How convert, validate and the torch DataLoader scale with processes / workers on one machine.

    python benchmarks/bench_scaling.py --corpus-mb 640 --shards 48 --jobs 1,2,4,8,16 --workdir /tmp/skscale

On one generated bz2 corpus (speech-like 16 kHz WAV, short and long shards), in one run:
  - convert bz2 -> zst:3 with -j N --threads 1 (plus the lbzip2 | zstd pipeline and indexed_bzip2
    alone, one core, when lbzip2 is on PATH), and bz2 -> FLAC-in-plain-tar (--audio flac);
  - validate (soundfile backend) with -j N on the zst output;
  - a torch DataLoader over shardkit.training.dataset.ShardDataset (zst shards, float32, batches of 16
    padded in the workers) with num_workers N, for fork and forkserver, start-up included.
Every run is checked for completeness (all shards converted, no findings, every utterance read).
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


def shardkit(*args) -> dict:
    proc = subprocess.run([sys.executable, "-m", "shardkit", *args, "--json"], capture_output=True, text=True)
    if proc.returncode not in (0,):
        raise SystemExit(f"shardkit {' '.join(args[:1])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def loader_run(data_list, workers, context, utterances):
    import torch
    from torch.utils.data import DataLoader

    from shardkit.training.dataset import ShardDataset, collate_padded

    ds = ShardDataset(data_list, rank=0, world_size=1, shuffle=True, seed=0)
    kwargs = {"num_workers": workers, "batch_size": 16, "collate_fn": collate_padded}
    if workers:
        kwargs.update(multiprocessing_context=context, prefetch_factor=4)
    t = time.perf_counter()
    seen = 0
    first = None
    for batch in DataLoader(ds, **kwargs):
        if first is None:
            first = time.perf_counter() - t
        seen += len(batch["key"])
    total = time.perf_counter() - t
    assert seen == utterances, (seen, utterances)
    del torch
    return total, first


def loader_list(data_list, utterances, out, hours, args):
    """DataLoader throughput per (start method, workers): medians of --repeat passes after a warm-up."""
    loader_run(data_list, 0, "fork", utterances)  # page cache, torch's lazy initialisation
    for context in args.contexts.split(","):
        for w in (int(x) for x in args.workers.split(",")):
            if w == 0 and context != args.contexts.split(",")[0]:
                continue
            runs = sorted(loader_run(data_list, w, context, utterances) for _ in range(args.repeat))
            total, first = runs[len(runs) // 2]
            out["loader"][f"{context}/{w}"] = {"seconds": total, "first_batch_s": first,
                                                "runs_s": [r[0] for r in runs],
                                                "hours_audio_per_s": hours / total,
                                                "utterances_per_s": utterances / total}
            print(f"loader {context} {w}: {total:.2f} s", file=sys.stderr, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus-mb", type=float, default=640)
    ap.add_argument("--shards", type=int, default=48)
    ap.add_argument("--jobs", default="1,2,4,8,16")
    ap.add_argument("--workers", default="0,1,2,4,8,16")
    ap.add_argument("--contexts", default="fork,forkserver")
    ap.add_argument("--workdir", default="/tmp/skscale")
    ap.add_argument("--repeat", type=int, default=3, help="passes per DataLoader and validate setting (median)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    jobs = [int(j) for j in args.jobs.split(",")]
    os.makedirs(args.workdir, exist_ok=True)
    t, paths = timed(lambda: make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb,
                                         shards=args.shards))
    print(f"corpus: {len(paths)} shards in {t:.1f} s", file=sys.stderr, flush=True)
    out = {"machine": machine_info(), "convert_bz2_to_zst": {}, "convert_bz2_to_flac": {}, "validate": {},
           "loader": {}}
    zst = os.path.join(args.workdir, "zst")
    for j in jobs:
        shutil.rmtree(zst, ignore_errors=True)
        t, rep = timed(lambda: shardkit("convert", *paths, "-o", zst, "-q", "-j", str(j), "--threads", "1",
                                        "--codec", "zst:3"))
        assert rep["ok"] == len(paths), rep
        out["convert_bz2_to_zst"][j] = {"seconds": t, "tar_mb_s": rep["tar_bytes_converted"] / t / 1e6}
        print(f"convert -j{j}: {t:.1f} s", file=sys.stderr, flush=True)
    tar_bytes = rep["tar_bytes_converted"]
    hours = tar_bytes / 32000 / 3600
    out["corpus"] = {"shards": len(paths), "tar_bytes": tar_bytes, "hours": hours,
                     "utterances": rep["samples"]}
    for j in jobs:
        out["convert_bz2_to_zst"][j]["speedup_vs_j1"] = out["convert_bz2_to_zst"][jobs[0]]["seconds"] / \
            out["convert_bz2_to_zst"][j]["seconds"]
    if shutil.which("lbzip2") and shutil.which("zstd"):
        pipe = os.path.join(args.workdir, "pipe")
        os.makedirs(pipe, exist_ok=True)

        def pipeline():
            for p in paths:
                subprocess.run(f"lbzip2 -dc -n1 '{p}' | zstd -3 -T1 -q -f -o '{pipe}/x.zst'", shell=True, check=True)

        def decompress():
            import indexed_bzip2

            for p in paths:
                with indexed_bzip2.open(p, parallelization=1) as f:
                    while f.read(1 << 20):
                        pass

        one = {}
        for name, fn in (("pipeline lbzip2 -n1 | zstd -3 -T1", pipeline), ("indexed_bzip2 alone", decompress),
                         ("shardkit -j1 --threads 1", lambda: shardkit("convert", *paths, "-o", zst + "1", "-q",
                                                                        "--codec", "zst:3", "-j", "1", "--threads",
                                                                        "1", "--overwrite")),
                         ("shardkit -j1 (threads = cores)", lambda: shardkit("convert", *paths, "-o", zst + "1", "-q",
                                                                              "--codec", "zst:3", "-j", "1",
                                                                              "--overwrite"))):
            one[name] = {"seconds": timed(fn)[0]}
            one[name]["tar_mb_s"] = tar_bytes / one[name]["seconds"] / 1e6
        base = one["pipeline lbzip2 -n1 | zstd -3 -T1"]["seconds"]
        for row in one.values():
            row["vs_pipeline"] = base / row["seconds"]
        out["one_job_vs_pipeline"] = one
    flac = os.path.join(args.workdir, "flac")
    for j in (jobs[0], jobs[-1]):
        shutil.rmtree(flac, ignore_errors=True)
        t, rep = timed(lambda: shardkit("convert", *paths, "-o", flac, "-q", "-j", str(j), "--threads", "1",
                                        "--codec", "none", "--audio", "flac"))
        assert rep["ok"] == len(paths) and rep["audio"]["kept"] == 0, rep
        out["convert_bz2_to_flac"][j] = {"seconds": t, "hours_audio_per_s": hours / t,
                                         "size_vs_tar": rep["bytes_out"] / tar_bytes}
    zst_list = os.path.join(zst, "data.list")
    for j in jobs:
        runs = []
        for _ in range(args.repeat):
            t, rep = timed(lambda: shardkit("validate", zst_list, "-j", str(j)))
            assert not rep["findings"] and rep["totals"]["utterances"] == out["corpus"]["utterances"], rep["totals"]
            runs.append(t)
        t = sorted(runs)[len(runs) // 2]
        out["validate"][j] = {"seconds": t, "runs_s": runs, "hours_audio_per_s": hours / t}
    for j in jobs:
        out["validate"][j]["speedup_vs_j1"] = out["validate"][jobs[0]]["seconds"] / out["validate"][j]["seconds"]
    loader_list(zst_list, out["corpus"]["utterances"], out, hours, args)
    emit_results(out, args.json_out)


if __name__ == "__main__":
    main()
