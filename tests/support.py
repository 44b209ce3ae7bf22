"""Helpers the tests share, defined once (fixtures live in the conftest.py files beside the tests).

The tests folder mirrors the package (tests/io, tests/run, tests/commands/balance, ...); the root
conftest.py puts this folder on sys.path, so every test module imports these as ``from support import ...``.
"""

from __future__ import annotations

import contextlib
import json
import io
import logging
import os
import socket
import tarfile
from http.server import SimpleHTTPRequestHandler

import numpy as np
import pytest
from click.testing import CliRunner, Result

from shardkit.io.synth import CorpusSpec, corpus_utterances

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)

# Three small corpora with different utterance lengths (short, long, mixed), keys with '/' and '-'.
SMALL_CORPORA = (
    CorpusSpec("aishell", 6, 0.4, 1.2, "zh"),
    CorpusSpec("librispeech", 4, 1.5, 3.0, "en"),
    CorpusSpec("accented", 4, 0.3, 2.5, "mix"),
)


def corpus(specs=SMALL_CORPORA, *, seed=0, audio_format="wav"):
    """All utterances of the given corpora, as (key, text, audio_bytes, seconds) tuples."""
    return [u for spec in specs for u in corpus_utterances(spec, seed=seed, audio_format=audio_format)]


def run_cli(*args) -> Result:
    """``shardkit ARGS...`` in this process (click's runner), every argument turned into a string."""
    from shardkit.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def folder_bytes(folder, *, skip=lambda relative: False) -> dict[str, bytes]:
    """Every file below ``folder`` by its path relative to it (``skip(relative)``: leave it out)."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            if not skip(relative):
                found[relative] = read_bytes(path)
    return found


def without(doc: dict, **drop) -> dict:
    """``doc`` less the named keys of its sections, to compare reports whose timings differ:
    ``without(report, shards={"seconds"})`` drops every shard entry's seconds; a section that is a dict
    (``settings={"threads"}``) loses the keys itself."""
    out = dict(doc)
    for section, keys in drop.items():
        value = doc[section]
        out[section] = ([{k: v for k, v in entry.items() if k not in keys} for entry in value]
                        if isinstance(value, list) else {k: v for k, v in value.items() if k not in keys})
    return out


def is_slice_file(relative: str) -> bool:
    """A ``--split`` slice's own report or list (``convert.slice-2-of-3.json``), as folder_bytes' ``skip``."""
    return ".slice-" in relative


class QuietHTTPHandler(SimpleHTTPRequestHandler):
    """A loopback test server's handler that logs nothing to stderr."""

    def log_message(self, *args):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3(bucket: str = "corpus"):
    """An S3-compatible server (moto) on 127.0.0.1 with one bucket; yields (s3fs filesystem, options)."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    import boto3
    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server._port}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
                   "client_kwargs": {"region_name": "us-east-1"}}
        yield s3fs.S3FileSystem(skip_instance_cache=True, **options), options
    finally:
        server.stop()


def tar_bytes(members, fmt=tarfile.GNU_FORMAT) -> bytes:
    """A tar written by the standard library (the reference writer), members as (name, bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# --- index files shaped like `shardkit index`'s, for planning tests -------------------------------

INDEX_MEANS = {"zh": 3.6, "en": 12.3, "acc": 5.0}  # seconds per utterance: AISHELL-2-, LibriSpeech-, accented-like


def _indexfile():
    from shardkit.io import indexfile

    return indexfile


def index_records(corpus_name: str, n: int, seed: int, *, aliases: bool = False):
    """Index lines shaped like `shardkit index`'s (shard paths relative and absent here), in shard order."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        key = f"{corpus_name}/S{i // 50:04d}/U{i:07d}"
        seconds = round(float(np.clip(rng.gamma(8, INDEX_MEANS[corpus_name] / 8), 0.5, 30)), 6)
        size = 44 + 2 * int(seconds * 16000)
        record = {"shard": f"rel/{corpus_name}/shards_{i // 50:09d}.tar", "key": key, "corpus": corpus_name,
                  "format": "wav", "bytes": size + 20, "sample_rate": 16000, "channels": 1,
                  "frames": int(seconds * 16000), "duration": seconds,
                  "members": [[key + ".txt", 512 + i, 20], [key + ".wav", 1536 + i, size]]}
        if aliases:
            record.update({"member": key + ".wav", "text_len": 7})
        else:
            record.update({"audio": key + ".wav", "text_chars": 7})
        out.append(record)
    return out

def write_jsonl_index(path, records):
    with open(path, "wb") as f:
        f.write(b"".join(_indexfile().dumps_line(r) for r in records))
    return str(path)

def to_parquet_index(src, dst):
    result = run_cli("index", src, "-o", dst, "-q", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["utterances"] == sum(1 for _ in _indexfile().iter_jsonl(str(src)))
    return str(dst)


NEMO_SPEC = CorpusSpec("nemo", 23, 0.5, 2.5, "en")


def nemo_by_count(folder, num_shards: int, *, shard_ids: bool = True, orphan: bool = False):
    """A NeMo tarred dataset cut as NeMo's converter cuts it: utterances by count, the remainder discarded."""
    import soundfile as sf

    utts = list(corpus_utterances(NEMO_SPEC, seed=7))
    per_shard = len(utts) // num_shards
    lines = []
    for k in range(num_shards):
        with tarfile.open(folder / f"audio_{k}.tar", "w") as tar:
            for key, text, audio, _ in utts[k * per_shard:(k + 1) * per_shard]:
                name = key.replace("/", "_") + ".wav"
                info = tarfile.TarInfo(name)
                info.size = len(audio)
                tar.addfile(info, io.BytesIO(audio))
                line = {"audio_filepath": name, "duration": sf.info(io.BytesIO(audio)).duration, "text": text}
                lines.append({**line, "shard_id": k} if shard_ids else line)
    if orphan:  # a line whose audio no tar holds: NeMo counts it in the length and never reads it
        lines.append({"audio_filepath": "gone.wav", "duration": 1.25, "text": "x"})
    with open(folder / "tarred_audio_manifest.json", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return folder / "tarred_audio_manifest.json"
