"""Proposed for the convert owner: convert --executor ray and --split I/N, end to end."""

import json
import logging
import shutil

import pytest

from shardkit.io.files import load_json
from support import read_bytes, run_cli, without


TIMINGS = {"settings": {"threads"}, "shards": {"seconds"}}  # threads: cores // jobs, no effect on bytes


def outputs_of(out):
    return {p: read_bytes(p) for p in read_bytes(out / "data.list").decode().split()}


def test_three_split_jobs_merged_equal_one_run(make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=2)
    out = tmp_path / "out"
    assert run_cli("convert", *sources, "-o", out, "-j", "2", "-q").exit_code == 0
    single = (without(load_json(str(out / "convert.json")), **TIMINGS), read_bytes(out / "data.list"), outputs_of(out))
    shutil.rmtree(out)
    for i in (1, 2, 3):
        result = run_cli("convert", *sources, "-o", out, "-j", "1", "-q", "--split", f"{i}/3")
        assert result.exit_code == 0, result.output
    assert not (out / "convert.json").exists()
    result = run_cli("merge-reports", out)
    assert result.exit_code == 0, result.output
    merged = (without(load_json(str(out / "convert.json")), **TIMINGS), read_bytes(out / "data.list"), outputs_of(out))
    assert merged == single
    # a rerun of one slice finds its work done
    result = run_cli("convert", *sources, "-o", out, "-q", "--split", "2/3", "--json")
    assert json.loads(result.stdout)["skipped"] == json.loads(result.stdout)["shards"] > 0


def test_bad_split_is_a_usage_error(make_shards, tmp_path):
    result = run_cli("convert", *make_shards("none"), "-o", tmp_path / "o", "--split", "4/3")
    assert result.exit_code == 2
    assert result.stderr == "Error: --split 4/3: I must be between 1 and N (slices count from 1)\n"
    result = run_cli("convert", *make_shards("none"), "-o", tmp_path / "o", "--ray-address", "auto")
    assert result.exit_code == 2
    assert result.stderr == "Error: --ray-address needs --executor ray\n"


def test_ray_executor_writes_what_the_local_one_writes(make_shards, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, logging_level=logging.WARNING)
    try:
        sources = make_shards("bz2", utts_per_shard=3)
        out = tmp_path / "out"
        assert run_cli("convert", *sources, "-o", out, "-j", "2", "-q").exit_code == 0
        local = (without(load_json(str(out / "convert.json")), **TIMINGS), read_bytes(out / "data.list"), outputs_of(out))
        shutil.rmtree(out)
        result = run_cli("convert", *sources, "-o", out, "-q", "--executor", "ray")
        assert result.exit_code == 0, result.output
        on_ray = (without(load_json(str(out / "convert.json")), **TIMINGS), read_bytes(out / "data.list"), outputs_of(out))
        assert on_ray == local
    finally:
        ray.shutdown()


def test_merge_reports_joins_the_slices_indexes_into_the_index_of_one_run(make_shards, tmp_path):
    """convert --split writes index.slice-I-of-N.parquet beside each slice's list; merge-reports streams
    them, in slice order, into index.parquet: the same rows as the index of one run."""
    from shardkit.io.indexfile import iter_index

    sources = make_shards("gz", utts_per_shard=2)
    out = tmp_path / "out"
    assert run_cli("convert", *sources, "-o", out, "-j", "1", "-q").exit_code == 0
    single = list(iter_index(str(out / "index.parquet")))
    shutil.rmtree(out)
    for i in (1, 2, 3):
        assert run_cli("convert", *sources, "-o", out, "-j", "1", "-q", "--split", f"{i}/3").exit_code == 0
        assert (out / f"index.slice-{i}-of-3.parquet").exists()
    assert not (out / "index.parquet").exists()
    result = run_cli("merge-reports", out, "--json", "-q")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index"] == str(out / "index.parquet")
    assert list(iter_index(str(out / "index.parquet"))) == single and len(single) > 6
    # a slice without its index: no merged index, and the summary says which slice lacks it
    (out / "index.parquet").unlink()
    (out / "index.slice-2-of-3.parquet").unlink()
    summary = json.loads(run_cli("merge-reports", out, "--json", "-q").stdout)
    assert "index" not in summary and "slice 2 wrote no index.slice-2-of-3.parquet" in summary["index_note"]
    assert not (out / "index.parquet").exists()
