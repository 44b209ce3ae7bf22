"""Fixtures: real audio (speech-like signals written with soundfile) packed into real shards."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import tarfile

import pytest

from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards

# Three small corpora with different utterance lengths (short, long, mixed), keys with '/' and '-'.
SMALL_CORPORA = (
    CorpusSpec("aishell", 6, 0.4, 1.2, "zh"),
    CorpusSpec("librispeech", 4, 1.5, 3.0, "en"),
    CorpusSpec("accented", 4, 0.3, 2.5, "mix"),
)


def corpus(specs=SMALL_CORPORA, *, seed=0, audio_format="wav"):
    """All utterances of the given corpora, as (key, text, audio_bytes, seconds) tuples."""
    return [u for spec in specs for u in corpus_utterances(spec, seed=seed, audio_format=audio_format)]


@pytest.fixture
def make_shards(tmp_path_factory):
    """Factory: write the small mix as shards of a codec; returns the shard paths (data.list beside)."""

    def make(codec="none", *, audio_format="wav", utts_per_shard=5, specs=SMALL_CORPORA, seed=0, name=None, level=None):
        out = tmp_path_factory.mktemp(name or f"src-{codec}-{audio_format}")
        return write_shards(corpus(specs, seed=seed, audio_format=audio_format), str(out),
                            utts_per_shard=utts_per_shard, codec=codec, level=level, audio_format=audio_format)

    return make


@pytest.fixture
def shards_dir(make_shards):
    paths = make_shards("bz2")
    return os.path.dirname(paths[0])


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


@pytest.fixture
def patched():
    """tarfile with shardkit's zstd bridge (what WeNet reads through before Python 3.14) for one test, then
    exactly as before (even if this venv has the hook on)."""
    from shardkit.io import zstd_tarfile as hook

    was_active = hook.is_patched(tarfile)
    hook.deactivate()
    hook.patch(tarfile)
    yield tarfile
    hook.deactivate()
    if was_active:
        hook.activate()
