"""Benchmark: `shardkit make` from each source (kaldi, wenet-raw, nemo, lhotse, parquet, wds).

Two figures, each checked while timed:

* ``pack``: packing a ~20-minute corpus of 16 kHz speech-like WAV (about 200 utterances of 2-10 s)
  from each source into plain tar shards with ``--audio-format keep`` (one process), against
  reading the same audio alone the way each source holds it: every file opened and read in
  manifest order (kaldi, wenet-raw, nemo, lhotse), every Parquet row group's audio column
  (pyarrow), every tar member through ``tario.iter_shard_members`` (wds). Rate ratio =
  read seconds / pack seconds (target >= 0.8). The configurations are interleaved, each repeated,
  medians reported; every run checks the utterance count and audio seconds in the report.
  The packing writes, hashes and fsyncs every shard; the reading does none of that, so two more
  figures place it: ``copy`` (read the audio the same way and write it into as many files as
  there are shards, each fsynced and renamed: the floor of any atomic packer) and ``plan`` (the
  input side alone: read the entries, probe, check, plan; its share of the packing time).
  ``vcopy``: the copy floor of a packer that records and verifies a sha256 (every byte hashed as
  written, each file read back and hashed again before its rename), without tar or checks.
  ``read_cold``/``pack_cold``: the read and the pack again, each right after the source's files
  were dropped from the page cache (``posix_fadvise(DONTNEED)``), as a corpus read once comes;
  ``pack_cold_no_verify``: the cold pack as ``make --no-verify`` (no read-back before the rename).
  ``--jobs`` sets make's ``-j`` for every pack row (the read rows stay one reader: the disk's rate);
  ``--minutes`` and ``--shard-duration`` size the corpus and its shards.
* ``plan``: peak RSS (VmHWM of a fresh process) of planning only (read, probe, check, plan;
  nothing written) a synthetic 1,000,000-line NeMo manifest: 1,000 long recordings, 1,000
  segments each (1.2-2.4 s, keys ``stem-OFFSETms``, ~35-character transcripts). The recordings
  are FLAC files whose STREAMINFO declares 40 minutes over a 1-s payload: planning reads headers
  only, so the header is all it sees. The baseline RSS of the same process after its imports is
  reported beside it (target: peak < 300 MB).

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_make_sources.py --repeats 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SOURCES = ("kaldi", "wenet-raw", "nemo", "lhotse", "parquet", "wds")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-make-sources")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--minutes", type=float, default=20.0, help="Audio in the packing corpus.")
    p.add_argument("--entries", type=int, default=1_000_000, help="Lines of the synthetic planning manifest.")
    p.add_argument("--only", choices=("pack", "plan"), default=None)
    p.add_argument("--jobs", type=int, default=1, help="make's -j for the pack rows (the read rows stay one reader).")
    p.add_argument("--shard-duration", type=float, default=300.0, help="Seconds of audio per packed shard.")
    p.add_argument("--sources", default=",".join(SOURCES), help="Comma-separated subset of: " + ", ".join(SOURCES))
    p.add_argument("--json-out", default=None)
    p.add_argument("--plan-child", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


# ---------------------------------------------------------------- packing corpus

def build_pack_corpus(work: str, minutes: float) -> dict:
    from shardkit.io.synth import encode, speech_like

    marker = os.path.join(work, "pack.json")
    if os.path.exists(marker):
        with open(marker) as f:
            saved = json.load(f)
        if saved["minutes"] == minutes:
            return saved
    rng = np.random.default_rng(7)
    audio_dir = os.path.join(work, "audio")
    os.makedirs(audio_dir, exist_ok=True)
    utts, total = [], 0.0
    while total < minutes * 60:
        i = len(utts)
        seconds = float(np.round(rng.uniform(2, 10), 3))
        data = encode(speech_like(seconds, 16000, seed=i), 16000, "wav")
        path = os.path.join(audio_dir, f"spk{i % 7}-utt{i:05d}.wav")
        with open(path, "wb") as f:
            f.write(data)
        utts.append({"key": f"spk{i % 7}/utt{i:05d}", "path": path, "seconds": seconds,
                     "text": " ".join(rng.choice(["HELLO", "WORLD", "SPEECH", "SHARD", "TRAIN"], 6))})
        total += seconds
    sources = {}
    kaldi = os.path.join(work, "kaldi")
    os.makedirs(kaldi, exist_ok=True)
    with open(os.path.join(kaldi, "wav.scp"), "w") as f:
        f.writelines(f"{u['key']} {u['path']}\n" for u in utts)
    with open(os.path.join(kaldi, "text"), "w") as f:
        f.writelines(f"{u['key']} {u['text']}\n" for u in utts)
    sources["kaldi"] = [kaldi]
    raw = os.path.join(work, "data.list")
    with open(raw, "w") as f:
        f.writelines(json.dumps({"key": u["key"], "wav": u["path"], "txt": u["text"]}) + "\n" for u in utts)
    sources["wenet-raw"] = [raw]
    nemo = os.path.join(work, "nemo.json")
    with open(nemo, "w") as f:
        f.writelines(json.dumps({"audio_filepath": u["path"], "duration": u["seconds"], "text": u["text"]}) + "\n"
                     for u in utts)
    sources["nemo"] = [nemo]

    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    recordings = [Recording.from_file(u["path"], recording_id=f"r{i}") for i, u in enumerate(utts)]
    sups = [SupervisionSegment(u["key"].replace("/", "-"), r.id, 0.0, r.duration, text=u["text"])
            for u, r in zip(utts, recordings)]
    cuts = os.path.join(work, "cuts.jsonl.gz")
    CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings),
                          supervisions=SupervisionSet.from_segments(sups)).to_file(cuts)
    sources["lhotse"] = [cuts]

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for u in utts:
        with open(u["path"], "rb") as f:
            rows.append({"id": u["key"], "text": u["text"], "audio": {"bytes": f.read(), "path": os.path.basename(u["path"])}})
    parquet = os.path.join(work, "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=50)
    sources["parquet"] = [parquet]
    del rows

    import webdataset as wds

    tars = []
    for start in range(0, len(utts), 50):
        tar = os.path.join(work, f"wds-{start // 50:06d}.tar")
        with wds.TarWriter(tar) as sink:
            for u in utts[start:start + 50]:
                with open(u["path"], "rb") as f:
                    sink.write({"__key__": u["key"].replace("/", "-"), "wav": f.read(), "json": {"text": u["text"]}})
        tars.append(tar)
    sources["wds"] = tars
    saved = {"minutes": minutes, "utterances": len(utts), "seconds": round(total, 3), "sources": sources,
             "paths": [u["path"] for u in utts]}
    with open(marker, "w") as f:
        json.dump(saved, f)
    return saved


def iter_audio(fmt: str, corpus: dict):
    """Every utterance's audio bytes, read the way the source holds them."""
    if fmt in ("kaldi", "wenet-raw", "nemo", "lhotse"):
        for path in corpus["paths"]:
            with open(path, "rb") as f:
                yield f.read()
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(corpus["sources"]["parquet"][0])
        for group in range(pf.num_row_groups):
            for cell in pf.read_row_group(group, columns=["audio"]).column("audio").to_pylist():
                yield cell["bytes"]
    else:
        from shardkit.io.tar import iter_shard_members

        for tar in corpus["sources"]["wds"]:
            for name, data in iter_shard_members(tar):
                if name.endswith(".wav"):
                    yield data


def source_files(fmt: str, corpus: dict) -> list[str]:
    """The files holding the source's audio (the audio files, the Parquet file, the tars)."""
    return corpus["paths"] if fmt in ("kaldi", "wenet-raw", "nemo", "lhotse") else corpus["sources"][fmt]


def evict(paths: list[str]) -> None:
    """Drop the files' pages from the page cache (POSIX_FADV_DONTNEED; clean pages go, no root
    needed), so the next read comes from the disk: a corpus being packed is read once, cold."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_alone(fmt: str, corpus: dict) -> int:
    """Read every audio byte the way the source holds it; returns the bytes read."""
    total = sum(len(data) for data in iter_audio(fmt, corpus))
    assert total > 0
    return total


def copy_alone(fmt: str, corpus: dict, out: str, files: int, *, verified: bool = False) -> int:
    """Read the audio as the source holds it and write it into ``files`` files, each fsynced and
    renamed (what any atomic packer must do at least): the floor of packing, without tar, hashing,
    planning or checks. ``verified``: also what a packer that records and verifies a sha256 must
    do at least: hash every byte as it is written, read each file back and hash it again."""
    import hashlib

    os.makedirs(out, exist_ok=True)
    per_file = -(-corpus["utterances"] // files)
    written, f, index, digest = 0, None, 0, None

    def finish(f, digest):
        f.flush()
        os.fsync(f.fileno())
        f.close()
        if verified:
            back = hashlib.sha256()
            with open(f.name, "rb", buffering=0) as g:
                while chunk := g.read(1 << 20):
                    back.update(chunk)
            assert back.digest() == digest.digest()
        os.replace(f.name, f.name[:-8])

    for i, data in enumerate(iter_audio(fmt, corpus)):
        if i % per_file == 0:
            if f is not None:
                finish(f, digest)
            f = open(os.path.join(out, f"copy{index:04d}.partial"), "wb")
            digest = hashlib.sha256()
            index += 1
        f.write(data)
        if verified:
            digest.update(data)
        written += len(data)
    finish(f, digest)
    return written


def pack(fmt: str, corpus: dict, out: str, *, jobs: int = 1, shard_duration: float = 300.0,
         verify: bool = True) -> dict:
    from shardkit.commands.make import MakeSettings, run_make
    from shardkit.commands.make.manifests import run_make_from
    from shardkit.run.options import RunOptions

    settings = MakeSettings(codec="none", level=None, audio_format="keep", shard_duration=shard_duration,
                            verify=verify)
    if fmt == "kaldi":
        src = corpus["sources"]["kaldi"][0]
        report = run_make(os.path.join(src, "wav.scp"), os.path.join(src, "text"), out, settings,
                          RunOptions(jobs=jobs, overwrite=True))
    else:
        report = run_make_from(fmt, corpus["sources"][fmt], out, settings, RunOptions(jobs=jobs, overwrite=True))
    summary = report.summary()
    assert summary["utterances"] == corpus["utterances"], (fmt, summary["utterances"], summary["findings"][:3])
    assert abs(summary["audio_seconds"] - corpus["seconds"]) < 0.01 * corpus["utterances"], fmt
    return summary


def plan_only(fmt: str, corpus: dict) -> int:
    """The input side alone: read the source's entries, probe, check and plan (nothing written)."""
    from shardkit.commands.make import MakeSettings, match_utterances, probe_recordings
    from shardkit.commands.make.kaldi import parse_text, parse_wav_scp, read_table
    from shardkit.commands.make.manifests import plan_source
    from shardkit.commands.make.sources import SourceOptions
    from shardkit.run.options import RunOptions

    if fmt == "kaldi":
        src = corpus["sources"]["kaldi"][0]
        wav = parse_wav_scp(read_table(os.path.join(src, "wav.scp")))
        utts, _, _ = match_utterances(wav, parse_text(read_table(os.path.join(src, "text"))))
        return len(probe_recordings([wav[u["recording"]] for u in utts], RunOptions(jobs=1)))
    builder, *_ = plan_source(fmt, corpus["sources"][fmt], SourceOptions(), MakeSettings(shard_duration=300.0),
                              RunOptions(jobs=1))
    return len(builder.indices)


def bench_pack(args) -> dict:
    corpus = build_pack_corpus(args.work_dir, args.minutes)
    read_alone("kaldi", corpus)  # warm the page cache
    sources = [fmt for fmt in args.sources.split(",") if fmt]
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise SystemExit(f"--sources: unknown {sorted(unknown)}; choose from {', '.join(SOURCES)}")
    packing = {"jobs": args.jobs, "shard_duration": args.shard_duration}
    times = {fmt: {"read": [], "plan": [], "copy": [], "vcopy": [], "pack": [], "read_cold": [], "pack_cold": [],
                   "pack_cold_nv": []}
             for fmt in sources}
    shards = None
    for _ in range(args.repeats):
        for fmt in sources:  # interleaved
            t = time.perf_counter()
            read_alone(fmt, corpus)
            times[fmt]["read"].append(time.perf_counter() - t)
            t = time.perf_counter()
            assert plan_only(fmt, corpus) == corpus["utterances"]
            times[fmt]["plan"].append(time.perf_counter() - t)
            t = time.perf_counter()
            summary = pack(fmt, corpus, os.path.join(args.work_dir, "out", fmt), **packing)
            times[fmt]["pack"].append(time.perf_counter() - t)
            shards = summary["shards"]
            t = time.perf_counter()
            copy_alone(fmt, corpus, os.path.join(args.work_dir, "copy", fmt), shards)
            times[fmt]["copy"].append(time.perf_counter() - t)
            t = time.perf_counter()
            copy_alone(fmt, corpus, os.path.join(args.work_dir, "copy", fmt), shards, verified=True)
            times[fmt]["vcopy"].append(time.perf_counter() - t)
            # the same read and pack with the source's files dropped from the page cache first
            evict(source_files(fmt, corpus))
            t = time.perf_counter()
            read_alone(fmt, corpus)
            times[fmt]["read_cold"].append(time.perf_counter() - t)
            evict(source_files(fmt, corpus))
            t = time.perf_counter()
            pack(fmt, corpus, os.path.join(args.work_dir, "out", fmt), **packing)
            times[fmt]["pack_cold"].append(time.perf_counter() - t)
            evict(source_files(fmt, corpus))  # and once more as `make --no-verify` (no read-back)
            t = time.perf_counter()
            pack(fmt, corpus, os.path.join(args.work_dir, "out", fmt), verify=False, **packing)
            times[fmt]["pack_cold_nv"].append(time.perf_counter() - t)
    hours = corpus["seconds"] / 3600
    result = {"audio_hours": round(hours, 4), "utterances": corpus["utterances"], "shards": shards, **packing,
              "per_source": {}}
    for fmt in sources:
        read, plan, copy, vcopy, packed, read_cold, pack_cold, pack_cold_nv = (
            statistics.median(times[fmt][k]) for k in (
                "read", "plan", "copy", "vcopy", "pack", "read_cold", "pack_cold", "pack_cold_nv"))
        result["per_source"][fmt] = {"read_s": round(read, 4), "plan_s": round(plan, 4), "copy_s": round(copy, 4),
                                     "pack_s": round(packed, 4), "plan_share_of_pack": round(plan / packed, 3),
                                     "read_h_per_s": round(hours / read, 2), "copy_h_per_s": round(hours / copy, 2),
                                     "pack_h_per_s": round(hours / packed, 2),
                                     "pack_vs_read": round(read / packed, 3), "pack_vs_copy": round(copy / packed, 3),
                                     "vcopy_s": round(vcopy, 4), "vcopy_h_per_s": round(hours / vcopy, 2),
                                     "pack_vs_vcopy": round(vcopy / packed, 3),
                                     "read_cold_s": round(read_cold, 4), "pack_cold_s": round(pack_cold, 4),
                                     "read_cold_h_per_s": round(hours / read_cold, 2),
                                     "pack_cold_h_per_s": round(hours / pack_cold, 2),
                                     "pack_vs_read_cold": round(read_cold / pack_cold, 3),
                                     "pack_cold_no_verify_h_per_s": round(hours / pack_cold_nv, 2),
                                     "pack_no_verify_vs_read_cold": round(read_cold / pack_cold_nv, 3)}
    return result


# ---------------------------------------------------------------- planning memory

def _flac_declaring(seconds_declared: float, rate: int = 16000) -> bytes:
    """A 1-s FLAC whose STREAMINFO declares ``seconds_declared`` of audio (total samples, 36 bits)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(rate, np.int16), rate, format="FLAC")
    data = bytearray(buf.getvalue())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    info = 8  # 'fLaC' + block header
    total = int(seconds_declared * rate)
    packed = int.from_bytes(data[info + 10:info + 18], "big")
    packed = (packed & ~((1 << 36) - 1)) | total
    data[info + 10:info + 18] = packed.to_bytes(8, "big")
    data[info + 18:info + 34] = bytes(16)  # MD5 unknown
    return bytes(data)


def build_plan_manifest(work: str, entries: int) -> str:
    path = os.path.join(work, f"nemo-{entries}.json")
    if os.path.exists(path):
        return path
    files = 1000
    per_file = -(-entries // files)
    flac = _flac_declaring(per_file * 2.5)
    rng = np.random.default_rng(1)
    words = ["the", "speech", "shard", "planner", "holds", "columns", "of", "numbers", "and", "strings"]
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        written = 0
        for i in range(files):
            audio = os.path.join(work, "long", f"spk{i % 50:03d}", f"session{i:05d}.flac")
            os.makedirs(os.path.dirname(audio), exist_ok=True)
            with open(audio, "wb") as a:
                a.write(flac)
            durations = np.round(rng.uniform(1.2, 2.4, per_file), 2)
            offsets = np.round(np.arange(per_file) * 2.5, 2)
            for offset, duration in zip(offsets, durations):
                if written == entries:
                    break
                text = " ".join(rng.choice(words, 6))
                f.write(json.dumps({"audio_filepath": audio, "offset": float(offset), "duration": float(duration),
                                    "text": text}) + "\n")
                written += 1
    os.replace(tmp, path)
    return path


def vm_hwm_mb() -> float:
    """Peak RSS of this process image (VmHWM; ru_maxrss would include the parent's, inherited at exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def plan_child(manifest: str) -> None:
    """In a fresh process: plan only, print RSS figures as JSON."""
    from shardkit.commands.make import MakeSettings
    from shardkit.commands.make.manifests import plan_source
    from shardkit.commands.make.sources import SourceOptions
    from shardkit.run.options import RunOptions

    base = vm_hwm_mb()
    t = time.perf_counter()
    builder, findings, key_map, needs_cut = plan_source("nemo", [manifest], SourceOptions(),
                                                        MakeSettings(shard_duration=3600.0), RunOptions(jobs=1))
    entries = len(builder.catalog)
    planned = len(builder.indices)
    shards = len(builder)
    first = builder(0)[0]
    catalog_mb = builder.catalog.nbytes() / 1e6
    elapsed = time.perf_counter() - t
    peak = vm_hwm_mb()
    print(json.dumps({"entries": entries, "planned": planned, "findings": len(findings), "shards": shards,
                      "needs_cut": needs_cut, "first_key": first["key"], "catalog_mb": round(catalog_mb, 1),
                      "baseline_rss_mb": round(base, 1), "peak_rss_mb": round(peak, 1), "seconds": round(elapsed, 2)}))


def bench_plan(args) -> dict:
    manifest = build_plan_manifest(args.work_dir, args.entries)
    runs = []
    for _ in range(max(1, min(args.repeats, 2))):
        out = subprocess.run([sys.executable, __file__, "--plan-child", manifest], check=True, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        run = json.loads(out.stdout)
        assert run["entries"] == args.entries and run["planned"] == args.entries and run["findings"] == 0, run
        runs.append(run)
    result = dict(runs[-1])
    result["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    result["seconds"] = statistics.median(r["seconds"] for r in runs)
    result["manifest_mb"] = round(os.path.getsize(manifest) / 1e6, 1)
    return result


def main(args) -> None:
    if args.plan_child:
        plan_child(args.plan_child)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import emit_results, machine_info  # machine_info imports torch: kept out of the planning child

    os.makedirs(args.work_dir, exist_ok=True)
    results = {"machine": machine_info()}
    if args.only in (None, "plan"):
        results["plan"] = bench_plan(args)
    if args.only in (None, "pack"):
        results["pack"] = bench_pack(args)
    emit_results(results, args.json_out)


if __name__ == "__main__":
    main(parse_args())
