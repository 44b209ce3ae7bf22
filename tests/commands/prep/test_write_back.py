"""prep's writer threads hand their shards' bytes to the disk while the sources are still read (WRITE_BACK_BYTES):
the same bytes as without, and a disk that fails then is named."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from shardkit.commands.prep import write
from shardkit.commands.prep.write import OutputShards
from shardkit.io.files import OutputError, member_digest


def _members(seed: int = 5):
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(4)), f"k{i:03d}.wav", rng.bytes(int(rng.integers(1, 30000)))) for i in range(150)]


def _write(folder, members, threads=2) -> list[bytes]:
    folder.mkdir()
    outputs = OutputShards([str(folder / f"shards_{s:09d}.tar") for s in range(4)], "none", None, threads=threads)
    for shard, name, data in members:
        outputs.add(shard, name, data, member_digest(name, data))
    return [open(e["path"], "rb").read() for e in outputs.finish(verify=True)]


def test_write_back_while_writing_changes_no_byte(tmp_path, monkeypatch):
    members = _members()
    reference = _write(tmp_path / "reference", members)
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(write, "WRITE_BACK_BYTES", 100_000)
    monkeypatch.setattr(write.os, "fdatasync", lambda fd: (synced.append(fd), real(fd)))
    assert _write(tmp_path / "written-back", members) == reference
    total = sum(len(d) for _, _, d in members)
    assert len(synced) >= 4 * (total // 100_000 // 2 - 1)  # each thread, every 100 kB it wrote, its 2 shards


def test_a_disk_failing_at_write_back_is_named_and_renames_nothing(tmp_path, monkeypatch):
    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(write, "WRITE_BACK_BYTES", 50_000)
    monkeypatch.setattr(write.os, "fdatasync", failing)
    paths = [str(tmp_path / f"shards_{s:09d}.tar") for s in range(4)]
    outputs = OutputShards(paths, "none", None, threads=2)
    with pytest.raises(OutputError) as caught:
        for shard, name, data in _members():
            outputs.add(shard, name, data, member_digest(name, data))
        outputs.finish(verify=True)
    assert caught.value.shard in paths and "Input/output error" in str(caught.value)
    outputs.abort()
    assert os.listdir(tmp_path) == []
