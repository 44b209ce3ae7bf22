"""Fixtures every test may use: real audio (speech-like signals written with soundfile) packed into real shards,
a loopback S3 store, and tarfile with the zstd bridge. The helpers behind them live in support.py."""

from __future__ import annotations

import os
import sys
import tarfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # support.py, wenet_chain.py, faultserver.py

from shardkit.io.synth import write_shards  # noqa: E402
from support import SMALL_CORPORA, corpus, moto_s3  # noqa: E402


def pytest_sessionstart(session):
    """A non-interactive shell starts a background job (``cmd &``) with SIGINT ignored, and shardkit keeps an ignored
    signal ignored, as the shell asked (io.interrupts); the tests of Ctrl-C, here and in the processes they start,
    would then see nothing. The suite restores Python's own handler, so it runs the same in the foreground or not."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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


@pytest.fixture(scope="module")
def s3_store():
    """An S3 server (moto) on 127.0.0.1 with bucket 'corpus', one per test module: (s3fs filesystem, options)."""
    with moto_s3() as pair:
        yield pair


@pytest.fixture
def s3_default(s3_store, monkeypatch):
    """The store as fsspec's default s3 config for one test (what FSSPEC_S3_ENDPOINT_URL and AWS_* give a real
    run); its filesystem. The config lives in this process only: runs that use it take -j 1."""
    import fsspec.config

    fs, options = s3_store
    monkeypatch.setitem(fsspec.config.conf, "s3", options)
    return fs
