"""WebDataset pipelines with shardkit's handler vs shardkit's own reader, side by side in one run.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_wds.py --corpus-mb 320 --repeat 5

Generates (once, cached in --work-dir) the deterministic speech-like corpus of shardkit.commands.bench
(16 kHz 16-bit WAV, alternating short and long shards), packs it as plain WAV tar, zst:3 WAV tar
and FLAC in a plain tar, then runs every row once per round, rounds interleaved, so machine noise
hits all rows alike; reports medians and the spread, and every ratio within the run. Rates are
per core: audio decoded per CPU-second of this process and its children (`pipe:zstd`), so time
spent waiting for a core on a busy machine does not count; wall-clock rates are recorded too.
Every run
must decode every utterance and every frame. zstd shards reach WebDataset's own tarfile reader
through shardkit's tarfile zstd hook (patched into this process, as `shardkit wenet enable-zstd`
does at start-up) and, for the soundfile row, also through `pipe:zstd -dc`.

Rows per format (h/s = hours of audio decoded per second, one core):
- shardkit reader: shardkit.iter_samples (float32);
- wds+soundfile: wds.WebDataset(urls).decode(soundfile handler), what users write today;
- wds+soundfile pipe:zstd: the same over `pipe:zstd -dc < shard` (zst only);
- wds+shardkit handler: wds.WebDataset(urls).decode(shardkit.training.wds.audio_handler());
- wds+shardkit: wds.WebDataset(urls).map(shardkit.training.wds.decode_audio());
- shardkit.training.wds.WebDataset: the drop-in (shardkit reads the tar) + decode_audio();
- DataPipeline: wds.DataPipeline(SimpleShardList, split_by_node, split_by_worker,
  shardkit.training.wds.tarfile_to_samples(), wds.map(decode_audio()));
- wds read only, no decode: wds.WebDataset(urls) alone, the ceiling for any handler on its reader.
WebDataset's built-in audio decoder, wds.torch_audio (a temporary file per utterance), is far
slower; it is timed on the first --torchaudio-shards shards only and reported separately.

Target (issue 16): WebDataset + shardkit's handler >= 0.8x shardkit's own reader on plain WAV and
zst:3 WAV, per core, in one run; and the ratio to WebDataset's default decoding.
These machines are shared and noisy: treat single figures with skepticism, compare within a run.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import bench_corpus, corpus_parser, emit_results, machine_info, markdown_table  # noqa: E402

from shardkit import _zstd_tarfile as hook  # noqa: E402
from shardkit.commands.bench import webdataset_read  # noqa: E402
from shardkit.training.reader import reuse_freed_memory  # noqa: E402


def parse_args():
    p = corpus_parser(__doc__, corpus_mb=320.0, work_dir="/tmp/shardkit-bench-wds")
    p.add_argument("--repeat", type=int, default=5, help="rounds (every row once per round)")
    p.add_argument("--torchaudio-shards", type=int, default=2, help="shards for the wds.torch_audio row; 0 skips")
    return p.parse_args()


def wds_handler(paths):
    import webdataset as wds

    import shardkit.training.wds

    count = frames = 0
    for sample in wds.WebDataset(paths, shardshuffle=False).decode(shardkit.training.wds.audio_handler()):
        count += 1
        frames += len((sample["wav"] if "wav" in sample else sample["flac"])[0])
    return count, frames


def data_pipeline(paths):
    import webdataset as wds

    import shardkit.training.wds

    pipeline = wds.DataPipeline(wds.SimpleShardList(paths), wds.split_by_node, wds.split_by_worker,
                                shardkit.training.wds.tarfile_to_samples(), wds.map(shardkit.training.wds.decode_audio()))
    count = frames = 0
    for sample in pipeline:
        count += 1
        frames += len((sample["wav"] if "wav" in sample else sample["flac"])[0])
    return count, frames


def wds_read_only(paths):
    """WebDataset's reader alone (tarfile + grouping, no decode): the ceiling for any handler."""
    import webdataset as wds

    count = 0
    for sample in wds.WebDataset(paths, shardshuffle=False):
        count += 1
    return count, None


def rows_for(fmt: str) -> dict:
    rows = {"shardkit reader": lambda p: webdataset_read(p, "shardkit reader"),
            "wds read only, no decode": wds_read_only,
            "wds+soundfile": lambda p: webdataset_read(p, "wds+soundfile")}
    if fmt.startswith("zst") and shutil.which("zstd"):
        rows["wds+soundfile pipe:zstd"] = lambda p: webdataset_read(p, "wds+soundfile pipe:zstd")
    rows.update({"wds+shardkit handler": wds_handler,
                 "wds+shardkit": lambda p: webdataset_read(p, "wds+shardkit"),
                 "shardkit.training.wds.WebDataset": lambda p: webdataset_read(p, "shardkit.training.wds.WebDataset"),
                 "DataPipeline": data_pipeline})
    return rows


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (a pipe:zstd subprocess), user + system."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def count_frames(paths):
    from shardkit.training.reader import iter_samples

    count = frames = 0
    for s in iter_samples(paths):
        count += 1
        frames += len(s["audio"])
    return count, frames


def main(args) -> int:
    reuse_freed_memory()  # process-wide: every row gets it alike
    if hook.needed():
        hook.patch(tarfile)
    totals, layout = bench_corpus(args.work_dir, args.corpus_mb, audio=("wav", "flac"), formats=("none", "zst:3"))
    formats = ["none/wav", "zst:3/wav", "none/flac"]
    plan = [(fmt, name, fn) for fmt in formats for name, fn in rows_for(fmt).items()]
    for fmt, _, fn in plan:  # warm-up on one shard: imports, first allocations
        fn(layout[fmt][:1])
    times: dict[tuple[str, str], list[float]] = {(fmt, name): [] for fmt, name, _ in plan}
    walls: dict[tuple[str, str], list[float]] = {(fmt, name): [] for fmt, name, _ in plan}
    for _ in range(args.repeat):
        for fmt, name, fn in plan:
            c0, w0 = cpu_seconds(), time.perf_counter()
            count, frames = fn(layout[fmt])
            times[(fmt, name)].append(cpu_seconds() - c0)
            walls[(fmt, name)].append(time.perf_counter() - w0)
            if count != totals["utterances"] or frames not in (None, totals["frames"]):
                raise SystemExit(f"{fmt} {name}: decoded {count} utterances / {frames} frames of "
                                 f"{totals['utterances']} / {totals['frames']}")
    hours = totals["seconds"] / 3600
    figures: dict[str, dict] = {}
    for (fmt, name), ts in times.items():
        median = statistics.median(ts)
        wall = statistics.median(walls[(fmt, name)])
        figures.setdefault(fmt, {})[name] = {"hours_per_s": round(hours / median, 3), "median_s": round(median, 4),
                                             "spread": round((max(ts) - min(ts)) / median, 3), "runs": len(ts),
                                             "wall_hours_per_s": round(hours / wall, 3), "median_wall_s": round(wall, 4)}
    torch_audio = {}
    if args.torchaudio_shards:
        try:
            import torchaudio  # noqa: F401
        except ImportError:
            pass
        else:
            for fmt in formats:
                subset = layout[fmt][:args.torchaudio_shards]
                expected = count_frames(subset)
                webdataset_read(subset[:1], "wds+torchaudio")  # FFmpeg loading
                t0 = cpu_seconds()
                got = webdataset_read(subset, "wds+torchaudio")
                elapsed = cpu_seconds() - t0
                if got != expected:
                    raise SystemExit(f"{fmt} wds+torchaudio: decoded {got} of {expected}")
                rate = expected[1] / 16000 / 3600 / elapsed  # the corpus is 16 kHz
                torch_audio[fmt] = {"shards": len(subset), "utterances": expected[0], "hours_per_s": round(rate, 4),
                                   "wds+shardkit_vs_torch_audio": round(figures[fmt]["wds+shardkit"]["hours_per_s"]
                                                                         / rate, 1)}
    ratios = {}
    for fmt, rows in figures.items():
        base = rows["shardkit reader"]["median_s"]
        default = rows["wds+soundfile"]["median_s"]
        ratios[fmt] = {name: {"vs_shardkit_reader": round(base / r["median_s"], 3),
                              "vs_wds_soundfile": round(default / r["median_s"], 3)} for name, r in rows.items()}
    targets = {f"{fmt}: wds+shardkit handler vs shardkit reader (>= 0.8)":
               ratios[fmt]["wds+shardkit handler"]["vs_shardkit_reader"] for fmt in ("none/wav", "zst:3/wav")}
    targets.update({f"{fmt}: shardkit.training.wds.WebDataset vs shardkit reader (>= 0.8)":
                    ratios[fmt]["shardkit.training.wds.WebDataset"]["vs_shardkit_reader"] for fmt in ("none/wav", "zst:3/wav")})
    result = {"machine": machine_info(), "corpus": totals, "rounds": args.repeat, "rows": figures, "ratios": ratios,
              "torch_audio": torch_audio, "targets": targets}
    lines = [f"{fmt}: wds.torch_audio {t['hours_per_s']:.3f} h/s on {t['shards']} shards; "
             f"wds+shardkit is {t['wds+shardkit_vs_torch_audio']}x that" for fmt, t in torch_audio.items()]
    for fmt, rows in figures.items():
        table = markdown_table(["row", "h/s per core", "±", "vs shardkit reader", "vs wds+soundfile", "wall h/s"],
                               [[name, f"{r['hours_per_s']:.2f}", f"{r['spread'] * 50:.0f}%",
                                 f"{ratios[fmt][name]['vs_shardkit_reader']:.2f}x",
                                 f"{ratios[fmt][name]['vs_wds_soundfile']:.2f}x", f"{r['wall_hours_per_s']:.2f}"]
                                for name, r in rows.items()])
        lines.append(f"\n{fmt}\n{table}")
    emit_results(result, args.json, text="\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
