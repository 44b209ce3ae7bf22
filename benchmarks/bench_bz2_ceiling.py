"""How fast could any bz2 -> zst:3 converter go against `lbzip2 -dc | zstd -3`? (issue 17 part 3)

Per shard of a bz2 corpus, in CPU seconds, one thread each, configurations interleaved round by
round:

* ``lbzip2``: ``lbzip2 -dc -n1 SHARD > /dev/null`` (the pipeline's decoder on one core);
* ``zstd_cli``: ``zstd -3 -T1 -c TAR > /dev/null`` (the pipeline's compressor, one worker);
* ``indexed_bzip2``: shardkit's decoder (``indexed_bzip2.open(parallelization=1)``), read to the end;
* ``zstandard``: shardkit's compressor (``zstandard`` level 3, streaming, as convert writes).

``ceiling`` = (lbzip2 + zstd_cli) / (indexed_bzip2 + zstandard): the most a converter built on
shardkit's decoder and compressor can gain over the pipeline in CPU, with nothing else to do (no
tar parsing, no digests, no read-back). On two cores both sides keep both cores busy, so wall
time follows CPU time.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_bz2_ceiling.py \\
        --corpus-mb 330 --shards 5 --repeat 3 --workdir /tmp/skbench-ceiling
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-mb", type=float, default=330.0, help="Uncompressed tar MB of the corpus.")
    p.add_argument("--shards", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3, help="Rounds; every configuration runs once per round.")
    p.add_argument("--workdir", default="/tmp/skbench-ceiling")
    p.add_argument("--json-out", default=None)
    return p.parse_args()


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tool_cpu(argv: list[str], stdin_path: str | None = None) -> float:
    before = children_cpu()
    with open(stdin_path or os.devnull, "rb") as stdin, open(os.devnull, "wb") as sink:
        subprocess.run(argv, stdin=stdin, stdout=sink, check=True)
    return children_cpu() - before


def indexed_bzip2_cpu(path: str) -> float:
    import indexed_bzip2

    start = time.process_time()
    with indexed_bzip2.open(path, parallelization=1) as f:
        while f.read(1 << 20):
            pass
    return time.process_time() - start


def zstandard_cpu(tar_path: str) -> float:
    import zstandard

    start = time.process_time()
    with open(tar_path, "rb") as src, open(os.devnull, "wb") as sink, \
            zstandard.ZstdCompressor(level=3).stream_writer(sink) as writer:
        while chunk := src.read(1 << 20):
            writer.write(chunk)
    return time.process_time() - start


def main(args) -> None:
    from common import emit_results, machine_info, make_corpus

    for tool in ("lbzip2", "zstd"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install {tool})")
    os.makedirs(args.workdir, exist_ok=True)
    shards = make_corpus(os.path.join(args.workdir, "corpus"), total_mb=args.corpus_mb, shards=args.shards,
                         codec="bz2")
    tars = []
    for i, shard in enumerate(shards):  # the decompressed tar, for the compressors
        tar = os.path.join(args.workdir, f"shard{i}.tar")
        if not os.path.exists(tar):
            with open(tar + ".tmp", "wb") as out:
                subprocess.run(["lbzip2", "-dc", "-n2", shard], stdout=out, check=True)
            os.replace(tar + ".tmp", tar)
        tars.append(tar)
    names = ("lbzip2", "zstd_cli", "indexed_bzip2", "zstandard")
    rounds: list[dict] = []
    for _ in range(args.repeat):
        totals = dict.fromkeys(names, 0.0)
        for shard, tar in zip(shards, tars):  # interleaved shard by shard
            totals["lbzip2"] += tool_cpu(["lbzip2", "-dc", "-n1", shard])
            totals["indexed_bzip2"] += indexed_bzip2_cpu(shard)
            totals["zstd_cli"] += tool_cpu(["zstd", "-3", "-T1", "-q", "-c"], stdin_path=tar)
            totals["zstandard"] += zstandard_cpu(tar)
        totals["ceiling"] = ((totals["lbzip2"] + totals["zstd_cli"])
                             / (totals["indexed_bzip2"] + totals["zstandard"]))
        rounds.append(totals)
    median = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    emit_results({"machine": machine_info(), "corpus_tar_mb": args.corpus_mb, "shards": len(shards),
                  "rounds": [{k: round(v, 3) for k, v in r.items()} for r in rounds], "median_cpu_s": median},
                 args.json_out)


if __name__ == "__main__":
    main(parse_args())
