"""Benchmark: ``balance --dry-run --wenet-conf`` (and ``plan --index --wenet-conf``) on the generated
three-corpus mix of ``bench_plan_scale.py``: this checkout against a baseline checkout, interleaved.

Before, balance read the index a second time for the trainer's filter (a Parquet index as one Python
dict per row); now its one columnar read collects the filter's columns. Each figure is one whole
process under ``/usr/bin/time`` (wall seconds, peak RSS); every run's stdout (less ``elapsed_seconds``)
and ``--dropped-keys`` file must be byte-identical between the checkouts.

The indexes are those ``bench_plan_scale.py`` writes into --work-dir (``{N}M-{corpus}.parquet``; the
JSON lines ones where present); they carry frames, sample_rate and text_chars. The conf drops
utterances longer than 15 s (max_length 1500) and transcripts over 200 characters.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_wenet_conf_read.py \\
        --baseline /tmp/wenet1-base --sizes 1,5 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

CORPORA = ("mandarin", "english", "accented")
CONF = """dataset_conf:
  filter_conf: {max_length: 1500, min_length: 10, token_max_length: 200, token_min_length: 1}
  resample_conf: {resample_rate: 16000}
  speed_perturb: true
  fbank_conf: {num_mel_bins: 80, frame_shift: 10, frame_length: 25, dither: 0.1}
  shuffle: true
  shuffle_conf: {shuffle_size: 1500}
  sort: true
  sort_conf: {sort_size: 500}
  batch_conf: {batch_type: dynamic, max_frames_in_batch: 12000}
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-plan-scale", help="Where the indexes are.")
    p.add_argument("--out-dir", default="/tmp/shardkit-bench-wenet-conf-read")
    p.add_argument("--sizes", default="1", help="Millions of utterances, comma-separated (indexes must exist).")
    p.add_argument("--forms", default="parquet", help="parquet and/or jsonl.")
    p.add_argument("--commands", default="balance", help="balance and/or plan.")
    p.add_argument("--baseline", default=None, metavar="CHECKOUT")
    p.add_argument("--repeats", type=int, default=1)
    return p.parse_args()


def command(kind: str, size: str, form: str, work: str, conf: str, dropped: str) -> list[str]:
    files = [os.path.join(work, f"{size}M-{c}.{form}") for c in CORPORA]
    if kind == "balance":
        cmd = ["balance", "--world-size", "64", "--num-workers", "4", "--shard-duration", "3600", "-o",
               os.path.join(os.path.dirname(dropped), "o"), "--dry-run"]
        cmd += [a for c, f in zip(CORPORA, files) for a in ("--corpus", f"{c}={f}")]
    else:
        cmd = ["plan", os.path.join(work, f"{size}M.list"), "--world-size", "64", "--num-workers", "4", "--epochs",
               "1"] + [a for f in files for a in ("--index", f)]
    return [sys.executable, "-m", "shardkit", *cmd, "--json", "-q", "--wenet-conf", conf, "--dropped-keys", dropped]


def timed(cmd: list[str], checkout: str) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stdout) of one process run from inside ``checkout`` (``python -m`` puts
    the working folder first on sys.path)."""
    proc = subprocess.run(["/usr/bin/time", "-f", "%e %M", *cmd], check=False, capture_output=True, text=True,
                          cwd=checkout, env={**os.environ, "PYTHONPATH": checkout})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    wall, rss = proc.stderr.strip().splitlines()[-1].split()
    return float(wall), int(rss) / 1024, proc.stdout


def main(args) -> None:
    os.makedirs(args.out_dir, exist_ok=True)
    conf = os.path.join(args.out_dir, "train.yaml")
    with open(conf, "w") as f:
        f.write(CONF)
    checkouts = {"this": os.getcwd(), **({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})}
    for size in args.sizes.split(","):
        for form in args.forms.split(","):
            if not all(os.path.exists(os.path.join(args.work_dir, f"{size}M-{c}.{form}")) for c in CORPORA):
                print(f"# {size}M {form}: no index in {args.work_dir}, skipped", file=sys.stderr)
                continue
            for kind in args.commands.split(","):
                runs: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
                outputs: dict[str, tuple[str, bytes]] = {}
                for _ in range(args.repeats):
                    for name, checkout in checkouts.items():  # interleaved
                        dropped = os.path.join(args.out_dir, f"dropped-{name}.txt")
                        wall, rss, stdout = timed(command(kind, size, form, args.work_dir, conf, dropped), checkout)
                        doc = json.loads(stdout)
                        doc.pop("elapsed_seconds", None)
                        with open(dropped, "rb") as f:
                            outputs[name] = (json.dumps(doc, sort_keys=True), f.read())
                        runs[name].append((wall, rss))
                assert len(set(outputs.values())) == 1, "the checkouts' outputs differ"
                doc = json.loads(outputs["this"][0])
                for name, rs in runs.items():
                    print(json.dumps({"utterances_M": float(size), "index": form, "command": kind, "checkout": name,
                                      "seconds": round(statistics.median(r[0] for r in rs), 2),
                                      "runs": [r[0] for r in rs],
                                      "peak_rss_MB": round(statistics.median(r[1] for r in rs)),
                                      "dropped": doc["wenet_conf"]["filter"]["dropped_utterances"],
                                      "utterances": doc["utterances"]}), flush=True)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}", file=sys.stderr)


if __name__ == "__main__":
    main(parse_args())
