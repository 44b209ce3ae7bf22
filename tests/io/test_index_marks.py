"""Completeness marks and source stamps of index files: a cut copy and a changed shard are caught by the
consumers (balance, plan), an index without marks still loads with a note."""

import json
import os

import pytest

from shardkit.errors import ShardkitError
from shardkit.io.indexfile import index_marks, iter_index
from shardkit.io.indexmarks import STAMP_BYTES, stamp_change, stamp_file
from support import run_cli


@pytest.fixture
def indexed(make_shards, tmp_path):
    """The small mix as plain shards (2 utterances each) and its index in both formats."""
    shards = make_shards("none", utts_per_shard=2)
    for suffix in ("jsonl", "parquet"):
        result = run_cli("index", *shards, "-o", tmp_path / f"all.{suffix}", "-q")
        assert result.exit_code == 0, result.output
    return shards, tmp_path


def balance(tmp_path, index, *extra):
    return run_cli("balance", "--corpus", f"mix={index}", "--world-size", "1", "--num-workers", "1",
                   "-o", tmp_path / "out", "--dry-run", "--json", *extra)


def plan(shards, index):
    return run_cli("plan", *shards, "--index", index, "--world-size", "1", "--num-workers", "1", "--json")


def _rewrite_same_size_and_mtime(path, offset):
    """Flip a byte at ``offset`` and put the mtime back: only a digest can tell."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_every_index_records_its_rows_and_each_shards_stamp(indexed):
    shards, tmp_path = indexed
    for suffix in ("jsonl", "parquet"):
        marks = index_marks(str(tmp_path / f"all.{suffix}"))
        assert marks.marked and marks.rows == 14 and marks.note() is None
        assert marks.sources == {s: stamp_file(s) for s in shards}
        assert set(marks.sources[shards[0]]) == {"size", "mtime_ns", "digest"}
    assert len(list(iter_index(str(tmp_path / "all.jsonl")))) == 14  # the mark lines are not records


def test_a_jsonl_index_cut_at_a_line_boundary_is_refused_by_balance_and_plan(indexed):
    shards, tmp_path = indexed
    lines = (tmp_path / "all.jsonl").read_bytes().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(lines[:11]))  # the head and 10 of 14 records: valid JSON on every line
    for result in (balance(tmp_path, cut), plan(shards, cut)):
        assert result.exit_code == 1, result.output
        assert json.loads(result.stdout)["error"] == (
            f"{cut}: is cut short: the segment that starts at line 1 has 10 records and no end mark after "
            f"line 11 (a copy that stopped early?); copy or index it again")


@pytest.mark.parametrize("edit, why", [
    (lambda lines: lines[:3] + lines[4:], "holds 13 records, its end mark says 14"),
    (lambda lines: lines[:3] + [lines[3].replace(b'"duration":', b'"duration":1')] + lines[4:],
     "do not match the digest of their end mark"),
    (lambda lines: [lines[0], lines[2], lines[1]] + lines[3:], "do not match the digest of their end mark"),
])
def test_a_jsonl_index_with_records_dropped_or_edited_is_refused(indexed, edit, why):
    shards, tmp_path = indexed
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"".join(edit((tmp_path / "all.jsonl").read_bytes().splitlines(keepends=True))))
    result = balance(tmp_path, edited)
    assert result.exit_code == 1
    assert why in json.loads(result.stdout)["error"]


def test_a_parquet_index_cut_short_is_refused(indexed):
    shards, tmp_path = indexed
    data = (tmp_path / "all.parquet").read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[:len(data) // 2])
    for result in (balance(tmp_path, cut), plan(shards, cut)):
        assert result.exit_code == 1
        assert json.loads(result.stdout)["error"].startswith(
            f"{cut}: not a readable Parquet index: cut short (a copy that stopped early?) or damaged")


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_shard_touched_after_indexing_is_named_with_what_changed(indexed, suffix):
    shards, tmp_path = indexed
    index = tmp_path / f"all.{suffix}"
    before = os.stat(shards[2])
    os.utime(shards[2], ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # same size, new mtime
    for result in (balance(tmp_path, index), plan(shards, index)):
        assert result.exit_code == 1
        error = json.loads(result.stdout)["error"]
        assert error.startswith(f"{shards[2]}: changed since it was indexed into {index}: mtime_ns "
                                f"{before.st_mtime_ns} -> {before.st_mtime_ns + 10**9}; digest of its first "
                                f"and last 64 KiB unchanged")
        assert "index it again" in error


def test_a_shard_rewritten_at_the_same_size_and_mtime_is_caught_by_its_digest(indexed):
    shards, tmp_path = indexed
    size = os.path.getsize(shards[1])
    _rewrite_same_size_and_mtime(shards[1], size - 600)  # inside the last 64 KiB: the digest reads it
    result = balance(tmp_path, tmp_path / "all.parquet")
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert error.startswith(f"{shards[1]}: changed since it was indexed into {tmp_path / 'all.parquet'}: digest ")
    assert "size" not in error.split(": digest")[0] and "mtime_ns" not in error


def test_a_shard_grown_is_named_with_its_sizes(indexed):
    shards, tmp_path = indexed
    size = os.path.getsize(shards[0])
    with open(shards[0], "ab") as f:
        f.write(b"\0" * 1024)
    why = stamp_change(shards[0], index_marks(str(tmp_path / "all.jsonl")).sources[shards[0]])
    assert why.startswith(f"size {size} -> {size + 1024}; mtime_ns ")
    with pytest.raises(ShardkitError, match=f"size {size} -> {size + 1024}"):
        index_marks(str(tmp_path / "all.jsonl")).check_sources()


def test_plan_checks_only_the_shards_it_lists(indexed):
    shards, tmp_path = indexed
    before = os.stat(shards[-1])
    os.utime(shards[-1], ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    result = plan(shards[:-1], tmp_path / "all.jsonl")
    assert result.exit_code == 0, result.output
    assert plan(shards, tmp_path / "all.jsonl").exit_code == 1


def test_plan_reads_no_shard_to_check_it_balance_reads_its_digest(indexed):
    """plan opens no shard: it compares size and mtime (a stat); a rewrite that keeps both is balance's to catch."""
    shards, tmp_path = indexed
    _rewrite_same_size_and_mtime(shards[0], os.path.getsize(shards[0]) - 600)
    assert plan(shards, tmp_path / "all.jsonl").exit_code == 0
    assert balance(tmp_path, tmp_path / "all.jsonl").exit_code == 1


def test_balance_given_shards_indexes_a_changed_shard_again(indexed):
    """balance indexes shard sources itself (OUT/.balance/index, shared by the slices of a job array): a
    shard rewritten at the same size and mtime between two slices is indexed again, not refused."""
    shards, tmp_path = indexed
    folder = os.path.dirname(shards[0])
    out = tmp_path / "out"
    run = ["balance", "--corpus", f"mix={folder}", "--world-size", "1", "--num-workers", "1", "--num-shards", "2",
           "-o", out, "-j", "1", "-q"]
    assert run_cli(*run, "--split", "1/2").exit_code == 0
    built = str(out / ".balance" / "index" / "index-0.parquet")
    assert index_marks(built).sources[shards[0]] == stamp_file(shards[0])
    _rewrite_same_size_and_mtime(shards[0], 1536 + 100)  # a sample of the first wav (header 1024, data 1536)
    result = run_cli(*run, "--split", "2/2")
    assert result.exit_code == 0, result.output
    assert index_marks(built).sources[shards[0]] == stamp_file(shards[0])


def test_an_old_index_without_marks_still_loads_with_a_note(indexed):
    shards, tmp_path = indexed
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(line for line in (tmp_path / "all.jsonl").read_bytes().splitlines(keepends=True)
                             if not line.startswith(b'{"shardkit_index"')))
    marks = index_marks(str(old))
    assert not marks.marked and marks.rows == 14 and "nor a changed shard can be detected" in marks.note()
    result = balance(tmp_path, old)
    assert result.exit_code == 0, result.output
    assert f"note: {old}: no completeness mark or source stamps" in result.stderr
    result = plan(shards, old)
    assert result.exit_code == 0 and "no completeness mark" in result.stderr
    assert json.loads(result.stdout)["unchecked_indexes"] == [str(old)]
    # rewritten as Parquet it is still one that cannot be checked: no stamps are made up
    assert run_cli("index", old, "-o", tmp_path / "old.parquet", "-q").exit_code == 0
    assert index_marks(str(tmp_path / "old.parquet")).sources is None


def test_a_jsonl_index_rewritten_as_parquet_keeps_its_stamps(indexed):
    shards, tmp_path = indexed
    assert run_cli("index", tmp_path / "all.jsonl", "-o", tmp_path / "again.parquet", "-q").exit_code == 0
    assert index_marks(str(tmp_path / "again.parquet")).sources == index_marks(str(tmp_path / "all.jsonl")).sources


def test_balance_records_the_stamps_it_used(indexed):
    shards, tmp_path = indexed
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(line for line in (tmp_path / "all.jsonl").read_bytes().splitlines(keepends=True)
                             if not line.startswith(b'{"shardkit_index"')))
    for index, unchecked in ((tmp_path / "all.parquet", None), (old, [str(old)])):
        out = tmp_path / f"out-{index.suffix[1:]}"
        result = run_cli("balance", "--corpus", f"mix={index}", "--world-size", "1", "--num-workers", "1",
                         "--num-shards", "2", "-o", out, "-j", "1", "-q")
        assert result.exit_code == 0, result.output
        recorded = json.loads((out / "balance.json").read_text())["sources"]["mix"]
        assert recorded["source_stamps"] == ({s: stamp_file(s) for s in shards} if unchecked is None else {})
        assert recorded.get("unchecked_indexes") == unchecked


def test_the_digest_reads_the_head_and_the_tail(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(3 * STAMP_BYTES))
    stamp = stamp_file(str(big))
    _rewrite_same_size_and_mtime(str(big), STAMP_BYTES + 10)  # the middle: not read (a cheap digest)
    assert stamp_change(str(big), stamp) is None
    _rewrite_same_size_and_mtime(str(big), 3 * STAMP_BYTES - 1)
    assert stamp_change(str(big), stamp).startswith("digest ")


def test_plan_records_the_stamps_of_the_shards_it_listed(indexed):
    shards, tmp_path = indexed
    result = plan(shards[:3], tmp_path / "all.parquet")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["source_stamps"] == {s: stamp_file(s) for s in shards[:3]}
    assert "unchecked_indexes" not in summary
