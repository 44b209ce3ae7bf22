"""What the input layer's deadlines cost: read throughput of a URL and a pipe: command, before and after.

before (HTTP): fsspec's HTTPFile, ranged GETs of 1 MiB (what open_input returned until issue 29);
after (HTTP): shardkit.io.remote.RemoteReader, one streamed GET with aiohttp's per-read timeout.
before (pipe): a BufferedReader over the command's stdout pipe (no deadline);
after (pipe): PipeReader, poll() with the read deadline before each read, in its own process group.

Each read is checked (byte count and sha256 equal to the file's). Configurations interleaved,
median of --repeats. Prints one JSON line per configuration.

    python benchmarks/bench_remote_inputs.py --mib 256 --repeats 5
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args()


def drain(f) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    while chunk := f.read(1 << 20):
        h.update(chunk)
        n += len(chunk)
    return n, h.hexdigest()


def http_before(url):
    import fsspec

    fs, key = fsspec.core.url_to_fs(url)
    with fs.open(key, "rb", block_size=1 << 20) as f:
        return drain(io.BufferedReader(f, buffer_size=1 << 20) if not hasattr(f, "peek") else f)


def http_after(url):
    from shardkit.io.remote import open_input

    with open_input(url) as f:
        return drain(f)


def pipe_before(path):
    proc = subprocess.Popen(f"cat {shlex.quote(path)}", shell=True, stdout=subprocess.PIPE, bufsize=1 << 20)
    out = drain(proc.stdout)
    proc.wait()
    return out


def pipe_after(path):
    from shardkit.io.remote import open_input

    with open_input(f"pipe:cat {shlex.quote(path)}", allow_pipes=True) as f:
        return drain(f)


def main(args) -> None:
    from faultserver import fault_server

    data = os.urandom(args.mib << 20)
    expected = (len(data), hashlib.sha256(data).hexdigest())
    with tempfile.NamedTemporaryFile(suffix=".tar") as tmp:
        tmp.write(data)
        tmp.flush()
        with fault_server({"x.tar": data}) as base:
            url = f"{base}/good/x.tar"
            configs = {"http before": (http_before, url), "http after": (http_after, url),
                       "pipe before": (pipe_before, tmp.name), "pipe after": (pipe_after, tmp.name)}
            times = {name: [] for name in configs}
            for _ in range(args.repeats):
                for name, (fn, target) in configs.items():
                    started = time.perf_counter()
                    assert fn(target) == expected, name
                    times[name].append(time.perf_counter() - started)
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(json.dumps({"config": name, "mib": args.mib, "median_s": round(median, 3),
                          "mib_per_s": round(args.mib / median, 1), "repeats": args.repeats}))


if __name__ == "__main__":
    main(parse_args())
