"""Real torch.distributed ranks for the tests (gloo, CPU): fork W processes, each joins the group and runs a
target; what each returns (or its error) comes back to the test. Shared by the equal-steps test
(tests/training/test_equal_steps.py) and the layouts' multi-rank test (tests/commands/balance/)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import traceback
from datetime import timedelta

from support import free_port


def _rank_entry(rank, world, port, out_dir, pg_timeout, target, args):
    """One rank: join the group, run ``target(rank, *args)``, write what it returns (or its error)."""
    import torch.distributed as dist

    result = {}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=pg_timeout))
        result = target(rank, *args)
    except BaseException as err:  # written for the test to assert on
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)  # skip torch's atexit teardown of a group that may have timed out


def launch(tmp_path, target, *args, world=2, pg_timeout=20, deadline=90) -> list[dict]:
    """Fork ``world`` rank processes running ``target``; their results, in rank order. Ranks still alive
    after ``deadline`` seconds are killed (a hang: one rank waiting in a collective the others never join)
    and fail the test."""
    out_dir = tmp_path / f"ranks-{time.monotonic_ns()}"
    out_dir.mkdir()
    ctx = multiprocessing.get_context("fork")  # torch is imported already: no second import per rank
    port = free_port()
    procs = [ctx.Process(target=_rank_entry, args=(r, world, port, str(out_dir), pg_timeout, target, args))
             for r in range(world)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline
    for p in procs:
        p.join(max(0.1, end - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"rank(s) {hung} still running after {deadline} s"
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def ok(results: list[dict]) -> list[dict]:
    """The results, after asserting that no rank failed (its error and traceback in the message)."""
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}\n{res.get('traceback')}"
    return results
