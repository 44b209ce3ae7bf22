"""Benchmark: `shardkit plan` on a 1 M-utterance index, with and without `--wenet-conf`.

The two commands run interleaved in fresh processes (`python -m shardkit plan LIST --index INDEX
--json -q`), so interpreter start-up and index reading count for both, as a user sees them;
medians over --repeats. Each run is checked: without the conf the plan covers every utterance,
with it the plan covers exactly those the filter keeps (the dropped count is recomputed here from
the index's own numbers with WeNet's filter rules), and every epoch's steps per rank add up.

The index: AISHELL-like utterances (gamma around 3.6 s, Mandarin-length transcripts) and
LibriSpeech-like ones (~12.3 s, English-length transcripts, so the default token_max_length 200
drops the long ones), 1000 per listed shard, written once into --work-dir (about 350 MB).
The conf: WeNet's defaults for the filter, speed perturbation, shuffle 1500 / sort 500, dynamic
batches of 12000 frames (`--batch static` for static batches of 16). No tokenizer file: tokens
are the index's text_chars, so no shard is read.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_wenet_conf.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-wenet-conf")
    p.add_argument("--utterances", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", choices=["dynamic", "static"], default="dynamic")
    return p.parse_args()


def make_index(work_dir: str, n: int) -> tuple[str, str, dict]:
    """The index file, its data.list and the per-utterance numbers the checks need (written once)."""
    from shardkit.commands.index import dumps_line

    rng = np.random.default_rng(2025)
    english = rng.random(n) < 0.22
    secs = np.where(english, np.clip(rng.normal(12.3, 3.6, n), 1.0, 35.0), np.clip(rng.gamma(9.0, 0.4, n), 0.8, 20))
    secs = np.round(secs, 3)
    frames = np.round(secs * 16000).astype(np.int64)
    chars = np.where(english, secs * rng.uniform(13, 17, n), secs * rng.uniform(3.5, 4.5, n)).astype(np.int64) + 1
    index = os.path.join(work_dir, f"index-{n}.jsonl")
    listing = os.path.join(work_dir, f"data-{n}.list")
    if not os.path.exists(index):
        with open(index + ".partial", "wb", buffering=1 << 22) as f:
            for i in range(n):
                name = "libri" if english[i] else "aishell"
                key = f"{name}/S{i // 300:05d}-U{i:07d}"
                offset = (i % 1000) * 120_000
                wav = 44 + 2 * int(frames[i])
                f.write(dumps_line({"shard": f"/data/mix/shards_{i // 1000:09d}.tar", "key": key, "corpus": name,
                                    "audio": key + ".wav", "format": "wav", "bytes": wav + 40, "sample_rate": 16000,
                                    "channels": 1, "frames": int(frames[i]), "duration": float(secs[i]),
                                    "text_chars": int(chars[i]),
                                    "members": [[key + ".txt", offset + 512, 40], [key + ".wav", offset + 1536, wav]]}))
        os.replace(index + ".partial", index)
    with open(listing, "w") as f:
        f.write("".join(f"/data/mix/shards_{s:09d}.tar\n" for s in range(-(-n // 1000))))
    return index, listing, {"frames": frames, "chars": chars}


def write_conf(work_dir: str, batch: str) -> str:
    path = os.path.join(work_dir, f"train-{batch}.yaml")
    batch_conf = ("{batch_type: dynamic, max_frames_in_batch: 12000}" if batch == "dynamic"
                  else "{batch_type: static, batch_size: 16}")
    with open(path, "w") as f:
        f.write("dataset_conf:\n  filter_conf: {max_length: 10240, min_length: 10, token_max_length: 200, "
                "token_min_length: 1}\n  resample_conf: {resample_rate: 16000}\n  speed_perturb: true\n"
                "  fbank_conf: {num_mel_bins: 80, frame_shift: 10, frame_length: 25, dither: 0.1}\n"
                "  spec_aug: true\n  shuffle: true\n  shuffle_conf: {shuffle_size: 1500}\n  sort: true\n"
                f"  sort_conf: {{sort_size: 500}}\n  batch_conf: {batch_conf}\n")
    return path


def run_plan(args, listing: str, index: str, conf: str | None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "shardkit", "plan", listing, "--index", index, "--world-size", str(args.world_size),
           "--num-workers", str(args.num_workers), "--epochs", str(args.epochs), "--json", "-q"]
    if conf:
        cmd += ["--wenet-conf", conf]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0, json.loads(out.stdout)


def expected_drops(numbers: dict) -> int:
    """WeNet's default filter on the index's numbers (frames at 16 kHz, tokens = text_chars)."""
    num_frames = numbers["frames"] / 16000 * 100
    t = numbers["chars"]
    keep = (num_frames >= 10) & (num_frames <= 10240) & (t >= 1) & (t <= 200) & (t / num_frames >= 0.0005) \
        & (t / num_frames <= 1)
    return int((~keep).sum())


def check(doc: dict, n: int, conf: bool, dropped: int) -> None:
    if not conf:
        assert doc["utterances"] == n and "wenet_conf" not in doc, doc.keys()
        return
    assert doc["wenet_conf"]["filter"]["dropped_utterances"] == dropped
    assert doc["utterances"] == n - dropped
    for epoch in doc["wenet_conf"]["batches"]["epochs"]:
        assert epoch["steps_per_rank"] == [sum(w) for w in epoch["batches_per_worker"]]


def stages(args, listing: str, index: str, conf: str) -> dict:
    """In-process seconds of the --wenet-conf steps: read the index columns, filter, simulate the batches."""
    from shardkit.wenet_conf.columns import index_columns
    from shardkit.wenet_conf.list_view import batches_of_lines
    from shardkit.wenet_conf.load import load_spec
    from shardkit.wenet_conf.simulation import Loader
    from shardkit.wenet_conf.verdict import apply_filter

    spec = load_spec(conf)
    with open(listing) as f:
        paths = f.read().split()
    t0 = time.perf_counter()
    cols = index_columns([index], want_txt=False, keep=set(paths))
    t1 = time.perf_counter()
    result = apply_filter(cols, spec)
    t2 = time.perf_counter()
    ids = {s: i for i, s in enumerate(cols.shards)}
    batches_of_lines(cols, result.keep, [ids[p] for p in paths], spec,
                     Loader(args.world_size, args.num_workers, seed=0, epochs=args.epochs))
    t3 = time.perf_counter()
    return {"read_index_s": t1 - t0, "filter_s": t2 - t1, "batches_s": t3 - t2}


def main(args) -> None:
    os.makedirs(args.work_dir, exist_ok=True)
    t0 = time.perf_counter()
    index, listing, numbers = make_index(args.work_dir, args.utterances)
    print(f"# index ready in {time.perf_counter() - t0:.1f} s: {os.path.getsize(index) / 1e6:.0f} MB",
          file=sys.stderr)
    conf = write_conf(args.work_dir, args.batch)
    dropped = expected_drops(numbers)
    times: dict[str, list[float]] = {"plain": [], "wenet_conf": []}
    last = {}
    for _ in range(args.repeats):
        for name, c in (("plain", None), ("wenet_conf", conf)):
            elapsed, doc = run_plan(args, listing, index, c)
            check(doc, args.utterances, c is not None, dropped)
            times[name].append(elapsed)
            last[name] = doc
    steps = [stages(args, listing, index, conf) for _ in range(args.repeats)]
    med = {k: statistics.median(v) for k, v in times.items()}
    e0 = last["wenet_conf"]["wenet_conf"]["batches"]["epochs"][0]
    print(json.dumps({
        "bench": "plan_wenet_conf", "utterances": args.utterances, "batch": args.batch,
        "world_size": args.world_size, "num_workers": args.num_workers, "epochs": args.epochs,
        "plain_median_s": round(med["plain"], 3), "wenet_conf_median_s": round(med["wenet_conf"], 3),
        "ratio": round(med["wenet_conf"] / med["plain"], 3),
        "plain_runs_s": [round(t, 3) for t in times["plain"]],
        "wenet_conf_runs_s": [round(t, 3) for t in times["wenet_conf"]],
        "in_process_median_s": {k: round(statistics.median(r[k] for r in steps), 3) for k in steps[0]},
        "dropped_utterances": dropped, "dropped_share": last["wenet_conf"]["wenet_conf"]["filter"]["dropped_share"],
        "epoch0_steps_per_rank": e0["steps_per_rank"], "epoch0_left_out": e0["equal_steps_left_out"],
        "python": platform.python_version(), "cpus": os.cpu_count(), "numpy": np.__version__}))


if __name__ == "__main__":
    main(parse_args())
