"""Benchmark `shardkit convert --audio flac` against the limits of its parts.

    python benchmarks/bench_transcode.py --corpus-mb 120 --shards 4 --workdir /tmp/skbench-flac

On one bz2 corpus, in one run (configurations interleaved, medians of --repeat runs):
  - the parts alone, one core: bz2 decoding (indexed_bzip2), FLAC encoding of every WAV member
    (soundfile, from decoded samples), FLAC decoding, WAV decoding;
  - the limit for bz2 -> FLAC-in-plain-tar: bz2 decoding + FLAC encoding (serial on one core);
  - shardkit convert bz2 -> --codec none --audio flac, -j1 --threads 1, with and without --no-verify,
    and -j2; plain WAV tar -> FLAC-in-tar -j1 (hours of audio per second per core);
  - sizes: FLAC-in-plain-tar and bz2 relative to the plain WAV tar.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import emit_results, machine_info, make_corpus  # noqa: E402


def convert(paths, out_dir, *args):
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "shardkit", "convert", *paths, "-o", out_dir, "-q", "--json", "--codec", "none",
           "--audio", "flac", *args]
    report = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert report["failed"] == 0 and report["audio"]["transcoded"] > 0 and report["audio"]["kept"] == 0, report
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus-mb", type=float, default=120)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--workdir", default="/tmp/skbench-flac")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)

    import indexed_bzip2
    import soundfile as sf

    from shardkit.tario import iter_shard_members

    paths = make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb, shards=args.shards)
    plain_dir = os.path.join(args.workdir, "plain")
    if not os.path.exists(os.path.join(plain_dir, "data.list")):
        subprocess.run([sys.executable, "-m", "shardkit", "convert", *paths, "-o", plain_dir, "-q", "--codec", "none"],
                       check=True)
    plain = [line.strip() for line in open(os.path.join(plain_dir, "data.list"))]
    wavs = [d for p in plain for n, d in iter_shard_members(p) if n.endswith(".wav")]
    pcm = [sf.read(io.BytesIO(w), dtype="int16") for w in wavs]
    flacs = []
    hours = sum(len(x) / r for x, r in pcm) / 3600
    tar_bytes = sum(os.path.getsize(p) for p in plain)

    def bz2_decode():
        for p in paths:
            with indexed_bzip2.open(p, parallelization=1) as f:
                while f.read(1 << 20):
                    pass

    def flac_encode():
        flacs.clear()
        for x, r in pcm:
            buf = io.BytesIO()
            sf.write(buf, x, r, format="FLAC", subtype="PCM_16")
            flacs.append(buf.getvalue())

    def flac_decode():
        for f in flacs:
            sf.read(io.BytesIO(f), dtype="int16")

    def wav_decode():
        for w in wavs:
            sf.read(io.BytesIO(w), dtype="int16")

    out = os.path.join(args.workdir, "out")
    configs = {
        "bz2 decode alone (indexed_bzip2 p=1)": bz2_decode,
        "FLAC encode alone (soundfile)": flac_encode,
        "FLAC decode alone (soundfile)": flac_decode,
        "WAV decode alone (soundfile)": wav_decode,
        "shardkit bz2->flac -j1 --threads 1": lambda: convert(paths, out, "-j", "1", "--threads", "1"),
        "shardkit bz2->flac -j1 --threads 1 --no-verify": lambda: convert(paths, out, "-j", "1", "--threads", "1",
                                                                          "--no-verify"),
        "shardkit bz2->flac -j2 --threads 1": lambda: convert(paths, out, "-j", "2", "--threads", "1"),
        "shardkit wav-tar->flac -j1": lambda: convert(plain, out, "-j", "1"),
        "shardkit wav-tar->flac -j1 --no-verify": lambda: convert(plain, out, "-j", "1", "--no-verify"),
        "shardkit wav-tar->flac -j2": lambda: convert(plain, out, "-j", "2"),
    }
    times = {k: [] for k in configs}
    for _ in range(args.repeat):
        for name, fn in configs.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    limit = med["bz2 decode alone (indexed_bzip2 p=1)"] + med["FLAC encode alone (soundfile)"]
    rows = {k: {"median_s": m, "runs": times[k], "hours_audio_per_s": hours / m} for k, m in med.items()}
    flac_report = convert(plain, out, "-j", "2")
    result = {
        "machine": machine_info(),
        "corpus": {"shards": len(paths), "hours": hours, "plain_tar_bytes": tar_bytes,
                   "bz2_bytes": sum(os.path.getsize(p) for p in paths), "utterances": len(wavs)},
        "rows": rows,
        "limit_bz2_to_flac_s": limit,
        "ratio_to_limit": {
            "-j1 (verify)": limit / med["shardkit bz2->flac -j1 --threads 1"],
            "-j1 --no-verify": limit / med["shardkit bz2->flac -j1 --threads 1 --no-verify"],
            "-j2 vs limit/2": (limit / 2) / med["shardkit bz2->flac -j2 --threads 1"],
        },
        "sizes_vs_plain_tar": {
            "bz2": sum(os.path.getsize(p) for p in paths) / tar_bytes,
            "flac_in_plain_tar": flac_report["bytes_out"] / tar_bytes,
        },
    }
    emit_results(result, args.json_out)


if __name__ == "__main__":
    main()
