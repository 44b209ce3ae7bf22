"""Ray, a task's worker killed mid-shard: the run completes, stdout is one JSON document, no temporary file stays."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from shardkit.io.tar import iter_shard_members
from support import REPO


def _env() -> dict:
    """This checkout first on the path, and no RAY_ADDRESS: each test starts a Ray instance of its own."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([REPO,
                                         env.get("PYTHONPATH", "")])
    return env

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
    env = _env()
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


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_losing_the_head_is_exit_code_3_one_json_error_and_a_rerun_resumes(make_shards, tmp_path):
    pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")  # Ray puts its own copy on sys.path when imported
    shards = make_shards("none", utts_per_shard=4)
    started = tmp_path / "started"
    # a shard that takes its time, so the head is lost while the run waits for it
    slow = f"pipe:touch {shlex.quote(str(started))}; sleep 120; cat {shlex.quote(shards[1])}"
    inputs = [shards[0], slow, *shards[2:]]
    (tmp_path / "in.list").write_text("".join(f"{line}\n" for line in inputs))
    out = tmp_path / "out"
    env = _env()
    args = [sys.executable, "-m", "shardkit", "convert", str(tmp_path / "in.list"), "-o", str(out), "--json", "-q",
            "--allow-pipes", "--io-timeout", "300"]
    run = subprocess.Popen([*args, "--executor", "ray", "--ray-address", "local", "-j", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    family = []  # the run's Ray processes: none may outlive the test
    try:
        deadline = time.monotonic() + 200
        while not started.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.5)
        assert started.exists(), run.communicate()[1][-3000:]
        # the head of this run's own Ray instance: its GCS server, a child of the convert process
        family = psutil.Process(run.pid).children(recursive=True)
        gcs = [p for p in family if "gcs_server" in " ".join(p.cmdline())]
        assert gcs
        for p in gcs:
            p.kill()
        stdout, stderr = run.communicate(timeout=150)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for p in family:  # what the lost head's node left behind (its agents outlive their raylet)
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    assert run.returncode == 3, stderr[-3000:]
    doc = json.loads(stdout)  # one document, and it is the error
    assert doc["exit_code"] == 3 and "lost the Ray cluster" in doc["error"]
    assert not [n for n in os.listdir(out) if n.endswith((".partial", ".lock"))]
    # a local rerun resumes: the shards finished before the loss are skipped
    fast = [shards[0], f"pipe:cat {shlex.quote(shards[1])}", *shards[2:]]
    (tmp_path / "in.list").write_text("".join(f"{line}\n" for line in fast))
    done = subprocess.run([*args, "-j", "1"], capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["ok"] + json.loads(done.stdout)["skipped"] == len(inputs)
