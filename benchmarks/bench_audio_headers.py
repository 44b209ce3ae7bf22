"""What hardened audio headers cost (issue 24): index, validate and convert --audio flac on the same shards,
shardkit at another checkout (``--baseline DIR``, e.g. made by ``git worktree add /tmp/main main``) against
this one, interleaved.

    flock /tmp/shardkit-bench.lock python benchmarks/bench_audio_headers.py --baseline /tmp/main --repeats 3

Each configuration runs in a fresh subprocess (its own imports), one job; prints one JSON line per
(checkout, step, format) with the median wall seconds and the utterances per second. Correctness: both
checkouts must report the same utterance count and seconds for index.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

STEPS = {
    "index": ["index", "{src}/data.list", "-o", "{tmp}/i.jsonl", "--json", "-j", "1"],
    "validate": ["validate", "{src}/data.list", "--json", "-j", "1"],
    "convert_flac": ["convert", "{src}/data.list", "-o", "{tmp}/o", "--codec", "none", "--audio", "flac", "--json",
                     "-j", "1", "--overwrite"],
}


def make_corpus(root: str, audio_format: str) -> str:
    from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

    out = os.path.join(root, audio_format)
    utts = list(corpus_utterances(CorpusSpec("bench", 400, 1.0, 6.0, "en"), seed=1, audio_format=audio_format))
    write_shards(utts, out, utts_per_shard=100, audio_format=audio_format)
    return out


def run_once(checkout: str, args: list[str]) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": checkout}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shardkit", *args], capture_output=True, text=True, env=env)
    return time.perf_counter() - started, json.loads(done.stdout)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="another shardkit checkout to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as root:
        corpora = {fmt: make_corpus(root, fmt) for fmt in ("wav", "flac")}
        for fmt, src in corpora.items():
            for step, template in STEPS.items():
                if step == "convert_flac" and fmt == "flac":
                    continue
                times: dict[str, list[float]] = {"baseline": [], "this": []}
                facts = {}
                for _ in range(args.repeats):
                    for name, checkout in (("baseline", args.baseline), ("this", here)):
                        tmp = tempfile.mkdtemp(dir=root)
                        seconds, report = run_once(checkout, [a.format(src=src, tmp=tmp) for a in template])
                        times[name].append(seconds)
                        if step == "index":
                            facts[name] = (report["utterances"], report["audio_seconds"])
                if step == "index" and facts["baseline"] != facts["this"]:
                    raise SystemExit(f"index facts differ: {facts}")
                for name, values in times.items():
                    print(json.dumps({"checkout": name, "step": step, "format": fmt, "utterances": 400,
                                      "median_s": round(statistics.median(values), 3),
                                      "utt_per_s": round(400 / statistics.median(values), 1)}), flush=True)


if __name__ == "__main__":
    main()
