"""Benchmark `shardkit convert --audio flac` against the limits of its parts.

    python benchmarks/bench_transcode.py --corpus-mb 120 --shards 4 --workdir /tmp/skbench-flac

On one bz2 corpus, in one run (configurations interleaved, medians of --repeat runs):
  - the parts alone, one core: bz2 decoding (indexed_bzip2), FLAC encoding of every WAV member
    (soundfile, from decoded samples), FLAC decoding, WAV decoding;
  - the limit for bz2 -> FLAC-in-plain-tar: bz2 decoding + FLAC encoding (serial on one core);
  - shardkit convert bz2 -> --codec none --audio flac, -j1 --threads 1, with and without --no-verify,
    and -j2; plain WAV tar -> FLAC-in-tar -j1 (hours of audio per second per core);
  - sizes: FLAC-in-plain-tar and bz2 relative to the plain WAV tar;
  - the encoders and levels (issue 17): libsndfile at levels 0-8 (size and speed), libFLAC through
    pyflac (if installed) with and without libFLAC's own verify mode, shardkit's transcode_member
    in-process, the CLI's start-up, and the CLI (-j1, as the user runs it) against libsndfile's
    encode + decode at its default level on the same members (CPU seconds of the child processes).
    --skip-bz2 leaves out the bz2 rows.
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
    ap.add_argument("--skip-bz2", action="store_true", help="only the plain WAV tar -> FLAC rows")
    args = ap.parse_args(argv)

    import indexed_bzip2
    import soundfile as sf

    from shardkit.io.tar import iter_shard_members

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
    levels = {}

    def sf_level(level):
        def run():
            total = 0
            for x, r in pcm:
                buf = io.BytesIO()
                sf.write(buf, x, r, format="FLAC", subtype="PCM_16", compression_level=level / 8)
                total += len(buf.getvalue())
            levels[level] = total
        return run

    def sf_encode_decode():
        for x, r in pcm:
            buf = io.BytesIO()
            sf.write(buf, x, r, format="FLAC", subtype="PCM_16")
            sf.read(io.BytesIO(buf.getvalue()), dtype="int16")

    def pyflac_encode(level, verify):
        import pyflac

        def run():
            for x, r in pcm:
                buf = io.BytesIO()
                enc = pyflac.StreamEncoder(r, lambda data, *_: buf.write(data), seek_callback=buf.seek,
                                           tell_callback=buf.tell, compression_level=level, verify=verify)
                enc.process(x.reshape(len(x), -1))
                enc.finish()
        return run

    def transcode_members(verify):
        from shardkit.io.transcode import transcode_member

        def run():
            for i, w in enumerate(wavs):
                transcode_member(f"u{i}.wav", w, "flac", None, verify)
        return run

    def startup():
        subprocess.run([sys.executable, "-c", "import shardkit.cli, shardkit.commands.convert, shardkit.io.transcode"], check=True)

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
    if args.skip_bz2:
        configs = {k: v for k, v in configs.items() if "bz2" not in k}
    configs.update({
        "libsndfile encode + decode, default level (the limit)": sf_encode_decode,
        **{f"libsndfile encode level {lv}": sf_level(lv) for lv in (0, 2, 3, 5, 8)},
        "shardkit transcode_member in-process (verified)": transcode_members(True),
        "shardkit transcode_member in-process (--no-verify)": transcode_members(False),
        "python start-up + shardkit imports": startup,
    })
    try:
        import pyflac  # noqa: F401
    except ImportError:
        pass
    else:
        for lv in (0, 5, 8):
            configs[f"pyflac (libFLAC) encode level {lv}"] = pyflac_encode(lv, False)
            configs[f"pyflac (libFLAC) encode level {lv}, libFLAC verify mode"] = pyflac_encode(lv, True)
    import resource

    def cpu_now():
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    times = {k: [] for k in configs}
    cpu = {k: [] for k in configs}
    for _ in range(args.repeat):
        for name, fn in configs.items():
            t, c = time.perf_counter(), cpu_now()
            fn()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(cpu_now() - c)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    med_cpu = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    rows = {k: {"median_s": m, "runs": times[k], "hours_audio_per_s": hours / m, "cpu_s": med_cpu[k],
                "hours_audio_per_cpu_s": hours / med_cpu[k] if med_cpu[k] else None} for k, m in med.items()}
    raw_pcm = sum(x.nbytes for x, _ in pcm)
    for lv, total in levels.items():
        rows[f"libsndfile encode level {lv}"]["size_vs_pcm"] = total / raw_pcm
    limit_cpu = med_cpu["libsndfile encode + decode, default level (the limit)"]
    enc_cpu = med_cpu["FLAC encode alone (soundfile)"]
    cli_targets = {
        "CLI -j1 verified vs libsndfile encode+decode (>= 0.9)": limit_cpu / med_cpu["shardkit wav-tar->flac -j1"],
        "CLI -j1 --no-verify vs encoder alone (>= 0.9)": enc_cpu / med_cpu["shardkit wav-tar->flac -j1 --no-verify"],
        "transcode_member verified vs libsndfile encode+decode": limit_cpu
        / med_cpu["shardkit transcode_member in-process (verified)"],
        "transcode_member --no-verify vs encoder alone": enc_cpu
        / med_cpu["shardkit transcode_member in-process (--no-verify)"],
    }
    flac_report = convert(plain, out, "-j", "2")
    if args.skip_bz2:
        emit_results({"machine": machine_info(), "corpus": {"shards": len(plain), "hours": hours,
                      "plain_tar_bytes": tar_bytes, "utterances": len(wavs)}, "rows": rows,
                      "targets_cpu": cli_targets,
                      "sizes_vs_plain_tar": {"flac_in_plain_tar": flac_report["bytes_out"] / tar_bytes}}, args.json_out)
        return
    limit = med["bz2 decode alone (indexed_bzip2 p=1)"] + med["FLAC encode alone (soundfile)"]
    result = {
        "machine": machine_info(),
        "corpus": {"shards": len(paths), "hours": hours, "plain_tar_bytes": tar_bytes,
                   "bz2_bytes": sum(os.path.getsize(p) for p in paths), "utterances": len(wavs)},
        "rows": rows,
        "targets_cpu": cli_targets,
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
