"""Benchmark `shardkit validate`: utterances/s and hours of audio/s per core, per backend and shard kind.

Builds a synthetic WeNet-style corpus (speech-like 16 kHz mono, the same utterances as WAV and as
FLAC, in plain and zst:3 shards) under --work, then, in one run on the same data:

- times ``run_validate`` (in-process, -j 1) with each backend on each shard kind;
- times the same checks done the WeNet way on the plain WAV shards: ``tarfile.open(fileobj=f,
  mode="r:*")``, member bytes, ``torchaudio.load(io.BytesIO(data))``, header length, NaN, rate,
  channels, text; and reports shardkit's soundfile speed-up over it;
- times ``run_validate`` with each -j in --jobs (process pool, start-up included) for scaling.

Correctness is checked while timing: every run must see every utterance, the corpus's exact audio
duration and no finding. Figures are medians of --repeats runs; wall time and process CPU time
are both reported ("per core" figures divide by CPU seconds of this process, children included
for -j runs). Treat them with skepticism on a shared machine: compare ratios within one run.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_validate.py --mb 40 --jobs 1,2
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import sys
import tarfile
import time

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/shardkit-bench-validate", help="corpus folder (reused when it matches)")
    p.add_argument("--mb", type=float, default=40.0, help="approximate size of the WAV corpus in MB")
    p.add_argument("--utts-per-shard", type=int, default=25)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", default="1,2", help="comma-separated -j values for the scaling runs")
    p.add_argument("--kinds", default="wav-none,wav-zst,flac-none,flac-zst")
    p.add_argument("--backends", default="soundfile,torchaudio")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--json-out", default=None, help="also write every result line to this JSON file")
    return p.parse_args(argv)


def build_corpus(work: str, mb: float, utts_per_shard: int) -> dict:
    """Write the four shard kinds (once; reused while the parameters match). Returns the manifest."""
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    utterances = max(utts_per_shard, int(mb * 1e6 / (6.0 * 32000)))  # mean 6 s of 16-bit 16 kHz mono
    params = {"utterances": utterances, "utts_per_shard": utts_per_shard, "version": 1}
    manifest_path = os.path.join(work, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest["params"] == params:
            return manifest
    spec = CorpusSpec("bench", utterances, 2.0, 10.0, "mix")
    manifest = {"params": params, "kinds": {}}
    for audio_format in ("wav", "flac"):
        utts = list(corpus_utterances(spec, seed=1, audio_format=audio_format))
        manifest["seconds"] = sum(u[3] for u in utts)
        for codec in ("none", "zst"):
            kind = f"{audio_format}-{codec}"
            paths = write_shards(utts, os.path.join(work, kind), utts_per_shard=utts_per_shard, codec=codec,
                                 audio_format=audio_format)
            manifest["kinds"][kind] = {"paths": paths, "bytes": sum(os.path.getsize(p) for p in paths)}
    manifest["utterances"] = utterances
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    return manifest


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, repeats: int) -> tuple[float, float, object]:
    """Median wall and CPU seconds over ``repeats`` calls, and the last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        c0, t0 = cpu_seconds(), time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu_seconds() - c0)
    return statistics.median(walls), statistics.median(cpus), result


def wenet_way(paths: list[str], sample_rate: int = 16000, channels: int = 1) -> dict:
    """The same checks, done as WeNet reads: tarfile + torchaudio.load(io.BytesIO(member bytes))."""
    import torchaudio

    from shardkit.io.audio import parse_wav_header

    utterances, seconds, findings = 0, 0.0, 0
    for path in paths:
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:*") as tar:
            prev_key, sample = None, {}

            def check(sample):
                nonlocal utterances, seconds, findings
                utterances += 1
                text = sample.get("txt")
                if text is None or not text.decode("utf8").strip():
                    findings += 1
                data = sample.get("wav")
                if data is None:
                    findings += 1
                    return
                waveform, rate = torchaudio.load(io.BytesIO(data))
                frames = waveform.shape[1]
                if frames == 0 or frames < parse_wav_header(data).frames_declared:
                    findings += 1
                if not bool(np.isfinite(waveform.numpy()).all()):
                    findings += 1
                if rate != sample_rate or waveform.shape[0] != channels:
                    findings += 1
                seconds += frames / rate

            for member in tar:
                pos = member.name.rfind(".")
                key, ext = member.name[:pos], member.name[pos + 1:]
                if key != prev_key and sample:
                    check(sample)
                    sample = {}
                prev_key = key
                sample[ext] = tar.extractfile(member).read()
            if sample:
                check(sample)
    return {"utterances": utterances, "audio_seconds": seconds, "findings": findings}


def shardkit_way(paths: list[str], backend: str, jobs: int) -> dict:
    from shardkit.commands.validate import ValidateOptions, run_validate
    from shardkit.run.options import RunOptions

    report = run_validate(paths, ValidateOptions(backend=backend, sample_rate=16000, channels=1), RunOptions(jobs=jobs))
    totals = report.totals()
    return {"utterances": totals["utterances"], "audio_seconds": totals["audio_seconds"],
            "findings": totals["findings"]}


def _warm_up(args):
    from shardkit.commands.validate import validate_shard

    path, options = args
    validate_shard(path, options)
    time.sleep(0.2)  # hold this worker so that the next warm-up task lands on another one
    return os.getpid()


def warm_pool_runs(paths: list[str], backend: str, jobs: int, repeats: int) -> tuple[float, dict]:
    """Median wall seconds of the per-shard tasks of ``run_validate`` on an already started pool.

    Leaves out process start-up and imports (torch takes seconds per worker), which a long run
    pays once; what remains is how the shard work itself scales.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from shardkit.commands.validate import ValidateOptions, _validate_task

    options = ValidateOptions(backend=backend, sample_rate=16000, channels=1)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("forkserver")) as pool:
        pids = set(pool.map(_warm_up, [(paths[0], options)] * jobs))
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            results = list(pool.map(_validate_task, [(p, options) for p in paths]))
            walls.append(time.perf_counter() - t0)
    totals = {"utterances": sum(r["utterances"] for r in results),
              "audio_seconds": sum(r["seconds"] for r in results),
              "findings": sum(len(r["findings"]) for r in results), "workers_warmed": len(pids)}
    return statistics.median(walls), totals


def verify(result: dict, manifest: dict, what: str) -> None:
    ok = (result["utterances"] == manifest["utterances"] and result["findings"] == 0
          and abs(result["audio_seconds"] - manifest["seconds"]) < 0.01 * manifest["utterances"])
    if not ok:
        raise SystemExit(f"{what}: wrong result {result} (expected {manifest['utterances']} utterances, "
                         f"{manifest['seconds']:.1f} s, no finding)")


def line(config: dict, wall: float, cpu: float, manifest: dict, kind_bytes: int) -> dict:
    n, hours = manifest["utterances"], manifest["seconds"] / 3600
    return {**config, "wall_s": round(wall, 4),
            "utt_per_s": round(n / wall, 1), "audio_h_per_s": round(hours / wall, 4),
            "cpu_s": round(cpu, 4) if cpu > 0 else None,
            "utt_per_cpu_s": round(n / cpu, 1) if cpu > 0 else None,
            "audio_h_per_cpu_s": round(hours / cpu, 4) if cpu > 0 else None,
            "shard_mb_per_s": round(kind_bytes / wall / 1e6, 1)}


def main(args) -> int:
    import shardkit

    manifest = build_corpus(args.work, args.mb, args.utts_per_shard)
    info = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "processor": _cpu_name(), "shardkit": shardkit.__version__, "utterances": manifest["utterances"],
            "audio_hours": round(manifest["seconds"] / 3600, 4),
            "bytes": {k: v["bytes"] for k, v in manifest["kinds"].items()}}
    print(json.dumps({"info": info}), flush=True)
    lines = []

    def emit(entry):
        lines.append(entry)
        print(json.dumps(entry), flush=True)

    kinds = args.kinds.split(",")
    backends = args.backends.split(",")
    # warm the page cache and the imports, so the first timed configuration is not penalised
    for backend in backends:
        shardkit_way(manifest["kinds"][kinds[0]]["paths"][:1], backend, 1)
    for kind in kinds:
        entry = manifest["kinds"][kind]
        for backend in backends:
            wall, cpu, result = timed(lambda: shardkit_way(entry["paths"], backend, 1), args.repeats)
            verify(result, manifest, f"{kind} {backend}")
            emit(line({"what": "shardkit validate -j 1", "kind": kind, "backend": backend}, wall, cpu, manifest,
                      entry["bytes"]))
    if not args.skip_baseline:
        entry = manifest["kinds"]["wav-none"]
        wall, cpu, result = timed(lambda: wenet_way(entry["paths"]), args.repeats)
        verify(result, manifest, "wenet way")
        emit(line({"what": "WeNet way (tarfile + torchaudio.load(BytesIO))", "kind": "wav-none",
                   "backend": "torchaudio"}, wall, cpu, manifest, entry["bytes"]))
        ours = next((e for e in lines if e["kind"] == "wav-none" and e["backend"] == "soundfile"), None)
        if ours:
            emit({"what": "speed-up over the WeNet way, plain WAV, soundfile backend",
                  "wall_ratio": round(wall / ours["wall_s"], 1)})
    for kind, backend in (("wav-none", "soundfile"), ("flac-zst", "soundfile"), ("wav-none", "torchaudio")):
        if kind not in kinds or backend not in backends:
            continue
        entry = manifest["kinds"][kind]
        base = None
        for jobs in [int(j) for j in args.jobs.split(",")]:
            wall, cpu, result = timed(lambda: shardkit_way(entry["paths"], backend, jobs), args.repeats)
            verify(result, manifest, f"-j {jobs}")
            base = base or wall
            # pool workers are children of the forkserver, not of this process: their CPU time is not
            # visible here, so -j runs report wall time only
            emit({**line({"what": f"shardkit validate -j {jobs} (cold: pool start-up and imports included)",
                          "kind": kind, "backend": backend, "jobs": jobs},
                         wall, cpu if jobs == 1 else 0.0, manifest, entry["bytes"]),
                  "speedup_vs_first": round(base / wall, 2)})
        warm_base = None
        for jobs in [int(j) for j in args.jobs.split(",")]:
            wall, result = warm_pool_runs(entry["paths"], backend, jobs, args.repeats)
            verify(result, manifest, f"warm -j {jobs}")
            warm_base = warm_base or wall
            emit({**line({"what": f"validate tasks on a started pool of {jobs}", "kind": kind, "backend": backend,
                          "jobs": jobs, "workers_warmed": result["workers_warmed"]}, wall, 0.0, manifest,
                         entry["bytes"]), "speedup_vs_first": round(warm_base / wall, 2)})
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"info": info, "results": lines}, f, indent=2)
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for row in f:
                if row.startswith("model name"):
                    return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main(parse_args()))
