"""convert's read-back verification and its decoder threads per task (issue 17)."""

import json
import os

import pytest

from shardkit.run.options import RunOptions
from shardkit.commands import convert as convert_module
from shardkit.commands.convert import (
    ConvertSettings,
    combine_digests,
    convert_shard,
    member_digest,
    run_convert,
    task_threads,
    threads_per_task,
    wave_threads,
)
from shardkit.io import readback as readback_module
from shardkit.io.readback import ReadBackWhileWriting
from shardkit.io.tar import TarWriter, iter_shard_members


class _FlippingTarWriter(TarWriter):
    """A writer with a bug: the second member's last byte goes to disk flipped (size unchanged)."""

    def add(self, name, data):
        if self.members == 1:
            data = data[:-1] + bytes([data[-1] ^ 0x01])
        super().add(name, data)


class _DroppingTarWriter(TarWriter):
    """A writer with a bug: the third member never reaches the tar."""

    def add(self, name, data):
        if self.members == 2 and not getattr(self, "dropped", False):
            self.dropped = True
            return
        super().add(name, data)


@pytest.mark.parametrize("codec", ["zst", "none"])
@pytest.mark.parametrize("writer", [_FlippingTarWriter, _DroppingTarWriter])
def test_readback_catches_a_member_written_wrong(make_shards, tmp_path, monkeypatch, codec, writer):
    src = make_shards("bz2", utts_per_shard=3)[0]
    monkeypatch.setattr(convert_module, "TarWriter", writer)
    dst = str(tmp_path / f"out.tar{'.zst' if codec == 'zst' else ''}")
    entry = convert_shard(src, dst, ConvertSettings(codec=codec))
    assert entry["status"] == "failed"
    assert "does not read back as written" in entry["error"]
    assert not os.path.exists(dst) and os.listdir(tmp_path) == []  # nothing published, no temporary left


def test_without_verify_the_same_bug_goes_through(make_shards, tmp_path, monkeypatch):
    """The read-back is what catches it (the test above cannot pass by accident)."""
    src = make_shards("bz2", utts_per_shard=3)[0]
    monkeypatch.setattr(convert_module, "TarWriter", _FlippingTarWriter)
    entry = convert_shard(src, str(tmp_path / "out.tar.zst"), ConvertSettings(verify=False))
    assert entry["status"] == "ok"


def test_members_digest_is_the_sha256_of_the_members_as_read_back(make_shards, tmp_path):
    src = make_shards("bz2", utts_per_shard=3)[0]
    dst = str(tmp_path / "out.tar.zst")
    entry = convert_shard(src, dst, ConvertSettings())
    assert entry["status"] == "ok"
    back = [(name, member_digest(name, data)) for name, data in iter_shard_members(dst)]
    assert entry["members_digest"] == combine_digests(back)
    assert entry["members"] == len(back) > 0


@pytest.mark.parametrize("cores,jobs,not_started,expected", [
    (2, 2, 5, 1), (2, 2, 2, 1), (2, 2, 1, 2), (16, 16, 3, 5), (16, 4, 40, 4), (16, 4, 1, 16), (2, 4, 1, 2),
    (2, 4, 3, 1), (1, 1, 1, 1)])
def test_task_threads_share_the_cores_among_the_shards_that_can_still_run(cores, jobs, not_started, expected):
    assert task_threads(cores, jobs, not_started) == expected


def test_the_last_shards_get_the_idle_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    settings = ConvertSettings(threads=None)
    tasks = [(f"s{i}.tar.bz2", f"o{i}.tar.zst", settings) for i in range(6)]
    extra = threads_per_task(tasks, 2, "local")
    assert extra["max_in_flight"] == 2  # submitting a task is starting it
    assert [extra["prepare"](t)[2].threads for t in tasks] == [2, 2, 2, 2, 2, 4]
    assert extra["prepare"](tasks[5])[:2] == tasks[5][:2]
    ray = threads_per_task(tasks, 2, "ray")
    assert "max_in_flight" not in ray and {ray["prepare"](t)[2].threads for t in tasks} == {1}


@pytest.mark.parametrize("sizes,cores,expected", [
    ([10] * 16, 16, [1] * 16), ([10, 10, 10], 16, [5, 5, 5]), ([30, 70], 2, [1, 1]),
    ([1] * 15 + [5], 16, [1] * 15 + [4]), ([1, 1000], 16, [1, 16]), ([0, 0], 4, [2, 2])])
def test_shards_that_start_together_share_the_cores_by_size(sizes, cores, expected):
    assert wave_threads(sizes, cores) == expected


def test_a_larger_shard_started_with_the_others_gets_more_threads(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    settings = ConvertSettings(threads=None)
    tasks = []
    for i, size in enumerate((100, 100, 100, 500)):
        (tmp_path / f"s{i}.tar.bz2").write_bytes(b"x" * size)
        tasks.append((str(tmp_path / f"s{i}.tar.bz2"), f"o{i}.tar.zst", settings))
    extra = threads_per_task(tasks, None, "local")
    assert [extra["prepare"](t)[2].threads for t in tasks] == [1, 1, 1, 5]
    # not every shard can start at once, or a source is not a local file: the rule by jobs, as before
    assert [threads_per_task(tasks, 2, "local")["prepare"](t)[2].threads for t in tasks] == [4, 4, 4, 8]
    piped = tasks[:3] + [("-", "o3.tar.zst", settings)]
    assert [threads_per_task(piped, None, "local")["prepare"](t)[2].threads for t in piped] == [2, 2, 4, 8]


def test_default_threads_give_the_same_bytes_for_any_jobs(make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=3)
    outputs = {}
    for jobs, threads in ((1, 1), (1, None), (2, None), (3, None)):
        out = tmp_path / f"j{jobs}-{threads}"
        report = run_convert(sources, str(out), ConvertSettings(threads=threads), RunOptions(jobs=jobs))
        assert report.exit_code == 0
        outputs[jobs, threads] = [open(e["output"]["path"], "rb").read() for e in report.shards]
        manifest = json.load(open(out / "convert.json"))
        assert manifest["settings"]["threads"] == threads
    assert len({tuple(v) for v in outputs.values()}) == 1


@pytest.mark.parametrize("codec", ["zst", "none"])
def test_readback_reads_the_file_not_the_bytes_handed_to_it(make_shards, tmp_path, monkeypatch, codec):
    """A byte damaged in the temporary file itself, after the writer handed it over, fails the shard:
    the read-back beside the writing reads the file through its own descriptor."""
    src = make_shards("bz2", utts_per_shard=3)[0]
    real_verify = ReadBackWhileWriting.verify

    def damaged_then_verified(self, tmp):
        with open(tmp, "r+b") as f:
            f.seek(os.path.getsize(tmp) // 3)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        return real_verify(self, tmp)

    monkeypatch.setattr(ReadBackWhileWriting, "verify", damaged_then_verified)
    dst = str(tmp_path / f"out.tar{'.zst' if codec == 'zst' else ''}")
    entry = convert_shard(src, dst, ConvertSettings(codec=codec))
    assert entry["status"] == "failed"
    assert ("does not read back as written" in entry["error"] if codec == "none"
            else "zst stream is truncated or corrupt" in entry["error"])
    assert not os.path.exists(dst) and os.listdir(tmp_path) == []


@pytest.mark.parametrize("codec", ["zst", "gz", "none"])
def test_readback_beside_the_writing_gives_the_bytes_of_an_unverified_write(make_shards, tmp_path, monkeypatch,
                                                                           codec):
    """With a wake-up for every write, the read-back runs interleaved with the writing (as on MiB-sized
    shards); the shard is the same bytes as written without it, and its members read back."""
    monkeypatch.setattr(readback_module, "NOTIFY_BYTES", 1)
    src = make_shards("bz2", utts_per_shard=3)[0]
    suffix = {"zst": ".zst", "gz": ".gz", "none": ""}[codec]
    verified = convert_shard(src, str(tmp_path / f"v.tar{suffix}"), ConvertSettings(codec=codec))
    unverified = convert_shard(src, str(tmp_path / f"u.tar{suffix}"), ConvertSettings(codec=codec, verify=False))
    assert verified["status"] == unverified["status"] == "ok"
    assert verified["output"]["sha256"] == unverified["output"]["sha256"]
    assert open(tmp_path / f"v.tar{suffix}", "rb").read() == open(tmp_path / f"u.tar{suffix}", "rb").read()
    assert verified["members"] == unverified["members"] > 0


def test_the_cli_starts_the_forkserver_with_the_modules_the_workers_need():
    """The CLI names them before importing the command (so its own imports overlap the server's); the
    library preloads the same list for a caller without the CLI."""
    from shardkit.cli import convert as cli_convert

    assert cli_convert._WORKER_MODULES == convert_module.WORKER_MODULES
    assert cli_convert._AUDIO_WORKER_MODULES == convert_module.AUDIO_WORKER_MODULES


def test_a_pool_run_preloads_the_workers_modules(make_shards, tmp_path, monkeypatch):
    from shardkit.run import executor

    asked = []
    monkeypatch.setattr(executor, "preload_in_forkserver", asked.append)
    report = run_convert(make_shards("bz2", utts_per_shard=2), str(tmp_path / "o"), ConvertSettings(),
                         RunOptions(jobs=2))
    assert report.exit_code == 0 and asked == [convert_module.WORKER_MODULES]


def test_a_pool_run_with_audio_preloads_the_transcoder_too(make_shards, tmp_path, monkeypatch):
    """Each worker would otherwise import soundfile and libFLAC's wrapper itself."""
    from shardkit.run import executor

    asked = []
    monkeypatch.setattr(executor, "preload_in_forkserver", asked.append)
    report = run_convert(make_shards("none", utts_per_shard=2), str(tmp_path / "o"),
                         ConvertSettings(codec="none", level=None, audio="flac"), RunOptions(jobs=2))
    assert report.exit_code == 0 and asked == [convert_module.WORKER_MODULES + ["shardkit.io.transcode"]]
    assert report.summary()["audio"]["transcoded"] > 0


def _jobs_asked(monkeypatch) -> list:
    from shardkit.run.options import RunOptions as Options

    asked, real = [], Options.run_tasks

    def spy(self, fn, tasks, **kwargs):
        asked.append(kwargs.get("jobs", self.jobs))
        return real(self, fn, tasks, **kwargs)

    monkeypatch.setattr(Options, "run_tasks", spy)
    return asked


def test_a_small_bz2_run_decodes_in_one_process_each_shard_on_every_core(make_shards, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(convert_module, "usable_cores", lambda: 2)
    asked = _jobs_asked(monkeypatch)
    sources = make_shards("bz2", utts_per_shard=2)
    report = run_convert(sources, str(tmp_path / "small"), ConvertSettings(threads=None), RunOptions())
    assert report.exit_code == 0 and asked == [1]  # no pool
    manifest = json.load(open(tmp_path / "small" / "convert.json"))
    assert manifest["settings"]["threads"] is None
    # past the size, or with jobs or threads given, the pool as before
    from shardkit.io import codecs

    monkeypatch.setattr(codecs, "ONE_PROCESS_BZ2_BYTES", 1)
    run_convert(sources, str(tmp_path / "big"), ConvertSettings(threads=None), RunOptions())
    run_convert(sources, str(tmp_path / "j2"), ConvertSettings(threads=None), RunOptions(jobs=2))
    assert asked == [1, None, 2]


def test_the_one_process_rule_takes_only_local_bz2_files_within_the_size(make_shards, tmp_path, monkeypatch):
    from shardkit.io import codecs

    bz2 = make_shards("bz2", utts_per_shard=2)
    total = sum(os.path.getsize(p) for p in bz2)
    assert codecs.bz2_fits_one_process(bz2, 1)  # one core: no pool to weigh against
    # the limit is ONE_PROCESS_BZ2_BYTES / (1 - 1/cores): twice it on 2 cores, 16/15 of it on 16
    monkeypatch.setattr(codecs, "ONE_PROCESS_BZ2_BYTES", (total + 1) // 2)
    assert codecs.bz2_fits_one_process(bz2, 1) and codecs.bz2_fits_one_process(bz2, 2)
    assert not codecs.bz2_fits_one_process(bz2, 16)
    monkeypatch.setattr(codecs, "ONE_PROCESS_BZ2_BYTES", -(-total * 15 // 16))
    assert codecs.bz2_fits_one_process(bz2, 16) and not codecs.bz2_fits_one_process(bz2, 17)
    assert not codecs.bz2_fits_one_process(make_shards("gz", utts_per_shard=2), 2)
    assert not codecs.bz2_fits_one_process(bz2 + [str(tmp_path / "missing.tar.bz2")], 2)
    assert not codecs.bz2_fits_one_process(bz2 + ["-"], 2)
    assert not codecs.bz2_fits_one_process([str(tmp_path)], 2)
    assert not codecs.bz2_fits_one_process([], 2)


def test_the_one_process_rule_never_opens_a_fifo(tmp_path):
    from shardkit.io import codecs

    fifo = tmp_path / "shard.tar.bz2"
    os.mkfifo(fifo)
    assert not codecs.bz2_fits_one_process([str(fifo)], 2)  # returns at once: no writer ever comes
