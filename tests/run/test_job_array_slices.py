"""--split I/N slices and merge-reports: a job array of slices merges into what one run writes."""

import json
import os
import shutil

import pytest

from shardkit.run.options import RunOptions
from shardkit.commands import merge_reports
from shardkit.commands.convert import ConvertSettings, run_convert
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.files import partial_list_path
from shardkit.io.files import atomic_write_json, load_json
from shardkit.run.split import inputs_digest, parse_split, select_slice, slice_bounds, slice_path, slice_record
from support import read_bytes, run_cli, without


# --- planning (pure) ----------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [("2/3", (2, 3)), ("1/1", (1, 1)), (" 10 / 12 ", (10, 12))])
def test_parse_split(text, expected):
    assert parse_split(text) == expected


@pytest.mark.parametrize("text, message", [
    ("3", "--split '3' is not I/N (slice I of N, counting from 1, e.g. 2/3)"),
    ("a/b", "--split 'a/b' is not I/N (slice I of N, counting from 1, e.g. 2/3)"),
    ("-1/3", "--split '-1/3' is not I/N (slice I of N, counting from 1, e.g. 2/3)"),
    ("0/3", "--split 0/3: I must be between 1 and N (slices count from 1)"),
    ("4/3", "--split 4/3: I must be between 1 and N (slices count from 1)"),
    ("1/0", "--split 1/0: I must be between 1 and N (slices count from 1)"),
])
def test_parse_split_refuses_bad_input(text, message):
    with pytest.raises(UsageError) as err:
        parse_split(text)
    assert str(err.value) == message


@pytest.mark.parametrize("total", range(0, 14))
@pytest.mark.parametrize("count", range(1, 8))
def test_slices_cover_every_item_once_in_order_and_differ_by_at_most_one(total, count):
    items = [f"/data/shard_{i:03d}.tar" for i in range(total)]
    slices = [select_slice(items, i, count) for i in range(1, count + 1)]
    assert [item for part in slices for item in part] == items
    assert max(map(len, slices)) - min(map(len, slices)) <= 1
    assert slices == [select_slice(items, i, count) for i in range(1, count + 1)]  # deterministic
    for i, part in enumerate(slices, start=1):
        start, stop = slice_bounds(total, i, count)
        assert items[start:stop] == part


def test_slice_names_and_records():
    assert slice_path("/o/convert.json", 2, 3) == "/o/convert.slice-2-of-3.json"
    assert slice_path("/o/data.list", 1, 12) == "/o/data.slice-1-of-12.list"
    assert slice_path("/o/.convert.journal.jsonl", 3, 3) == "/o/.convert.journal.slice-3-of-3.jsonl"
    items = ["a", "b", "c", "d", "e"]
    assert slice_record(items, 2, 3) == {"index": 2, "count": 3, "start": 1, "stop": 3, "inputs_total": 5,
                                         "inputs_sha256": inputs_digest(items)}
    assert inputs_digest(items) != inputs_digest(items[::-1])


# --- merging: a job array of convert slices equals one run ---------------------------------------


def convert_slice(sources, out_dir, index, count, settings):
    """What `shardkit convert --split I/N` does: the slice of the full list, reports under slice names."""
    run_convert(select_slice(sources, index, count), str(out_dir), settings, RunOptions(jobs=1))
    doc = load_json(os.path.join(out_dir, "convert.json"))
    doc["slice"] = slice_record(sources, index, count)
    atomic_write_json(slice_path(os.path.join(out_dir, "convert.json"), index, count), doc)
    os.unlink(os.path.join(out_dir, "convert.json"))
    full = os.path.join(out_dir, "data.list")
    # a slice that failed a shard lists the rest as partial
    for name, sliced in ((full, slice_path(full, index, count)),
                         (partial_list_path(full), partial_list_path(slice_path(full, index, count)))):
        if os.path.exists(name):
            os.replace(name, sliced)


TIMINGS = {"shards": {"seconds"}}


@pytest.fixture
def sources(make_shards):
    return make_shards("gz", utts_per_shard=2)  # 7 shards: slices of 2, 2 and 3


@pytest.fixture
def sliced_run(sources, tmp_path):
    """One whole run's outputs and reports, then the same folder rebuilt by 3 slices (not merged)."""
    out = tmp_path / "out"
    settings = ConvertSettings(codec="zst", level=3)
    report = run_convert(sources, str(out), settings, RunOptions(jobs=1))
    single = {"manifest": load_json(str(out / "convert.json")), "list": read_bytes(out / "data.list"),
              "shards": {p: read_bytes(p) for p in [e["output"]["path"] for e in report.shards]}}
    shutil.rmtree(out)
    for index in (1, 2, 3):
        convert_slice(sources, out, index, 3, settings)
    return out, single


def test_three_slices_merged_equal_a_single_run(sliced_run):
    out, single = sliced_run
    assert not (out / "convert.json").exists() and not (out / "data.list").exists()
    summary = merge_reports(str(out), "convert").summary
    assert summary["slices"] == 3 and summary["entries"] == 7 and summary["statuses"] == {"ok": 7}
    assert read_bytes(out / "data.list") == single["list"]
    assert without(load_json(str(out / "convert.json")), **TIMINGS) == without(single["manifest"], **TIMINGS)
    assert {p: read_bytes(p) for p in single["shards"]} == single["shards"]
    assert sorted(os.listdir(out)) == sorted(
        [os.path.basename(p) for p in single["shards"]] + ["convert.json", "data.list"]
        + [f"convert.slice-{i}-of-3.json" for i in (1, 2, 3)] + [f"data.slice-{i}-of-3.list" for i in (1, 2, 3)]
        # the by-product index (each simulated slice is a whole run over its part) and its parts in .index
        + ["index.parquet", ".index"])


def test_merge_reports_cli_reports_and_exits_0(sliced_run):
    out, single = sliced_run
    result = run_cli("merge-reports", out)
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"merged 3 slices of convert: 7 entries (ok 7); report: {out}/convert.json; "
                             f"list: {out}/data.list\n")
    result = run_cli("merge-reports", out, "--json", "-q")
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert summary["data_list"] == f"{out}/data.list" and summary["problems"] == 0


def test_a_missing_slice_is_named_and_nothing_is_written(sliced_run):
    out, _ = sliced_run
    os.unlink(out / "convert.slice-2-of-3.json")
    result = run_cli("merge-reports", out, "--command", "convert")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: {out}: missing slice 2 of 3 (no convert.slice-2-of-3.json); "
                             f"rerun those jobs, then merge again\n")
    assert not (out / "convert.json").exists() and not (out / "data.list").exists()
    os.unlink(out / "convert.slice-3-of-3.json")
    with pytest.raises(ShardkitError, match=r"missing slices 2, 3 of 3 \(no convert.slice-2-of-3.json, "
                                            r"convert.slice-3-of-3.json\)"):
        merge_reports(str(out))


def test_slices_of_another_job_array_are_refused(sliced_run):
    out, _ = sliced_run
    shutil.copy(out / "convert.slice-1-of-3.json", out / "convert.slice-1-of-4.json")
    with pytest.raises(ShardkitError) as err:
        merge_reports(str(out))
    assert str(err.value) == (f"{out}: slice reports of different job arrays (N = 3, 4: convert.slice-1-of-3.json, "
                              f"convert.slice-1-of-4.json); remove the stale ones and merge again")


def test_slices_with_other_settings_or_another_input_list_are_refused(sliced_run):
    out, _ = sliced_run
    path = str(out / "convert.slice-3-of-3.json")
    original = load_json(path)
    atomic_write_json(path, {**original, "settings": {**original["settings"], "level": 19}})
    with pytest.raises(ShardkitError) as err:
        merge_reports(str(out))
    assert str(err.value) == (f"{out}: slices 1 and 3 disagree on 'settings' (run with other settings or another "
                              f"shardkit version); rerun the odd one")
    atomic_write_json(path, {**original, "settings": {**original["settings"], "threads": 16}})
    merge_reports(str(out))  # decompressor threads follow each node's cores and change no output byte
    assert load_json(str(out / "convert.json"))["settings"]["threads"] == original["settings"]["threads"]
    atomic_write_json(path, {**original, "slice": {**original["slice"], "inputs_sha256": "0" * 64}})
    with pytest.raises(ShardkitError) as err:
        merge_reports(str(out))
    assert str(err.value) == f"{out}: slices 1 and 3 were cut from different input lists (inputs_sha256 differs)"
    atomic_write_json(path, {**original, "shards": original["shards"][:-1]})
    with pytest.raises(ShardkitError) as err:
        merge_reports(str(out))
    assert str(err.value) == (f"{path}: holds 2 entries for inputs 4-7, but slice 3 of 3 of 7 inputs is 4-7")


def test_a_slice_without_its_list_is_refused(sliced_run):
    out, _ = sliced_run
    os.unlink(out / "data.slice-1-of-3.list")
    with pytest.raises(ShardkitError) as err:
        merge_reports(str(out))
    assert str(err.value) == f"{out}: slice report 1 has no data.slice-I-of-3.list beside it"


def test_merge_exits_1_when_a_merged_shard_failed(sources, tmp_path):
    out = tmp_path / "out"
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"not a tar archive at all\n" * 40)
    inputs = sources[:3] + [str(broken)]
    for index in (1, 2):
        convert_slice(inputs, out, index, 2, ConvertSettings())
    result = run_cli("merge-reports", out)
    assert result.exit_code == 1
    assert result.stderr.startswith("merged 2 slices of convert: 4 entries (failed 1, ok 3); ")
    assert len(read_bytes(out / "data.partial.list").splitlines()) == 3  # it lacks the failed shard, and says so
    assert not (out / "data.list").exists()


def test_nothing_to_merge(tmp_path):
    result = run_cli("merge-reports", tmp_path)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {tmp_path}: no slice reports to merge (looked for convert.slice-I-of-N.json)\n"
    result = run_cli("merge-reports", tmp_path / "absent")
    assert result.exit_code == 2
    assert result.stderr == f"Error: {tmp_path / 'absent'}: no such folder\n"
