"""WAV tar -> FLAC-in-tar, verified, one core (issue 39): where the time goes, the other encoders, before/after.

    python benchmarks/bench_flac_verified.py --baseline BASELINE_CHECKOUT --repeat 5 --workdir /tmp/flac39b

On one plain WAV corpus (common.make_corpus: 16 kHz mono 16-bit speech-like, --corpus-mb of tar, 4 shards),
every configuration once per round, rounds interleaved, medians of --repeat rounds; CPU seconds of this
process and its children (one core: everything runs in one thread, and -j1 runs inline), and wall seconds.

- profile: the parts of a verified transcode alone, in-process: tar read, WAV header parse, WAV decode
  (libsndfile), FLAC encode (soundfile), FLAC decode (soundfile: the old path's verification), the sample
  comparison, the sample digest, libFLAC's encoder through shardkit.io.libflac with and without its verify
  mode, transcode_member on the soundfile path (fallback) and on the libFLAC path, convert's own side
  (convert_shard with a transform that hands back finished members: tar write, digests, index, read-back,
  fsync), and Python start-up with the imports;
- alternatives on the same members: the `flac` CLI (-5, then -5 --verify, and -d), pyFLAC's StreamEncoder
  with and without libFLAC's verify mode, soundfile encode alone and encode + decode (the issue's
  "encode + decode alone", the limit the goal is a ratio of);
- the CLI as the user runs it, `convert --codec none --audio flac -j1`, verified, from --baseline (a checkout
  before this change) and from this checkout, and the ratio of each to the limit measured in the same round;
  and both on two tiny shards (~30 s of audio each): what every run pays whatever its size.

Every CLI run must transcode every audio member and keep none; every transcode is checked to decode back.
Both checkouts are byte-compiled first, as `pip install` does: where PYTHONDONTWRITEBYTECODE is set (as on
the development machine), every run would otherwise compile shardkit's modules again.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from operator import sub, truediv

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import emit_results, machine_info, make_corpus  # noqa: E402


TINY_BEFORE = "CLI before (baseline), verified, two tiny shards (fixed costs)"
TINY_AFTER = "CLI after (this checkout), verified, two tiny shards (fixed costs)"


def cpu_now() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cli(root: str, paths: list[str], out: str, *extra: str) -> None:
    """`convert --codec none --audio flac -j1` from the checkout at ``root``."""
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.run([sys.executable, "-m", "shardkit", "convert", *paths, "-o", out, "--codec", "none", "--audio",
                        "flac", "-j1", "-q", "--json", *extra], cwd=root, env={**os.environ, "PYTHONPATH": root},
                       capture_output=True, text=True, check=True)
    report = json.loads(p.stdout)
    assert report["failed"] == 0 and report["audio"]["kept"] == 0 and report["audio"]["transcoded"] > 0, report


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="a checkout before this change (e.g. git archive of main)")
    ap.add_argument("--corpus-mb", type=float, default=120)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--workdir", default="/tmp/flac39b")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--only", action="append", default=[], metavar="WORDS",
                    help="run only the rows whose name contains WORDS (repeatable; the limit always runs), e.g. "
                         "--only CLI for more rounds of the before/after rows")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import numpy as np
    import soundfile as sf

    from shardkit.commands.convert import ConvertSettings, convert_shard
    from shardkit.io import libflac, transcode
    from shardkit.io.audio import parse_wav_header
    from shardkit.io.tar import iter_shard_members

    root = os.path.dirname(HERE)
    for checkout in (root, os.path.abspath(args.baseline)):
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(checkout, "shardkit")], check=True,
                       stdout=subprocess.DEVNULL)
    paths = make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb, shards=args.shards,
                        codec="none")
    # two tiny shards (~30 s of audio each, 9 utterances): what a run costs whatever its size (start-up, the index,
    # the report)
    tiny = make_corpus(os.path.join(args.workdir, "tiny"), total_mb=2, shards=2, codec="none")
    members = [(p, n, d) for p in paths for n, d in iter_shard_members(p)]
    wavs = [d for _, n, d in members if n.endswith(".wav")]
    pcm = [sf.read(io.BytesIO(w), dtype="int16", always_2d=True) for w in wavs]
    hours = sum(len(x) / r for x, r in pcm) / 3600
    lib = libflac.encoder_library(None)
    assert lib is not None, "no libFLAC writing soundfile's bytes: pip install pyflac"
    encoded = [transcode.transcode_member(f"u{i}.wav", w, "flac")[1] for i, w in enumerate(wavs)]
    decoded = [sf.read(io.BytesIO(f), dtype="int16", always_2d=True)[0] for f in encoded]
    assert all(np.array_equal(a, x) for a, (x, _) in zip(decoded, pcm))

    wav_dir, flac_dir, cli_out = (os.path.join(args.workdir, d) for d in ("wav", "flac-cli", "flac-out"))
    os.makedirs(wav_dir, exist_ok=True)
    for i, w in enumerate(wavs):
        with open(os.path.join(wav_dir, f"u{i:05d}.wav"), "wb") as f:
            f.write(w)
    wav_files = sorted(glob.glob(os.path.join(wav_dir, "*.wav")))

    def flac_cli(*opts, inputs=wav_files):
        os.makedirs(flac_dir, exist_ok=True)
        subprocess.run(["flac", "-s", "-f", "--no-padding", "--no-seektable", f"--output-prefix={flac_dir}/", *opts,
                        *inputs], check=True)

    def flac_cli_decode():
        flac_cli("-d", inputs=sorted(glob.glob(os.path.join(flac_dir, "*.flac"))))

    def with_encoder(verify):
        def run():
            for x, r in pcm:
                enc = libflac.VerifiedEncoder(lib, r, x.shape[1], 16, None, verify)
                for i in range(0, len(x), 1 << 16):
                    enc.write(x[i:i + (1 << 16)])
                enc.finish()
        return run

    def pyflac_encode(verify):
        import pyflac

        def run():
            for x, r in pcm:
                buf = io.BytesIO()
                enc = pyflac.StreamEncoder(r, lambda data, *_: buf.write(data), seek_callback=buf.seek,
                                           tell_callback=buf.tell, compression_level=5, verify=verify)
                enc.process(x)
                enc.finish()
        return run

    def wav_blocks(opener):
        def run():
            for w in wavs:
                with opener(w) as src:
                    while len(src.read(1 << 16, dtype="int16", always_2d=True)):
                        pass
        return run

    def sf_encode():
        for x, r in pcm:
            sf.write(io.BytesIO(), x, r, format="FLAC", subtype="PCM_16")

    def sf_encode_decode():
        for x, r in pcm:
            buf = io.BytesIO()
            sf.write(buf, x, r, format="FLAC", subtype="PCM_16")
            sf.read(io.BytesIO(buf.getvalue()), dtype="int16", always_2d=True)

    def on_path(fallback: bool):
        def run():
            os.environ[libflac.LIBRARY_ENV] = "none" if fallback else ""
            libflac.encoder_library.cache_clear()
            try:
                for i, w in enumerate(wavs):
                    transcode.transcode_member(f"u{i}.wav", w, "flac")
            finally:
                os.environ.pop(libflac.LIBRARY_ENV)
                libflac.encoder_library.cache_clear()
        return run

    finished = {}
    for p in paths:
        for name, data in ((n, d) for q, n, d in members if q == p):
            finished[(p, name)] = transcode.transcode_member(name, data, "flac") if name.endswith(".wav") else \
                (name, data, None)

    def convert_side():
        settings = ConvertSettings(codec="none", level=None, audio="flac")
        for p in paths:
            dst = os.path.join(args.workdir, "side", os.path.basename(p))
            entry = convert_shard(p, dst, settings, lambda shard, name, _data: finished[(shard, name)])
            assert entry["status"] == "ok", entry

    def startup():
        subprocess.run([sys.executable, "-c", "import shardkit.cli, shardkit.commands.convert, shardkit.io.transcode"],
                       cwd=root, env={**os.environ, "PYTHONPATH": root}, check=True)

    configs = {
        # the parts (profile)
        "tar read (iter_shard_members)": lambda: [None for p in paths for _ in iter_shard_members(p)],
        "WAV header parse (sniff + header_facts)": lambda: [transcode._transcodable(w, "flac", None) for w in wavs],
        "WAV decode (libsndfile, int16 blocks; before)": wav_blocks(lambda w: sf.SoundFile(io.BytesIO(w))),
        "WAV samples from the data chunk (after)":
            wav_blocks(lambda w: transcode._PcmWav(w, parse_wav_header(w))),
        "sample digest (SHA-256 of the int16 samples)": lambda: [transcode.pcm_digest(x, r) for x, r in pcm],
        "sample comparison (np.array_equal)": lambda: [np.array_equal(a, x) for a, (x, _) in zip(decoded, pcm)],
        "FLAC decode alone (soundfile; the old path's verification)":
            lambda: [sf.read(io.BytesIO(f), dtype="int16", always_2d=True) for f in encoded],
        "FLAC encode alone (soundfile)": sf_encode,
        "**soundfile encode + decode (the limit)**": sf_encode_decode,
        "libFLAC encode (io.libflac, verify mode off)": with_encoder(False),
        "libFLAC encode + verify mode (io.libflac)": with_encoder(True),
        "transcode_member, the fallback: soundfile + a second decode": on_path(True),
        "transcode_member, libFLAC verify mode (after)": on_path(False),
        "convert's side (tar, digests, index, read-back, fsync), finished members": convert_side,
        "Python start-up + imports": startup,
        # the alternatives
        "flac CLI -5": lambda: flac_cli("-5"),
        "flac CLI -5 --verify": lambda: flac_cli("-5", "--verify"),
        "flac CLI -d (decode alone)": flac_cli_decode,
        "pyFLAC StreamEncoder level 5": pyflac_encode(False),
        "pyFLAC StreamEncoder level 5, verify mode": pyflac_encode(True),
        # the CLI, before and after
        "CLI before (baseline), verified": lambda: cli(os.path.abspath(args.baseline), paths, cli_out),
        "CLI after (this checkout), verified": lambda: cli(root, paths, cli_out),
        "CLI before (baseline), --no-verify": lambda: cli(os.path.abspath(args.baseline), paths, cli_out,
                                                          "--no-verify"),
        "CLI after (this checkout), --no-verify": lambda: cli(root, paths, cli_out, "--no-verify"),
        TINY_BEFORE: lambda: cli(os.path.abspath(args.baseline), tiny, cli_out),
        TINY_AFTER: lambda: cli(root, tiny, cli_out),
    }
    limit = "**soundfile encode + decode (the limit)**"
    if args.only:
        configs = {k: v for k, v in configs.items() if k == limit or any(w in k for w in args.only)}
    if shutil.which("flac") is None:
        configs = {k: v for k, v in configs.items() if not k.startswith("flac CLI")}
    try:
        import pyflac  # noqa: F401
    except ImportError:
        configs = {k: v for k, v in configs.items() if not k.startswith("pyFLAC")}

    cpu = {k: [] for k in configs}
    wall = {k: [] for k in configs}
    loads = []
    for r in range(args.repeat):
        loads.append(open("/proc/loadavg").read().split()[0])
        for name, fn in configs.items():
            w, c = time.perf_counter(), cpu_now()
            fn()
            cpu[name].append(cpu_now() - c)
            wall[name].append(time.perf_counter() - w)
        print(f"round {r + 1}/{args.repeat} done (load {loads[-1]})", file=sys.stderr, flush=True)

    def median(xs):
        return sorted(xs)[len(xs) // 2]

    def per_round(a: str, b: str, op):
        return round(median([op(x, y) for x, y in zip(cpu[a], cpu[b])]), 3) if a in cpu and b in cpu else None

    rows = {k: {"cpu_s": round(median(cpu[k]), 3), "wall_s": round(median(wall[k]), 3),
                "h_per_cpu_s": round(hours / median(cpu[k]), 3),
                "vs_limit_per_round": round(median([a / b for a, b in zip(cpu[limit], cpu[k])]), 3)}
            for k in configs}
    result = {"machine": machine_info(), "load_at_each_round": loads,
              "corpus": {"shards": len(paths), "hours": round(hours, 4), "utterances": len(wavs),
                         "tar_bytes": sum(os.path.getsize(p) for p in paths)},
              "rows": rows,
              "ratios": {  # each per round, then the median (None: a row --only left out)
                  "CLI before / limit": per_round(limit, "CLI before (baseline), verified", truediv),
                  "CLI after / limit": per_round(limit, "CLI after (this checkout), verified", truediv),
                  "CLI --no-verify after / encode alone": per_round(
                      "FLAC encode alone (soundfile)", "CLI after (this checkout), --no-verify", truediv),
                  "after / before (CPU, per round)": per_round(
                      "CLI before (baseline), verified", "CLI after (this checkout), verified", truediv),
                  "fixed costs, before - after (CPU s, per round)": per_round(TINY_BEFORE, TINY_AFTER, sub)}}
    print("| what, one core | CPU s | wall s | h of audio per CPU-s | limit's CPU / this (per round) |")
    print("|---|---:|---:|---:|---:|")
    for k, v in rows.items():
        print(f"| {k} | {v['cpu_s']:.3f} | {v['wall_s']:.3f} | {v['h_per_cpu_s']:.3f} | {v['vs_limit_per_round']:.3f} |")
    emit_results(result, args.json_out)


if __name__ == "__main__":
    main()
