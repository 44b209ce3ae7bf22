"""Index files (issue 25): Parquet beside JSON lines, the conversion between them, planning from either,
damage named by file and row, and the index convert writes beside data.list for balance."""

import hashlib
import json
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from support import SMALL_CORPORA, corpus, index_records, to_parquet_index, write_jsonl_index

from shardkit.cli import main
from shardkit.commands import balance
from shardkit.commands.balance import BalanceSettings, CorpusSource, _load_mix, _plan
from shardkit.planning.balance import PlanSettings, plan_balance, plan_digest
from shardkit.run.options import RunOptions
from shardkit.errors import ShardkitError, UsageError
from shardkit.io import indexfile
from shardkit.io.tar import group_samples, iter_shard_members

pytest.importorskip("pyarrow")

def _plan_index_files(files_per_corpus, weight=1.0, **plan_args):
    corpora = [CorpusSource(name, tuple(files), weight) for name, files in files_per_corpus.items()]
    mix, index_files = _load_mix(corpora, "/nonexistent-work-dir", RunOptions(jobs=1))
    args = {"world_size": 4, "num_workers": 2, "shard_duration": 600.0, "num_shards": None, "remainder": "pad",
            "seed": 3, "epochs": 2, **plan_args}
    args["dry_run"] = not args.pop("writing", True)  # a dry run only counts the repeats
    return _plan(corpora, mix, index_files, BalanceSettings(**args))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Three corpora as JSON lines (two files for zh, aliases in acc) and the same as Parquet."""
    root = tmp_path_factory.mktemp("generated")
    zh = index_records("zh", 3000, 0)
    jsonl = {"zh": [write_jsonl_index(root / "zh-1.jsonl", zh[:1700]), write_jsonl_index(root / "zh-2.jsonl", zh[1700:])],
             "en": [write_jsonl_index(root / "en.jsonl", index_records("en", 1200, 1))],
             "acc": [write_jsonl_index(root / "acc.jsonl", index_records("acc", 900, 2, aliases=True))]}
    parquet = {name: [to_parquet_index(p, p[:-len(".jsonl")] + ".parquet") for p in files]
               for name, files in jsonl.items()}
    return {"root": root, "jsonl": jsonl, "parquet": parquet}


def test_a_converted_index_holds_every_record_as_given(generated):
    for name, files in generated["jsonl"].items():
        for src, dst in zip(files, generated["parquet"][name]):
            expected = list(indexfile.iter_jsonl(src))  # aliases renamed: member -> audio, text_len -> text_chars
            assert list(indexfile.iter_index(dst)) == expected
    assert all("audio" in r and "text_chars" in r and "member" not in r
               for r in indexfile.iter_index(generated["parquet"]["acc"][0]))


@pytest.mark.parametrize("weights", [(1, 1, 1), (0.5, 2, 1.5)])
def test_jsonl_parquet_and_mixed_indexes_give_the_same_plan(generated, weights):
    j, p = generated["jsonl"], generated["parquet"]
    mixed = {"zh": [j["zh"][0], p["zh"][1]], "en": p["en"], "acc": j["acc"]}
    plans = []
    for files in (j, p, mixed):
        planned = _plan_index_files(files)
        plans.append(planned)
    for other in plans[1:]:
        assert plan_digest(other.plan) == plan_digest(plans[0].plan)
        assert np.array_equal(other.plan.seconds, plans[0].plan.seconds)
        assert list(other.repeats) == list(plans[0].repeats) and other.figures == plans[0].figures
    assert plans[0].plan.balanced


def test_balance_dry_run_reads_either_index_alike(generated):
    outs = []
    for kind in ("jsonl", "parquet"):
        args = ["balance", "--world-size", "4", "--num-workers", "2", "--shard-duration", "600", "-o", "unused",
                "--dry-run", "--json", "-q"]
        for name, files in generated[kind].items():
            args += ["--corpus", f"{name}={','.join(files)}:1.5"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        for key in ("utterances", "num_shards", "balanced", "max_deviation_seconds", "mean_shard_seconds", "seconds"):
            assert key in summary
        outs.append({k: v for k, v in summary.items() if k not in ("elapsed_seconds",)})
    assert outs[0] == outs[1]


# the plan of these mixes, byte for byte, as the planner before issue 25 computed it (plan version 1)
GOLDEN = [
    (dict(sizes=(3000, 2000, 1000), weights=(1, 1, 1), ws=4, nw=2, dur=600, rem="pad", seed=0),
     "4dfe8fbf3824d8f958182d421c808aafffaa13d2da2aa0da11a0ff6273d837d7", "042edcd2a08da5d7"),
    (dict(sizes=(5000, 700), weights=(0.5, 2.0), ws=2, nw=4, dur=300, rem="pad", seed=3),
     "8cdf44932a5fb7e80d704918c9e6a852c0ee656137969d04937d8a3ef903204b", "2f1a4847b83dbd61"),
    (dict(sizes=(2500, 2500, 900), weights=(1.5, 1, 1), ws=8, nw=1, dur=900, rem="drop", seed=7),
     "c4867462a8a3845c72aa83cdc44eb4edeed4bc1bda02ee9370b0423ffc4a79fd", "b22e7d3284d504f0"),
    (dict(sizes=(20000, 15000, 8000), weights=(1, 1, 1), ws=16, nw=4, dur=3600, rem="pad", seed=1),
     "289991819b3877634d8a71f93823416e1487979e59710b57e0e38ea0838606b3", "2414acdd61d3f4bd"),
]


@pytest.mark.parametrize("case,digest,seconds_digest", GOLDEN)
def test_the_compact_planner_plans_what_the_previous_one_planned(case, digest, seconds_digest):
    rng = np.random.default_rng(case["seed"])
    durations = [np.round(rng.gamma(8, m / 8, n), 3) for n, m in zip(case["sizes"], (3.6, 12.3, 5.0))]
    plan = plan_balance(durations, case["weights"], PlanSettings(world_size=case["ws"], num_workers=case["nw"],
                        shard_duration=case["dur"], remainder=case["rem"], seed=case["seed"], version=1))
    assert plan_digest(plan) == digest
    assert hashlib.sha256(np.ascontiguousarray(plan.seconds).tobytes()).hexdigest()[:16] == seconds_digest


def test_a_truncated_parquet_index_is_named(generated, tmp_path):
    src = generated["parquet"]["en"][0]
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(open(src, "rb").read()[:-100])
    result = CliRunner().invoke(main, ["balance", "--corpus", f"en={broken}", "--world-size", "1", "--num-workers",
                                       "1", "-o", str(tmp_path / "o"), "--dry-run", "-q"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {broken}: not a readable Parquet index: cut short (a copy that "
                                    "stopped early?) or damaged (")


def test_a_damaged_row_group_is_named_with_its_rows(tmp_path):
    records = index_records("zh", 3000, 5)
    path = str(tmp_path / "big.parquet")
    old = indexfile.ROW_GROUP_ROWS
    indexfile.ROW_GROUP_ROWS = 1000  # three row groups
    try:
        indexfile.write_index_file(path, [records])
    finally:
        indexfile.ROW_GROUP_ROWS = old
    pf = indexfile.open_parquet_index(path)
    assert pf.num_row_groups == 3
    column = pf.metadata.row_group(1).column(pf.schema_arrow.names.index("duration"))
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(open(path, "rb").read())
    data[start + 20:start + column.total_compressed_size - 4] = os.urandom(column.total_compressed_size - 24)
    open(path, "wb").write(bytes(data))
    with pytest.raises(ShardkitError, match=r"row group 1 \(rows 1000-1999\) cannot be read") as caught:
        _plan_index_files({"zh": [path]})
    assert path in str(caught.value)


def test_a_bad_duration_in_a_parquet_index_is_named_by_row(tmp_path):
    records = index_records("en", 40, 1)
    records[17]["duration"] = float("nan")
    path = indexfile.write_index_file(str(tmp_path / "nan.parquet"), [records])
    with pytest.raises(ShardkitError, match=r"row 17: duration must be a finite number >= 0 \(got nan\)"):
        _plan_index_files({"en": [path]})


@pytest.mark.parametrize("line,message", [
    ({"shard": "s.tar", "key": "k", "duration": "long", "members": []}, "field 'duration' must be a finite number"),
    ({"shard": "s.tar", "key": "k", "duration": 1.0, "members": [["k.wav", -1, 5]]}, "field 'members' must be a list"),
    ({"shard": 3, "key": "k", "duration": 1.0, "members": []}, "field 'shard' must be a non-empty string"),
    ({"shard": "s.tar", "key": "k", "duration": 1.0, "members": [], "sample_rate": "16k"},
     "field 'sample_rate' must be an integer >= 0"),
    ({"shard": "s.tar", "key": "k", "members": []}, "is not an index record (needs shard, key, duration, members)"),
])
def test_a_bad_jsonl_field_is_named_by_file_and_line_and_nothing_is_written(tmp_path, line, message):
    records = index_records("zh", 5, 0)
    src = tmp_path / "in.jsonl"
    with open(src, "wb") as f:
        f.write(b"".join(indexfile.dumps_line(r) for r in records[:2]) + json.dumps(line).encode() + b"\n")
    result = CliRunner().invoke(main, ["index", str(src), "-o", str(tmp_path / "out.parquet"), "-q"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {src}: line 3")
    assert message in result.output
    assert not os.path.exists(tmp_path / "out.parquet")


def test_numbers_as_other_tools_write_them_are_accepted(tmp_path):
    record = {"shard": "../absent/s.tar", "key": "k", "duration": "2.5", "members": [["k.wav", 512, 80044]],
              "sample_rate": 16000.0, "member": "k.wav", "text_len": 3}
    src = write_jsonl_index(tmp_path / "other.jsonl", [record])
    dst = to_parquet_index(src, tmp_path / "other.parquet")
    assert list(indexfile.iter_index(dst)) == [{"shard": "../absent/s.tar", "key": "k", "duration": 2.5,
                                                "members": [["k.wav", 512, 80044]], "sample_rate": 16000,
                                                "audio": "k.wav", "text_chars": 3}]


def test_key_hashes_find_duplicates_and_only_them():
    import pyarrow as pa

    keys = [f"spk{i % 7}/utt-{i:05d}" for i in range(5000)] + ["", "a", "é" * 11, "x" * 200]
    hashes = indexfile.key_hashes(pa.array(keys))
    assert len(set(hashes.tolist())) == len(keys)
    assert np.array_equal(hashes, indexfile.hash_strings(keys))
    again = indexfile.key_hashes(pa.chunked_array([pa.array(keys[:100]), pa.array(keys[100:])]))
    assert np.array_equal(again, hashes)
    assert indexfile.duplicate_hashes(np.concatenate([hashes, hashes[[5, 9]]])).tolist() == sorted(hashes[[5, 9]])
    # keys of one width take a faster path (a matrix, no gathers): the same hashes as among other widths
    for width in (1, 8, 9, 23, 24):
        fixed = [f"{i:0{width}d}"[-width:] + "" for i in range(300)]
        alone = indexfile.key_hashes(pa.array(fixed))
        assert np.array_equal(alone, indexfile.key_hashes(pa.array(fixed + ["mixed-width"]))[:-1])
        assert np.array_equal(alone, indexfile.hash_strings(fixed))


def test_key_hashes_of_one_width_read_in_place_equal_the_strings_hashes():
    import pyarrow as pa

    # widths around the 8-byte words, slices (a buffer that runs on past the keys) and the last keys, whose
    # final word would read past the data's end: each written into a caller's array, as load_columns does
    for width in (1, 3, 7, 8, 9, 15, 16, 17, 27):
        fixed = pa.array([f"{i:0{width}d}"[-width:] for i in range(257)] + ["tail" * width])
        for keys in (fixed[:257], fixed.slice(5, 200), fixed.slice(256, 1)):
            out = np.full(len(keys) + 2, 7, np.uint64)
            indexfile.key_hashes(keys, out[1:-1], np.zeros(len(keys) + 9, np.uint64))
            assert np.array_equal(out[1:-1], indexfile.hash_strings(keys.to_pylist())), width
            assert out[0] == 7 and out[-1] == 7  # nothing written outside the caller's span


def _impossible_index(tmp_path, unknown_rate: bool):
    """A Parquet index whose row 1234 claims its seconds at 16 kHz in 1 byte (more frames than bytes can hold),
    in its second row group; ``unknown_rate``: that row's sample rate is not known (null)."""
    records = index_records("zh", 3000, 2)
    records[1234]["bytes"] = 1
    if unknown_rate:
        del records[1234]["sample_rate"]
    old = indexfile.ROW_GROUP_ROWS
    indexfile.ROW_GROUP_ROWS = 1000
    try:
        return indexfile.write_index_file(str(tmp_path / "lie.parquet"), [records])
    finally:
        indexfile.ROW_GROUP_ROWS = old


def test_seconds_a_parquet_rows_bytes_cannot_hold_are_refused_naming_the_key(tmp_path):
    path = _impossible_index(tmp_path, unknown_rate=False)
    with pytest.raises(ShardkitError, match=r"utterance 'zh/S0024/U0001234' of shard rel/zh/shards_000000024.tar "
                                            r"in corpus 'zh': .* cannot be held in 1 bytes"):
        _plan_index_files({"zh": [path]})
    # an unknown sample rate (a null) decides nothing: the same row passes
    planned = _plan_index_files({"zh": [_impossible_index(tmp_path, unknown_rate=True)]})
    assert len(np.unique(planned.plan.utt)) == 3000  # row 1234 among them


def test_a_key_in_two_parquet_corpora_is_refused(tmp_path):
    a = indexfile.write_index_file(str(tmp_path / "a.parquet"), [index_records("zh", 30, 0)])
    clash = index_records("en", 30, 1)
    clash[12]["key"] = "zh/S0000/U0000004"
    b = indexfile.write_index_file(str(tmp_path / "b.parquet"), [clash])
    with pytest.raises(ShardkitError, match=r"key 'zh/S0000/U0000004' appears twice: in rel/zh/shards_000000000.tar "
                                            r"\(corpus 'a'\) and in rel/en/shards_000000000.tar \(corpus 'b'\)"):
        _plan_index_files({"a": [a], "b": [b]}, num_shards=8)


def test_the_unique_key_check_sorts_the_loads_hashes_in_place_and_still_names_a_clash(tmp_path, monkeypatch):
    from shardkit.commands.balance import columns, sources

    a = indexfile.write_index_file(str(tmp_path / "a.parquet"), [index_records("zh", 300, 0)])
    b = indexfile.write_index_file(str(tmp_path / "b.parquet"), [index_records("en", 200, 1)])
    mix = columns.load_columns(["a", "b"], [[a], [b]])
    pool, joined = mix.hash_pool, np.concatenate([c.key_hash for c in mix.corpora])
    assert len(pool) == 500 and np.array_equal(pool, joined)  # the corpora's hashes are the pool's slices
    monkeypatch.setattr(sources.np, "concatenate", lambda *a, **k: pytest.fail("a joined copy of the hashes"))
    sources.check_unique_keys(mix)
    assert np.array_equal(pool, np.sort(joined)) and mix.hash_pool is None
    monkeypatch.undo()
    clash = index_records("en", 200, 1)
    clash[150]["key"] = "zh/S0005/U0000299"
    b = indexfile.write_index_file(str(tmp_path / "b.parquet"), [clash])
    with pytest.raises(ShardkitError, match=r"key 'zh/S0005/U0000299' appears twice"):
        _plan_index_files({"a": [a], "b": [b]}, num_shards=8)


def test_without_pyarrow_jsonl_works_and_parquet_is_a_clear_usage_error(make_shards, tmp_path, monkeypatch):
    shards = make_shards("none")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UsageError, match=r"needs pyarrow: pip install 'shardkit\[parquet\]'"):
        indexfile.require_pyarrow()
    runner = CliRunner()
    result = runner.invoke(main, ["index", *shards, "-o", str(tmp_path / "i.parquet"), "-q", "-j", "1"])
    assert result.exit_code == 2 and "a Parquet index needs pyarrow: pip install 'shardkit[parquet]'" in result.output
    assert runner.invoke(main, ["index", *shards, "-o", str(tmp_path / "i.jsonl"), "-q", "-j", "1"]).exit_code == 0
    result = runner.invoke(main, ["balance", "--corpus", f"all={tmp_path / 'i.jsonl'}", "--world-size", "1",
                                  "--num-workers", "1", "--num-shards", "2", "-o", str(tmp_path / "o"), "--dry-run",
                                  "-q", "--json"])
    assert result.exit_code == 0, result.output


def test_convert_leaves_the_index_beside_data_list_and_balance_uses_it(make_shards, tmp_path):
    shards = make_shards("bz2")
    runner = CliRunner()
    out = tmp_path / "converted"
    result = runner.invoke(main, ["convert", *shards, "-o", str(out), "-j", "1", "-q", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index"] == str(out / "index.parquet")
    listed = open(out / "data.list").read().split()
    by_product = list(indexfile.iter_index(str(out / "index.parquet")))
    assert runner.invoke(main, ["index", *listed, "-o", str(tmp_path / "fresh.parquet"), "--corpus", "converted",
                                "-q", "-j", "1"]).exit_code == 0
    assert by_product == list(indexfile.iter_index(str(tmp_path / "fresh.parquet")))  # what `index` reads
    assert [r["key"] for r in by_product] == [key for key, *_ in corpus(SMALL_CORPORA)]
    # balance from the by-product index writes shards with the source bytes
    result = runner.invoke(main, ["balance", "--corpus", f"all={out / 'index.parquet'}", "--world-size", "2",
                                  "--num-workers", "1", "--num-shards", "2", "-o", str(tmp_path / "bal"), "-j", "1",
                                  "-q", "--json"])
    assert result.exit_code == 0, result.output
    truth = {key: (text.encode(), audio) for key, text, audio, _ in corpus(SMALL_CORPORA)}
    written = [s for shard in open(tmp_path / "bal" / "data.list").read().split()
               for s in group_samples(iter_shard_members(shard), shard=shard)]
    repeats = {new: old for old, new in balance.read_repeats(str(tmp_path / "bal"))}
    assert {repeats.get(s["__key__"], s["__key__"]) for s in written} == set(truth)
    for s in written:
        assert (s["txt"], s["wav"]) == truth[repeats.get(s["__key__"], s["__key__"])]


def test_make_leaves_the_index_beside_data_list(tmp_path):
    from shardkit.io.synth import encode, speech_like

    root = tmp_path / "d"
    (root / "wav").mkdir(parents=True)
    with open(root / "wav.scp", "w") as scp, open(root / "text", "w") as text:
        for i in range(9):
            key = f"spk{i % 3}-utt{i:03d}"
            path = root / "wav" / f"{key}.wav"
            path.write_bytes(encode(speech_like(0.5 + 0.1 * i, 16000, seed=i), 16000, "wav"))
            scp.write(f"{key} {path}\n")
            text.write(f"{key} HELLO {i}\n")
    out = tmp_path / "made"
    result = CliRunner().invoke(main, ["make", "--wav-scp", str(root / "wav.scp"), "--text", str(root / "text"),
                                       "--utts-per-shard", "4", "-o", str(out), "-j", "1", "-q", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index"] == str(out / "index.parquet")
    listed = open(out / "data.list").read().split()
    assert CliRunner().invoke(main, ["index", *listed, "-o", str(tmp_path / "fresh.parquet"), "--corpus", "made",
                                     "-q", "-j", "1"]).exit_code == 0
    by_product = list(indexfile.iter_index(str(out / "index.parquet")))
    assert len(by_product) == 9 and by_product == list(indexfile.iter_index(str(tmp_path / "fresh.parquet")))


def test_a_repeat_named_like_a_real_key_is_refused_from_parquet(tmp_path):
    records = index_records("zh", 20, 0)
    records[7]["key"] = records[3]["key"] + "-rep1"
    path = indexfile.write_index_file(str(tmp_path / "r.parquet"), [records])
    with pytest.raises(ShardkitError, match=f"repeat of '{records[3]['key']}' would be named "
                                            f"'{records[3]['key']}-rep1', which is already a key in the mix"):
        _plan_index_files({"zh": [path]}, 2.0, num_shards=8, world_size=1, num_workers=1, shard_duration=None)


@pytest.mark.parametrize("case,digest,seconds_digest", GOLDEN[:3])
def test_draws_started_ahead_and_any_thread_count_plan_the_same_bytes(case, digest, seconds_digest):
    """balance starts the planner's seeded permutations while the index is read (Draws) and plans in
    threads: a permutation is a function of its seed, purpose, corpus and length, so the plan is the same."""
    from concurrent.futures import ThreadPoolExecutor

    from shardkit.planning.balance.draws import Draws

    rng = np.random.default_rng(case["seed"])
    durations = [np.round(rng.gamma(8, m / 8, n), 3) for n, m in zip(case["sizes"], (3.6, 12.3, 5.0))]
    for threads in (1, 3):
        with ThreadPoolExecutor(1) as ahead:
            draws = Draws(ahead)
            for c, (d, w) in enumerate(zip(durations, case["weights"])):
                draws.prefetch(len(d), w, case["seed"], c, case["rem"])
                draws.prefetch(len(d) + 1, w, case["seed"], c, case["rem"])  # a draw never taken: no harm
            plan = plan_balance(durations, case["weights"], PlanSettings(
                world_size=case["ws"], num_workers=case["nw"], shard_duration=case["dur"], remainder=case["rem"],
                seed=case["seed"], version=1), threads=threads, draws=draws)
        assert plan_digest(plan) == digest
        assert hashlib.sha256(np.ascontiguousarray(plan.seconds).tobytes()).hexdigest()[:16] == seconds_digest


def test_repeats_are_read_a_chunk_at_a_time_in_index_order(generated, tmp_path, monkeypatch):
    """balance never holds every repeat: the report counts them, and the file is written from chunks, corpus
    by corpus in index order (each row group of the index read once); a mix with no key that looks like a
    repeat's name is checked without reading a key; a clash in a later chunk is still refused."""
    from shardkit.commands.balance import sources

    planned = _plan_index_files(generated["parquet"], 2.0)
    whole = balance.repeated_keys(planned.plan, planned.mix)
    plan = planned.plan
    assert len(planned.repeats) == len(whole) == int((plan.copy > 0).sum()) > 3000
    monkeypatch.setattr(sources, "REPEATS_CHUNK", 100)
    chunks = list(sources.iter_repeated_keys(plan, planned.mix))
    assert max(len(c) for c in chunks) == 100 and len(chunks) >= len(whole) // 100
    assert [pair for chunk in chunks for pair in chunk] == whole == list(planned.repeats)
    expected = []
    for c, corpus in enumerate(planned.mix.corpora):  # (corpus, utterance, copy) in order, keys from the index
        mine = (plan.corpus == c) & (plan.copy > 0)
        for u, k in sorted(zip(plan.utt[mine].tolist(), plan.copy[mine].tolist())):
            key = balance.take_keys(corpus, np.array([u]))[0]
            expected.append([key, balance.repeat_key(key, k)])
    assert whole == expected

    def no_reads(*_):
        raise AssertionError("a key was read")
    assert planned.mix.repeat_like == set()
    monkeypatch.setattr(sources, "take_keys", no_reads)
    planned.repeats.check()
    monkeypatch.undo()

    records = index_records("zh", 600, 0)
    records[590]["key"] = records[5]["key"] + "-rep1"  # read in a late chunk
    path = indexfile.write_index_file(str(tmp_path / "r.parquet"), [records])
    monkeypatch.setattr(sources, "REPEATS_CHUNK", 100)
    with pytest.raises(ShardkitError, match=f"'{records[5]['key']}-rep1', which is already a key in the mix"):
        _plan_index_files({"zh": [path]}, 2.0, num_shards=8, world_size=1, num_workers=1, shard_duration=None)


def test_a_dry_run_reads_no_repeated_key_when_no_clash_is_possible(generated, monkeypatch):
    """A dry run only counts the repeats: with no real key that looks like a repeat's name, planning reads
    no key back (neither ahead, while the planner deals, nor to check); a writing run reads them ahead."""
    from shardkit.commands.balance import sources

    reads = []
    real = sources.take_keys
    for module in (balance, sources):
        monkeypatch.setattr(module, "take_keys", lambda corpus, utts: reads.append(len(utts)) or real(corpus, utts))
    planned = _plan_index_files(generated["parquet"], 2.0, writing=False)
    assert len(planned.repeats) > 3000 and planned.mix.repeat_like == set() and reads == []
    _plan_index_files(generated["parquet"], 1.0, writing=True)  # padding only: few repeats, read while planning
    assert reads


def test_the_members_column_built_from_flat_lists_equals_one_dict_per_member():
    pa = pytest.importorskip("pyarrow")
    from shardkit.io.indexparquet import record_of_row, records_to_batch, schema

    records = [{"shard": "a.tar", "key": "spk/u1", "members": [["spk/u1.wav", 512, 32044], ["spk/u1.txt", 33280, 9]]},
               {"shard": "a.tar", "key": "spk/u2", "members": []},
               {"shard": "b.tar", "key": "u3", "members": [["other/u3.flac", 1024, 7], ["u3.txt", 2560, 3]]}]
    batch = records_to_batch(records)
    by_dicts = pa.array([[{"name": n, "offset": o, "size": s} for n, o, s in members] for members in
                         ([[".wav", 512, 32044], [".txt", 33280, 9]], [], [["\0other/u3.flac", 1024, 7], [".txt", 2560, 3]])],
                        schema().field("members").type)
    assert batch.column("members").equals(by_dicts)
    assert [record_of_row(row)["members"] for row in batch.to_pylist()] == [r["members"] for r in records]
