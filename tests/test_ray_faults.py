"""Ray, a task's worker killed mid-shard: the run completes, stdout is one JSON document, no temporary file stays."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from shardkit.io.tar import iter_shard_members


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_ray_worker_leaves_one_json_document_and_no_temporary_file(make_shards, tmp_path):
    pytest.importorskip("ray")
    shards = make_shards("none", utts_per_shard=4)
    once = tmp_path / "killed-once"
    victim = shards[1]
    # the first attempt writes part of the shard, then kills its own Ray worker (the shell's parent);
    # Ray runs the task again on another worker, which reads the whole shard
    kill = (f"pipe:if mkdir {shlex.quote(str(once))} 2>/dev/null; then head -c 30000 {shlex.quote(victim)}; "
            f"kill -9 $PPID; sleep 5; fi; cat {shlex.quote(victim)}")
    inputs = [shards[0], kill, *shards[2:]]
    (tmp_path / "in.list").write_text("".join(f"{line}\n" for line in inputs))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    # --ray-address local: a Ray instance of this test's own, whatever else runs on the machine
    done = subprocess.run([sys.executable, "-m", "shardkit", "convert", str(tmp_path / "in.list"), "-o", str(out),
                           "--executor", "ray", "--ray-address", "local", "-j", "2", "--json", "-q",
                           "--allow-pipes"],
                          capture_output=True, text=True, timeout=360, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)  # one document, nothing of Ray's before or after it
    assert report["ok"] == len(inputs) and once.exists()
    left = [name for _, _, names in os.walk(out) for name in names if name.endswith(".partial")]
    assert left == []
    converted = [line for line in open(out / "data.list").read().split()]
    assert list(iter_shard_members(converted[1])) == list(iter_shard_members(victim))
