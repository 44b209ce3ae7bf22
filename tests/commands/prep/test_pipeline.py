"""prep's reading in its own process (bz2 sources decoded in parallel blocks, commands.prep.pipeline): the same
bytes, report and rejects as the pool's reading, errors located at the source, and readers that stop with the run."""

from __future__ import annotations

import json
import threading
import time

import pytest

from support import corpus
from shardkit.commands.prep import PrepSettings, pipeline, run_prep
from shardkit.commands.prep.read import SourceTask
from shardkit.commands.validate.options import ValidateOptions
from shardkit.errors import ShardkitError
from shardkit.io.mix import CorpusSource
from shardkit.io.synth import CorpusSpec, encode, speech_like, write_shards
from shardkit.run.executor import TaskFailedError
from shardkit.run.options import RunOptions

CHECKS = ValidateOptions(sample_rate=16000, channels=1)


@pytest.fixture
def bz2_mix(tmp_path) -> dict[str, str]:
    """Two bz2 corpora with planted faults (a wrong rate, empty text, a duplicate key across shards)."""
    a = list(corpus((CorpusSpec("aishell", 12, 0.4, 1.2, "zh"),)))
    b = list(corpus((CorpusSpec("libri", 10, 1.5, 3.0, "en"),)))
    a[2] = (a[2][0], a[2][1], encode(speech_like(0.8, 8000, seed=1), 8000), 0.8)
    a[5] = (a[5][0], "  ", a[5][2], a[5][3])
    b.append(b[0])
    folders = {}
    for name, utts in (("aishell", a), ("libri", b)):
        folders[name] = str(tmp_path / "src" / name)
        write_shards(utts, folders[name], utts_per_shard=3, codec="bz2")
    return folders


def _prep(folders, out, jobs):
    corpora = [CorpusSource(name, (folder,)) for name, folder in folders.items()]
    settings = PrepSettings(world_size=2, num_workers=2, codec="none", level=None, pool_bytes=200_000,
                            shard_duration=4.0)
    return run_prep(corpora, str(out), settings, CHECKS, RunOptions(jobs=jobs))


def _outputs(out) -> tuple[list[bytes], bytes, dict]:
    shards = [open(p, "rb").read() for p in (out / "data.list").read_text().split()]
    doc = json.loads((out / "prep.json").read_text())
    doc["summary"].pop("elapsed_seconds")
    for row in doc["sources"]:
        row.pop("elapsed_s", None)
    for shard in doc["shards"]:
        shard.pop("path")
    return shards, (out / "rejects.jsonl").read_bytes(), doc


def test_in_process_reading_writes_the_pools_bytes_report_and_rejects(bz2_mix, tmp_path, monkeypatch):
    assert pipeline.reads_in_process([t.path for t in _tasks(bz2_mix)], "local", 2)
    in_process = _prep(bz2_mix, tmp_path / "in-process", jobs=2)
    one_job = _prep(bz2_mix, tmp_path / "one-job", jobs=1)
    monkeypatch.setattr(pipeline, "reads_in_process", lambda *args: False)
    pooled = _prep(bz2_mix, tmp_path / "pool", jobs=2)
    assert in_process.summary_fields["findings"] == pooled.summary_fields["findings"] > 0
    reference = _outputs(tmp_path / "pool")
    assert _outputs(tmp_path / "in-process") == reference == _outputs(tmp_path / "one-job")
    assert one_job.summary_fields["rejected_utterances"] == 3  # the rate, the empty text, the duplicate


def test_which_runs_read_in_process(bz2_mix, tmp_path):
    bz2 = sorted(str(p) for p in (tmp_path / "src").rglob("*.bz2"))
    gz = tmp_path / "other" / "a.tar.gz"
    write_shards(list(corpus((CorpusSpec("g", 2, 0.5, 1.0, "en"),))), str(gz.parent), utts_per_shard=2, codec="gz")
    gz = next(str(p) for p in gz.parent.glob("*.gz"))
    assert pipeline.reads_in_process(bz2, "local", 2)
    assert pipeline.reads_in_process(bz2 + [str(tmp_path / "gone.tar.bz2")], "local", 8)  # its finding either way
    assert not pipeline.reads_in_process(bz2, "local", 1)  # one job reads inline already
    assert not pipeline.reads_in_process(bz2, "local", pipeline.BLOCK_DECODE_CORES + 1)
    assert not pipeline.reads_in_process(bz2, "ray", 2)
    assert not pipeline.reads_in_process(bz2 + [gz], "local", 2)
    assert not pipeline.reads_in_process(bz2 + ["https://example.org/a.tar.bz2"], "local", 2)
    specs = [f"{name}={folder}" for name, folder in bz2_mix.items()]
    assert pipeline.corpora_read_in_process(specs, "local", 2)
    assert not pipeline.corpora_read_in_process(specs + [f"g={gz}"], "local", 2)
    assert not pipeline.corpora_read_in_process(["no spec"], "local", 2)
    assert not pipeline.corpora_read_in_process(specs + ["r=https://example.org/data.list"], "local", 2)


def _tasks(folders) -> list[SourceTask]:
    from pathlib import Path

    return [SourceTask(str(p), c, CHECKS) for c, folder in enumerate(folders.values())
            for p in sorted(Path(folder).glob("*.bz2"))]


def test_results_come_in_list_order_and_a_readers_error_names_its_source(bz2_mix, monkeypatch):
    tasks = _tasks(bz2_mix)
    assert [r["shard"] for _, r in pipeline.read_in_process(tasks, 2)] == [t.path for t in tasks]
    real = pipeline.read_source

    def failing(task, stop=None):
        if task.path == tasks[2].path:
            raise RuntimeError("a bug")
        if task.path == tasks[4].path:
            raise ShardkitError("a located failure")
        return real(task, stop)

    monkeypatch.setattr(pipeline, "read_source", failing)
    with pytest.raises(TaskFailedError) as err:
        list(pipeline.read_in_process(tasks, 2))
    assert err.value.shard == tasks[2].path and "RuntimeError: a bug" in str(err.value)
    with pytest.raises(ShardkitError) as err:
        list(pipeline.read_in_process(tasks[3:], 2))
    assert err.value.shard == tasks[4].path


def test_a_signal_stops_the_reading_and_its_reader_threads(bz2_mix, monkeypatch):
    from shardkit.io import interrupts

    started = threading.Event()
    real = pipeline.read_source

    def slow(task, stop=None):
        started.set()
        while not stop.is_set():  # a source that would take long: only the run's stop ends it
            time.sleep(0.01)
        return real(task, stop)  # raises Stopped at its first utterance

    def signalled():
        if started.is_set():
            raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "read_source", slow)
    monkeypatch.setattr(interrupts, "check", signalled)
    with pytest.raises(KeyboardInterrupt):
        next(pipeline.read_in_process(_tasks(bz2_mix), 2))
    deadline = time.monotonic() + 10
    while any(t.name.startswith("prep-reader-") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name.startswith("prep-reader-") for t in threading.enumerate())


_SIGTERM_WHILE_READING = """
import os, signal, sys
import shardkit.commands.prep.pipeline as pipeline
import shardkit.commands.prep.resume as resume
from shardkit.cli import main

resume.POOL_FACTOR = 0  # resume points as often as --checkpoint-mb allows: this small corpus has several
saved, real_save, real_read = [], resume.save, pipeline.read_source

def counting_save(out_dir, state):
    real_save(out_dir, state)
    saved.append(state["next_source"])

def read_then_stop(task, stop=None):
    if len(saved) >= 2:  # preempted while a reader thread reads a source after a resume point
        os.kill(os.getpid(), signal.SIGTERM)
    return real_read(task, stop)

resume.save, pipeline.read_source = counting_save, read_then_stop
main(sys.argv[1:])
"""


def test_sigterm_while_reading_in_process_exits_143_and_the_rerun_continues(tmp_path):
    """The scheduler's SIGTERM reaches the main thread while it waits on a reader thread: exit 143 and one
    JSON document, the last resume point kept, and the rerun (in process again) ends byte-identical."""
    import os
    import subprocess
    import sys

    from shardkit.commands.prep import resume

    source = str(tmp_path / "src" / "long")
    write_shards(list(corpus((CorpusSpec("long", 60, 2.0, 4.0, "en"),))), source, utts_per_shard=4, codec="bz2")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}

    def args(folder):
        return ["prep", "--world-size", "2", "--num-workers", "2", "--codec", "none", "--sample-rate", "16000",
                "--channels", "1", "-o", str(folder), "-j", "2", "--pool-mb", "1", "--corpus", f"long={source}"]

    reference, out = tmp_path / "reference", tmp_path / "out"
    subprocess.run([sys.executable, "-m", "shardkit", *args(reference), "-q"], env=env, check=True)
    stopped = subprocess.run([sys.executable, "-c", _SIGTERM_WHILE_READING, *args(out), "--checkpoint-mb", "1",
                              "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 143, stopped.stderr
    assert json.loads(stopped.stdout) == {"command": "prep", "error": "terminated", "exit_code": 143}
    state = resume._PlainUnpickler(open(out / resume.RESUME, "rb")).load()
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".partial")) == \
        sorted(os.path.basename(e["tmp"]) for e in state["shards"])
    rerun = subprocess.run([sys.executable, "-m", "shardkit", *args(out), "--json"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["resumed_at_source"] == state["next_source"] > 0
    listed = [(folder / "data.list").read_text().split() for folder in (reference, out)]
    assert [open(p, "rb").read() for p in listed[1]] == [open(p, "rb").read() for p in listed[0]]
    assert not any(p.name.endswith(".partial") for p in out.iterdir()) and not (out / resume.RESUME).exists()
