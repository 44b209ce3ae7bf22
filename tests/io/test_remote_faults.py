"""Remote inputs that fail as a real network fails: each is a finding for its shard, never a hang or the run's end.

Every faulty input sits between good ones (a good URL before, a good local shard after); validate,
convert and index run over the whole list at -j 1 and -j 2 with short deadlines
(``--io-timeout 1:1 --io-retries 1``) and must process every good shard and name each fault.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import time

import pytest
from click.testing import CliRunner
from support import moto_s3
from faultserver import fault_server

from shardkit.cli import main
from shardkit.errors import ClusterError, ShardkitError
from shardkit.io.indexfile import index_marks, iter_index
from shardkit.io.remote import configure_io, io_settings
from shardkit.io.tar import iter_shard_members

pytest.importorskip("aiohttp")

FAST = ["--io-timeout", "1:1", "--io-retries", "1"]
HTTP_FAULTS = ("good", "closed", "long", "stall", "flaky", "droponce", "missing", "loop", "gzip")


@pytest.fixture(autouse=True)
def fresh_io_settings(monkeypatch):
    """Each test starts from the default input settings and no SHARDKIT_ALLOW_PIPES in the environment."""
    monkeypatch.delenv("SHARDKIT_ALLOW_PIPES", raising=False)
    previous = configure_io()
    yield
    configure_io(previous)


@pytest.fixture
def faulty_list(make_shards, tmp_path):
    """A data.list of every fault between good inputs; yields (list path, {input: expected}, size).

    ``expected`` is None for an input that must be read in full, else a regex its error must match.
    """
    shards = make_shards("none", utts_per_shard=4)
    data = open(shards[0], "rb").read()
    size = len(data)
    piped = tmp_path / "p.tar"
    shutil.copy(shards[2], piped)
    with fault_server({f"{fault}.tar": data for fault in HTTP_FAULTS}) as base:
        expected = {
            f"{base}/good/good.tar": None,
            f"{base}/closed/closed.tar": re.escape(f"connection closed after {size // 2} of {size} bytes (tried 2 times)"),
            f"{base}/long/long.tar": re.escape(f"connection closed after {size} of {size + 1000} bytes (tried 2 times)"),
            f"{base}/stall/stall.tar": rf"stalled: no data for 1 s after \d+ of {size} bytes \(tried 2 times\)",
            f"{base}/flaky/flaky.tar": None,  # 500 once: retried
            f"{base}/droponce/droponce.tar": None,  # closed mid-body once: resumed with a range request
            f"{base}/missing/missing.tar": re.escape("HTTP 404 Not Found"),
            f"{base}/loop/loop.tar": re.escape("redirect loop (gave up after 10 redirects)"),
            f"{base}/gzip/gzip.tar": None,  # labelled gzip, plain bytes: read as stored
            "pipe:echo cannot fetch >&2; exit 3": re.escape("command exited with status 3 after writing 0 bytes: "
                                                            "cannot fetch"),
            "pipe:sleep 30": re.escape("command stalled: no output for 1 s after 0 bytes (its process group was "
                                       "killed)"),
            "pipe:true": r"empty",
            f"pipe:cat {shlex.quote(str(piped))}": None,
            shards[1]: None,
        }
        listing = tmp_path / "inputs.list"
        listing.write_text("".join(f"{line}\n" for line in expected))
        yield str(listing), expected, {"good": shards[0], "p": shards[2], "local": shards[1]}


def run_cli(args):
    result = CliRunner().invoke(main, [*args, *FAST, "--allow-pipes", "--json", "-q"])
    assert result.stdout.count('\n{') == 0 and result.stdout.startswith("{"), result.stdout
    return result.exit_code, json.loads(result.stdout)


def check_errors(errors: dict[str, str], expected: dict[str, str | None]) -> None:
    """Exactly the faulty inputs failed, each with its own reason, located at its URL or command."""
    assert set(errors) == {k for k, v in expected.items() if v is not None}
    for shard, error in errors.items():
        assert re.search(expected[shard], error), (shard, error)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_convert_fails_each_faulty_input_and_converts_the_rest(faulty_list, tmp_path, jobs):
    listing, expected, sources = faulty_list
    code, report = run_cli(["convert", listing, "-o", str(tmp_path / "out"), "-j", jobs, "--codec", "zst"])
    assert code == 1
    assert report["shards"] == len(expected) and report["ok"] == sum(v is None for v in expected.values())
    check_errors({f["shard"]: f["error"].removeprefix(f"{f['shard']}: ") for f in report["failures"]}, expected)
    listed = open(report["data_list"]).read().split()
    assert len(listed) == report["ok"]
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith(".partial")]
    # what came over the network is member for member the file it was served from
    for name in ("good", "flaky", "droponce", "gzip"):
        assert list(iter_shard_members(str(tmp_path / "out" / f"{name}.tar.zst"))) == \
            list(iter_shard_members(sources["good"]))
    assert list(iter_shard_members(str(tmp_path / "out" / "p.tar.zst"))) == list(iter_shard_members(sources["p"]))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_validate_reads_urls_and_pipes_and_reports_each_fault(faulty_list, jobs):
    listing, expected, _ = faulty_list
    code, report = run_cli(["validate", listing, "-j", jobs])
    assert code == 1
    by_shard = {s["shard"]: s for s in report["shards"]}
    assert list(by_shard) == list(expected)
    good = [s for s, v in expected.items() if v is None]
    assert [(by_shard[s]["utterances"] > 0, by_shard[s]["codec"]) for s in good] == [(True, "none")] * len(good)
    # the faults' shards all serve one file: its keys repeat, and only those findings concern good inputs
    findings = {f["shard"]: f for f in report["findings"] if f["check"] != "duplicate_key"}
    check_errors({s: f["message"] for s, f in findings.items()}, expected)
    checks = {s.split("/")[3] if "://" in s else s: f["check"] for s, f in findings.items()}
    assert checks["missing"] == "missing_file" and checks["closed"] == "input" and checks["loop"] == "input"
    assert checks["pipe:true"] == "empty_shard" and checks["pipe:sleep 30"] == "input"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_index_reads_urls_and_pipes_and_names_each_fault(faulty_list, tmp_path, jobs):
    listing, expected, _ = faulty_list
    code, report = run_cli(["index", listing, "-o", str(tmp_path / "all.jsonl"), "-j", jobs])
    assert code == 1
    assert report["shards"] == len(expected)
    check_errors({f["shard"]: f["error"].removeprefix(f"{f['shard']}: ") for f in report["failures"]}, expected)


@pytest.mark.timeout(120)
def test_index_of_a_pipe_input_matches_the_file(make_shards, tmp_path):
    shard = make_shards("none")[0]
    (tmp_path / "one.list").write_text(f"pipe:cat {shlex.quote(shard)}\n")
    runner = CliRunner()
    assert runner.invoke(main, ["index", shard, "-o", str(tmp_path / "file.jsonl"), "-q"]).exit_code == 0
    result = runner.invoke(main, ["index", str(tmp_path / "one.list"), "-o", str(tmp_path / "pipe.jsonl"), "-q",
                                  "--allow-pipes"])
    assert result.exit_code == 0, result.output
    file_records = list(iter_index(str(tmp_path / "file.jsonl")))
    pipe_records = list(iter_index(str(tmp_path / "pipe.jsonl")))
    assert len(file_records) == 5
    assert [{**r, "shard": None} for r in pipe_records] == [{**r, "shard": None} for r in file_records]
    # a pipe's source cannot be stamped (no file to stat): the file's index has a stamp, the pipe's none
    assert index_marks(str(tmp_path / "file.jsonl")).sources and not index_marks(str(tmp_path / "pipe.jsonl")).sources


# --- pipe: commands run only when asked ---------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["convert", "validate", "index"])
def test_a_pipe_line_runs_no_command_unless_allowed(make_shards, tmp_path, monkeypatch, command):
    shard, other = make_shards("none")[:2]
    marker = tmp_path / "MARKER"
    (tmp_path / "in.list").write_text(f"pipe:touch {shlex.quote(str(marker))}; cat {shlex.quote(shard)}\n{other}\n")
    extra = {"convert": ["-o", str(tmp_path / "out")], "index": ["-o", str(tmp_path / "i.jsonl")], "validate": []}
    args = [command, str(tmp_path / "in.list"), *extra[command], "-q", "--json", "-j", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and not marker.exists()
    assert "refusing to run the command of a pipe: input" in result.stdout and "--allow-pipes" in result.stdout
    assert "SHARDKIT_ALLOW_PIPES=1" in result.stdout
    monkeypatch.setenv("SHARDKIT_ALLOW_PIPES", "1")
    overwrite = ["--overwrite"] if command == "convert" else []
    result = CliRunner().invoke(main, [*args, *overwrite])
    assert result.exit_code == 0, result.stdout
    assert marker.exists()


def test_the_training_reader_refuses_pipes_unless_allowed(make_shards, tmp_path):
    from shardkit.training.reader import iter_samples

    shard = make_shards("none")[0]
    marker = tmp_path / "MARKER"
    line = f"pipe:touch {shlex.quote(str(marker))}; cat {shlex.quote(shard)}"
    with pytest.raises(ShardkitError, match="allow_pipes=True"):
        list(iter_samples([line], decode=False))
    assert not marker.exists()
    assert [s["key"] for s in iter_samples([line], decode=False, allow_pipes=True)] == \
        [s["key"] for s in iter_samples([shard], decode=False)]
    assert marker.exists()


def test_a_stalled_pipe_takes_its_whole_process_group_with_it(tmp_path):
    from shardkit.io.remote import open_input

    configure_io(read_timeout=1)
    child = tmp_path / "child.pid"
    # the command leaves a child of its own running; the stall must end it too
    with pytest.raises(ShardkitError, match="command stalled: no output for 1 s after 0 bytes"):
        with open_input(f"pipe:sleep 60 & echo $! > {shlex.quote(str(child))}; wait", allow_pipes=True) as f:
            f.read()
    pid = int(child.read_text())

    def running() -> bool:  # a zombie (killed, not yet reaped by whoever adopted it) runs nothing
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    for _ in range(50):
        if not running():
            break
        time.sleep(0.1)
    assert not running()


def test_io_timeout_option_is_checked():
    result = CliRunner().invoke(main, ["validate", "x.tar", "--io-timeout", "0"])
    assert result.exit_code == 2 and "--io-timeout takes READ or CONNECT:READ seconds" in result.output
    CliRunner().invoke(main, ["validate", "/nonexistent.tar", "--io-timeout", "5:60", "--io-retries", "0", "-q"])
    assert (io_settings().connect_timeout, io_settings().read_timeout, io_settings().retries) == (5, 60, 0)


# --- S3 (moto on 127.0.0.1) -----------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_s3_missing_key_fails_its_shard_only(make_shards, tmp_path, monkeypatch):
    import fsspec

    shards = make_shards("none", utts_per_shard=4)
    with moto_s3() as (fs, options):
        monkeypatch.setitem(fsspec.config.conf, "s3", options)
        fs.put_file(shards[0], "corpus/in/a.tar")
        inputs = ["s3://corpus/in/a.tar", "s3://corpus/in/absent.tar", shards[1]]
        (tmp_path / "s3.list").write_text("".join(f"{line}\n" for line in inputs))
        code, report = run_cli(["convert", str(tmp_path / "s3.list"), "-o", str(tmp_path / "out"), "-j", "1",
                                "--codec", "zst"])
        assert code == 1 and report["ok"] == 2
        assert report["failures"] == [{"shard": "s3://corpus/in/absent.tar",
                                       "error": "s3://corpus/in/absent.tar: no such file or object"}]
        code, report = run_cli(["validate", str(tmp_path / "s3.list"), "-j", "1"])
        assert code == 1 and [(f["shard"], f["check"]) for f in report["findings"]] == \
            [("s3://corpus/in/absent.tar", "missing_file")]
        # an upload that fails mid-way fails that shard cleanly: no object, no temporary key, no local file
        import s3fs

        put_file = s3fs.S3FileSystem._put_file

        async def failing_put(self, lpath, rpath, *args, **kwargs):
            if "shards_000000001" in rpath:
                raise ConnectionResetError(104, "Connection reset by peer")
            return await put_file(self, lpath, rpath, *args, **kwargs)

        monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", failing_put)
        s3fs.S3FileSystem.clear_instance_cache()  # instances bind their sync methods when made
        code, report = run_cli(["convert", str(tmp_path / "s3.list"), "-o", "s3://corpus/faults-out", "-j", "1",
                                "--codec", "zst"])
        assert code == 1 and report["ok"] == 1
        assert [f["shard"] for f in report["failures"]] == ["s3://corpus/in/absent.tar", shards[1]]
        assert "cannot publish" in report["failures"][1]["error"]
        fs.invalidate_cache()
        assert sorted(os.path.basename(k) for k in fs.ls("corpus/faults-out", detail=False)) == \
            ["a.tar.zst", "convert.json", "data.partial.list"]  # a failed shard: the list says it is partial
        assert not [n for n in os.listdir(tempfile.gettempdir()) if "shards_000000001" in n and "partial" in n]


# --- every exception in a task is that shard's finding --------------------------------------------------


def _raise_value_error(task):
    if task == "bad":
        raise ValueError("a library's own exception")
    return task.upper()


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_tasks_turns_any_task_exception_into_that_tasks_result(jobs):
    from shardkit.run.executor import run_tasks

    results = dict(run_tasks(_raise_value_error, ["a", "bad", "c"], jobs=jobs, ordered=True,
                             on_error=lambda task, err: f"failed {task}: {err.reason}"))
    assert results == {0: "A", 1: "failed bad: task raised ValueError: a library's own exception", 2: "C"}


def test_a_lost_cluster_is_exit_code_3_with_one_json_document_and_a_rerun_resumes(make_shards, tmp_path,
                                                                                   monkeypatch):
    import shardkit.run.executor as executor  # convert runs its tasks through RunOptions.run_tasks, i.e. here

    shards = make_shards("none", utts_per_shard=4)
    real = executor.run_tasks

    def losing(fn, tasks, **kwargs):
        for k, (index, entry) in enumerate(real(fn, tasks, **kwargs)):
            if k == 1:
                raise ClusterError("lost the Ray cluster: its head at 10.0.0.1:6379 has not answered for 20 s")
            yield index, entry

    monkeypatch.setattr(executor, "run_tasks", losing)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", *shards, "-o", str(out), "-j", "1", "--json", "-q"])
    assert result.exit_code == 3
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 3 and "lost the Ray cluster" in doc["error"]
    assert not [n for n in os.listdir(out) if n.endswith((".partial", ".lock"))]
    monkeypatch.setattr(executor, "run_tasks", real)
    result = CliRunner().invoke(main, ["convert", *shards, "-o", str(out), "-j", "1", "--json", "-q"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["this_run"]["skipped"] == 1 and report["ok"] == len(shards) - 1


def test_a_head_that_stops_answering_is_a_cluster_error(monkeypatch):
    """The watch that ends a run as ClusterError before Ray's own 60 s wait ends the process with status 1."""
    import socket
    import types

    from shardkit.run import executor

    with socket.socket() as s:  # a port that nobody listens on: the head is gone
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake_ray = types.SimpleNamespace(
        get_runtime_context=lambda: types.SimpleNamespace(gcs_address=f"127.0.0.1:{port}"),
        wait=lambda refs, num_returns, timeout: ([], refs),
        exceptions=types.SimpleNamespace(RaySystemError=RuntimeError))
    monkeypatch.setattr(executor, "CLUSTER_LOST_SECONDS", 0.0)
    watch = executor._ClusterWatch(fake_ray)
    with pytest.raises(ClusterError) as err:
        executor._wait_one(fake_ray, {"ref": 0}, watch)
    assert err.value.exit_code == 3 and watch.lost
    assert str(err.value).startswith(f"lost the Ray cluster: its head at 127.0.0.1:{port} has not answered for ")


@pytest.mark.parametrize("command", ["convert", "validate", "index"])
def test_a_library_exception_inside_a_task_fails_that_shard_only(make_shards, tmp_path, monkeypatch, command):
    import aiohttp

    import shardkit.commands.convert as convert
    import shardkit.commands.index as index
    import shardkit.commands.validate as validate

    shards = make_shards("none", utts_per_shard=4)
    bad = shards[1]

    def raising(real):
        def task(*args, **kwargs):
            if bad in (args[0] if isinstance(args[0], tuple) else args):
                raise aiohttp.ClientPayloadError("Response payload is not completed")
            return real(*args, **kwargs)
        return task

    where = {"convert": (convert, "_task"), "validate": (validate, "_validate_task"), "index": (index, "_index_task")}
    module, name = where[command]
    monkeypatch.setattr(module, name, raising(getattr(module, name)))
    extra = {"convert": ["-o", str(tmp_path / "out")], "index": ["-o", str(tmp_path / "i.jsonl")], "validate": []}
    result = CliRunner().invoke(main, [command, *shards, *extra[command], "-j", "1", "--json", "-q"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    message = f"{bad}: task raised ClientPayloadError: Response payload is not completed"
    if command == "validate":
        assert [(f["shard"], f["check"], f["message"]) for f in report["findings"]] == \
            [(bad, "task", "task raised ClientPayloadError: Response payload is not completed")]
    else:
        assert report["failures"] == [{"shard": bad, "error": message}]
        assert report["shards"] == len(shards)
