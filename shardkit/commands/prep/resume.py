"""prep's resume points: what a rerun needs to continue a killed run instead of starting again.

Every output shard is open until the last source is read, so a killed run has no finished shard; what
it has are the parts of every shard written so far. At a resume point (see ``_Run._checkpoint_due``)
the writer threads flush what they hold, and the run's whole state is saved in ``.prep-resume.pkl``:
the planner, the pool (the utterances held back, with their bytes: the sources they came from are
not read again), the figures and rejects so far, the duplicate-key table, the next source to read,
and per output shard its temporary file, size, sha256 and member digests. A rerun with the same spec
finds the file, checks that every temporary file still starts with those bytes (``check_partials``),
cuts each back to that size and goes on from the next source; the bytes it writes are the ones an
uninterrupted run writes, because every decision is a function of the sources in list order.

Plain tar output only (the recipe's default): a compressor's state cannot be saved, and flushing
it mid-stream would change the output bytes. The file holds plain data only (dicts, lists, str,
bytes, numbers) and is read with an unpickler that refuses every class, so a damaged or planted file
can fail the resume (the run then starts again) but cannot run code.
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np

RESUME = ".prep-resume.pkl"
FORMAT = 1
POOL_FACTOR = 8  # a resume point once the bytes written since the last are 8 x the pool it saves


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{RESUME} holds plain data only (found {module}.{name})")


def planner_state(planner) -> dict:
    """The streaming planner as plain data (arrays as lists of Python numbers: exact round trip)."""
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in vars(planner).items()}


def restore_planner(planner, state: dict) -> None:
    """Put a saved planner state back into ``planner`` (the arrays and the sorted pool rebuilt from plain lists)."""
    for key, value in state.items():
        setattr(planner, key, value)
    planner.counts = np.array(state["counts"], np.int64)
    planner.seconds = np.array(state["seconds"], np.float64)
    planner._pool = [tuple(x) for x in state["_pool"]]


def plain(obj):
    """``obj`` with numpy scalars and arrays turned into Python numbers and lists (the unpickler refuses them)."""
    if isinstance(obj, dict):
        return {plain(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [plain(x) for x in obj]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, (np.generic, np.ndarray)):
        return obj.tolist()
    return obj


def save(out_dir: str, state: dict) -> None:
    """Atomically (temp name, fsync, rename): a kill while saving keeps the previous resume point."""
    from shardkit.io.files import atomic_write_bytes

    atomic_write_bytes(os.path.join(out_dir, RESUME), pickle.dumps(plain({"format": FORMAT, **state}), protocol=5))


def load(out_dir: str, spec: str) -> dict | None:
    """The saved state of a killed run of this spec whose temporary files are intact, else None."""
    from shardkit.commands.prep.write import check_partials

    path = os.path.join(out_dir, RESUME)
    try:
        with open(path, "rb") as f:
            state = _PlainUnpickler(io.BufferedReader(f)).load()
    except FileNotFoundError:
        return None
    except Exception:  # a damaged file is no resume point: the run starts again
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("spec") != spec:
        return None
    prefixes = check_partials(state["shards"])
    if prefixes is None:
        return None
    state["prefixes"] = prefixes
    return state


def remove(out_dir: str) -> None:
    """Delete the output folder's resume file (the run is complete); absent is fine."""
    try:
        os.unlink(os.path.join(out_dir, RESUME))
    except FileNotFoundError:
        pass
