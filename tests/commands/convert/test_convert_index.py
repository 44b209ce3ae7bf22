"""convert's index.parquet, a by-product of the writing: the records of its transcoded members take the encoder's
proven facts instead of parsing what was just written, and must be exactly what a parse of the output gives."""

import json

import pytest

from shardkit.io.indexfile import ShardRecords, iter_index
from shardkit.io.tar import iter_members_with_offsets
from support import run_cli


def _records_parsed_from(shard: str) -> list[dict]:
    """The records of a written shard, every audio header parsed from its bytes (no writer's facts)."""
    records = ShardRecords.for_shard(shard)
    for name, data, offset, _ in iter_members_with_offsets(shard):
        records.add(name, offset, data, len(data))
    assert records.error is None
    return records.finish()


@pytest.mark.parametrize("audio_format,target", [("wav", "flac"), ("flac", "wav")])
def test_the_index_of_transcoded_members_is_what_their_bytes_say(make_shards, tmp_path, audio_format, target):
    shards = make_shards("none", audio_format=audio_format, utts_per_shard=4)
    out = tmp_path / "out"
    result = run_cli("convert", *shards, "-o", out, "--audio", target, "-j1", "-q", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["audio"]["transcoded"] > 0 and report["audio"]["kept"] == 0
    written = sorted(str(p) for p in out.glob("*.tar"))
    expected = [r for shard in written for r in _records_parsed_from(shard)]
    indexed = list(iter_index(report["index"]))
    assert len(indexed) == len(expected) == report["samples"]
    key = ("shard", "key", "audio", "format", "sample_rate", "channels", "frames", "duration", "bytes", "members")
    assert sorted(tuple(str(r[k]) for k in key) for r in indexed) == \
        sorted(tuple(str(r[k]) for k in key) for r in expected)
    assert {r["format"] for r in indexed} == {target}
