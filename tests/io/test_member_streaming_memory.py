"""Bounded memory: convert (byte copy, verified) and index stream a large member in chunks.

The member is a hole in a sparse file (no disk written for it); the peak RSS is measured in a child
process (its own VmHWM, so what the test process holds does not count).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from shardkit.io.tar import BLOCK
from support import REPO

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

BIG = 400 << 20  # bytes of the large member; holding it once would pass the bound below
LIMIT_MB = 200


def wav_header(data_bytes: int, rate: int = 16000) -> bytes:
    import struct

    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate,
            2 * rate, 2, 16) + b"data" + struct.pack("<I", data_bytes))


def sparse_shard(path, size: int = BIG) -> None:
    """k.txt, then k.wav of ``size`` bytes (a WAV header, then a hole), as one plain tar."""
    with open(path, "wb") as f:
        for name, data_size, head in (("big/k.txt", 5, b"hello"), ("big/k.wav", size, wav_header(size - 44))):
            info = tarfile.TarInfo(name)
            info.size = data_size
            f.write(info.tobuf(tarfile.GNU_FORMAT))
            f.write(head)
            f.seek(data_size - len(head) + (-data_size % BLOCK), os.SEEK_CUR)
        f.write(bytes(2 * BLOCK))


CHILD = r"""
import json, os, resource, sys
what, src, out = sys.argv[1:4]
if what == "convert":
    from shardkit.commands.convert import ConvertSettings, convert_shard
    entry = convert_shard(src, out, ConvertSettings(codec="zst", level=1))
    result = {"status": entry["status"], "error": entry["error"], "members": entry["members"]}
elif what == "validate":
    from shardkit.commands.validate import ValidateOptions, validate_shard
    r = validate_shard(src, ValidateOptions())
    result = {"findings": r["findings"], "utterances": r["utterances"], "seconds": r["seconds"]}
else:
    from shardkit.commands.index import index_shard
    records = index_shard(src)
    result = {"frames": records[0]["frames"], "members": records[0]["members"]}
try:  # this process image's own peak: ru_maxrss keeps the parent's peak across fork and exec on Linux
    with open("/proc/self/status") as f:
        result["peak_mb"] = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
except OSError:
    result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(result))
"""


def run_child(what, src, out=""):
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-c", CHILD, what, str(src), str(out)], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(done.stdout)


def test_convert_copies_a_large_member_in_bounded_memory(tmp_path):
    src = tmp_path / "big.tar"
    sparse_shard(src)
    result = run_child("convert", src, tmp_path / "big.tar.zst")
    assert result["status"] == "ok" and result["members"] == 2, result
    assert result["peak_mb"] < LIMIT_MB, result
    from shardkit.io.tar import MemberStream, iter_shard_members

    got = [(n, d.size if isinstance(d, MemberStream) else len(d))
           for n, d in iter_shard_members(str(tmp_path / "big.tar.zst"), stream_over=1 << 20)]
    assert got == [("big/k.txt", 5), ("big/k.wav", BIG)]


def test_index_reads_a_large_member_in_bounded_memory(tmp_path):
    src = tmp_path / "big.tar"
    sparse_shard(src)
    result = run_child("index", src)
    assert result["peak_mb"] < LIMIT_MB, result
    assert result["frames"] == (BIG - 44) // 2
    assert result["members"] == [["big/k.txt", 512, 5], ["big/k.wav", 1536, BIG]]
    with open(src, "rb") as f:  # the offsets point at the data
        f.seek(1536)
        assert f.read(4) == b"RIFF"


@pytest.mark.parametrize("codec", ["none", "zst"])
def test_validate_holds_the_member_once(tmp_path, codec):
    """validate decodes the member in full, block by block: about the member's size, not twice it."""
    src = tmp_path / "big.tar"
    sparse_shard(src)
    if codec == "zst":
        import zstandard

        with open(src, "rb") as f, open(tmp_path / "big.tar.zst", "wb") as out:
            zstandard.ZstdCompressor(level=1).copy_stream(f, out)
        src = tmp_path / "big.tar.zst"
    result = run_child("validate", src)
    assert result["findings"] == [] and result["utterances"] == 1, result
    assert result["seconds"] == pytest.approx((BIG - 44) / 2 / 16000, abs=0.01)
    assert result["peak_mb"] < 1.3 * BIG / 2**20 + 150, result
