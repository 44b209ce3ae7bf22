"""balance as a pipeline of named steps over layered modules: plan (pure), sources (read), write, report."""

import ast
import os

import numpy as np
import pytest

import shardkit.commands.balance as balance
import shardkit.io.mix as mix_module
import shardkit.planning.balance as plan_module
from shardkit.commands.balance import columns as columns_module
from shardkit.commands.balance import report as report_module
from shardkit.commands.balance import sources as sources_module
from shardkit.commands.balance import write as write_module
from shardkit.commands.balance.columns import CorpusColumns, MixColumns
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.mix import CorpusSource
from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards
from shardkit.run.options import RunOptions

PACKAGE = os.path.dirname(balance.__file__)
PLANNING = os.path.dirname(os.path.dirname(plan_module.__file__))
# the pure planners: balance's (a package) and prep's streaming one
PLANNERS = [os.path.join(PLANNING, "balance", name) for name in ("__init__.py", "draws.py", "deal.py", "swaps.py")] + \
    [os.path.join(PLANNING, "prep.py")]


def _mix(sizes=(6, 4)):
    """Columns of a small two-corpus mix, without files: what the pure steps take."""
    rng = np.random.default_rng(0)
    corpora, shards = [], []
    for c, n in enumerate(sizes):
        shards.append(f"/src/{c}.tar")
        corpora.append(CorpusColumns(rng.uniform(1.0, 3.0, n), [f"c{c}-u{i}" for i in range(n)],
                                     np.full(n, c, np.int64), np.full(n, c, np.int64),
                                     np.arange(n, dtype=np.int64) * 100))
    index_files = [f"/idx/{c}.jsonl" for c in range(len(sizes))]
    return MixColumns([f"c{c}" for c in range(len(sizes))], corpora, shards, index_files)


def _plan_mix(mix, **args):
    corpora = [CorpusSource(name, (f"/src/{name}",)) for name in mix.names]
    args = {"world_size": 2, "num_workers": 1, "shard_duration": None, "num_shards": 4, "remainder": "pad", "seed": 0,
            "epochs": 1, **args}
    return balance._plan(corpora, mix, [[f] for f in mix.index_files], balance.BalanceSettings(**args))


def test_the_planner_module_does_no_io():
    """The planners (planning/balance/, planning/prep.py) import nothing that reads or writes: a plan is a
    function of its arguments."""
    for path in PLANNERS:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = {alias.name.split(".")[0] if isinstance(node, ast.Import) else node.module
                    for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names}
        # threads are no I/O: the per-corpus steps run in a thread pool (the plan is the same for any count);
        # shardkit.planning.radix is checked below in the same way (numpy only)
        assert imported <= {"__future__", "hashlib", "math", "dataclasses", "typing", "numpy", "shardkit.errors",
                            "concurrent.futures", "shardkit.planning.radix", "bisect", "heapq",
                            "shardkit.planning.balance", "shardkit.planning.balance.draws",
                            "shardkit.planning.balance.deal", "shardkit.planning.balance.swaps"}, path
        assert "open" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}, path
    with open(os.path.join(PLANNING, "radix.py"), encoding="utf-8") as f:
        radix = ast.parse(f.read())
    assert {node.module if isinstance(node, ast.ImportFrom) else alias.name for node in ast.walk(radix)
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names} <= {"__future__", "numpy"}
    assert "open" not in {n.id for n in ast.walk(radix) if isinstance(n, ast.Name)}


def test_every_name_of_the_layers_is_importable_from_the_package():
    for module in (plan_module, mix_module, columns_module, sources_module, write_module, report_module):
        for name in dir(module):
            value = getattr(module, name)
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__:
                assert getattr(balance, name) is value, name
    for name in balance.__all__:
        assert hasattr(balance, name), name
    assert (balance.WORK_DIR, balance.MANIFEST, balance.JOURNAL) == (".balance", "balance.json",
                                                                       ".balance.journal.jsonl")


def test_every_function_of_the_package_stays_simple():
    radon = pytest.importorskip("radon.complexity")
    for name in sorted(os.listdir(PACKAGE)) + PLANNERS:
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
                blocks = radon.cc_visit(f.read())
            worst = max(blocks, key=lambda b: b.complexity)
            assert worst.complexity <= 30, (name, worst.name, worst.complexity)


def test_the_plan_step_is_pure_and_repeatable():
    mix = _mix()
    first, again = _plan_mix(mix), _plan_mix(mix)
    assert np.array_equal(first.plan.utt, again.plan.utt) and first.figures == again.figures
    assert first.sources == {"c0": {"sources": ["/src/c0"], "index_files": ["/idx/0.jsonl"]},
                             "c1": {"sources": ["/src/c1"], "index_files": ["/idx/1.jsonl"]}}
    assert first.plan.num_shards == 4 and list(first.repeats) == balance.repeated_keys(first.plan, mix)


def test_the_layout_names_a_slice_block_and_its_own_reports():
    planned = _plan_mix(_mix())
    paths = [f"/out/shards_{s:09d}.tar" for s in range(4)]
    whole = balance._layout("/out", "/out/.balance", paths, planned.plan, None)
    assert (whole.chosen, whole.slice_info, whole.spool_dir) == (range(4), None, "/out/.balance/spool")
    assert (whole.manifest_path, whole.data_list, whole.journal_path, whole.reports) == (
        "/out/balance.json", "/out/data.list", "/out/.balance.journal.jsonl", ["/out/balance.json"])
    part = balance._layout("/out", "/out/.balance", paths, planned.plan, (2, 2))
    assert part.chosen == range(2, 4) and part.slice_info["index"] == 2
    assert part.spool_dir == "/out/.balance/spool.slice-2-of-2"
    assert part.reports == ["/out/balance.slice-2-of-2.json", "/out/balance.json"]
    assert part.data_list == "/out/data.slice-2-of-2.list"
    # the slice digest covers the plan: another seed, another digest
    other = balance._layout("/out", "/out/.balance", paths, _plan_mix(_mix(), seed=1).plan, (2, 2))
    assert other.slice_info["inputs_sha256"] != part.slice_info["inputs_sha256"]


def test_write_tasks_carry_index_positions_in_planned_order():
    mix = _mix()
    planned = _plan_mix(mix)
    layout = balance._layout("/out", "/out/.balance", [f"/out/{s}" for s in range(4)], planned.plan, (1, 2))
    previous = {"/out/1": {"path": "/out/1", "status": "ok"}}
    tasks = balance._write_tasks(planned, layout, balance.WriteSettings(), previous)
    assert [t[0] for t in tasks] == ["/out/0", "/out/1"] and [t[3] for t in tasks] == [None, previous["/out/1"]]
    plan = planned.plan
    for s, (_, refs, _, _) in enumerate(tasks):
        part = plan.shard_slice(s)
        assert refs == [(int(c), int(u) * 100, int(k)) for c, u, k in zip(plan.corpus[part], plan.utt[part],
                                                                          plan.copy[part])]
    used = balance._used_sources(planned, layout.chosen)
    assert used == sorted({int(c) for c in plan.corpus[:2 * plan.utts_per_shard]})
    assert balance._used_sources(planned, range(0)) == []


def test_run_arguments_are_refused_before_anything_is_claimed(tmp_path):
    corpora = [CorpusSource("a", (str(tmp_path),))]
    with pytest.raises(UsageError, match="--split writes a slice"):
        balance.run_balance(corpora, str(tmp_path / "out"), balance.BalanceSettings(world_size=1, num_workers=1,
                                                                                    dry_run=True), RunOptions(split=(1, 2)))
    with pytest.raises(UsageError, match="--remainder must be one of pad, drop"):
        balance.run_balance(corpora, str(tmp_path / "out"), balance.BalanceSettings(world_size=1, num_workers=1,
                                                                                    remainder="keep"))
    assert not (tmp_path / "out").exists()


def test_an_unbalanced_plan_is_refused_before_writing():
    planned = _plan_mix(_mix())
    planned.plan.tolerance = -1.0
    with pytest.raises(ShardkitError, match="cannot balance within tolerance"):
        balance._check_balanced(planned.plan)


def test_run_balance_calls_its_steps_through_the_package(tmp_path, monkeypatch):
    """The pipeline looks up what it calls in ``shardkit.commands.balance``: patching a name there
    changes what run_balance does, as it did when the package was one module."""
    utts = list(corpus_utterances(CorpusSpec("a", 6, 0.3, 0.9, "en"), seed=1))
    write_shards(utts, str(tmp_path / "a"), utts_per_shard=3)
    calls = []
    real = balance.plan_balance

    def planning(*args, **kwargs):
        calls.append(args[2].world_size)
        return real(*args, **kwargs)

    monkeypatch.setattr(balance, "plan_balance", planning)
    report = balance.run_balance([CorpusSource("a", (str(tmp_path / "a"),))], str(tmp_path / "out"),
                                 balance.BalanceSettings(world_size=1, num_workers=1, num_shards=2, dry_run=True),
                                 RunOptions(jobs=1))
    assert calls == [1] and report.dry_run and report.exit_code == 0
    assert [row["utterances"] for row in report.shards] == [3, 3]


def test_a_dry_runs_shard_rows_are_built_only_when_read_and_are_the_plans(tmp_path, monkeypatch):
    """A dry run's summary needs no shard table (it is 36 k rows at 20 M utterances); a library caller reading
    ``report.shards`` still gets one row per planned shard, its seconds and corpus counts the plan's."""
    for name, count in (("a", 8), ("b", 4)):
        write_shards(list(corpus_utterances(CorpusSpec(name, count, 0.3, 0.9, "en"), seed=2)), str(tmp_path / name),
                     utts_per_shard=2)
    built = []
    real = report_module.shard_table
    monkeypatch.setattr(report_module, "shard_table", lambda *args: built.append(args) or real(*args))
    report = balance.run_balance([CorpusSource(n, (str(tmp_path / n),)) for n in ("a", "b")], str(tmp_path / "out"),
                                 balance.BalanceSettings(world_size=2, num_workers=1, num_shards=4, dry_run=True),
                                 RunOptions(jobs=1))
    summary = report.summary()
    assert summary["written"] == {"ok": 0, "skipped": 0, "failed": 0} and summary["num_shards"] == 4
    assert built == []  # the summary read no row
    plan = report.plan
    rows = [(row["shard"], row["path"], row["utterances"], row["seconds"], row["corpora"]) for row in report.shards]
    assert rows == [(s, None, plan.utts_per_shard, round(float(plan.shard_seconds[s]), 3),
                     {"a": int(plan.shard_corpus_counts[s, 0]), "b": int(plan.shard_corpus_counts[s, 1])})
                    for s in range(4)]
    assert report.shards is report.shards and len(built) == 1  # built once
