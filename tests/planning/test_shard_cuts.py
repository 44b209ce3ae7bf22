"""shardkit.planning.shard_cuts: make's cuts of utterances into shards, a pure function of the durations."""

from __future__ import annotations

import ast

import numpy as np
import pytest

from shardkit.planning import shard_cuts
from shardkit.planning.shard_cuts import plan_cuts, plan_shards


def test_the_module_imports_only_numpy_and_math_and_opens_nothing():
    with open(shard_cuts.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {node.module if isinstance(node, ast.ImportFrom) else alias.name for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert imported <= {"__future__", "math", "numpy"}
    assert "open" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("count", [1, 2, 7, 50])
@pytest.mark.parametrize("rule", [{"utts_per_shard": 1}, {"utts_per_shard": 3}, {"shard_duration": 0.5},
                                  {"shard_duration": 4.0}, {"shard_duration": 1e9}])
def test_cuts_are_the_boundaries_of_the_planned_shards(count, rule):
    durations = list(np.random.default_rng(count).uniform(0.2, 3.0, count))
    cuts = plan_cuts(durations, **rule)
    shards = plan_shards(durations, **rule)
    assert cuts[0] == 0 and cuts[-1] == count and all(a < b for a, b in zip(cuts, cuts[1:]))
    assert shards == [list(range(a, b)) for a, b in zip(cuts[:-1], cuts[1:])]


def test_no_utterance_no_shard_and_bad_rules_are_refused():
    assert plan_cuts([], shard_duration=10.0) == []
    with pytest.raises(ValueError):
        plan_cuts([1.0], utts_per_shard=0)
    with pytest.raises(ValueError):
        plan_cuts([1.0], shard_duration=0.0)
