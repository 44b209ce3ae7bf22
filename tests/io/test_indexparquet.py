"""The Parquet index's dictionary columns, built without pyarrow.compute: the same arrays and the same file bytes."""

import io
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardkit.io import indexparquet
from shardkit.io.indexfile import ParquetIndexWriter


@pytest.mark.parametrize("values", [
    [],
    ["a"],
    [None],
    ["b", "a", None, "b", "c", "a", None],
    ["shards/part-ü.tar", "shards/part-ü.tar", "", "x", ""],
    [f"s{i % 7}" for i in range(1000)],
])
def test_dictionary_columns_equal_pyarrows_dictionary_encode(values):
    built = indexparquet._dictionary_encoded(values)
    expected = pa.array(values, pa.string()).dictionary_encode()
    assert built.equals(expected)
    assert built.type == expected.type == pa.dictionary(pa.int32(), pa.string())
    assert built.dictionary.to_pylist() == expected.dictionary.to_pylist()  # first appearance order
    assert built.indices.to_pylist() == expected.indices.to_pylist()


def _records(n: int) -> list[dict]:
    return [{"shard": f"out/corpus{i % 3}/shard{i % 5}.tar", "corpus": None if i % 11 == 0 else f"corpus{i % 3}",
             "key": f"spk{i % 4}/utt{i}", "audio": f"spk{i % 4}/utt{i}.flac", "format": "flac", "bytes": 1000 + i,
             "sample_rate": 16000, "channels": 1, "frames": 16000 + i, "duration": 1 + i / 16000, "text_chars": i % 40,
             "members": [[f"spk{i % 4}/utt{i}.flac", 512 * i, 900 + i], [f"spk{i % 4}/utt{i}.txt", 512 * i + 1024, 100]]}
            for i in range(n)]


def _index_bytes(records: list[dict]) -> bytes:
    buf = io.BytesIO()
    writer = ParquetIndexWriter(buf)
    writer.write(records)
    writer.close({"a.tar": {"size": 1, "mtime_ns": 2}})
    return buf.getvalue()


def test_the_index_file_is_byte_for_byte_what_dictionary_encode_gave(monkeypatch):
    records = _records(2500)
    built = _index_bytes(records)
    monkeypatch.setattr(indexparquet, "_dictionary_encoded",
                        lambda values: pa.array(values, pa.string()).dictionary_encode())
    assert built == _index_bytes(records)
    table = pq.read_table(io.BytesIO(built))
    assert table.column("corpus").to_pylist() == [r["corpus"] for r in records]
    assert table.column("shard").to_pylist() == [r["shard"] for r in records]


def test_writing_an_index_does_not_import_pyarrow_compute(tmp_path):
    # pyarrow.compute costs ~0.05 CPU-s at import, in every run that writes index.parquet
    probe = ("import json, sys\n"
             "from shardkit.io.indexfile import ParquetIndexWriter\n"
             "with open(sys.argv[1], 'wb') as f:\n"
             "    w = ParquetIndexWriter(f)\n"
             "    w.write(json.loads(sys.argv[2]))\n"
             "    w.close(None)\n"
             "print('pyarrow.compute' in sys.modules)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "index.parquet"), json.dumps(_records(20))],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert pq.read_table(tmp_path / "index.parquet").num_rows == 20
