"""What `shardkit balance` sets before numpy loads (a fresh interpreter, as the user starts it): one OpenBLAS
thread, since balance does no linear algebra (benchmarks/results/2026-11-28-plan-scale.md), and a value the user
set is kept. The plan is the same either way."""

import json
import os
import subprocess
import sys

# runs the CLI as `shardkit` does, then prints whether numpy was loaded when the command started, and
# OPENBLAS_NUM_THREADS as the run left it
_PROBE = """
import json, os, sys
import shardkit.cli.balance as balance_cli
seen = {}
set_threads = balance_cli._one_blas_thread
def probe():
    seen["numpy_before"] = "numpy" in sys.modules
    set_threads()
balance_cli._one_blas_thread = probe
sys.argv = ["shardkit", *sys.argv[1:]]
from shardkit.cli import main
try:
    main()
finally:
    print(json.dumps([seen.get("numpy_before"), "numpy" in sys.modules, os.environ.get("OPENBLAS_NUM_THREADS")]),
          file=sys.stderr)
"""


def _dry_run(shards, out, blas_threads=None):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = blas_threads
    args = ["balance", "--corpus", f"mix={','.join(map(str, shards))}", "--world-size", "2", "--num-workers", "1",
            "--num-shards", "2", "-o", str(out), "--dry-run", "--json", "-q"]
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), json.loads(done.stderr.strip().splitlines()[-1])


def test_balance_sets_one_blas_thread_before_numpy_loads(make_shards, tmp_path):
    shards = make_shards("none", utts_per_shard=3)
    summary, (numpy_before, numpy_after, blas) = _dry_run(shards, tmp_path / "out")
    assert summary["balanced"] and summary["num_shards"] == 2
    assert numpy_before is False and numpy_after is True  # set in time: OpenBLAS reads it as numpy loads
    assert blas == "1"


def test_a_blas_thread_count_the_user_set_stays_and_plans_the_same(make_shards, tmp_path):
    shards = make_shards("none", utts_per_shard=3)
    ours, (_, _, blas) = _dry_run(shards, tmp_path / "ours")
    theirs, (_, _, user_blas) = _dry_run(shards, tmp_path / "theirs", blas_threads="3")
    assert blas == "1" and user_blas == "3"
    drop = ("elapsed_seconds",)
    assert {k: v for k, v in ours.items() if k not in drop} == {k: v for k, v in theirs.items() if k not in drop}
