"""Benchmark: planning a 1 M / 5 M / 20 M / 100 M-utterance three-corpus mix from JSON lines and Parquet indexes.

Each figure is one whole ``shardkit balance --dry-run`` (or ``shardkit plan``) process, start-up
included, run under ``/usr/bin/time`` for its wall time, CPU (user + sys) and peak RSS; configurations
are interleaved within a repeat, medians reported with the load average at each run, and every run's
plan is checked (balanced, the expected utterance count, the same plan from JSON lines and from
Parquet, and with ``--baseline`` the same report, every byte but its run time, from both checkouts). ``dry_run`` plans with the default plan version, ``dry_run_v1``/``dry_run_v2`` ask for
versions 1 and 2 (``--plan-version``), so one run compares them on the same indexes.

The mix is generated (shaped like the issue's: Mandarin ~3.6 s, English ~12.3 s, accented ~5 s,
50 / 30 / 20 % of the utterances; ~1 hour of audio per source shard), one index file per corpus,
written once into --work-dir and reused (20 M utterances: ~0.6 GB of Parquet; JSON lines ~320
bytes an utterance, so the 20 M JSON lines files are skipped unless --jsonl-max allows them).

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_plan_scale.py --sizes 1,5,20
    python benchmarks/bench_plan_scale.py --sizes 20,100 --jsonl-max 0 --commands dry_run,dry_run_v2 --repeats 3

Both checkouts are byte-compiled first, as `pip install` does: where PYTHONDONTWRITEBYTECODE is set (as on the
development machine), every process would otherwise compile shardkit's modules again (since the evening round of
2026-11-28; earlier figures paid it on both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

import numpy as np

MIX = (("mandarin", 0.5, 3.6), ("english", 0.3, 12.3), ("accented", 0.2, 5.0))
CHUNK = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-plan-scale")
    p.add_argument("--sizes", default="1,5,20", help="Millions of utterances, comma-separated.")
    p.add_argument("--jsonl-max", type=float, default=5, help="Largest size (millions) also run from JSON lines.")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--world-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--shard-duration", type=float, default=3600.0)
    p.add_argument("--commands", default="dry_run,plan",
                   help="dry_run, dry_run_v1 / dry_run_v2 (--plan-version 1 / 2) and/or plan.")
    p.add_argument("--baseline", default=None, metavar="CHECKOUT",
                   help="Also run the dry run (from each index kind) with the shardkit of this checkout (e.g. main's).")
    return p.parse_args()


def corpus_durations(n: int, mean: float, seed: int) -> np.ndarray:
    """Seconds of n utterances, gamma-shaped around ``mean``, whole 16 kHz frames, 0.5..30 s."""
    rng = np.random.default_rng(seed)
    return np.round(np.clip(rng.gamma(8.0, mean / 8.0, n), 0.5, 30.0) * 16000) / 16000


def write_parquet(path: str, corpus: str, durations: np.ndarray) -> None:
    """A Parquet index as ``shardkit index`` writes it, built column-wise (no per-row Python objects)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from shardkit.io.indexfile import ROW_GROUP_ROWS, open_parquet_writer, schema

    per_shard = max(1, int(3600 / durations.mean()))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        writer = open_parquet_writer(f)
        for lo in range(0, len(durations), CHUNK):
            d = durations[lo:lo + CHUNK]
            i = np.arange(lo, lo + len(d))
            shard_no = i // per_shard
            frames = np.round(d * 16000).astype(np.int64)
            wav = 44 + 2 * frames
            # offsets within the shard: each utterance takes a txt (header + 1 block) and a wav (header + blocks)
            span = 512 + 512 + 512 + (wav + 511) // 512 * 512
            first = np.r_[True, shard_no[1:] != shard_no[:-1]]
            starts = np.cumsum(span) - span
            start = starts - starts[np.maximum.accumulate(np.where(first, np.arange(len(d)), 0))]
            txt_off, wav_off = start + 512, start + 1536
            shard_names = pc.binary_join_element_wise(
                f"/data/{corpus}/shards_", pc.utf8_lpad(pc.cast(pa.array(shard_no), pa.string()), 9, "0"), ".tar", "")
            keys = pc.binary_join_element_wise(
                f"{corpus}/S", pc.utf8_lpad(pc.cast(pa.array(shard_no), pa.string()), 6, "0"), "/U",
                pc.utf8_lpad(pc.cast(pa.array(i), pa.string()), 9, "0"), "")
            names = pa.DictionaryArray.from_arrays(pa.array(np.tile([0, 1], len(d)).astype(np.int32)),
                                                   pa.array([".txt", ".wav"])).cast(pa.string())
            offsets = np.stack([txt_off, wav_off], 1).reshape(-1)
            sizes = np.stack([np.full(len(d), 30), wav], 1).reshape(-1)
            members = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * len(d) + 1, 2, dtype=np.int32)),
                                               pa.StructArray.from_arrays([names, pa.array(offsets), pa.array(sizes)],
                                                                          ["name", "offset", "size"]))
            n = len(d)
            columns = {
                "corpus": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([corpus])),
                "shard": shard_names.dictionary_encode(), "key": keys,
                "audio": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                        pa.array([".wav"])).cast(pa.string()),
                "format": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                         pa.array(["wav"])).cast(pa.string()),
                "bytes": pa.array(wav + 30), "sample_rate": pa.array(np.full(n, 16000, np.int32)),
                "channels": pa.array(np.ones(n, np.int16)), "frames": pa.array(frames), "duration": pa.array(d),
                "text_chars": pa.array(np.full(n, 20, np.int32)), "members": members,
                "text": pa.nulls(n, pa.string())}  # transcripts live in the shards' .txt members
            table = pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema()], schema=schema())
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        writer.close()
    os.replace(tmp, path)


def parquet_to_jsonl(src: str, dst: str) -> None:
    from shardkit.io.indexfile import dumps_line, iter_parquet_records

    with open(dst + ".tmp", "wb", buffering=1 << 20) as f:
        for record in iter_parquet_records(src):
            f.write(dumps_line(record))
    os.replace(dst + ".tmp", dst)


def ensure_indexes(work: str, millions: float, jsonl: bool) -> dict[str, dict[str, str]]:
    n = int(millions * 1_000_000)
    out = {"parquet": {}, "jsonl": {}}
    os.makedirs(work, exist_ok=True)
    for c, (corpus, share, mean) in enumerate(MIX):
        count = int(n * share) if c < len(MIX) - 1 else n - sum(int(n * s) for _, s, _ in MIX[:-1])
        base = os.path.join(work, f"{millions:g}M-{corpus}")
        if not os.path.exists(base + ".parquet"):
            print(f"generating {base}.parquet ({count} utterances)", file=sys.stderr)
            write_parquet(base + ".parquet", corpus, corpus_durations(count, mean, seed=c))
        out["parquet"][corpus] = base + ".parquet"
        if jsonl:
            if not os.path.exists(base + ".jsonl"):
                print(f"writing {base}.jsonl", file=sys.stderr)
                parquet_to_jsonl(base + ".parquet", base + ".jsonl")
            out["jsonl"][corpus] = base + ".jsonl"
    return out


def timed(cmd: list[str], checkout: str | None = None) -> tuple[float, float, str, float]:
    """(wall seconds, peak RSS MB, stdout, CPU seconds) of one process under /usr/bin/time (shardkit from
    ``checkout``)."""
    env = {**os.environ, "PYTHONPATH": checkout or os.getcwd()}
    # run from inside the checkout: `python -m` puts the working folder first on sys.path, before PYTHONPATH
    proc = subprocess.run(["/usr/bin/time", "-f", "%e %M %U %S", *cmd], capture_output=True, text=True, env=env,
                          cwd=checkout or os.getcwd())
    last = proc.stderr.strip().splitlines()[-1].split()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return float(last[0]), int(last[1]) / 1024, proc.stdout, float(last[2]) + float(last[3])


def dry_run_cmd(files: dict[str, str], args, out: str, command: str = "dry_run") -> list[str]:
    cmd = [sys.executable, "-m", "shardkit", "balance", "--world-size", str(args.world_size), "--num-workers",
           str(args.num_workers), "--shard-duration", str(args.shard_duration), "-o", out, "--dry-run", "--json", "-q"]
    if command in ("dry_run_v1", "dry_run_v2"):  # this checkout's planner, asked for an earlier plan version
        cmd += ["--plan-version", command[-1]]
    for corpus, path in files.items():
        cmd += ["--corpus", f"{corpus}={path}"]
    return cmd


def plan_cmd(files: dict[str, str], args, work: str) -> list[str]:
    """``shardkit plan LIST --index ...``: the shard list is every shard the indexes name."""
    import pyarrow.parquet as pq

    listing = os.path.join(work, os.path.basename(next(iter(files.values()))).split("-")[0] + ".list")
    if not os.path.exists(listing):
        names = []
        for path in files.values():
            parquet = path[:-len(".jsonl")] + ".parquet" if path.endswith(".jsonl") else path
            table = pq.read_table(parquet, columns=["shard"], read_dictionary=["shard"])
            for chunk in table.column("shard").chunks:
                names.extend(chunk.dictionary.to_pylist())
        with open(listing, "w") as f:
            f.write("\n".join(dict.fromkeys(names)) + "\n")
    cmd = [sys.executable, "-m", "shardkit", "plan", listing, "--world-size", str(args.world_size), "--num-workers",
           str(args.num_workers), "--epochs", "1", "--json", "-q"]
    for path in files.values():
        cmd += ["--index", path]
    return cmd


def main(args) -> None:
    rows = []
    commands = args.commands.split(",")
    for checkout in filter(None, [os.getcwd(), args.baseline]):
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(checkout, "shardkit")], check=True,
                       stdout=subprocess.DEVNULL)
    for millions in [float(x) for x in args.sizes.split(",")]:
        indexes = ensure_indexes(args.work_dir, millions, millions <= args.jsonl_max)
        disk = sum(os.path.getsize(p) for p in indexes["parquet"].values()) / (millions * 1e6)
        results: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
        digests = {}
        reports: dict[tuple, set[str]] = {}
        configs = [(kind, command, None) for kind in ("parquet", "jsonl") if indexes[kind] for command in commands]
        if args.baseline:  # the same dry run with the other checkout's shardkit, from each index kind
            configs += [(kind, "dry_run_baseline", args.baseline) for kind in ("parquet", "jsonl") if indexes[kind]]
        for _ in range(args.repeats):
            for kind, command, checkout in configs:
                cmd = (dry_run_cmd(indexes[kind], args, os.path.join(args.work_dir, "out"), command)
                       if command.startswith("dry_run") else plan_cmd(indexes[kind], args, args.work_dir))
                load = os.getloadavg()[0]
                wall, rss, stdout, cpu = timed(cmd, checkout)
                summary = json.loads(stdout)
                if command.startswith("dry_run"):
                    assert summary["balanced"], summary["max_deviation_seconds"]
                    assert summary["utterances"] >= millions * 1e6 - 1
                    # plans of one version agree (a baseline from before plan versions plans version 1)
                    version = summary.get("plan_version", 1)
                    digests.setdefault(version, {})[command + kind] = (
                        summary["max_deviation_seconds"], summary["num_shards"], summary["seconds"],
                        summary["mean_shard_seconds"])
                    # and from one index kind, every byte of the report but its run time, whichever checkout
                    report = {k: v for k, v in summary.items() if k != "elapsed_seconds"}
                    reports.setdefault((version, kind), set()).add(json.dumps(report, sort_keys=True))
                results.setdefault((kind, command), []).append((wall, rss, cpu, load))
        for runs in digests.values():  # the same plan from every index kind and checkout
            assert len(set(runs.values())) <= 1, digests
        for (version, kind), texts in reports.items():  # the same report, byte for byte, from every checkout
            assert len(texts) == 1, f"plan version {version} from {kind}: the reports differ between checkouts"
        deviation = {name: figures[0] for runs in digests.values() for name, figures in runs.items()}
        for (kind, command), runs in results.items():
            rows.append({"utterances_M": millions, "index": kind, "command": command,
                         "seconds": round(statistics.median(r[0] for r in runs), 2),
                         "seconds_each": [r[0] for r in runs],
                         "peak_rss_MB": round(statistics.median(r[1] for r in runs)),
                         "peak_rss_MB_max": round(max(r[1] for r in runs)),
                         "cpu_seconds": round(statistics.median(r[2] for r in runs), 2),
                         "cpu_seconds_each": [round(r[2], 2) for r in runs],
                         "load_average_each": [round(r[3], 2) for r in runs],
                         "parquet_bytes_per_utt": round(disk, 1),
                         "max_deviation_seconds": deviation.get(command + kind)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}", file=sys.stderr)


if __name__ == "__main__":
    main(parse_args())
