"""RunOptions (the one execution-options value) and the event protocol the CLI renders with one bar class."""

from __future__ import annotations

import pytest

from shardkit.cli._progress import ProgressBars
from shardkit.errors import UsageError
from shardkit.run.events import DONE, NOTE, STAGE, Event, Events
from shardkit.run.options import RunOptions


def test_ray_address_needs_the_ray_executor():
    with pytest.raises(UsageError, match="--ray-address needs --executor ray"):
        RunOptions(ray_address="auto")
    assert RunOptions(executor="ray", ray_address="auto").ray_address == "auto"


def test_unknown_executor_and_zero_jobs_are_usage_errors():
    with pytest.raises(UsageError, match="unknown executor"):
        RunOptions(executor="slurm")
    with pytest.raises(UsageError, match="jobs must be 1 or more"):
        RunOptions(jobs=0)


def test_run_tasks_uses_the_options_jobs_and_hands_back_every_result():
    results = dict(RunOptions(jobs=1).run_tasks(abs, [-3, 4, -5]))
    assert results == {0: 3, 1: 4, 2: 5}


def test_events_carry_the_current_stage_and_the_failure():
    seen: list[Event] = []
    events = Events(seen.append)
    events.stage("write", total=2)
    events.done({"status": "ok"})
    events.done({"status": "failed", "error": "a.tar: member 'k.wav': truncated"})
    events.note("planning...")
    assert [(e.kind, e.stage) for e in seen] == [(STAGE, "write"), (DONE, "write"), (DONE, "write"), (NOTE, "write")]
    assert [e.failed for e in seen[1:3]] == [None, "a.tar: member 'k.wav': truncated"]


def test_progress_bars_open_one_bar_per_stage_and_print_failures_when_quiet(capsys):
    with ProgressBars(quiet=True) as bars:
        bars(Event(STAGE, stage="convert", total=1))
        bars(Event(DONE, stage="convert", error="x.tar: unreadable"))
        assert bars.bar is None
    assert "failed: x.tar: unreadable" in capsys.readouterr().err
    with ProgressBars() as bars:
        bars(Event(STAGE, stage="index", total=2))
        first = bars.bar
        bars(Event(DONE, stage="index", nbytes=10))
        bars(Event(STAGE, stage="write", total=None))
        assert first.disable or first.n == 1
        assert bars.bar is not first
    assert bars.bar is None
