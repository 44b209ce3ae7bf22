"""Helpers the tests share, defined once (fixtures live in the conftest.py files beside the tests).

The tests folder mirrors the package (tests/io, tests/run, tests/commands/balance, ...); the root
conftest.py puts this folder on sys.path, so every test module imports these as ``from support import ...``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import tarfile
from http.server import SimpleHTTPRequestHandler

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
