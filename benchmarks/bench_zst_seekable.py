"""What zstd's seekable format costs and buys: convert before/after, frame sizes, compression threads.

    git archive <commit before> shardkit | tar -x -C /tmp/shardkit-before     # the code before, for --baseline-root
    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_zst_seekable.py \
        --baseline-root /tmp/shardkit-before --rounds 5

One run, on the same plain shards (a speech-like corpus, 16 kHz 16-bit WAV), configurations interleaved
in a new order each round, medians:

1. ``shardkit convert`` plain -> zst:3, -j 1 and -j 2, this checkout (seekable format) against the code
   at --baseline-root (one frame per shard): wall time, CPU seconds of the convert processes, output size.
   Every run verifies its output (convert reads each shard back); the outputs are checked to be seekable
   (after) or one frame (before), and to decompress to the same tar streams.
2. The writer's choices, in this process over the same tars: one frame (zstandard's stream_writer,
   before), pyzstd's SeekableZstdFile with frames of 256 KiB to 4 MiB in one thread, and 1 MiB frames with
   zstd's worker threads (nbWorkers 1, 2): MB/s of tar per wall second and per CPU second, size; and
   the resume cost each frame size leaves, the time to stand at a random offset through the seek table
   (``reader._open_at``: the frame holding it decompressed up to it) and read one 64 KiB member.
3. A whole read of convert's outputs, before and after: decompression alone and shardkit's member reader,
   from each shard's start and from a resume offset (the rest of a resumed shard).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine_info  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMES = (256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-seekable")
    p.add_argument("--plain-dir", default=None, help="plain shards to use [default: make 1,728 utterances in 16]")
    p.add_argument("--baseline-root", default=None, help="a checkout of the code before (one-frame zst)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seeks", type=int, default=200, help="random resume offsets per frame size")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def plain_shards(args) -> list[str]:
    if args.plain_dir:
        return sorted(os.path.join(args.plain_dir, n) for n in os.listdir(args.plain_dir) if n.endswith(".tar"))
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    folder = os.path.join(args.work_dir, "plain")
    marker = os.path.join(folder, "paths.json")
    if not os.path.exists(marker):
        utts = corpus_utterances(CorpusSpec("seekable", 1728, 1.0, 3.0, "en"), seed=1)
        paths = write_shards(utts, folder, utts_per_shard=108, codec="none")
        with open(marker, "w") as f:
            json.dump(paths, f)
    with open(marker) as f:
        return json.load(f)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_convert(root: str, paths: list[str], out: str, jobs: int) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and output bytes of one convert run of the code at ``root``."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": root}
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "shardkit", "convert", *paths, "-o", out, "--codec", "zst:3", "-j", str(jobs),
                    "-q"], env=env, check=True, cwd=root)
    wall = time.perf_counter() - start
    size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out) if n.endswith(".tar.zst"))
    return wall, _children_cpu() - cpu, size


def check_outputs(out: str, paths: list[str], seekable: bool) -> None:
    import pyzstd

    from shardkit.io.codecs import iter_decompressed

    for p in paths:
        path = os.path.join(out, os.path.basename(p) + ".zst")
        assert pyzstd.SeekableZstdFile.is_seekable_format_file(path) == seekable, path
        with open(path, "rb") as f, open(p, "rb") as plain:
            assert b"".join(iter_decompressed(f, shard=path)) == plain.read(), path


def convert_rows(args, paths: list[str]) -> list[dict]:
    roots = {"after (seekable, 1 MiB frames)": ROOT}
    if args.baseline_root:
        roots["before (one frame)"] = os.path.abspath(args.baseline_root)
    tasks = [(name, jobs) for name in roots for jobs in (1, 2)]
    figures: dict = {}
    for round_ in range(args.rounds):
        random.Random(round_).shuffle(tasks)
        for name, jobs in tasks:
            out = os.path.join(args.work_dir, "out", f"{'after' if roots[name] == ROOT else 'before'}-j{jobs}")
            wall, cpu, size = run_convert(roots[name], paths, out, jobs)
            if round_ == 0:
                check_outputs(out, paths, seekable=roots[name] == ROOT)
            figures.setdefault((name, jobs), []).append((wall, cpu, size))
    tar_mb = sum(os.path.getsize(p) for p in paths) / 1e6
    rows = []
    for (name, jobs), runs in sorted(figures.items()):
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        # CPU of -j 2 is not counted whole (the pool's workers are not reaped by convert's process): -j 1 only
        rows.append({"code": name, "jobs": jobs, "wall_s": round(wall, 3),
                     "cpu_s": round(cpu, 3) if jobs == 1 else None,
                     "mb_per_s": round(tar_mb / wall, 1), "mb_per_cpu_s": round(tar_mb / cpu, 1) if jobs == 1 else None,
                     "output_mb": round(runs[0][2] / 1e6, 3), "ratio": round(runs[0][2] / 1e6 / tar_mb, 4)})
    return rows


def _one_frame(data: bytes) -> bytes:
    import zstandard

    sink = io.BytesIO()
    with zstandard.ZstdCompressor(level=3, write_checksum=True).stream_writer(sink, closefd=False) as w:
        _feed(w, data)
    return sink.getvalue()


def _seekable(frame: int, workers: int = 0):
    import pyzstd

    def write(data: bytes) -> bytes:
        options = {pyzstd.CParameter.compressionLevel: 3, pyzstd.CParameter.checksumFlag: 1}
        if workers:
            options[pyzstd.CParameter.nbWorkers] = workers
        sink = io.BytesIO()
        with pyzstd.SeekableZstdFile(sink, "w", level_or_option=options, max_frame_content_size=frame) as w:
            _feed(w, data)
        return sink.getvalue()

    return write


def _feed(writer, data: bytes) -> None:
    """Writes as a tar writer makes them: a 512-byte header, then the member (here 64 KiB pieces)."""
    view = memoryview(data)
    for i in range(0, len(data), 65536):
        writer.write(view[i:i + 512])
        writer.write(view[i + 512:i + 65536])


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def seek_cost(blob: bytes, offsets: list[int]) -> float:
    """Median seconds to stand at an offset through the seek table and read the 64 KiB after it."""
    from shardkit.training.reader import _open_at

    times = []
    for offset in offsets:
        f = io.BufferedReader(io.BytesIO(blob))
        start = time.perf_counter()
        source = _open_at(f, "bench", "zst", offset, 1)
        source.read(65536)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def writer_rows(args, paths: list[str]) -> list[dict]:
    datas = []
    for p in paths:
        with open(p, "rb") as f:
            datas.append(f.read())
    total_mb = sum(map(len, datas)) / 1e6
    writers = {"one frame (zstandard stream_writer, before)": _one_frame}
    writers.update({f"seekable, {frame >> 10} KiB frames": _seekable(frame) for frame in FRAMES})
    writers.update({f"seekable, 1024 KiB frames, zstd nbWorkers={n}": _seekable(1 << 20, n) for n in (1, 2)})
    figures: dict = {name: [] for name in writers}
    outputs: dict = {}
    names = list(writers)
    for round_ in range(args.rounds):
        random.Random(100 + round_).shuffle(names)
        for name in names:
            cpu, start = _process_cpu(), time.perf_counter()
            blobs = [writers[name](d) for d in datas]
            figures[name].append((time.perf_counter() - start, _process_cpu() - cpu))
            outputs[name] = blobs
    one = sum(map(len, outputs["one frame (zstandard stream_writer, before)"]))
    rng = random.Random(7)
    rows = []
    for name in writers:
        wall = statistics.median(f[0] for f in figures[name])
        cpu = statistics.median(f[1] for f in figures[name])
        size = sum(map(len, outputs[name]))
        row = {"writer": name, "mb_per_s": round(total_mb / wall, 1), "mb_per_cpu_s": round(total_mb / cpu, 1),
               "output_mb": round(size / 1e6, 3), "vs_one_frame_size_pct": round(100 * (size / one - 1), 3)}
        if name.startswith("seekable") and "nbWorkers" not in name:
            blob, data = outputs[name][0], datas[0]
            offsets = [rng.randrange(0, len(data) - 65536) // 512 * 512 for _ in range(args.seeks)]
            row["resume_seek_ms"] = round(1000 * seek_cost(blob, offsets), 3)
        rows.append(row)
    same = len({outputs[n][0] for n in writers if "nbWorkers" in n}) == 1
    rows.append({"writer": "nbWorkers=1 and =2 give the same bytes", "same": same})
    return rows


def read_rows(args, paths: list[str]) -> list[dict]:
    """A whole epoch's read of convert's outputs, before and after: decompression alone (zstandard's
    stream_reader across frames, as the reader) and shardkit's member reader (read_members)."""
    from shardkit.training.reader import read_members
    from shardkit.training.zstd_source import ZSTD_READ_SIZE

    def decompress(files):
        import zstandard

        scratch, total = bytearray(1 << 20), 0
        for path in files:
            with open(path, "rb") as f:
                stream = zstandard.ZstdDecompressor().stream_reader(f, read_size=ZSTD_READ_SIZE,
                                                                    read_across_frames=True)
                while n := stream.readinto(scratch):
                    total += n
        return total

    def members(files, start=0):
        return sum(len(data) for path in files for _, data in read_members(path, start=start))

    outs = {"after (seekable)": os.path.join(args.work_dir, "out", "after-j1"),
            "before (one frame)": os.path.join(args.work_dir, "out", "before-j1")}
    # "resumed": read_members from the second member's header (1,024: the first is a .txt of one block),
    # so every shard is opened at a resume offset: through the seek table after, by skipping before
    hows = {"decompress": decompress, "read_members": members, "read_members resumed at 1 KiB":
            lambda files: members(files, start=1024)}
    tasks = [(code, how) for code in outs if os.path.isdir(outs[code]) for how in hows]
    figures: dict = {}
    tar_mb = sum(os.path.getsize(p) for p in paths) / 1e6
    for round_ in range(args.rounds):
        random.Random(200 + round_).shuffle(tasks)
        for code, how in tasks:
            files = [os.path.join(outs[code], os.path.basename(p) + ".zst") for p in paths]
            start = time.perf_counter()
            hows[how](files)
            figures.setdefault((code, how), []).append(time.perf_counter() - start)
    return [{"read": how, "code": code, "mb_per_s": round(tar_mb / statistics.median(times), 1)}
            for (code, how), times in sorted(figures.items())]


def main(args) -> int:
    os.makedirs(args.work_dir, exist_ok=True)
    paths = plain_shards(args)
    tar_mb = sum(os.path.getsize(p) for p in paths) / 1e6
    print(f"{len(paths)} plain shards, {tar_mb:.1f} MB of tar", file=sys.stderr)
    converts = convert_rows(args, paths)
    for r in converts:
        print(json.dumps(r))
    writers = writer_rows(args, paths)
    for r in writers:
        print(json.dumps(r))
    reads = read_rows(args, paths)
    for r in reads:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_info(), "args": vars(args), "tar_mb": round(tar_mb, 1),
                       "convert": converts, "writers": writers, "reads": reads}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
