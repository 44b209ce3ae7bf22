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
                       "torchaudio", "yaml", "matplotlib", "tqdm", "numpy.random",
                       # nor what the index's dictionary columns and the old-path finder needed no longer
                       "pyarrow.compute", "importlib.resources"]

# runs the CLI as `shardkit` does, then prints which of the modules asked about were loaded
_PROBE = """
import json, sys
watched = json.loads(sys.argv[1])
sys.argv = ["shardkit", *sys.argv[2:]]
from shardkit.cli import main
try:
    main()
finally:
    import os
    print(json.dumps([m for m in watched if m in sys.modules] + [os.environ.get("OPENBLAS_NUM_THREADS")]),
          file=sys.stderr)
"""


def _run(watched: list[str], *args, blas_threads: str | None = None) -> tuple[list[str], str, str | None]:
    """``shardkit ARGS`` in a fresh interpreter (OPENBLAS_NUM_THREADS set to ``blas_threads``, or unset): which
    of ``watched`` it loaded, its standard output, and OPENBLAS_NUM_THREADS as the run left it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = blas_threads
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(watched), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    *loaded, blas = json.loads(done.stderr.strip().splitlines()[-1])
    return loaded, done.stdout, blas


@pytest.mark.parametrize("audio", ["keep", "flac"])
def test_a_local_run_imports_only_what_it_uses(make_shards, tmp_path, audio):
    shards = make_shards("none", utts_per_shard=3)
    loaded, out, blas = _run(NOT_FOR_A_LOCAL_RUN + ["pyarrow"], "convert", *shards, "-o", tmp_path / "out",
                             "--audio", audio, "-j1", "-q", "--json")
    report = json.loads(out)
    assert report["failed"] == 0 and report["ok"] == len(shards)
    if audio == "flac":
        assert report["audio"]["transcoded"] > 0 and report["audio"]["kept"] == 0
    assert [m for m in loaded if m in NOT_FOR_A_LOCAL_RUN] == []
    # index.parquet is written beside data.list: the one Parquet file the run writes, so pyarrow is loaded
    assert report["index"] and "pyarrow" in loaded
    assert blas == "1"  # numpy's OpenBLAS starts no thread per core: convert does no linear algebra


def test_a_blas_thread_count_the_user_set_stays(make_shards, tmp_path):
    shards = make_shards("none", utts_per_shard=2)
    _, out, blas = _run([], "convert", *shards, "-o", tmp_path / "out", "-j1", "-q", "--json", blas_threads="3")
    assert json.loads(out)["ok"] == len(shards) and blas == "3"


def test_help_loads_no_array_parquet_or_pool_library():
    # nor another command's module: the group looks up the module named after the command first
    watched = ["numpy", "pyarrow", "soundfile", "asyncio", "multiprocessing", "shardkit.cli.balance",
               "shardkit.cli.bench"]
    loaded, out, _ = _run(watched, "convert", "--help")
    assert "Examples" in out and loaded == []
