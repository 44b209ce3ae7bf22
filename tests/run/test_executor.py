"""run_tasks: inline, process pool and Ray give the same results; dead workers are retried."""

import os
import sys

import pytest

from shardkit.commands.convert import ConvertSettings, convert_shard
from shardkit.commands.convert import _task as convert_task
from shardkit.errors import AudioError, UsageError
from shardkit.io.tar import iter_shard_members
from shardkit.run.executor import TaskFailedError, run_tasks, task_name

# --- task functions (module level: they travel to worker processes by reference) ---------------


def square(task):
    return task * task


def fail_on_bad(task):
    name, value = task
    if name == "bad.tar":
        raise ValueError(f"cannot handle {value}")
    return value


def audio_error(task):
    raise AudioError("not a WAV", member="k1.wav")


def die_once(task):
    """Kills its own worker process the first time it runs for an item; returns on the retry."""
    name, marker_dir, value = task
    marker = os.path.join(marker_dir, name + ".died")
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(17)
    return value * 2


def always_die(task):
    os._exit(17)


_STATE = {}


def remember(prefix):
    _STATE["prefix"] = prefix


def with_prefix(task):
    return _STATE["prefix"] + task


def convert_dying_mid_shard(task):
    """convert_shard, but the first attempt kills the worker after writing two members."""
    src, dst, settings, marker_dir = task
    marker = os.path.join(marker_dir, os.path.basename(src) + ".died")
    seen = []

    def transform(shard, name, data):
        seen.append(name)
        if len(seen) == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(17)
        return name, data, None

    return convert_shard(src, dst, settings, transform)


# --- helpers ------------------------------------------------------------------------------------


def collect(iterator):
    return dict(iterator)


def comparable(entry):
    """A convert entry without what differs between runs (timing) or by design (output folder)."""
    out = {k: v for k, v in entry.items() if k not in ("seconds", "output")}
    out["output"] = {k: v for k, v in entry["output"].items() if k != "path"}
    return out


def convert_tasks(sources, out_dir, settings=ConvertSettings()):
    return [(src, os.path.join(out_dir, os.path.basename(src).split(".")[0] + ".tar.zst"), settings)
            for src in sources]


# --- local --------------------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", [1, 2])
def test_local_results_match_inline_calls(jobs):
    results = list(run_tasks(square, range(20), jobs=jobs))
    assert sorted(i for i, _ in results) == list(range(20))
    assert collect(results) == {i: i * i for i in range(20)}


def test_ordered_results_come_in_task_order_with_a_small_window():
    seen = []
    results = list(run_tasks(square, range(25), jobs=2, max_in_flight=3, ordered=True,
                             on_result=lambda i, r: seen.append(i)))
    assert results == [(i, i * i) for i in range(25)]
    assert seen == list(range(25))


def test_stopping_early_shuts_the_pool_down():
    results = run_tasks(square, range(1000), jobs=2, max_in_flight=4)
    first = next(results)
    results.close()
    assert first[1] == first[0] ** 2


def test_empty_task_list_yields_nothing():
    assert list(run_tasks(square, [], jobs=2)) == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_raising_task_is_reraised_naming_its_item(jobs):
    tasks = [("a.tar", 1), ("bad.tar", 2), ("c.tar", 3)]
    with pytest.raises(TaskFailedError) as err:
        list(run_tasks(fail_on_bad, tasks, jobs=jobs))
    assert str(err.value) == "bad.tar: task raised ValueError: cannot handle 2"
    assert isinstance(err.value.__cause__, ValueError)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_shardkit_error_keeps_its_class_and_gains_the_shard(jobs):
    with pytest.raises(AudioError) as err:
        list(run_tasks(audio_error, [("x.tar",), ("y.tar",)], jobs=jobs, ordered=True))
    assert str(err.value) == "x.tar: member 'k1.wav': not a WAV"


def test_local_pool_survives_a_worker_killed_mid_run(tmp_path):
    tasks = [(f"s{i}", str(tmp_path), i) for i in range(6)]
    results = collect(run_tasks(die_once, tasks, jobs=2, retries=3))
    assert results == {i: 2 * i for i in range(6)}
    assert len(list(tmp_path.glob("*.died"))) == 6  # every item killed its worker once


def test_local_pool_gives_up_after_its_retries(tmp_path):
    with pytest.raises(TaskFailedError) as err:
        list(run_tasks(always_die, [("only.tar",), ("other.tar",)], jobs=2, retries=1))
    assert str(err.value) == ("only.tar: its worker process died (killed, out of memory or crashed) "
                              "each of the 2 times it ran")


@pytest.mark.parametrize("jobs", [1, 2])
def test_initializer_runs_in_every_worker(jobs):
    results = collect(run_tasks(with_prefix, ["a", "b", "c"], jobs=jobs, initializer=remember, initargs=("x-",)))
    assert results == {0: "x-a", 1: "x-b", 2: "x-c"}


def test_bad_arguments_are_usage_errors():
    with pytest.raises(UsageError, match="unknown executor 'dask'; choose one of local, ray"):
        run_tasks(square, [1], executor="dask")
    with pytest.raises(UsageError, match="retries must be 0 or more"):
        run_tasks(square, [1], retries=-1)


def test_ray_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UsageError) as err:
        run_tasks(square, [1], executor="ray")
    assert str(err.value) == "--executor ray needs Ray, which is not installed: pip install 'shardkit[ray]'"


def test_an_unreachable_ray_address_is_a_usage_error():
    ray = pytest.importorskip("ray")
    import socket

    if ray.is_initialized():
        pytest.skip("this process is connected to Ray already: run_tasks keeps that connection")

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UsageError) as err:
        run_tasks(square, [1], executor="ray", ray_address=f"127.0.0.1:{port}")
    assert str(err.value) == f"cannot reach the Ray cluster at --ray-address 127.0.0.1:{port} (Connection refused)"


def test_task_names_come_from_the_first_path_field():
    assert task_name(("/data/a.tar", "/out/a.tar.zst", None), 4) == "/data/a.tar"
    assert task_name((3, 4), 7) == "task 7"
    assert task_name("/data/b.tar", 0) == "/data/b.tar"


# --- Ray (a local instance started here, 2 CPUs, on 127.0.0.1) -----------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    import logging

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    # address="local": always a fresh instance of our own, never another user's running cluster;
    # PYTHONPATH lets workers import this module's task functions by name
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")])}})
    yield ray
    ray.shutdown()


def test_ray_results_equal_local_results(ray_cluster):
    tasks = list(range(30))
    local = collect(run_tasks(square, tasks, jobs=2))
    on_ray = collect(run_tasks(square, tasks, executor="ray", max_in_flight=4))
    assert on_ray == local
    assert list(run_tasks(square, tasks, executor="ray", max_in_flight=3, ordered=True)) == sorted(local.items())


def test_ray_stops_early_and_cancels_the_rest(ray_cluster):
    results = run_tasks(square, range(500), executor="ray", max_in_flight=4)
    first = next(results)
    results.close()
    assert first[1] == first[0] ** 2
    assert list(run_tasks(square, [3], executor="ray")) == [(0, 9)]  # the cluster is still usable


def test_ray_converts_shards_byte_identical_to_the_local_pool(ray_cluster, make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=4)
    local = collect(run_tasks(convert_task, convert_tasks(sources, str(tmp_path / "local")), jobs=2))
    on_ray = collect(run_tasks(convert_task, convert_tasks(sources, str(tmp_path / "ray")), executor="ray"))
    assert {i: comparable(e) for i, e in on_ray.items()} == {i: comparable(e) for i, e in local.items()}
    assert all(e["status"] == "ok" for e in on_ray.values())
    for i in local:
        with open(local[i]["output"]["path"], "rb") as a, open(on_ray[i]["output"]["path"], "rb") as b:
            assert a.read() == b.read()


def test_ray_retries_a_worker_killed_mid_shard(ray_cluster, make_shards, tmp_path):
    sources = make_shards("gz", utts_per_shard=4)
    markers = tmp_path / "markers"
    markers.mkdir()
    settings = ConvertSettings()
    tasks = [(src, dst, settings, str(markers)) for src, dst, settings in
             convert_tasks(sources, str(tmp_path / "ray"), settings)]
    results = collect(run_tasks(convert_dying_mid_shard, tasks, executor="ray", retries=2))
    assert len(list(markers.iterdir())) == len(sources)  # every shard's first worker died mid-write
    assert [results[i]["status"] for i in range(len(sources))] == ["ok"] * len(sources)
    for i, src in enumerate(sources):
        out = results[i]["output"]["path"]
        assert list(iter_shard_members(out)) == list(iter_shard_members(src))
        assert not os.path.exists(os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial"))


def test_ray_gives_up_on_a_task_whose_worker_always_dies(ray_cluster):
    with pytest.raises(TaskFailedError) as err:
        list(run_tasks(always_die, [("doomed.tar",)], executor="ray", retries=1))
    assert str(err.value).startswith("doomed.tar: Ray could not finish the task in 2 attempts (")


def test_ray_reraises_task_errors_naming_the_item(ray_cluster):
    with pytest.raises(TaskFailedError) as err:
        list(run_tasks(fail_on_bad, [("a.tar", 1), ("bad.tar", 2)], executor="ray"))
    assert str(err.value) == "bad.tar: task raised ValueError: cannot handle 2"
    with pytest.raises(AudioError) as err:
        list(run_tasks(audio_error, [("x.tar",)], executor="ray"))
    assert str(err.value) == "x.tar: member 'k1.wav': not a WAV"


def test_ray_initializer_runs_once_per_worker(ray_cluster):
    results = collect(run_tasks(with_prefix, ["a", "b", "c", "d"], executor="ray", initializer=remember,
                                initargs=("r-",)))
    assert results == {0: "r-a", 1: "r-b", 2: "r-c", 3: "r-d"}
