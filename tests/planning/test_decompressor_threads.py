"""shardkit.planning.threads: decompressor threads per task, a pure function of cores, jobs and executor."""

from __future__ import annotations

import pytest

from shardkit.planning.threads import decompressor_threads


@pytest.mark.parametrize("cores", [1, 2, 3, 8, 16, 64])
@pytest.mark.parametrize("jobs", [None, 1, 2, 3, 7, 16, 100])
def test_tasks_share_the_cores_and_each_gets_at_least_one(cores, jobs):
    threads = decompressor_threads(cores, jobs, "local")
    assert threads >= 1
    assert threads == max(1, cores // (jobs or cores))  # what `validate` chose before it was a planner
    if jobs is not None and jobs <= cores:
        assert threads * jobs <= cores


@pytest.mark.parametrize("cores, jobs", [(1, None), (16, 1), (64, 4)])
def test_a_ray_task_uses_the_one_cpu_it_asks_for(cores, jobs):
    assert decompressor_threads(cores, jobs, "ray") == 1


def test_validate_chooses_threads_only_when_asked():
    from shardkit.commands.validate import ValidateOptions

    assert ValidateOptions().with_threads(1, "local").threads == 1  # the library's default stays 1
    assert ValidateOptions(threads=3).with_threads(1, "ray").threads == 3
    assert ValidateOptions(threads=None).with_threads(None, "ray").threads == 1
