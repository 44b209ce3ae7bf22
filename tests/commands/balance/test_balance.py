import json
import os
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from shardkit.commands import balance
from shardkit.cli import main
from shardkit.commands.balance import PlanSettings, plan_balance
from shardkit.errors import UsageError
from shardkit.io.audio import probe
from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards
from shardkit.io.tar import group_samples, iter_shard_members

# --- the pure planner: invariants over a grid ---------------------------------------------------


def _durations(seed, sizes=(300, 80, 40)):
    rng = np.random.default_rng(seed)
    return [rng.uniform(2.0, 6.0, sizes[0]), rng.uniform(8.0, 20.0, sizes[1]), rng.uniform(1.0, 15.0, sizes[2])]


def _check_invariants(plan, durations, weights):
    groups = plan.world_size * plan.num_workers
    assert plan.num_shards % groups == 0 and plan.num_shards >= groups
    assert len(plan.utt) == plan.num_shards * plan.utts_per_shard
    secs = plan.shard_seconds
    median = float(np.median(plan.seconds))
    assert np.abs(secs - secs.mean()).max() <= max(0.005 * secs.mean(), median) + 1e-9
    counts = plan.shard_corpus_counts
    totals = counts.sum(axis=0)
    assert (counts >= totals // plan.num_shards).all() and (counts <= -(-totals // plan.num_shards)).all()
    # positions describe real utterances, and no (utterance, copy) twice: output keys stay unique
    for c, d in enumerate(durations):
        mine = plan.corpus == c
        assert np.array_equal(plan.seconds[mine], d[plan.utt[mine]])
    assert len(set(zip(plan.corpus.tolist(), plan.utt.tolist(), plan.copy.tolist()))) == len(plan.utt)
    for c, stats in enumerate(plan.corpora):
        assert stats["copies_out"] == int(totals[c])
        assert stats["kept"] + stats["dropped"] == len(durations[c])
        assert stats["kept"] + stats["repeated"] + stats["padded"] - stats["remainder_dropped"] == stats["copies_out"]


@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (2, 1), (2, 2), (3, 2), (8, 1)])
@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("weights", [(1, 1, 1), (0.5, 2, 1.5)])
@pytest.mark.parametrize("shard_duration", [60.0, 250.0])
def test_plan_invariants_hold_over_a_grid(world_size, num_workers, remainder, weights, shard_duration):
    durations = _durations(world_size * 10 + num_workers)
    plan = plan_balance(durations, weights, PlanSettings(world_size=world_size, num_workers=num_workers,
                                                         shard_duration=shard_duration, remainder=remainder, seed=5))
    _check_invariants(plan, durations, weights)
    total = sum(round(w * len(d)) for w, d in zip(weights, durations))
    if remainder == "pad":
        assert total <= len(plan.utt) < total + plan.num_shards
    else:
        assert total - plan.num_shards < len(plan.utt) <= total


@pytest.mark.parametrize("sizes", [(7, 3, 2), (1, 1, 30), (500, 5, 5)])
def test_plan_invariants_hold_for_lopsided_mixes(sizes):
    durations = _durations(1, sizes)
    plan = plan_balance(durations, [1, 1, 1], PlanSettings(world_size=2, num_workers=1, num_shards=4))
    _check_invariants(plan, durations, [1, 1, 1])


def test_weights_repeat_and_subsample_exactly():
    durations = _durations(2)
    plan = plan_balance(durations, [2.0, 0.5, 1.0], PlanSettings(world_size=1, num_workers=1, num_shards=1,
                                                                 remainder="drop"))
    a, b, c = plan.corpora
    assert (a["kept"], a["repeated"], a["dropped"]) == (300, 300, 0)
    assert (b["kept"], b["repeated"], b["dropped"]) == (40, 0, 40)
    assert (c["kept"], c["repeated"], c["dropped"]) == (40, 0, 0)
    assert Counter(Counter(plan.utt[plan.corpus == 0].tolist()).values()) == {2: 300}
    assert sorted(plan.copy[plan.corpus == 0].tolist()) == [0] * 300 + [1] * 300


def test_num_shards_is_rounded_to_a_multiple_with_a_note():
    plan = plan_balance(_durations(3), [1, 1, 1], PlanSettings(world_size=4, num_workers=1, num_shards=10))
    assert plan.num_shards == 12
    assert plan.notes == ["--num-shards 10 rounded to 12, the nearest multiple of world_size x num_workers = 4"]


def test_plan_is_deterministic_for_a_seed():
    args = dict(world_size=2, num_workers=2, shard_duration=100.0)
    first = plan_balance(_durations(4), [1, 1.5, 1], PlanSettings(seed=9, **args))
    again = plan_balance(_durations(4), [1, 1.5, 1], PlanSettings(seed=9, **args))
    other = plan_balance(_durations(4), [1, 1.5, 1], PlanSettings(seed=10, **args))
    for name in ("corpus", "utt", "copy", "seconds"):
        assert np.array_equal(getattr(first, name), getattr(again, name))
    assert not np.array_equal(first.utt, other.utt)


@pytest.mark.parametrize("kwargs,message", [
    (dict(names=["a", "a", "b"]), "corpus 'a' is given twice"),
    (dict(durations=[[], [1.0], [2.0]]), "corpus 'corpus0' is empty (no utterances)"),
    (dict(weights=[1, 0, 1]), "corpus 'corpus1': weight must be a number > 0 (got 0.0)"),
    (dict(weights=[1, -2, 1]), "corpus 'corpus1': weight must be a number > 0 (got -2.0)"),
    (dict(world_size=0), "--world-size and --num-workers must be >= 1 (got 0 and 1)"),
    (dict(num_workers=0), "--world-size and --num-workers must be >= 1 (got 1 and 0)"),
    (dict(num_shards=500), "--num-shards 500 asks for more shards than there are utterances (420 after weights)"),
    (dict(shard_duration=10.0), "--shard-duration 10 s is shorter than the longest utterance (19.964 s, in corpus "
                                "'corpus1')"),
])
def test_bad_input_is_a_clear_usage_error(kwargs, message):
    args = dict(durations=_durations(0), weights=[1, 1, 1], world_size=1, num_workers=1, shard_duration=600.0)
    args.update(kwargs)
    if "num_shards" in kwargs:
        del args["shard_duration"]
    durations, weights, names = args.pop("durations"), args.pop("weights"), args.pop("names", None)
    with pytest.raises(UsageError) as err:
        plan_balance(durations, weights, PlanSettings(**args), names=names)
    assert str(err.value) == message


# --- end to end on real audio: three corpora (plain, zst, bz2 shards) ------------------------------

SPECS = (CorpusSpec("aishell", 40, 0.3, 0.9, "zh"), CorpusSpec("librispeech", 16, 1.5, 3.0, "en"),
         CorpusSpec("accented", 12, 0.3, 2.5, "mix"))
CODECS = ("none", "zst", "bz2")


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """The three corpora as shards, plus everything known about each utterance for checking."""
    root = tmp_path_factory.mktemp("mix")
    truth = {}
    for spec, codec in zip(SPECS, CODECS):
        utts = list(corpus_utterances(spec, seed=1))
        write_shards(utts, str(root / spec.name), utts_per_shard=7, codec=codec)
        for key, text, audio, seconds in utts:
            truth[key] = {"corpus": spec.name, "txt": text.encode(), "wav": audio, "seconds": seconds}
    # the same mix cut the naive way: fixed utterances per shard, corpus after corpus
    naive = write_shards([u for spec in SPECS for u in corpus_utterances(spec, seed=1)], str(root / "naive"),
                         utts_per_shard=8)
    return {"root": root, "truth": truth, "naive": naive}


def _corpus_args(root, weights=("1", "1", "1")):
    args = []
    for spec, weight in zip(SPECS, weights):
        args += ["--corpus", f"{spec.name}={root / spec.name}:{weight}"]
    return args


def _balance_json(mix, out, *extra, weights=("1", "1", "1")):
    result = CliRunner().invoke(main, ["balance", *_corpus_args(mix["root"], weights), "-o", str(out), "-j", "1",
                                       "-q", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _read_output(out):
    shards = open(out / "data.list").read().split()
    return shards, [list(group_samples(iter_shard_members(s), shard=s)) for s in shards]


@pytest.mark.parametrize("world_size,num_workers,weights", [(1, 1, ("1", "1", "1")), (2, 1, ("1", "0.5", "2")),
                                                            (2, 2, ("1", "1", "1.5")), (3, 1, ("2", "1", "1"))])
def test_balanced_shards_hold_equal_work_and_the_source_bytes(mix, tmp_path, world_size, num_workers, weights):
    report = _balance_json(mix, tmp_path / "out", "--world-size", str(world_size), "--num-workers", str(num_workers),
                      "--shard-duration", "6", weights=weights)
    shards, samples = _read_output(tmp_path / "out")
    assert len(shards) == report["num_shards"] and len(shards) % (world_size * num_workers) == 0
    assert {len(s) for s in samples} == {report["utterances_per_shard"]}
    truth = mix["truth"]
    keys = [s["__key__"] for shard in samples for s in shard]
    assert len(set(keys)) == len(keys)
    repeats = {new: old for old, new in balance.read_repeats(str(tmp_path / "out"))}
    seconds = []
    for shard in samples:
        seconds.append(sum(probe(s["wav"])["duration"] for s in shard))
        for sample in shard:
            original = repeats.get(sample["__key__"], sample["__key__"])
            assert sample["__members__"] == [sample["__key__"] + ".txt", sample["__key__"] + ".wav"]
            assert (sample["txt"], sample["wav"]) == (truth[original]["txt"], truth[original]["wav"])
    seconds = np.array(seconds)
    median = np.median([probe(s["wav"])["duration"] for shard in samples for s in shard])
    assert np.abs(seconds - seconds.mean()).max() <= max(0.005 * seconds.mean(), median)
    # corpus shares per shard: the whole mix's, within one utterance
    per_shard = [Counter(truth[repeats.get(s["__key__"], s["__key__"])]["corpus"] for s in shard) for shard in samples]
    for spec in SPECS:
        share = sum(c[spec.name] for c in per_shard) / len(per_shard)
        assert all(abs(c[spec.name] - share) < 1 for c in per_shard)
    # the report says what was kept, repeated, padded; and what WeNet's split will give
    manifest = json.load(open(tmp_path / "out" / "balance.json"))
    assert [s["seconds"] for s in manifest["shards"]] == pytest.approx(seconds.tolist(), abs=1e-3)
    assert all(sum(s["corpora"].values()) == report["utterances_per_shard"] for s in manifest["shards"])
    assert manifest["plan"]["divides"] and manifest["repeat_key_format"] == "{key}-rep{copy}"
    out_copies = sum(c["copies_out"] for c in report["corpora"])
    assert out_copies == len(keys)
    assert len(repeats) == sum(c["repeated"] + c["padded"] for c in report["corpora"])


def test_plan_shows_equal_ranks_on_balanced_shards_and_imbalance_on_naive_ones(mix, tmp_path):
    _balance_json(mix, tmp_path / "out", "--world-size", "2", "--num-workers", "2", "--shard-duration", "6")
    runner = CliRunner()
    balanced = runner.invoke(main, ["plan", str(tmp_path / "out" / "data.list"), "--world-size", "2",
                                    "--num-workers", "2", "--epochs", "4", "--json", "-q", "-j", "1"])
    naive = runner.invoke(main, ["plan", *mix["naive"], "--world-size", "2", "--num-workers", "2", "--epochs", "4",
                                 "--json", "-q", "-j", "1"])
    assert balanced.exit_code == 0 and naive.exit_code == 0, balanced.output + naive.output
    balanced, naive = json.loads(balanced.stdout), json.loads(naive.stdout)
    assert balanced["divides"] and not naive["divides"]
    for epoch in balanced["epochs"]:
        assert len({r["utterances"] for r in epoch["ranks"]}) == 1
        assert epoch["rank_spread"] < 1.02
    assert naive["worst_rank_spread"] > 1.25


def test_same_seed_same_bytes_other_seed_other_shards(mix, tmp_path):
    args = ("--world-size", "2", "--num-workers", "1", "--shard-duration", "8")
    first = _balance_json(mix, tmp_path / "a", *args)
    again = _balance_json(mix, tmp_path / "b", *args, "-j", "2")
    other = _balance_json(mix, tmp_path / "c", *args, "--seed", "1")
    assert first["num_shards"] == again["num_shards"] == other["num_shards"]
    for name in sorted(os.listdir(tmp_path / "a")):
        if name.startswith("shards_"):
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "shards_000000000.tar").read_bytes() != \
        (tmp_path / "c" / "shards_000000000.tar").read_bytes()


def test_dry_run_writes_no_shard_and_rerun_skips_finished_shards(mix, tmp_path):
    args = ("--world-size", "2", "--num-workers", "1", "--num-shards", "4", "--codec", "none")
    dry = _balance_json(mix, tmp_path / "out", *args, "--dry-run")
    assert dry["dry_run"] and dry["num_shards"] == 4 and not (tmp_path / "out").exists()
    first = _balance_json(mix, tmp_path / "out", *args)
    assert first["written"] == {"ok": 4, "skipped": 0, "failed": 0}
    assert dry["plan"] == first["plan"]
    again = _balance_json(mix, tmp_path / "out", *args)
    assert again["written"] == {"ok": 0, "skipped": 4, "failed": 0}
    assert sorted(os.listdir(tmp_path / "out")) == ["balance.json", "balance.repeats.jsonl", "data.list"] + \
        [f"shards_00000000{i}.tar" for i in range(4)]


def test_an_index_is_a_source_and_a_changed_shard_is_caught(mix, tmp_path):
    source = tmp_path / "src"
    utts = list(corpus_utterances(SPECS[0], seed=1))
    shards = write_shards(utts, str(source), utts_per_shard=10)
    runner = CliRunner()
    assert runner.invoke(main, ["index", *shards, "-o", str(tmp_path / "a.jsonl"), "-q", "-j", "1"]).exit_code == 0
    args = ["balance", "--corpus", f"a={tmp_path / 'a.jsonl'}", "--corpus", f"l={mix['root'] / 'librispeech'}",
            "--world-size", "2", "--num-workers", "1", "--num-shards", "2", "-q", "-j", "1"]
    assert runner.invoke(main, [*args, "-o", str(tmp_path / "ok")]).exit_code == 0
    write_shards(utts[::-1], str(source), utts_per_shard=10)  # same names, other contents
    result = runner.invoke(main, [*args, "-o", str(tmp_path / "changed")])
    assert result.exit_code == 1
    # refused before any shard is written: the index's stamp of the shard no longer matches it
    assert result.output.startswith(f"Error: {shards[0]}: changed since it was indexed into {tmp_path / 'a.jsonl'}: ")
    assert not (tmp_path / "changed" / "data.list").exists()


@pytest.mark.parametrize("corpora,extra,message", [
    (["a={aishell}", "a={librispeech}"], [], "corpus 'a' is given twice"),
    (["a={aishell}", "e={empty}"], [], "corpus 'e' is empty (no utterances in its sources)"),
    (["a={aishell}:0"], [], "corpus 'a': weight must be a number > 0 (got 0)"),
    (["a={aishell}:-1"], [], "corpus 'a': weight must be a number > 0 (got -1)"),
    (["a={aishell}"], ["--world-size", "0"], "--world-size and --num-workers must be >= 1 (got 0 and 1)"),
    (["a={aishell}"], ["--num-shards", "41"], "--num-shards 41 asks for more shards than there are utterances "
                                              "(40 after weights)"),
    (["a={aishell}", "l={librispeech}"], ["--shard-duration", "1"],
     "--shard-duration 1 s is shorter than the longest utterance (2.951 s, in corpus 'l')"),
    (["a={aishell}", "b={aishell}"], [], "{aishell_shard} is given to corpus 'a' and to corpus 'b'"),
    (["a={aishell}"], ["--num-shards", "2", "--shard-duration", "5"], "give --shard-duration or --num-shards, not both"),
    (["a"], [], "--corpus 'a': expected NAME=SOURCES[:WEIGHT]"),
])
def test_bad_input_exits_2_before_writing(mix, tmp_path, corpora, extra, message):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    names = {"aishell": mix["root"] / "aishell", "librispeech": mix["root"] / "librispeech",
             "empty": tmp_path / "empty.jsonl", "aishell_shard": mix["root"] / "aishell" / "shards_000000000.tar"}
    args = ["balance"]
    for c in corpora:
        args += ["--corpus", c.format(**names)]
    if "--world-size" not in extra:
        extra = [*extra, "--world-size", "1"]
    result = CliRunner().invoke(main, [*args, "--num-workers", "1", "-o", str(tmp_path / "out"), "-q", "-j", "1",
                                       *extra])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == f"Error: {message.format(**names)}"
    shards = [n for n in os.listdir(tmp_path / "out") if n.startswith("shards_")] if (tmp_path / "out").exists() else []
    assert shards == []


def test_a_key_in_two_corpora_is_refused(mix, tmp_path):
    utts = list(corpus_utterances(SPECS[0], seed=1))[:10]
    first = write_shards(utts, str(tmp_path / "one"), utts_per_shard=10)[0]
    second = write_shards(utts, str(tmp_path / "two"), utts_per_shard=10)[0]
    result = CliRunner().invoke(main, ["balance", "--corpus", f"a={first}", "--corpus", f"b={second}", "--world-size",
                                       "1", "--num-workers", "1", "-o", str(tmp_path / "out"), "-q", "-j", "1"])
    assert result.exit_code == 1
    assert result.output.splitlines()[-2] == (
        f"Error: key 'aishell/S0000-U000000' appears twice: in {first} (corpus 'a') and in {second} (corpus 'b'); "
        f"keys must be unique across the mix")
    # the last line: what was written (nothing: no folder is left) and the command to rerun
    assert result.output.splitlines()[-1].startswith("balance: stopped before writing; written: nothing")
    assert not (tmp_path / "out").exists()


def test_out_dir_holding_the_sources_is_refused(tmp_path):
    shards = write_shards(list(corpus_utterances(SPECS[0], seed=1))[:6], str(tmp_path), utts_per_shard=3)
    before = {p: open(p, "rb").read() for p in shards}
    result = CliRunner().invoke(main, ["balance", "--corpus", f"a={tmp_path}", "--world-size", "1", "--num-workers",
                                       "1", "--num-shards", "2", "--codec", "none", "-o", str(tmp_path), "-q"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (f"Error: {tmp_path}: OUT_DIR holds input {shards[0]} (both are "
                                              f"{os.path.realpath(tmp_path)} by real path), so outputs could "
                                              f"overwrite inputs; choose another folder")
    assert {p: open(p, "rb").read() for p in shards} == before


def test_parts_written_apart_hold_every_utterance_once_each_part_balanced(mix, tmp_path):
    """--part I/P: P runs over the same sources, each into its own OUT_DIR, each planning 1/P of every corpus:
    every source utterance is written once as itself (in the part that holds its row), each part balanced."""
    originals = []
    for i in (1, 2):
        out = tmp_path / f"part-{i}"
        report = _balance_json(mix, out, "--world-size", "2", "--num-workers", "1", "--shard-duration", "6",
                          "--part", f"{i}/2")
        assert report["part"] == {"index": i, "count": 2} and report["balanced"]
        assert json.load(open(out / "balance.json"))["settings"]["part"] == {"index": i, "count": 2}
        shards, samples = _read_output(out)
        assert {len(s) for s in samples} == {report["utterances_per_shard"]} and len(shards) % 2 == 0
        repeats = dict((new, old) for old, new in balance.read_repeats(str(out)))
        for sample in (s for shard in samples for s in shard):
            original = repeats.get(sample["__key__"], sample["__key__"])
            assert (sample["txt"], sample["wav"]) == (mix["truth"][original]["txt"], mix["truth"][original]["wav"])
            if sample["__key__"] not in repeats:
                originals.append(sample["__key__"])
    assert sorted(originals) == sorted(mix["truth"])  # each utterance once, in one part
