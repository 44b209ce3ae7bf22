"""The WebDataset drop-ins before and after a change, interleaved in one run (issue 36's speed check).

    python benchmarks/bench_wds_dropin.py --before ../shardkit-before --after . --rounds 5   # ../shardkit-before: a git worktree of the commit to compare with

Builds 8 shards of speech-like 16 kHz WAV (plain tar and tar.gz) once, then times, round after round,
each checkout's ``shardkit.training.wds.WebDataset(urls).map(decode_audio())`` over all shards in a
fresh process (PYTHONPATH = that checkout), alternating before/after so machine noise hits both alike.
Reports the median CPU seconds of each and the ratio after/before (CPU time of the process: waiting
for a core on a shared machine does not count).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, glob
from shardkit.training.wds import WebDataset, decode_audio
urls = sorted(glob.glob(sys.argv[1]))
start = time.process_time()
frames = sum(s["wav"][0].shape[0] for s in WebDataset(urls, shardshuffle=False).map(decode_audio()))
print(time.process_time() - start, frames)
"""


def build(folder: str, shards: int = 8, per_shard: int = 60) -> None:
    import tarfile

    from shardkit.io.synth import encode, speech_like

    for i in range(shards):
        for suffix, mode in ((".tar", "w"), (".tar.gz", "w:gz")):
            with tarfile.open(os.path.join(folder, f"s{i:02d}{suffix}"), mode) as tar:
                for j in range(per_shard):
                    key = f"utt{i:02d}_{j:03d}"
                    for ext, data in (("txt", b"hello world"), ("wav", encode(speech_like(4.0, 16000, seed=i * 1000 + j),
                                                                                16000, "wav"))):
                        info = tarfile.TarInfo(f"{key}.{ext}")
                        info.size = len(data)
                        import io

                        tar.addfile(info, io.BytesIO(data))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        build(folder)
        results = {}
        for pattern in ("*.tar", "*.tar.gz"):
            times = {"before": [], "after": []}
            frames = set()
            for _ in range(args.rounds):
                for name in ("before", "after"):
                    env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(args, name)))
                    out = subprocess.run([sys.executable, "-c", CHILD, os.path.join(folder, pattern)], env=env,
                                         check=True, capture_output=True, text=True).stdout.split()
                    times[name].append(float(out[0]))
                    frames.add(int(out[1]))
            assert len(frames) == 1, frames  # both read every frame
            before, after = statistics.median(times["before"]), statistics.median(times["after"])
            results[pattern] = (before, after)
            print(f"{pattern:8} before {before:.3f} s  after {after:.3f} s  after/before {after / before:.3f}  "
                  f"(CPU s, median of {args.rounds}; all: {times})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
