"""index and balance with --executor ray and --split I/N: slices joined equal one run over the whole list."""

import json
import logging
import os
import shutil

import pytest
from support import SMALL_CORPORA, folder_bytes, is_slice_file, read_bytes, run_cli

from shardkit.io.indexfile import index_marks, iter_index
from shardkit.io.synth import corpus_utterances, write_shards


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The three small corpora in their own folders: bz2 (spooled by balance), zst and plain shards."""
    root = tmp_path_factory.mktemp("corpora")
    for spec, codec in zip(SMALL_CORPORA, ("bz2", "zst", "none")):
        write_shards(list(corpus_utterances(spec, seed=2)), str(root / spec.name), utts_per_shard=2, codec=codec)
    return root


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


# --- index ------------------------------------------------------------------------------------


def test_index_slices_concatenated_are_the_index_of_one_run(corpora, tmp_path):
    sources = corpora / "aishell" / "data.list"  # 3 shards: slices of 1
    assert run_cli("index", sources, "-o", tmp_path / "all.jsonl", "-q", "-j", "1").exit_code == 0
    for i in (1, 2, 3):
        result = run_cli("index", sources, "-o", tmp_path / "all.jsonl", "-q", "--split", f"{i}/3", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["index"] == str(tmp_path / f"all.slice-{i}-of-3.jsonl")
    # each slice is one marked segment (its own completeness marks and stamps): concatenated, the records
    # are those of the whole list's index in its order, and the joined file checks whole
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes(b"".join(read_bytes(tmp_path / f"all.slice-{i}-of-3.jsonl") for i in (1, 2, 3)))
    whole = list(iter_index(str(tmp_path / "all.jsonl")))
    assert list(iter_index(str(joined))) == whole and len(whole) == 6
    marks, single = index_marks(str(joined)), index_marks(str(tmp_path / "all.jsonl"))
    assert marks.record() == single.record() and marks.marked and len(marks.sources) == 3


def test_balance_refuses_an_index_with_a_slice_missing(corpora, tmp_path):
    for i in (1, 3):
        run_cli("index", corpora / "aishell", "-o", tmp_path / "a.jsonl", "-q", "--split", f"{i}/3")
    given = ",".join(str(tmp_path / f"a.slice-{i}-of-3.jsonl") for i in (1, 3))
    result = run_cli("balance", "--corpus", f"aishell={given}", "--world-size", "1", "--num-workers", "1",
                     "-o", tmp_path / "out", "--dry-run", "-q")
    assert result.exit_code == 2
    assert result.stderr == (f"Error: corpus 'aishell': index {tmp_path}/a.jsonl is given in slices without "
                             f"slice 2 of 3\n")


def test_index_on_ray_equals_local(corpora, tmp_path, ray_local):
    for executor in ("local", "ray"):
        result = run_cli("index", corpora / "librispeech", "-o", tmp_path / f"{executor}.jsonl", "-q",
                         "--executor", executor)
        assert result.exit_code == 0, result.output
    assert read_bytes(tmp_path / "ray.jsonl") == read_bytes(tmp_path / "local.jsonl")


# --- balance ----------------------------------------------------------------------------------


def balance(corpora, out, *extra):
    args = ["balance", "-o", out, "--world-size", "2", "--num-workers", "1", "--num-shards", "4", "-j", "1", "-q"]
    for spec in SMALL_CORPORA:
        args += ["--corpus", f"{spec.name}={corpora / spec.name}"]
    return run_cli(*args, *extra)


def test_three_balance_slices_merged_equal_one_run(corpora, tmp_path):
    out = tmp_path / "out"
    assert balance(corpora, out).exit_code == 0
    single = folder_bytes(out, skip=is_slice_file)
    assert sorted(single) == ["balance.json", "balance.repeats.jsonl", "data.list"] + [f"shards_{s:09d}.tar" for s in range(4)]
    shutil.rmtree(out)
    for i in (1, 2, 3):
        result = balance(corpora, out, "--split", f"{i}/3", "--json")
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["written"]["ok"] == (2 if i == 3 else 1)  # 4 shards: slices of 1, 1 and 2
        assert summary["data_list"] == f"{out}/data.slice-{i}-of-3.list"
    # each slice spooled what it read into its own folder and removed it; the shared indexes stay
    assert sorted(os.listdir(out / ".balance")) == ["index"]
    result = run_cli("merge-reports", out, "--command", "balance")
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"merged 3 slices of balance: 4 entries (ok 4); report: {out}/balance.json; "
                             f"list: {out}/data.list\n")
    assert folder_bytes(out, skip=is_slice_file) == single
    # a rerun of one slice finds its shards written
    result = balance(corpora, out, "--split", "2/3", "--json")
    assert json.loads(result.stdout)["written"] == {"ok": 0, "skipped": 1, "failed": 0}


def test_balance_missing_slice_and_split_with_dry_run(corpora, tmp_path):
    out = tmp_path / "out"
    for i in (1, 2):
        assert balance(corpora, out, "--split", f"{i}/3").exit_code == 0
    result = run_cli("merge-reports", out, "--command", "balance")
    assert result.exit_code == 1
    assert result.stderr == (f"Error: {out}: missing slice 3 of 3 (no balance.slice-3-of-3.json); "
                             f"rerun those jobs, then merge again\n")
    result = balance(corpora, out, "--split", "1/3", "--dry-run")
    assert result.exit_code == 2
    assert result.stderr == ("Error: --split writes a slice of the shards and --dry-run writes none; "
                             "plan without --split\n")


def test_balance_slices_of_another_plan_are_refused(corpora, tmp_path):
    out = tmp_path / "out"
    assert balance(corpora, out, "--split", "1/2").exit_code == 0
    assert balance(corpora, out, "--split", "2/2", "--seed", "7").exit_code == 0
    result = run_cli("merge-reports", out, "--command", "balance")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {out}: slices 1 and 2 were cut from different input lists (inputs_sha256 differs)\n"


def test_balance_on_ray_writes_what_local_writes(corpora, tmp_path, ray_local):
    outputs = {}
    for executor in ("local", "ray"):
        out = tmp_path / executor
        result = balance(corpora, out, "--executor", executor)
        assert result.exit_code == 0, result.output
        outputs[executor] = {name: data.replace(str(out).encode(), b"OUT")
                             for name, data in folder_bytes(out, skip=is_slice_file).items()}
    assert outputs["ray"] == outputs["local"]
