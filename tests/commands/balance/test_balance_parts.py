"""Planning in parts (balance --part I/P): a mix above one node's memory, planned 1/P at a time.

A part is the utterances whose row (over a corpus' index files, in order) is I - 1 modulo P, so
every part draws evenly from every source shard and every corpus; it is loaded (every row read and
checked, only the part's columns kept) and planned alone.
"""

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands.balance import BalanceSettings, CorpusSource, _load_mix, _plan, take_keys
from shardkit.run.options import RunOptions
from support import index_records, to_parquet_index, write_jsonl_index

pytest.importorskip("pyarrow")

ARGS = {"world_size": 4, "num_workers": 2, "shard_duration": 300.0, "num_shards": None, "remainder": "pad",
        "seed": 5, "epochs": 2}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """Three corpora; zh in two files (JSON lines, then Parquet), en Parquet, acc JSON lines."""
    root = tmp_path_factory.mktemp("parts")
    zh = index_records("zh", 2500, 10)
    files = {"zh": [write_jsonl_index(root / "zh-1.jsonl", zh[:1300]),
                    to_parquet_index(write_jsonl_index(root / "zh-2.jsonl", zh[1300:]), root / "zh-2.parquet")],
             "en": [to_parquet_index(write_jsonl_index(root / "en.jsonl", index_records("en", 1000, 11)), root / "en.parquet")],
             "acc": [write_jsonl_index(root / "acc.jsonl", index_records("acc", 700, 12))]}
    keys = {name: [r["key"] for r in records] for name, records in
            (("zh", zh), ("en", index_records("en", 1000, 11)), ("acc", index_records("acc", 700, 12)))}
    return files, keys


def _plan_part(files, part=None):
    corpora = [CorpusSource(name, tuple(paths)) for name, paths in files.items()]
    mix, index_files = _load_mix(corpora, "/nonexistent", RunOptions(jobs=1), part=part)
    return mix, _plan(corpora, mix, index_files, BalanceSettings(**ARGS)).plan


def _originals(mix, plan):
    """(corpus, key) of every copy 0 in the plan."""
    out = []
    for c, corpus in enumerate(mix.corpora):
        mine = np.flatnonzero((plan.corpus == c) & (plan.copy == 0))
        out += [(mix.names[c], key) for key in take_keys(corpus, plan.utt[mine])]
    return out


@pytest.mark.parametrize("parts", [2, 3])
def test_parts_cover_every_utterance_once_and_each_is_balanced(index, parts):
    files, keys = index
    whole_mix, whole = _plan_part(files)
    seen = Counter()
    for i in range(1, parts + 1):
        mix, plan = _plan_part(files, (i, parts))
        # the part's columns are 1/P of the corpus: its rows i-1, i-1+P, ... (memory: 1/P)
        for c, name in enumerate(mix.names):
            assert len(mix.corpora[c].durations) == len(range(i - 1, len(keys[name]), parts))
            assert take_keys(mix.corpora[c], np.arange(3)) == keys[name][i - 1::parts][:3]
        assert plan.balanced and plan.num_shards % 8 == 0
        assert (plan.shard_corpus_counts.sum(axis=1) == plan.utts_per_shard).all()
        seen.update(_originals(mix, plan))
        # what it is to the one-piece plan: the same rule on 1/P of the mix (its shard count the multiple of
        # world_size x num_workers nearest its seconds / --shard-duration, so shards near that length;
        # the same corpus shares
        seconds = sum(float(c.durations.sum()) for c in mix.corpora)
        assert plan.num_shards == max(8, 8 * int(np.floor(seconds / 300.0 / 8 + 0.5)))
        assert abs(plan.shard_seconds.mean() - 300.0) <= 300.0 * 4 / plan.num_shards + 10
        share = plan.shard_corpus_counts.sum(axis=0) / plan.shard_corpus_counts.sum()
        whole_share = whole.shard_corpus_counts.sum(axis=0) / whole.shard_corpus_counts.sum()
        assert np.abs(share - whole_share).max() < 0.01
    every = {(name, key) for name, ks in keys.items() for key in ks}
    assert set(seen) == every and set(seen.values()) == {1}  # every utterance once, in exactly one part
    assert Counter(_originals(whole_mix, whole)) == seen


def test_part_is_a_cli_option_and_checked(index, tmp_path):
    files, _ = index
    args = ["balance", "--world-size", "4", "--num-workers", "2", "--shard-duration", "300", "--dry-run", "--json",
            "-q", "-o", str(tmp_path / "o")] + [a for name, paths in files.items()
                                                for a in ("--corpus", f"{name}={','.join(paths)}")]
    result = CliRunner().invoke(main, args + ["--part", "2/3"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["part"] == {"index": 2, "count": 3} and summary["balanced"]
    assert summary["utterances"] >= (2500 + 1000 + 700) // 3
    result = CliRunner().invoke(main, args + ["--part", "4/3"])
    assert result.exit_code == 2 and "--part 4/3: I must be between 1 and N (parts count from 1)" in result.stderr
