"""The run around the data (issue 37, part 1): a disk that fills or fails at any write, SIGINT and SIGTERM at
chosen points (inside soundfile's C callbacks, in the middle of a write, to the main process of a pool), for
every writer: convert, index, balance, prep, make, validate's quarantine and merge-reports.

What each case holds a run to (the rule of ARCHITECTURE.md, "What a run leaves"): exit 1 (a full or failing
disk), 2 (an unusable output path), 130 (SIGINT) or 143 (SIGTERM); one JSON document under --json; the file
it was writing named on one line; no temporary file, spool or scratch folder left; every file under a final
name complete; and the same command, rerun once there is room, finishes.

Full disks are real: a small tmpfs (root on Linux; skipped elsewhere), filled to leave a chosen number of
bytes. Other errnos (EIO, EDQUOT, EFBIG, EROFS) are injected at the files AtomicFile opens. Signals reach
subprocesses at points the fault hooks of ``fault_site/sitecustomize.py`` hold them at.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest
from support import REPO, run_cli

FAULT_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_site")
TEMPORARY = ("spool", "shardkit-balance-", ".write-probe")


# --- what every case checks ---------------------------------------------------------------------------


def leftovers(folder) -> list[str]:
    """Temporary files (``.NAME.<hex>.partial``), spools, scratch folders and locks below ``folder`` (none may
    outlive a run; ``data.partial.list`` and ``index.partial.parquet`` are a failed run's outputs, not these)."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(str(folder)), "**"), recursive=True) + \
            glob.glob(os.path.join(glob.escape(str(folder)), "**", ".*"), recursive=True):
        name = os.path.basename(path)
        temporary = name.startswith(".") and name.endswith(".partial")
        if temporary or any(part in name for part in TEMPORARY) or name.endswith(".lock") or name == ".balance":
            found.append(os.path.relpath(path, folder))
    return sorted(set(found))


def assert_final_names_complete(folder) -> None:
    """Every shard under a final name reads to its end with Python's tarfile (what WeNet reads), and every
    list names only shards that exist."""
    for path in glob.glob(os.path.join(glob.escape(str(folder)), "**", "*.tar*"), recursive=True):
        if path.endswith(".partial"):
            continue
        with tarfile.open(path, "r:*") as tar:
            for info in tar:
                if info.isreg():
                    assert len(tar.extractfile(info).read()) == info.size, path
    for listing in glob.glob(os.path.join(glob.escape(str(folder)), "**", "*.list"), recursive=True):
        base = os.path.dirname(listing)
        for line in open(listing, encoding="utf-8").read().split():
            assert os.path.isfile(os.path.join(base, line)), f"{listing} names {line}, which is not there"


def one_document(stdout: str) -> dict:
    """--json printed exactly one JSON document."""
    decoder = json.JSONDecoder()
    doc, end = decoder.raw_decode(stdout.lstrip())
    assert not stdout.lstrip()[end:].strip(), f"more than one document on stdout: {stdout!r}"
    return doc


# --- full disks (a real tmpfs) ---------------------------------------------------------------------------


def _mount(path, size: str) -> None:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or done.returncode})")


class SmallDisk:
    """A tmpfs at ``path``: :meth:`fill` leaves ``free`` bytes, :meth:`empty` frees them again."""

    def __init__(self, path):
        self.path = path
        self.filler = os.path.join(path, "filler")

    def fill(self, free: int) -> None:
        st = os.statvfs(self.path)
        with open(self.filler, "wb") as f:
            left = st.f_bavail * st.f_frsize - free
            while left > 0:
                left -= f.write(b"\0" * min(left, 1 << 20))

    def empty(self) -> None:
        os.unlink(self.filler)


@pytest.fixture
def small_disk(tmp_path):
    path = tmp_path / "disk"
    _mount(path, "16m")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two small corpora as plain shards (and gzip copies, which balance spools), and a Kaldi folder."""
    from support import SMALL_CORPORA, corpus

    from shardkit.io.synth import write_shards

    root = tmp_path_factory.mktemp("fault-sources")
    lists = {}
    for spec in SMALL_CORPORA[:2]:
        utts = corpus((spec,))
        lists[spec.name] = os.path.dirname(write_shards(utts, str(root / spec.name), utts_per_shard=3)[0])
        lists[spec.name + ".gz"] = os.path.dirname(write_shards(utts, str(root / (spec.name + "-gz")),
                                                                utts_per_shard=3, codec="gz")[0])
    kaldi = root / "kaldi"
    os.makedirs(kaldi / "wav")
    with open(kaldi / "wav.scp", "w") as scp, open(kaldi / "text", "w") as text:
        for key, words, audio, _ in corpus(SMALL_CORPORA[:2]):
            name = key.replace("/", "_")
            (kaldi / "wav" / f"{name}.wav").write_bytes(audio)
            scp.write(f"{name} {kaldi / 'wav' / name}.wav\n")
            text.write(f"{name} {words}\n")
    return {name: os.path.join(folder, "data.list") for name, folder in lists.items()} | {"kaldi": str(kaldi)}


def command_args(command: str, sources: dict, out: str) -> list[str]:
    a, b = sources["aishell"], sources["librispeech"]
    layout = ["--world-size", "1", "--num-workers", "2", "--num-shards", "2", "-o", out]
    return {
        "convert": ["convert", a, b, "-o", out, "--codec", "gz", "-j", "1"],
        "index": ["index", a, b, "-o", os.path.join(out, "mix.index.parquet"), "-j", "1"],
        "balance": ["balance", "--corpus", f"a={sources['aishell.gz']}", "--corpus",
                    f"b={sources['librispeech.gz']}", *layout],
        "prep": ["prep", "--corpus", f"a={a}", "--corpus", f"b={b}", "--sample-rate", "16000", "--channels", "1",
                 *layout],
        "make": ["make", "--wav-scp", os.path.join(sources["kaldi"], "wav.scp"), "--text",
                 os.path.join(sources["kaldi"], "text"), "-o", out, "--utts-per-shard", "4", "-j", "1"],
        # every utterance is a finding at 8 kHz: all of them go to rejects shards
        "validate": ["validate", a, "--sample-rate", "8000", "--quarantine", out, "-j", "1"],
    }[command]


# a finished validate with findings exits 1; everything else 0
FINISHED = {"validate": 1}
WRITERS = ["convert", "index", "balance", "prep", "make", "validate"]


@pytest.mark.parametrize("free", [0, 8 << 10, 96 << 10, 320 << 10])
@pytest.mark.parametrize("command", WRITERS)
def test_a_full_disk_at_any_write_is_exit_1_named_cleaned_up_and_resumed(command, free, sources, small_disk):
    out = os.path.join(small_disk.path, "out")
    args = command_args(command, sources, out)
    small_disk.fill(free)
    result = run_cli(*args, "--json")
    assert "Traceback" not in result.output and "Exception ignored" not in result.stderr, result.stderr
    doc = one_document(result.stdout)
    if result.exit_code != FINISHED.get(command, 0) or "error" in doc:  # it did not fit
        assert result.exit_code == 1, result.output
        named = [line for line in result.stderr.splitlines() if "No space left on device" in line]
        assert named and any(str(small_disk.path) in line for line in named), result.stderr
        assert doc.get("exit_code", 1) == 1
    assert leftovers(small_disk.path) == [], result.stderr
    assert_final_names_complete(small_disk.path)
    small_disk.empty()
    rerun = run_cli(*args, "--json")
    assert rerun.exit_code == FINISHED.get(command, 0), rerun.output
    assert "error" not in one_document(rerun.stdout)
    assert leftovers(small_disk.path) == []
    assert_final_names_complete(small_disk.path)
    assert not glob.glob(os.path.join(glob.escape(out), "*.partial.*")), "a finished rerun left a partial list/index"


@pytest.mark.parametrize("free", [0, 4 << 10])
def test_merge_reports_on_a_full_disk_names_its_file_and_a_rerun_merges(free, sources, small_disk):
    out = os.path.join(small_disk.path, "out")
    for i in (1, 2):
        done = run_cli(*command_args("convert", sources, out), "--split", f"{i}/2", "-q")
        assert done.exit_code == 0, done.output
    small_disk.fill(free)
    result = run_cli("merge-reports", out, "--command", "convert", "--json")
    assert result.exit_code == 1, result.output
    assert one_document(result.stdout)["exit_code"] == 1
    assert "No space left on device" in result.stderr and str(small_disk.path) in result.stderr
    assert leftovers(small_disk.path) == [] and not os.path.exists(os.path.join(out, "data.list"))
    small_disk.empty()
    assert run_cli("merge-reports", out, "--command", "convert", "-q").exit_code == 0
    assert leftovers(small_disk.path) == [] and os.path.exists(os.path.join(out, "data.list"))


# --- other errnos, injected where AtomicFile opens its temporary file ---------------------------------------


@pytest.fixture
def failing_writes(monkeypatch):
    """``fail(errno, after=N, names=SUBSTRING)``: files opened for writing through ``os.fdopen`` (every
    AtomicFile) whose path holds SUBSTRING raise OSError(errno) once N bytes were written to them."""

    def fail(code: int, *, after: int = 0, names: str = ""):
        real_fdopen = os.fdopen

        class Failing:
            def __init__(self, f, path):
                self._f, self._path, self._left = f, path, after

            def write(self, data):
                if len(data) > self._left:
                    raise OSError(code, os.strerror(code))
                self._left -= len(data)
                return self._f.write(data)

            def __getattr__(self, name):
                return getattr(self._f, name)

        def fdopen(fd, mode="r", *args, **kwargs):
            f = real_fdopen(fd, mode, *args, **kwargs)
            path = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
            return Failing(f, path) if "w" in mode and names in path else f

        monkeypatch.setattr(os, "fdopen", fdopen)

    return fail


@pytest.mark.parametrize("code", [errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS])
@pytest.mark.parametrize("command", ["convert", "prep", "make"])
def test_a_failing_disk_names_the_file_and_leaves_no_temporary_file(command, code, sources, tmp_path,
                                                                    failing_writes):
    out = str(tmp_path / "out")
    failing_writes(code, after=20000, names=".tar")
    result = run_cli(*command_args(command, sources, out), "--json")
    assert "Traceback" not in result.output, result.output
    doc = one_document(result.stdout)
    # a full or failing disk: 1; a read-only one: the output path is unusable, 2 (a shard's failure is 1)
    assert result.exit_code == (1 if code != errno.EROFS else result.exit_code) and result.exit_code in (1, 2)
    assert doc.get("exit_code", result.exit_code) == result.exit_code
    named = [line for line in result.stderr.splitlines() if os.strerror(code) in line]
    assert named and any(out in line for line in named), result.stderr
    assert leftovers(tmp_path) == []
    assert_final_names_complete(out)


def test_efbig_from_the_kernel_file_size_limit_is_exit_1_naming_the_shard(sources, tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse a write past N bytes with EFBIG (Python ignores SIGXFSZ): a real
    failing write, without root."""
    import resource

    out = str(tmp_path / "out")
    limit = 60000

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "shardkit", *command_args("prep", sources, out), "--json"],
                          capture_output=True, text=True, env=_env(), preexec_fn=limited, timeout=300)
    assert done.returncode == 1, done.stderr
    assert one_document(done.stdout)["exit_code"] == 1
    assert "Traceback" not in done.stderr and "File too large" in done.stderr and out in done.stderr
    assert leftovers(tmp_path) == []
    rerun = subprocess.run([sys.executable, "-m", "shardkit", *command_args("prep", sources, out), "-q"],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr


# --- signals at chosen points ---------------------------------------------------------------------------


def _env(**faults) -> dict:
    path = os.pathsep.join([FAULT_SITE, REPO, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **{k: str(v) for k, v in faults.items()}}


def _start(args: list[str], **faults) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardkit", *args, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(**faults), start_new_session=True)


def _stalled(mark: str, proc: subprocess.Popen, timeout: float = 120) -> str:
    """The temporary file a stalled commit holds (the fault hook names it in ``mark.<pid>``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = glob.glob(glob.escape(mark) + ".*")
        if found:
            time.sleep(0.05)  # the hook writes the name, then sleeps
            return open(found[0]).read()
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the run never reached the stalled commit: {proc.communicate()}")


def test_sigint_inside_soundfiles_callback_stops_convert_audio_flac_with_130_and_a_rerun_resumes(make_shards,
                                                                                                tmp_path):
    """Ctrl-C while libsndfile calls back into Python (FLAC encoding writes through soundfile's cffi callbacks):
    the KeyboardInterrupt raised there is swallowed by cffi; the run must still stop (it went on to exit 0)."""
    # the Ctrl-C comes during the first member's encoding
    _interrupted_flac_convert_exits_130_and_resumes(make_shards, tmp_path, SHARDKIT_TEST_SIGINT_IN_SOUNDFILE=3)


def test_sigint_inside_libflacs_write_callback_stops_convert_audio_flac_with_130_and_a_rerun_resumes(make_shards,
                                                                                                    tmp_path):
    """Ctrl-C while libFLAC calls back into Python (the verified FLAC path writes each frame through a ctypes
    callback, which would print and drop the raise): the encoder stops, the run exits 130, and resumes."""
    from shardkit.io import libflac

    if libflac.encoder_library(None) is None:
        pytest.skip("no libFLAC writing soundfile's bytes here (pip install shardkit[flac])")
    # the Ctrl-C comes during the first member's encoding
    _interrupted_flac_convert_exits_130_and_resumes(make_shards, tmp_path, SHARDKIT_TEST_SIGINT_IN_LIBFLAC=2)


def _interrupted_flac_convert_exits_130_and_resumes(make_shards, tmp_path, **fault) -> None:
    """``convert --audio flac -j 1`` with a Ctrl-C raised where ``fault`` says: exit 130 with the one JSON
    document, no traceback, no temporary file left, and a rerun that finishes every shard."""
    shards = make_shards("none", utts_per_shard=2)
    out = str(tmp_path / "out")
    args = ["convert", *shards, "--audio", "flac", "-j", "1", "-o", out]
    proc = _start(args, **fault)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert one_document(stdout) == {"command": "convert", "error": "interrupted", "exit_code": 130}
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert leftovers(out) == []
    rerun = subprocess.run([sys.executable, "-m", "shardkit", *args, "--json"], capture_output=True, text=True,
                           env=_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["ok"] + json.loads(rerun.stdout)["skipped"] == len(shards)


SIGNALLED = [("convert", signal.SIGTERM, []), ("convert", signal.SIGTERM, ["-j", "2"]),
             ("convert", signal.SIGINT, ["-j", "2"]), ("index", signal.SIGTERM, []),
             ("balance", signal.SIGTERM, []), ("prep", signal.SIGTERM, []), ("make", signal.SIGTERM, []),
             ("validate", signal.SIGTERM, [])]


@pytest.mark.parametrize("command,signum,extra", SIGNALLED, ids=lambda v: getattr(v, "name", None) or str(v))
def test_a_signal_to_the_main_process_mid_write_cleans_up_and_the_rerun_finishes(command, signum, extra, sources,
                                                                               tmp_path):
    """The signal reaches the main process only (a scheduler's SIGTERM, `kill PID`) while a commit is held,
    its temporary file written and not renamed (in a pool worker with -j 2)."""
    out = str(tmp_path / "out")
    scratch = tmp_path / "tmp"
    os.makedirs(scratch)
    args = [*command_args(command, sources, out), *extra]
    if "-j" in extra:
        args = [a for i, a in enumerate(args) if not (a == "-j" and args[i + 1] == "1") and
                not (a == "1" and args[i - 1] == "-j")]
    mark = str(tmp_path / "stalled")
    proc = _start(args, SHARDKIT_TEST_STALL_COMMIT=1, SHARDKIT_TEST_MARK=mark, TMPDIR=scratch)
    held = _stalled(mark, proc)
    assert os.path.exists(held)
    started = time.monotonic()
    os.kill(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert time.monotonic() - started < 30, "the run waited for its tasks instead of stopping"
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    assert proc.returncode == 128 + signum, stderr
    assert one_document(stdout) == {"command": command, "error": word, "exit_code": 128 + signum}
    assert stderr.strip().splitlines()[-1].startswith(f"{word}: finished shards are kept"), stderr
    assert "Traceback" not in stderr, stderr
    assert not os.path.exists(held)
    assert leftovers(tmp_path) == [] and os.listdir(scratch) == []
    assert_final_names_complete(out if os.path.isdir(out) else tmp_path)
    rerun = subprocess.run([sys.executable, "-m", "shardkit", *args, "-q"], capture_output=True, text=True,
                           env=_env(TMPDIR=scratch), timeout=300)
    assert rerun.returncode == FINISHED.get(command, 0), rerun.stderr
    assert leftovers(tmp_path) == [] and os.listdir(scratch) == []


def test_a_swallowed_interrupt_is_raised_again_at_the_next_checkpoint():
    """The mechanism itself: a SIGINT handled inside soundfile's callback does not escape soundfile, and
    ``interrupts.check`` raises it afterwards (SIGTERM alike, with its own exit code)."""
    import io

    import numpy as np
    import soundfile

    from shardkit.io import interrupts

    class Signalling(io.BytesIO):
        def write(self, data):
            os.kill(os.getpid(), signal.SIGINT)
            return super().write(data)

    with interrupts.handling_signals():
        try:  # cffi swallows the raise: the write goes on, or fails as libsndfile's error, never as the interrupt
            soundfile.write(Signalling(), np.zeros(16000, np.int16), 16000, format="FLAC")
        except soundfile.LibsndfileError:
            pass
        assert interrupts.received() == signal.SIGINT
        with pytest.raises(interrupts.Interrupted) as caught:
            interrupts.check()
        assert caught.value.exit_code == 130 and caught.value.error == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and interrupts.received() is None
    assert interrupts.Interrupted(signal.SIGTERM).exit_code == 143


# --- what a killed run (SIGKILL: no cleanup at all) leaves, the next run removes ------------------------------


def test_the_temporary_files_of_a_killed_run_go_with_the_rerun_index_parts_and_balance_scratch_included(
        sources, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert run_cli(*command_args("convert", sources, str(out)), "-q").exit_code == 0
    shard = sorted(glob.glob(str(out / "**" / "*.tar.gz"), recursive=True))[0]
    folder, name = os.path.split(shard)
    killed = [os.path.join(folder, f".{name}.0123456789ab.partial"),
              os.path.join(folder, ".index", f".{name}.jsonl.0123456789ab.partial")]
    for path in killed:
        open(path, "wb").close()
    assert run_cli(*command_args("convert", sources, str(out)), "-q").exit_code == 0
    assert [p for p in killed if os.path.exists(p)] == []

    scratch = tmp_path / "tmp"
    os.makedirs(scratch)
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    from shardkit.commands.balance import _scratch_prefix

    os.makedirs(scratch / f"{_scratch_prefix(dead.pid)}x1y2z3" / "index")
    os.makedirs(scratch / f"{_scratch_prefix(os.getppid())}live")  # a live run's stays
    assert run_cli(*command_args("balance", sources, str(tmp_path / "balanced")), "-q").exit_code == 0
    assert [n for n in os.listdir(scratch) if n.startswith("shardkit-")] == [f"{_scratch_prefix(os.getppid())}live"]


def test_a_failed_parquet_index_leaves_no_temporary_file_and_no_writer_complaint(sources, tmp_path):
    """A shard that fails while a Parquet index is written: the index is not written, and pyarrow's writer is
    closed with its file (it used to print "Exception ignored in ParquetWriter.__del__ ... write to closed
    file" when collected)."""
    good = sorted(glob.glob(os.path.join(os.path.dirname(sources["aishell"]), "*.tar")))[0]
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(open(good, "rb").read()[:3000])
    out = tmp_path / "out" / "mix.index.parquet"
    done = subprocess.run([sys.executable, "-m", "shardkit", "index", good, str(truncated), "-o", str(out), "-j",
                           "1", "--json"], capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 1, done.stderr
    assert one_document(done.stdout)["failed"] == 1
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_two_runs_of_one_balance_slice_at_once_one_refused_leave_no_empty_work_folder(sources, tmp_path):
    """The issue's case: two `balance --split 2/2` at once over indexed corpora (no shared indexes to keep):
    the second is refused naming the holder, and OUT/.balance does not outlive the first."""
    indexes = []
    for name in ("aishell.gz", "librispeech.gz"):
        path = tmp_path / f"{name}.index.parquet"
        assert run_cli("index", sources[name], "-o", path, "-q").exit_code == 0
        indexes += ["--corpus", f"{name.split('.')[0]}={path}"]
    out = tmp_path / "out"
    args = ["balance", *indexes, "--world-size", "1", "--num-workers", "2", "--num-shards", "2", "-o", str(out),
            "--split", "2/2", "--json"]
    runs = [subprocess.Popen([sys.executable, "-m", "shardkit", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env()) for _ in range(2)]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in results)
    refused = [stderr for code, _, stderr in results if code == 2]
    # either both ran in turn (the second found the slice finished) or one was refused, naming the holder
    assert codes in ([0, 0], [0, 2]), results
    assert all("another shardkit balance run (slice 2 of 2)" in text for text in refused)
    assert not os.path.exists(out / ".balance") and leftovers(out) == []


def test_a_sigterm_while_the_program_is_still_importing_is_answered_once_it_can(sources, tmp_path):
    """A scheduler may stop a job at once: a SIGTERM that arrives while shardkit is importing its modules is
    recorded (interrupts.record_early) and answered as soon as the CLI can clean up: exit 143, one document."""
    out = str(tmp_path / "out")
    # the signal is sent by the process to itself as its first act, before any shardkit import
    code = ("import os, signal, sys; from shardkit.io.interrupts import record_early; record_early(); "
            "os.kill(os.getpid(), signal.SIGTERM); import runpy; sys.argv[0] = 'shardkit'; "
            "runpy.run_module('shardkit', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, *command_args("convert", sources, out), "--json"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 143, done.stderr
    assert one_document(done.stdout) == {"command": "convert", "error": "terminated", "exit_code": 143}
    assert not os.path.exists(out)


_SIGTERM_AFTER_RESUME_POINT = """
import os, signal, sys
import shardkit.commands.prep.resume as resume
import shardkit.commands.prep.write as write
from shardkit.cli import main

resume.POOL_FACTOR = 0  # resume points as often as --checkpoint-mb allows: this small corpus has several
saved, added = [], [0]
save, add = resume.save, write.OutputShards.add

def counting_save(out_dir, state):
    save(out_dir, state)
    saved.append(state["next_source"])

def add_then_stop(self, *args):
    add(self, *args)
    if saved:
        added[0] += 1
        if added[0] == 7:  # preempted mid-writing: members past the resume point, some still queued
            os.kill(os.getpid(), signal.SIGTERM)

resume.save, write.OutputShards.add = counting_save, add_then_stop
main(sys.argv[1:])
"""


def test_prep_stopped_by_sigterm_after_a_resume_point_keeps_it_and_the_rerun_continues(tmp_path):
    """A scheduler's preemption of a long prep: exit 143 and one document, the temporary shards of the last
    resume point kept (nothing else), and the rerun continues from it to the bytes of an uninterrupted run."""
    from support import corpus

    from shardkit.commands.prep import resume
    from shardkit.io.synth import CorpusSpec, write_shards

    source = str(tmp_path / "src" / "long")
    write_shards(list(corpus((CorpusSpec("long", 60, 2.0, 4.0, "en"),))), source, utts_per_shard=4, codec="bz2")
    reference, out = tmp_path / "reference", tmp_path / "out"

    def args(folder):
        return ["prep", "--world-size", "2", "--num-workers", "2", "--codec", "none", "--sample-rate", "16000",
                "--channels", "1", "-o", str(folder), "-j", "1", "--pool-mb", "1", "--corpus", f"long={source}"]

    subprocess.run([sys.executable, "-m", "shardkit", *args(reference), "-q"], env=_env(), check=True)
    stopped = subprocess.run([sys.executable, "-c", _SIGTERM_AFTER_RESUME_POINT, *args(out), "--checkpoint-mb", "1",
                              "--json"], env=_env(), capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 143, stopped.stderr
    assert one_document(stopped.stdout) == {"command": "prep", "error": "terminated", "exit_code": 143}
    state = resume._PlainUnpickler(open(out / resume.RESUME, "rb")).load()
    kept = sorted(p.name for p in out.iterdir() if p.name.endswith(".partial"))
    assert kept == sorted(os.path.basename(e["tmp"]) for e in state["shards"])  # those of the resume point only
    rerun = subprocess.run([sys.executable, "-m", "shardkit", *args(out), "--json"], env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["resumed_at_source"] == state["next_source"] > 0
    listed = [open(os.path.join(folder, "data.list")).read().split() for folder in (reference, out)]
    assert [open(p, "rb").read() for p in listed[1]] == [open(p, "rb").read() for p in listed[0]]
    assert leftovers(out) == [] and not (out / resume.RESUME).exists()
