"""The first batch after a mid-epoch restore vs a fresh start's first batch (issue 27's 1.2x target).

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_resume.py --work-dir /tmp/shardkit-bench-resume

One shuffled epoch of a ShardDataset under torchdata's StatefulDataLoader (batch 8) is read once per
format to save the loader state at 10%, 50% and 90% of its steps. Then, round after round with the
rows interleaved (in a new order each round), a new dataset and loader are made and timed to their
first batch: fresh (the epoch's start), restored from each saved state (ShardDataset's own state:
plain tar seeks; zst:3 as convert writes it, zstd's seekable format with 1 MiB frames, jumps to the
frame; zst:3 in one frame without a seek table, as written before, skips by decompressing), and
restored the way main did it before resume (the dataset wrapped so that it has no state:
StatefulDataLoader replays every batch before the saved step). Each restored first batch is
checked against the uninterrupted run's batch at that step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine_info  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-resume")
    p.add_argument("--utterances", type=int, default=1728)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--no-replay", action="store_true", help="skip the replay rows (main's way)")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def make_data(work_dir: str, utterances: int, shards: int) -> dict:
    """Plain shards; zst:3 as shardkit convert writes it (zstd's seekable format, 1 MiB frames); and
    zst:3 in one frame without a seek table (as shardkit wrote it before, and as other tools write)."""
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    folder = os.path.join(work_dir, f"none-{utterances}-{shards}")
    marker = os.path.join(folder, "paths.json")
    if not os.path.exists(marker):
        utts = list(corpus_utterances(CorpusSpec("resume", utterances, 1.0, 3.0, "en"), seed=1))
        paths = write_shards(utts, folder, utts_per_shard=-(-utterances // shards), codec="none")
        with open(marker, "w") as f:
            json.dump(paths, f)
    with open(marker) as f:
        plain = json.load(f)
    return {"none": plain, "zst": converted(plain, os.path.join(work_dir, f"zst-convert-{utterances}-{shards}")),
            "zst-one-frame": [one_frame_copy(p, os.path.join(work_dir, f"zst-one-frame-{utterances}-{shards}"))
                              for p in plain]}


def converted(plain: list[str], folder: str) -> list[str]:
    """``shardkit convert --codec zst:3`` of the plain shards (this checkout's writer), checked seekable."""
    import subprocess

    import pyzstd

    paths = [os.path.join(folder, os.path.basename(p) + ".zst") for p in plain]
    subprocess.run([sys.executable, "-m", "shardkit", "convert", *plain, "-o", folder, "--codec", "zst:3", "-q"],
                   check=True)  # a rerun resumes: shards already written are kept
    assert all(pyzstd.SeekableZstdFile.is_seekable_format_file(p) for p in paths), "convert wrote no seek table"
    return paths


def one_frame_copy(plain: str, folder: str) -> str:
    """The plain shard as zst:3 in one frame with its checksum and no seek table (zstandard's
    stream_writer, as shardkit's writer did before it wrote the seekable format)."""
    import zstandard

    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, os.path.basename(plain) + ".zst")
    if not os.path.exists(out):
        with open(plain, "rb") as src, open(out + ".tmp", "wb") as dst, \
                zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(dst, closefd=False) as w:
            while chunk := src.read(1 << 20):
                w.write(chunk)
        os.replace(out + ".tmp", out)
    return out


import torch.utils.data  # noqa: E402


class _Stateless(torch.utils.data.IterableDataset):
    """A ShardDataset without state, as on main: StatefulDataLoader can only replay it."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


def _loader(shards, workers, batch, stateless=False):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardkit.training.dataset import ShardDataset, collate_padded

    dataset = ShardDataset(shards, seed=11, rank=0, world_size=1)
    if stateless:
        dataset = _Stateless(dataset)
    return StatefulDataLoader(dataset, batch_size=batch, num_workers=workers, collate_fn=collate_padded)


def save_states(shards, workers, batch, fractions, stateless=False):
    """Read one epoch; the loader state at each fraction's step, the steps, and every batch's keys."""
    loader = _loader(shards, workers, batch)
    keys = [b["key"] for b in loader]
    steps = {f: max(1, round(f * len(keys))) for f in fractions}
    states = {}
    loader = _loader(shards, workers, batch, stateless)
    for step, _ in enumerate(loader, 1):
        for f, s in steps.items():
            if s == step:
                states[f] = loader.state_dict()
        if step == max(steps.values()):
            break
    return states, steps, keys


def _saved(shards, workers, batch, fractions, replay):
    states, steps, keys = save_states(shards, workers, batch, fractions)
    replay_states = save_states(shards, workers, batch, fractions, stateless=True)[0] if replay else None
    return shards, states, replay_states, steps, keys


def first_batch(shards, workers, batch, state=None, stateless=False):
    start = time.perf_counter()
    loader = _loader(shards, workers, batch, stateless)
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    keys = next(it)["key"]
    seconds = time.perf_counter() - start
    del it
    return seconds, keys


def main(args) -> int:
    import logging

    logging.getLogger("torchdata").setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")
    data = make_data(args.work_dir, args.utterances, args.shards)
    fractions = (0.1, 0.5, 0.9)
    rows = {}
    setups = {}
    for codec, shards in data.items():
        for workers in args.workers:
            setups[(codec, workers)] = _saved(shards, workers, args.batch, fractions, not args.no_replay)
    tasks = [(setup, "fresh", 0.0) for setup in setups]
    tasks += [(setup, kind, f) for setup in setups for f in fractions
              for kind in (("restored",) if args.no_replay else ("restored", "replay"))]
    for round_ in range(args.rounds):
        # a new order every round: whatever a row inherits from the one before it (freed memory, a
        # worker just gone) falls on every row alike
        random.Random(round_).shuffle(tasks)
        for (codec, workers), kind, f in tasks:
            shards, states, replay_states, steps, keys = setups[(codec, workers)]
            state = None if kind == "fresh" else (states if kind == "restored" else replay_states)[f]
            t, got = first_batch(shards, workers, args.batch, state, stateless=kind == "replay")
            assert got == keys[steps[f] if state is not None else 0], (codec, workers, kind, f)
            rows.setdefault((codec, workers, kind, f), []).append(t)
    report = []
    for (codec, workers, kind, f), times in rows.items():
        fresh = statistics.median(rows[(codec, workers, "fresh", 0.0)])
        med = statistics.median(times)
        report.append({"codec": codec, "workers": workers, "row": kind, "at": f,
                       "step": setups[(codec, workers)][3].get(f, 0), "steps": len(setups[(codec, workers)][4]),
                       "median_s": round(med, 5), "min_s": round(min(times), 5), "max_s": round(max(times), 5),
                       "vs_fresh": round(med / fresh, 3)})
    report.sort(key=lambda r: (r["codec"], -r["workers"], ["fresh", "restored", "replay"].index(r["row"]), r["at"]))
    print(f"{'codec':12} {'workers':>7} {'row':9} {'at':>4} {'step':>9} {'median s':>9} {'vs fresh':>8} "
          f"{'min s':>8} {'min vs fresh':>12}")
    for r in report:
        fresh_min = next(x["min_s"] for x in report if x["row"] == "fresh" and x["codec"] == r["codec"]
                         and x["workers"] == r["workers"])
        r["min_vs_fresh_min"] = round(r["min_s"] / fresh_min, 3)
        print(f"{r['codec']:12} {r['workers']:>7} {r['row']:9} {r['at']:>4} {r['step']:>4}/{r['steps']:<4} "
              f"{r['median_s']:>9.4f} {r['vs_fresh']:>8.2f} {r['min_s']:>8.4f} {r['min_vs_fresh_min']:>12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "args": vars(args), "rows": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
