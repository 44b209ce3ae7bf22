"""The Parquet index's schema and rows: records (JSON-lines shaped dicts) to columns and back.

Member and audio names are stored relative to the key (``.wav`` for ``spk/utt1.wav`` of key ``spk/utt1``),
so Parquet's dictionary encoding makes them nearly free; a name that does not start with its key is stored
whole behind a NUL (``"\\0other.wav"``, NUL never occurs in a tar name). ``text`` (nullable) holds the
transcript of a record whose text is inline (an index of a NeMo tarred dataset or a Shar folder, whose
``members`` hold only the audio); an index written before it had the column still reads (no text).
"""

from __future__ import annotations

from shardkit.errors import UsageError

_FULL_NAME = "\0"


def require_pyarrow(what: str = "a Parquet index"):
    """``pyarrow.parquet``, or a UsageError that says how to get it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"{what} needs pyarrow: pip install 'shardkit[parquet]' (or use a .jsonl index)") from None
    return pq


def schema():
    import pyarrow as pa

    member = pa.struct([("name", pa.string()), ("offset", pa.int64()), ("size", pa.int64())])
    return pa.schema([
        ("corpus", pa.dictionary(pa.int32(), pa.string())), ("shard", pa.dictionary(pa.int32(), pa.string())),
        ("key", pa.string()), ("audio", pa.string()), ("format", pa.string()), ("bytes", pa.int64()),
        ("sample_rate", pa.int32()), ("channels", pa.int16()), ("frames", pa.int64()), ("duration", pa.float64()),
        ("text_chars", pa.int32()), ("members", pa.list_(member)), ("text", pa.string()),
    ])


def _relative(name: str, key: str) -> str:
    return name[len(key):] if name.startswith(key) else _FULL_NAME + name


def _absolute(stored: str, key: str) -> str:
    return stored[1:] if stored.startswith(_FULL_NAME) else key + stored


def records_to_batch(records: list[dict]):
    """A pyarrow RecordBatch of records (dicts with at least the required fields)."""
    import pyarrow as pa

    columns = _columns(records)
    arrays = []
    for field in schema():
        values = columns[field.name]
        if field.name == "members":
            arrays.append(_members_array(*values, field.type))
        elif pa.types.is_dictionary(field.type):
            arrays.append(_dictionary_encoded(values))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema())


def _members_array(bounds: list[int], names: list[str], offsets: list[int], sizes: list[int], list_type):
    """The ``members`` column from flat lists (record i's members are ``bounds[i]:bounds[i + 1]``): the same
    array as ``pa.array`` of one dict per member, without building those dicts (about half the index's
    Python time when convert assembles it after its last shard)."""
    import pyarrow as pa

    member = list_type.value_type
    struct = pa.StructArray.from_arrays([pa.array(names, member.field("name").type),
                                         pa.array(offsets, member.field("offset").type),
                                         pa.array(sizes, member.field("size").type)], fields=list(member))
    return pa.ListArray.from_arrays(pa.array(bounds, pa.int32()), struct, type=list_type)


def _dictionary_encoded(values: list):
    """``pa.array(values).dictionary_encode()``'s array (values in order of first appearance, int32 indices,
    nulls masked), built without it: that method imports pyarrow.compute (~0.05 CPU-s,
    benchmarks/results/2026-11-28-flac.md) into every run that writes an index, for columns of a few values."""
    import pyarrow as pa

    codes: dict[str, int] = {}
    indices = [None if v is None else codes.setdefault(v, len(codes)) for v in values]
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(list(codes), pa.string()))


def _columns(records: list[dict]) -> dict[str, list]:
    """The records as columns of the index schema; member and audio names stored relative to the key
    (``members``: the flat lists of :func:`_members_array`)."""
    keys = [r["key"] for r in records]
    audio = [None if r.get("audio") is None else _relative(r["audio"], r["key"]) for r in records]
    columns = {"corpus": [r.get("corpus") for r in records], "shard": [r["shard"] for r in records], "key": keys,
               "audio": audio, "members": _flat_members(records)}
    for name in ("format", "bytes", "sample_rate", "channels", "frames", "duration", "text_chars", "text"):
        columns[name] = [r.get(name) for r in records]
    return columns


def _flat_members(records: list[dict]) -> tuple[list, list, list, list]:
    """(bounds, names relative to the key, offsets, sizes) of every record's members, in order."""
    bounds, names, offsets, sizes = [0], [], [], []
    for r in records:
        key = r["key"]
        for member in r["members"]:
            name = member[0]
            names.append(name[len(key):] if name.startswith(key) else _FULL_NAME + name)
            offsets.append(member[1])
            sizes.append(member[2])
        bounds.append(len(names))
    return bounds, names, offsets, sizes


def open_parquet_writer(file):
    """A pyarrow ParquetWriter of the index schema with the index's encodings, over an open binary file."""
    pq = require_pyarrow()
    return pq.ParquetWriter(file, schema(), compression="zstd", compression_level=6,
                            use_dictionary=["corpus", "shard", "audio", "format", "sample_rate", "channels",
                                            "members.list.element.name"], write_statistics=["duration"])


def record_of_row(row: dict) -> dict:
    """A Parquet row as the record a JSON line holds (names made whole again, nulls left out)."""
    key = row["key"]
    record = {k: v for k, v in row.items() if v is not None and k not in ("members", "audio")}
    if row.get("audio") is not None:
        record["audio"] = _absolute(row["audio"], key)
    record["members"] = [[_absolute(m["name"], key), m["offset"], m["size"]] for m in row["members"] or ()]
    return record


