"""What `shardkit convert` imports: only what the run uses (a fresh interpreter, as the user starts it).

Every module below costs CPU at start-up in every run (benchmarks/results/2026-11-28-flac.md); the test pins
that a local run does not load them, and that the run still converts every member.
"""

import json
import os
import subprocess
import sys

import pytest

# imported by a run that needs them (a URL, a pool, the progress bars, Ray), never by a local quiet -j1 run
NOT_FOR_A_LOCAL_RUN = ["asyncio", "fsspec", "multiprocessing", "concurrent.futures.process", "ray", "torch",
                       "torchaudio", "yaml", "matplotlib", "tqdm", "numpy.random"]

# runs the CLI as `shardkit` does, then prints which of the modules asked about were loaded
_PROBE = """
import json, sys
watched = json.loads(sys.argv[1])
sys.argv = ["shardkit", *sys.argv[2:]]
from shardkit.cli import main
try:
    main()
finally:
    print(json.dumps([m for m in watched if m in sys.modules]), file=sys.stderr)
"""


def _run(watched: list[str], *args) -> tuple[list[str], str]:
    """``shardkit ARGS`` in a fresh interpreter: which of ``watched`` it loaded, and its standard output."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(watched), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


@pytest.mark.parametrize("audio", ["keep", "flac"])
def test_a_local_run_imports_only_what_it_uses(make_shards, tmp_path, audio):
    shards = make_shards("none", utts_per_shard=3)
    loaded, out = _run(NOT_FOR_A_LOCAL_RUN + ["pyarrow"], "convert", *shards, "-o", tmp_path / "out", "--audio", audio,
                       "-j1", "-q", "--json")
    report = json.loads(out)
    assert report["failed"] == 0 and report["ok"] == len(shards)
    if audio == "flac":
        assert report["audio"]["transcoded"] > 0 and report["audio"]["kept"] == 0
    assert [m for m in loaded if m in NOT_FOR_A_LOCAL_RUN] == []
    # index.parquet is written beside data.list: the one Parquet file the run writes, so pyarrow is loaded
    assert report["index"] and "pyarrow" in loaded


def test_help_loads_no_array_parquet_or_pool_library():
    # nor another command's module: the group looks up the module named after the command first
    watched = ["numpy", "pyarrow", "soundfile", "asyncio", "multiprocessing", "shardkit.cli.balance",
               "shardkit.cli.bench"]
    loaded, out = _run(watched, "convert", "--help")
    assert "Examples" in out and loaded == []
