"""The reader's three targets, measured side by side in one run on the same corpus.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_reader.py --corpus-mb 320 --repeat 3

or, for the zst:3 rows only (issue 39's reader row: one core, interleaved, medians):

    python benchmarks/bench_reader.py --corpus-mb 320 --repeat 7 --only zst --skip-wenet

and before/after against another checkout (processes alternating, each with its own floors):

    python benchmarks/bench_reader.py --corpus-mb 320 --repeat 3 --only zst --clock cpu --baseline /tmp/sk-base

Generates (once, cached in --work-dir) a deterministic speech-like corpus of 16 kHz 16-bit WAV
(shardkit.commands.bench's generator: alternating short and long shards), packs it as plain tar, zst:3
and bz2, then runs every row once per round, rounds interleaved, so machine noise hits all rows
alike; reports medians and the spread. Every run must read every utterance (and decode every
frame, where it decodes). MB/s are of the uncompressed WAV tar. Targets (the issue):

1. plain-tar WAV read + decode >= 2 GB/s per core (about 5x tarfile + soundfile float32);
2. zst:3 read + decode >= 0.8x zstd decompression alone (issue 39: >= 0.9x), and against its floor: zstd
   alone plus the int16 -> float32 conversion of every byte, with no tar and no per-utterance work; the
   microseconds per utterance the reader adds to zstd alone, and the fused loop (shardkit.training.fused)
   against the three generator stages it replaces, in the same process;
3. zst:3 with shardkit's reader >= 50x the WeNet-style bz2 + torchaudio path.

These machines are shared and noisy: treat single figures with skepticism, compare within a run.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bench_corpus, bullets, corpus_parser, emit_results, machine_info, markdown_table  # noqa: E402

from shardkit.training.reader import iter_samples, reuse_freed_memory  # noqa: E402

# The floors' compressed read size: the reader's (shardkit.training.zstd_source.ZSTD_READ_SIZE), written out so
# that this script also measures a checkout from before that module (PYTHONPATH=<checkout>)
ZSTD_READ_SIZE = 1 << 20


def parse_args():
    p = corpus_parser(__doc__, corpus_mb=320.0, work_dir="/tmp/shardkit-bench-reader")
    p.add_argument("--repeat", type=int, default=3, help="rounds (every row once per round)")
    p.add_argument("--malloc", choices=("tuned", "default"), default="tuned",
                   help="tuned: shardkit.training.reader.reuse_freed_memory(), as ShardDataset's workers do")
    p.add_argument("--skip-wenet", action="store_true", help="leave out the slow WeNet-style bz2 row")
    p.add_argument("--only", choices=("all", "zst"), default="all", help="zst: the zst:3 rows only")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this process's CPU seconds (every row runs in this one thread), steadier on a busy machine")
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="before/after: run this script in a process per checkout (this one's package, then CHECKOUT's, "
                        "e.g. a `git archive` of main), alternating, --processes times; each process measures its "
                        "own floors beside shardkit, and the ratios' medians over the processes are reported")
    p.add_argument("--processes", type=int, default=6, help="with --baseline: processes per checkout")
    return p.parse_args()


def before_after(args) -> int:
    """``--baseline``: each checkout's ratios to the floors measured in its own processes, alternating, so that
    the machine's load and each process's memory layout (which moves single runs by several percent) hit both."""
    import subprocess
    import tempfile

    this = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = {"this checkout": this, f"baseline {args.baseline}": os.path.abspath(args.baseline)}
    forwarded = ["--corpus-mb", str(args.corpus_mb), "--work-dir", args.work_dir, "--repeat", str(args.repeat),
                 "--only", args.only, "--clock", args.clock, "--malloc", args.malloc, "--skip-wenet"]
    ratios: dict[str, dict[str, list[float]]] = {name: {} for name in checkouts}
    loads = [open("/proc/loadavg").read().split()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            for k, (name, root) in enumerate(checkouts.items()):
                out = os.path.join(tmp, f"{i}-{k}.json")
                # a pad of a few bytes moves the process's heap: the layout is sampled, not fixed by chance
                subprocess.run([sys.executable, os.path.abspath(__file__), *forwarded, "--json", out],
                               env=dict(os.environ, PYTHONPATH=root, SHARDKIT_BENCH_PAD=str(16 * i)),
                               check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    for target, value in json.load(f)["targets"].items():
                        ratios[name].setdefault(target, []).append(value)
            loads.append(open("/proc/loadavg").read().split()[0])
    names = list(ratios)
    rows = [[target] + [f"{statistics.median(ratios[n][target]):.3f} ({min(ratios[n][target]):.3f}-"
                        f"{max(ratios[n][target]):.3f})" for n in names] for target in ratios[names[0]]]
    result = {"machine": machine_info(), "processes": args.processes, "rounds": args.repeat, "loadavg_1min": loads,
              "ratios": ratios}
    emit_results(result, args.json, echo=False,
                 text=markdown_table(["ratio (median of the processes, range)", *names], rows)
                 + f"\n\n1-minute load average over the run: {', '.join(loads)}")
    return 0


def corpus(work: str, corpus_mb: float, formats: tuple[str, ...] = ("none", "zst:3", "bz2")) -> tuple[dict, dict]:
    """The WAV corpus as plain tar, zst:3 and bz2 (or ``formats``): totals and ``{format: shard paths}``."""
    totals, layout = bench_corpus(work, corpus_mb, audio=("wav",), formats=formats)
    return totals, {key.split("/")[0]: paths for key, paths in layout.items()}


def raw_read(paths):
    buf = bytearray(1 << 20)
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return None, total


def _zstd_into(paths, buf: bytearray):
    """The fastest decompression python-zstandard offers: each shard's stream_reader.readinto ``buf``, reused;
    yields how many bytes each read filled."""
    import zstandard

    for p in paths:
        with open(p, "rb") as f:
            reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=ZSTD_READ_SIZE, read_across_frames=True)
            while n := reader.readinto(buf):
                yield n


def zstd_alone(paths):
    """zstd decompression alone (:func:`_zstd_into`): the limit."""
    return None, sum(_zstd_into(paths, bytearray(1 << 20)))


def zstd_and_conversion(paths, dtype="float32"):
    """The floor of a decoding reader: zstd alone, then every decoded byte converted as 16-bit PCM to ``dtype``
    (the conversion ``decode_fast`` does, over 1 MiB at a time, in cache): no tar, no members, no Python
    per utterance. What the reader does beyond this is its overhead."""
    import numpy as np

    buf = bytearray(1 << 20)
    pcm = np.frombuffer(buf, "<i2")
    out = np.empty(len(pcm), dtype)
    scale = out.dtype.type(1 / 32768)
    total = 0
    for n in _zstd_into(paths, buf):
        total += n
        np.copyto(out, pcm)
        if dtype != "int16":
            out *= scale
    return None, total


def codec_reader(paths):
    """shardkit.io.codecs' strict reader (what convert, validate and index read zst through), for comparison."""
    from shardkit.io.codecs import iter_decompressed

    total = 0
    for p in paths:
        with open(p, "rb") as f:
            total += sum(len(c) for c in iter_decompressed(f, shard=p))
    return None, total


def shardkit_read(paths, dtype="float32", decode=True):
    count = frames = 0
    for s in iter_samples(paths, dtype=dtype, decode=decode):
        count += 1
        frames += len(s["audio"]) if decode else 0
    return count, frames


def shardkit_stages(paths, dtype="float32"):
    """iter_samples as three generator stages (members -> utterances -> decode, PCM WAV decoded as read): what it
    was before the fused loop (shardkit.training.fused), measured in the same process as the fused read."""
    from shardkit.training import reader

    count = frames = 0
    utterances = reader.iter_utterances(paths, decode_wav=reader._WavDecoder(dtype))
    for s in reader.decode_utterances(utterances, dtype=dtype):
        count += 1
        frames += len(s["audio"])
    return count, frames


def tarfile_soundfile(paths):
    import soundfile as sf

    count = frames = 0
    for p in paths:
        with tarfile.open(p, mode="r|*") as tar:
            for m in tar:
                data = tar.extractfile(m).read()
                if m.name.endswith(".wav"):
                    frames += len(sf.read(io.BytesIO(data), dtype="float32", always_2d=True)[0])
                    count += 1
    return count, frames


def wenet_bz2(paths):
    from shardkit.commands.bench import wenet_reference

    return wenet_reference(paths)


ZSTD_ALONE = "zst:3: zstd decompression alone (stream_reader)"
STAGES = "zst:3: shardkit {} through the three stages"
# target -> (numerator row, denominator row): a ratio of their MB/s
TARGETS = {
    "plain float32 vs tarfile + soundfile (about 5x)": ("plain: shardkit float32", "plain: tarfile + soundfile float32"),
    "zst:3 float32 vs zstd alone (>= 0.8; issue 39: >= 0.9)": ("zst:3: shardkit float32", ZSTD_ALONE),
    "zst:3 int16 vs zstd alone": ("zst:3: shardkit int16", ZSTD_ALONE),
    "zst:3 float32 vs its floor (zstd + conversion)": ("zst:3: shardkit float32",
                                                       "zst:3: zstd alone + float32 conversion (the floor)"),
    "zst:3 int16 vs its floor (zstd + copy)": ("zst:3: shardkit int16", "zst:3: zstd alone + int16 copy (the floor)"),
    "floor: zstd + float32 conversion vs zstd alone": ("zst:3: zstd alone + float32 conversion (the floor)", ZSTD_ALONE),
    "zst:3 float32 vs shardkit.io.codecs reader": ("zst:3: shardkit float32", "zst:3: shardkit.io.codecs reader"),
    "zst:3 float32 vs the three stages": ("zst:3: shardkit float32", STAGES.format("float32")),
    "zst:3 int16 vs the three stages": ("zst:3: shardkit int16", STAGES.format("int16")),
    "zst:3 float32 vs WeNet-style bz2 (>= 50x)": ("zst:3: shardkit float32",
                                                  "bz2: WeNet-style tarfile r:* + torchaudio.load"),
}


def main(args) -> int:
    if args.baseline:
        return before_after(args)
    _pad = bytearray(int(os.environ.get("SHARDKIT_BENCH_PAD", "0")))  # noqa: F841 (kept: see before_after)
    if args.malloc == "tuned":
        reuse_freed_memory()
    totals, layout = corpus(args.work_dir, args.corpus_mb, ("zst:3",) if args.only == "zst" else ("none", "zst:3", "bz2"))
    tar_bytes = totals["wav_tar_bytes"]
    plain, zst, bz2 = layout.get("none"), layout["zst:3"], layout.get("bz2")
    rows = {
        "plain: raw read (page cache)": (raw_read, plain, "bytes"),
        "plain: shardkit float32": (shardkit_read, plain, "frames"),
        "plain: shardkit int16": (lambda paths: shardkit_read(paths, "int16"), plain, "frames"),
        "plain: tarfile + soundfile float32": (tarfile_soundfile, plain, "frames"),
        "zst:3: zstd decompression alone (stream_reader)": (zstd_alone, zst, "bytes"),
        "zst:3: zstd alone + float32 conversion (the floor)": (zstd_and_conversion, zst, "bytes"),
        "zst:3: zstd alone + int16 copy (the floor)": (lambda paths: zstd_and_conversion(paths, "int16"), zst, "bytes"),
        "zst:3: shardkit.io.codecs reader": (codec_reader, zst, "bytes"),
        "zst:3: shardkit read + group, no decode": (lambda paths: shardkit_read(paths, decode=False), zst, "count"),
        "zst:3: shardkit float32": (shardkit_read, zst, "frames"),
        "zst:3: shardkit int16": (lambda paths: shardkit_read(paths, "int16"), zst, "frames"),
        STAGES.format("float32"): (shardkit_stages, zst, "frames"),
        STAGES.format("int16"): (lambda paths: shardkit_stages(paths, "int16"), zst, "frames"),
    }
    if not args.skip_wenet and args.only == "all":
        rows["bz2: WeNet-style tarfile r:* + torchaudio.load"] = (wenet_bz2, bz2, "frames")
    if args.only == "zst":
        rows = {name: row for name, row in rows.items() if name.startswith("zst:3")}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for fn, paths, _ in rows.values():  # warm-up on one shard: imports, FFmpeg loading, first allocations
        fn(paths[:1])
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeat):
        for name, (fn, paths, kind) in rows.items():
            t0 = clock()
            count, amount = fn(paths)
            times[name].append(clock() - t0)
            if kind == "bytes" and amount != tar_bytes:
                raise SystemExit(f"{name}: read {amount} of {tar_bytes} bytes")
            if kind != "bytes" and count != totals["utterances"]:
                raise SystemExit(f"{name}: read {count} of {totals['utterances']} utterances")
            if kind == "frames" and amount != totals["frames"]:
                raise SystemExit(f"{name}: decoded {amount} of {totals['frames']} frames")
    figures = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        figures[name] = {"mb_per_s": round(tar_bytes / median / 1e6, 1), "median_s": round(median, 4),
                         "spread": round((max(ts) - min(ts)) / median, 3), "runs": len(ts),
                         "hours_per_s": round(totals["seconds"] / 3600 / median, 3)}
    mb = {name: f["mb_per_s"] for name, f in figures.items()}
    targets = {name: round(mb[a] / mb[b], 3) if a in mb and b in mb else None for name, (a, b) in TARGETS.items()}
    if "plain: shardkit float32" in mb:
        targets["plain float32 MB/s (>= 2000)"] = mb["plain: shardkit float32"]
    for dtype in ("float32", "int16"):  # what the reader adds to zstd alone, per utterance (the fused loop's measure)
        if f"zst:3: shardkit {dtype}" in figures:
            added = figures[f"zst:3: shardkit {dtype}"]["median_s"] - figures[ZSTD_ALONE]["median_s"]
            targets[f"zst:3 {dtype}: us per utterance above zstd alone"] = round(added / totals["utterances"] * 1e6, 1)
    targets = {name: value for name, value in targets.items() if value is not None}
    result = {"machine": machine_info(), "malloc": args.malloc, "clock": args.clock, "corpus": totals,
              "rounds": args.repeat, "loadavg": open("/proc/loadavg").read().split()[:3],
              "rows": figures, "targets": targets}
    text = "\n".join(json.dumps({"row": name, **f}) for name, f in figures.items())
    table = markdown_table(["row", "MB/s of tar", "h/s", "±"],
                           [[name, f"{f['mb_per_s']:,.0f}", f"{f['hours_per_s']:.2f}", f"{f['spread'] * 50:.0f}%"]
                            for name, f in figures.items()])
    emit_results(result, args.json, echo=False, text=f"{text}\n\n{table}\n\n{bullets(targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
