"""The run lifecycle (shardkit.run.lifecycle): claimed outputs, folder locks, atomic verified writes,
journals that resume, workers that die with their parent, and one-line errors for unusable outputs."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from support import REPO, corpus, folder_bytes, read_bytes, run_cli, without

from shardkit.errors import UsageError
from shardkit.io.synth import CorpusSpec, encode, speech_like
from shardkit.io.files import AtomicFile
from shardkit.io.files import OutputError, atomic_write_bytes, remove_leftovers
from shardkit.run.lifecycle import Journal, OutputLock, claim_output, claim_output_file

RATE = 16000


def partials(folder):
    return sorted(glob.glob(os.path.join(glob.escape(str(folder)), "**", ".*partial"), recursive=True))


def shard_outputs(folder):
    """Shards and lists a run wrote (reports carry timings, and the by-product index names its folder, so
    they are compared apart; its parts live in the hidden .index folder)."""
    return {k: v.replace(str(folder).encode(), b"OUT") if k.endswith(".list") else v
            for k, v in folder_bytes(folder).items() if not any(p.startswith(".") for p in k.split(os.sep))
            and not k.endswith(".json") and not os.path.basename(k).startswith("index")}


# --------------------------------------------------------------------------------------- claims


def test_symlinked_output_folder_that_is_the_source_folder_is_refused(make_shards, tmp_path):
    sources = make_shards("bz2")
    folder = os.path.dirname(sources[0])
    before = folder_bytes(folder)
    link = tmp_path / "link"
    os.symlink(folder, link)
    for args in (["convert", *sources, "-o", link], ["convert", *sources, "-o", link, "--salvage"],
                 ["validate", *sources, "--quarantine", link]):
        result = run_cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.count("\n") == 1
        assert str(link) in result.stderr and sources[0] in result.stderr and os.path.realpath(folder) in result.stderr
    spelled = os.path.join(folder, "..", os.path.basename(folder))  # the same folder spelled another way
    result = run_cli("convert", *sources, "-o", spelled)
    assert result.exit_code == 2 and "by real path" in result.stderr
    assert folder_bytes(folder) == before


def test_outputs_below_or_beside_the_inputs_stay_allowed(make_shards, tmp_path):
    sources = make_shards("bz2")
    folder = os.path.dirname(sources[0])
    before = folder_bytes(folder)
    result = run_cli("convert", *sources, "-o", os.path.join(folder, "zst"), "-q")
    assert result.exit_code == 0, result.output
    result = run_cli("validate", *sources, "--quarantine", os.path.join(folder, "quarantine"), "-q")
    assert result.exit_code == 0, result.output
    result = run_cli("index", os.path.join(folder, "data.list"), "-o", os.path.join(folder, "index.jsonl"), "-q")
    assert result.exit_code == 0, result.output
    after = folder_bytes(folder)
    assert {k: v for k, v in after.items() if k in before} == before


def test_a_folder_argument_may_sit_inside_the_output_folder(make_shards, tmp_path):
    sources = make_shards("none")
    folder = os.path.dirname(sources[0])
    parent = os.path.dirname(folder)
    result = run_cli("convert", folder, "-o", parent, "-q", "--codec", "zst")
    assert result.exit_code == 0, result.output
    for name in (os.path.basename(s) + ".zst" for s in sources):
        assert os.path.exists(os.path.join(parent, name))


def test_an_output_that_is_a_hard_link_to_an_input_is_refused(make_shards, tmp_path):
    sources = make_shards("none")
    folder = os.path.dirname(sources[0])
    before = folder_bytes(folder)
    out = tmp_path / "out"
    out.mkdir()
    # convert --codec none writes shards_000000000.tar: make that name the source itself
    os.link(sources[0], out / os.path.basename(sources[0]))
    result = run_cli("convert", *sources, "-o", out, "--codec", "none")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and "hard link" in result.stderr and sources[0] in result.stderr
    # a single output file: the list written by list concat
    os.link(os.path.join(folder, "data.list"), tmp_path / "linked.list")
    result = run_cli("list", "concat", os.path.join(folder, "data.list"), "-o", tmp_path / "linked.list")
    assert result.exit_code == 2 and "hard link" in result.stderr
    assert folder_bytes(folder) == before


def test_claim_functions_directly(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(b"x")
    claim_output(str(tmp_path / "out"), [str(src / "a.tar")], [str(tmp_path / "out" / "a.tar")])
    claim_output(str(src / "sub"), [str(src / "a.tar")])
    with pytest.raises(UsageError, match="holds input"):
        claim_output(str(src), [str(src / "a.tar")])
    os.symlink(src / "a.tar", tmp_path / "alias.tar")
    with pytest.raises(UsageError, match="is input"):
        claim_output_file(str(tmp_path / "alias.tar"), [str(src / "a.tar")])
    with pytest.raises(UsageError, match="names a folder"):
        claim_output_file(str(src), [])
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(src / "a.tar", out / "a.tar")  # a planned output that is a symlink to an input
    with pytest.raises(UsageError, match="a symbolic link to it"):
        claim_output(str(out), [str(src / "a.tar")], [str(out / "a.tar")])


# --------------------------------------------------------------------------------------- locks


HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from shardkit.run.lifecycle import OutputLock
lock = OutputLock({folder!r}, {command!r}, {split!r}).acquire()
print("locked", flush=True)
time.sleep(60)
"""


def hold_lock(folder, command, split=None):
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(repo=REPO, folder=str(folder), command=command,
                                                               split=split)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_run_into_a_locked_folder_refuses_at_once_naming_the_holder(make_shards, tmp_path):
    sources = make_shards("bz2")
    out = tmp_path / "out"
    out.mkdir()
    holder = hold_lock(out, "convert")
    try:
        started = time.monotonic()
        result = run_cli("convert", *sources, "-o", out, "-q")
        assert time.monotonic() - started < 10
        assert result.exit_code == 2
        assert result.stderr == (f"Error: {out}: another shardkit convert run is writing this folder: pid "
                                 f"{holder.pid} on host {socket.gethostname()}, since "
                                 f"{result.stderr.split(', since ')[1].split(' holds')[0]} holds "
                                 f".shardkit-convert.lock; wait for it to finish or stop it, then run again\n")
        assert not [p for p in os.listdir(out) if not p.startswith(".shardkit")]
        # another slice of a job array, or another command, has its own lock
        assert run_cli("convert", *sources, "-o", out, "-q", "--split", "1/2").exit_code == 0
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing: its lock file is taken over with a note
    result = run_cli("convert", *sources, "-o", out, "-q")
    assert result.exit_code == 0, result.output
    assert f"took over a stale lock of pid {holder.pid} on host {socket.gethostname()}" in result.stderr
    assert not os.path.exists(out / ".shardkit-convert.lock")


def test_two_concurrent_converts_one_refuses_and_the_output_is_whole(make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=2)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": REPO}
    cmd = [sys.executable, "-m", "shardkit", "convert", *sources, "-o", str(out), "-j", "1", "-q"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    # either they overlapped (one refused) or one finished before the other began (it resumed)
    assert codes in ([0, 0], [0, 2]), results
    for code, err in results:
        if code == 2:
            assert "another shardkit convert run is writing this folder: pid" in err and "on host" in err
    report = json.loads(read_bytes(out / "convert.json"))
    import hashlib

    for entry in report["shards"]:
        assert hashlib.sha256(read_bytes(entry["output"]["path"])).hexdigest() == entry["output"]["sha256"]
    assert len(read_bytes(out / "data.list").decode().split()) == len(sources)
    assert not partials(out)


def test_a_refusal_names_the_holder_that_is_still_writing_its_record(tmp_path):
    """The holder writes its record just after taking the lock: a run that arrives in between must
    not report "no pid recorded yet", nor the previous, dead holder's pid left in the file."""
    import fcntl
    import threading

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / ".shardkit-convert.lock"
    for leftover in ("", json.dumps({"pid": dead.pid, "host": socket.gethostname()})):
        path.write_text(leftover)
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the holder has the lock, its record comes next

        def write_record():
            time.sleep(0.2)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)

        writer = threading.Thread(target=write_record)
        writer.start()
        try:
            with pytest.raises(UsageError, match=f"pid {os.getpid()} on host"):
                OutputLock(str(tmp_path), "convert").acquire()
        finally:
            writer.join()
            os.close(fd)


def test_lock_in_the_same_process_and_release(tmp_path):
    with OutputLock(str(tmp_path), "make"):
        with pytest.raises(UsageError, match="another shardkit make run"):
            OutputLock(str(tmp_path), "make").acquire()
        OutputLock(str(tmp_path), "make", (1, 2)).acquire().release()
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------- atomic files


def test_atomic_file_removes_its_temporary_file_unless_committed(tmp_path):
    dst = str(tmp_path / "x.bin")
    with pytest.raises(RuntimeError):
        with AtomicFile(dst) as f:
            f.write(b"half")
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []
    with AtomicFile(dst) as f:
        f.write(b"whole")

        def refuse(tmp):
            assert read_bytes(tmp) == b"whole"
            raise UsageError("does not verify")

        with pytest.raises(UsageError):
            f.commit(refuse)
    assert os.listdir(tmp_path) == []
    with AtomicFile(dst) as a, AtomicFile(dst) as b:  # temporary names are unique per write
        assert a.tmp != b.tmp
        a.write(b"a")
        b.write(b"b")
        a.commit()
        b.commit()
    assert read_bytes(dst) == b"b" and os.listdir(tmp_path) == ["x.bin"]


def test_leftovers_of_killed_runs_old_and_new_names_are_removed(tmp_path):
    for name in (".a.tar.partial", ".a.tar.0123456789ab.partial", ".b.tar.partial", ".a.tar.json"):
        (tmp_path / name).write_bytes(b"x")
    assert remove_leftovers([str(tmp_path / "a.tar")]) == 2
    assert sorted(os.listdir(tmp_path)) == [".a.tar.json", ".b.tar.partial"]


def test_a_vanished_folder_is_a_one_line_output_error(tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir()
    shutil.rmtree(folder)
    with pytest.raises(OutputError) as info:
        atomic_write_bytes(str(folder / "report.json"), b"{}")
    assert str(info.value) == f"{folder / 'report.json'}: cannot write (its folder vanished)"


# --------------------------------------------------------------------------------------- full and read-only disks


def _mount_tmpfs(path, size):
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or done.returncode})")


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a tiny tmpfs that is full."""
    path = tmp_path / "full"
    _mount_tmpfs(path, "256k")
    try:
        fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT)  # fill it: empty files and folders still fit
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def read_only(tmp_path):
    """A read-only folder (a remounted tmpfs: root ignores permission bits, not a read-only mount)."""
    path = tmp_path / "ro"
    _mount_tmpfs(path, "1m")
    try:
        os.makedirs(path / "out")
        done = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot remount read-only ({done.stderr.decode().strip()})")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def one_line_error(result, path, reason, exit_code=2):
    """Exit 2 for an unusable output path (read-only, no permission); a full disk is exit 1 (a rerun resumes)."""
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and str(path) in lines[0] and reason in lines[0], \
        result.stderr
    assert "Traceback" not in result.output


def test_full_disk_gives_one_line_errors_and_leaves_no_temporary_files(make_shards, full_disk, tmp_path):
    sources = make_shards("bz2")
    listing = os.path.join(os.path.dirname(sources[0]), "data.list")
    one_line_error(run_cli("validate", *sources, "--report", full_disk / "validate.json", "-q"),
                   full_disk / "validate.json", "No space left on device", 1)
    one_line_error(run_cli("index", listing, "-o", full_disk / "index.jsonl", "-q"),
                   full_disk / "index.jsonl", "No space left on device", 1)
    one_line_error(run_cli("list", "concat", listing, listing, "--allow-duplicates", "-o", full_disk / "all.list"),
                   full_disk / "all.list", "No space left on device", 1)
    result = run_cli("convert", *sources, "-o", full_disk / "zst", "-q", "-j", "1")
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output
    assert "No space left on device" in result.stderr and str(full_disk / "zst") in result.stderr
    assert not partials(full_disk)


def test_convert_on_a_full_disk_keeps_what_it_finished(make_shards, tmp_path):
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    sources = make_shards("bz2", utts_per_shard=2)
    sizes = sorted(os.path.getsize(s) for s in sources)
    path = tmp_path / "small"
    _mount_tmpfs(path, f"{(sum(sizes) // 2 // 4096 + 4) * 4096}")  # about half of the shards fit
    try:
        result = run_cli("convert", *sources, "-o", path / "out", "-q", "-j", "1", "--codec", "none")
        assert result.exit_code in (1, 2), result.output
        assert "Traceback" not in result.output and "No space left on device" in result.output
        assert not partials(path)
        finished = sorted(p for p in os.listdir(path / "out") if p.endswith(".tar"))
        assert finished  # the shards that fit are kept, whole
        from shardkit.io.tar import iter_shard_members

        for name in finished:
            assert list(iter_shard_members(str(path / "out" / name)))
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_read_only_outputs_give_one_line_errors(make_shards, read_only):
    sources = make_shards("bz2")
    listing = os.path.join(os.path.dirname(sources[0]), "data.list")
    one_line_error(run_cli("validate", *sources, "--report", read_only / "v.json", "-q"), read_only / "v.json",
                   "Read-only file system")
    one_line_error(run_cli("index", listing, "-o", read_only / "out" / "i.jsonl", "-q"),
                   read_only / "out" / "i.jsonl", "Read-only file system")
    one_line_error(run_cli("list", "concat", listing, "-o", read_only / "out" / "all.list"),
                   read_only / "out" / "all.list", "Read-only file system")
    one_line_error(run_cli("list", "rewrite", listing, "-o", read_only / "out" / "new.list", "--suffix", ".tar.bz2"),
                   read_only / "out" / "new.list", "Read-only file system")
    for args in (["convert", *sources, "-o", read_only / "out"],
                 ["validate", *sources, "--quarantine", read_only / "out"]):
        one_line_error(run_cli(*args, "-q"), read_only / "out", "Read-only file system")
    assert os.listdir(read_only / "out") == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root bypasses permission bits (the read-only mount test covers it)")
def test_unwritable_folder_for_ordinary_users(make_shards, tmp_path):
    sources = make_shards("bz2")
    listing = os.path.join(os.path.dirname(sources[0]), "data.list")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        one_line_error(run_cli("list", "concat", listing, "-o", locked / "all.list"), locked / "all.list",
                       "Permission denied")
        one_line_error(run_cli("index", listing, "-o", locked / "i.jsonl", "-q"), locked / "i.jsonl",
                       "Permission denied")
    finally:
        locked.chmod(0o755)


# --------------------------------------------------------------------------------------- kill -9


def kaldi_dir(root, count=24, seconds=3.0):
    os.makedirs(os.path.join(root, "wav"), exist_ok=True)
    with open(os.path.join(root, "wav.scp"), "w") as scp, open(os.path.join(root, "text"), "w") as text:
        for i in range(count):
            key = f"spk{i % 3}-utt{i:03d}"
            path = os.path.join(root, "wav", f"{key}.wav")
            with open(path, "wb") as f:
                f.write(encode(speech_like(seconds, RATE, seed=i), RATE, "wav"))
            scp.write(f"{key} {path}\n")
            text.write(f"{key} words of utterance {i}\n")
    return os.path.join(root, "wav.scp"), os.path.join(root, "text")


def session_processes(sid):
    """Live processes of session ``sid`` (the killed command and everything it started)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[4]) == sid:  # state, ppid, pgrp, session
            found.append(int(pid))
    return found


def kill_when(cmd, ready, *, timeout=120):
    """Start ``cmd`` in its own session, kill -9 its main process once ``ready()``, and return
    the processes of the session still alive 5 s later."""
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, "-m", "shardkit", *map(str, cmd)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.fail(f"{cmd[0]} finished before it could be killed; the corpus is too small for this machine")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(5)
    left = session_processes(proc.pid)
    for pid in left:  # do not leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def journal_lines(path):
    def ready():
        try:
            with open(path, encoding="utf-8") as f:
                return sum(1 for line in f if line.endswith("\n")) >= 1
        except FileNotFoundError:
            return False
    return ready


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to find left-over processes")


@pytest.fixture(scope="module")
def big_shards(tmp_path_factory):
    from shardkit.io.synth import write_shards

    out = tmp_path_factory.mktemp("big")
    return write_shards(corpus((CorpusSpec("a", 96, 2.0, 3.0, "en"),)), str(out), utts_per_shard=8, codec="bz2",
                        audio_format="wav")


@needs_proc
def test_kill_9_during_convert_j2_leaves_no_process_and_a_rerun_finishes_identically(big_shards, tmp_path):
    reference, out = tmp_path / "ref", tmp_path / "out"
    assert run_cli("convert", *big_shards, "-o", reference, "-j", "2", "-q").exit_code == 0
    left = kill_when(["convert", *big_shards, "-o", out, "-j", "2", "-q"],
                     journal_lines(out / ".convert.journal.jsonl"))
    assert left == []
    result = run_cli("convert", *big_shards, "-o", out, "-j", "2", "-q", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["skipped"] >= 1 and summary["this_run"]["skipped"] == summary["skipped"]
    assert summary["this_run"]["done"] == summary["ok"]
    assert shard_outputs(out) == shard_outputs(reference)
    assert not partials(out) and not os.path.exists(out / ".shardkit-convert.lock")


@needs_proc
def test_kill_9_during_validate_quarantine(big_shards, tmp_path):
    # damage every other shard so that quarantine has work
    src = tmp_path / "src"
    src.mkdir()
    damaged = []
    for i, path in enumerate(big_shards):
        data = read_bytes(path)
        dst = src / os.path.basename(path)
        dst.write_bytes(data[:len(data) * 3 // 4] if i % 2 else data)
        damaged.append(str(dst))
    reference, quarantine = tmp_path / "ref", tmp_path / "q"
    assert run_cli("validate", *damaged, "--quarantine", reference, "-j", "2", "-q").exit_code == 1
    left = kill_when(["validate", *damaged, "--quarantine", quarantine, "-j", "2", "-q"],
                     lambda: os.path.isdir(quarantine) and any(n.startswith(".shards") or n.endswith(".tar.bz2")
                                                               for n in os.listdir(quarantine)))
    assert left == []
    result = run_cli("validate", *damaged, "--quarantine", quarantine, "-j", "2", "-q")
    assert result.exit_code == 1, result.output
    assert shard_outputs(quarantine) == shard_outputs(reference)


@needs_proc
def test_kill_9_during_make_and_the_resumed_report_says_who_wrote_what(tmp_path):
    wav_scp, text = kaldi_dir(str(tmp_path / "d"), count=48)
    args = ["--wav-scp", wav_scp, "--text", text, "--utts-per-shard", "4", "--audio-format", "flac"]
    reference, out = tmp_path / "ref", tmp_path / "out"
    assert run_cli("make", *args, "-o", reference, "-j", "2", "-q").exit_code == 0
    left = kill_when(["make", *args, "-o", out, "-j", "2", "-q"], journal_lines(out / ".make.journal.jsonl"))
    assert left == []
    earlier = len(Journal(str(out / ".make.journal.jsonl")).load())
    result = run_cli("make", *args, "-o", out, "-j", "2", "-q", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["shard_status"]["skipped"] == summary["this_run"]["skipped"] == earlier
    assert summary["shard_status"]["ok"] == summary["this_run"]["done"] == 12 - earlier
    manifest = json.loads(read_bytes(out / "make.json"))
    assert manifest["summary"]["shard_status"] == summary["shard_status"]
    assert sum(e["this_run"] == "skipped" for e in manifest["shards"]) == earlier
    assert shard_outputs(out) == shard_outputs(reference)


@needs_proc
def test_kill_9_during_balance(big_shards, tmp_path):
    reference, out = tmp_path / "ref", tmp_path / "out"
    args = ["--corpus", "a=" + os.path.join(os.path.dirname(big_shards[0]), "data.list"), "--world-size", "2",
            "--num-workers", "1", "--num-shards", "8", "--codec", "zst", "-j", "2", "-q"]
    result = run_cli("balance", *args, "-o", reference)
    assert result.exit_code == 0, result.output
    left = kill_when(["balance", *args, "-o", out], journal_lines(out / ".balance.journal.jsonl"))
    assert left == []
    result = run_cli("balance", *args, "-o", out)
    assert result.exit_code == 0, result.output
    assert shard_outputs(out) == shard_outputs(reference)


# --------------------------------------------------------------------------------------- make: split, ray, resume


TIMINGS = {"summary": {"seconds", "this_run"}, "shards": {"seconds", "elapsed", "this_run"}}


def test_make_split_merged_equals_one_run(tmp_path):
    wav_scp, text = kaldi_dir(str(tmp_path / "d"), count=10, seconds=0.5)
    # an utterance without audio: a finding every slice sees once
    with open(text, "a") as f:
        f.write("ghost no audio\n")
    args = ["make", "--wav-scp", wav_scp, "--text", text, "--utts-per-shard", "2", "-q"]
    one, sliced = tmp_path / "one", tmp_path / "sliced"
    assert run_cli(*args, "-o", one).exit_code == 1
    for i in (1, 2, 3):
        result = run_cli(*args, "-o", sliced, "--split", f"{i}/3", "-j", "1")
        assert result.exit_code == 1, result.output
    assert not (sliced / "make.json").exists()
    result = run_cli("merge-reports", sliced, "--command", "make")
    assert result.exit_code == 1, result.output  # as the one run: an utterance was skipped
    assert read_bytes(sliced / "data.list").replace(str(sliced).encode(), b"") == \
        read_bytes(one / "data.list").replace(str(one).encode(), b"")
    assert shard_outputs(sliced).keys() >= shard_outputs(one).keys()
    assert all(read_bytes(sliced / n) == read_bytes(one / n) for n in os.listdir(one) if n.endswith(".tar.zst"))
    merged, single = (without(json.loads(read_bytes(p / "make.json")), **TIMINGS) for p in (sliced, one))
    for doc, root in ((merged, sliced), (single, one)):
        for e in doc["shards"]:
            e["output"]["path"] = os.path.basename(e["output"]["path"])
            e["planned_path"] = os.path.basename(e["planned_path"])
        doc["summary"]["out_dir"] = doc["summary"]["data_list"] = doc["summary"]["manifest"] = None
    assert merged == single


def test_make_on_ray_writes_what_the_local_run_writes(tmp_path):
    ray = pytest.importorskip("ray")
    wav_scp, text = kaldi_dir(str(tmp_path / "d"), count=6, seconds=0.5)
    args = ["make", "--wav-scp", wav_scp, "--text", text, "--utts-per-shard", "2", "-q", "--codec", "zst"]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, logging_level=logging.WARNING)
    try:
        assert run_cli(*args, "-o", tmp_path / "local", "-j", "2").exit_code == 0
        result = run_cli(*args, "-o", tmp_path / "ray", "--executor", "ray")
        assert result.exit_code == 0, result.output
    finally:
        ray.shutdown()
    local, on_ray = (sorted(n for n in os.listdir(tmp_path / d) if n.endswith(".tar.zst")) for d in ("local", "ray"))
    assert local == on_ray and len(local) == 3
    assert all(read_bytes(tmp_path / "local" / n) == read_bytes(tmp_path / "ray" / n) for n in local)


def test_make_writes_to_a_url(tmp_path):
    from support import moto_s3

    wav_scp, text = kaldi_dir(str(tmp_path / "d"), count=4, seconds=0.5)
    # -j 1: the store's settings below live in this process only
    args = ["make", "--wav-scp", wav_scp, "--text", text, "--utts-per-shard", "2", "-q", "-j", "1", "--codec", "zst"]
    assert run_cli(*args, "-o", tmp_path / "local").exit_code == 0
    import fsspec

    with moto_s3() as (fs, options):
        saved = fsspec.config.conf.get("s3")
        fsspec.config.conf["s3"] = options  # as FSSPEC_S3_* would
        try:
            result = run_cli(*args, "-o", "s3://corpus/made")
            assert result.exit_code == 0, result.output
            fs.invalidate_cache()
            names = sorted(p.rsplit("/", 1)[1] for p in fs.ls("corpus/made"))
            assert names == ["data.list", "make.json", "shards_000000000.tar.zst", "shards_000000001.tar.zst"]
            for name in names[2:]:
                assert fs.cat(f"corpus/made/{name}") == read_bytes(tmp_path / "local" / name)
            rerun = run_cli(*args, "-o", "s3://corpus/made", "--json")
            assert json.loads(rerun.stdout)["this_run"] == {"done": 0, "skipped": 2, "failed": 0}
        finally:
            fsspec.config.conf.pop("s3", None)
            if saved is not None:
                fsspec.config.conf["s3"] = saved


def test_a_folder_written_by_the_previous_version_resumes(make_shards, tmp_path):
    """Earlier versions kept the same journal lines and a fixed ``.NAME.partial``: both still work."""
    sources = make_shards("bz2", utts_per_shard=3)
    out = tmp_path / "out"
    assert run_cli("convert", *sources, "-o", out, "-q").exit_code == 0
    report = json.loads(read_bytes(out / "convert.json"))
    # as a killed run of the previous version left it: a journal of finished shards, no report
    with open(out / ".convert.journal.jsonl", "w") as f:
        for entry in report["shards"]:
            entry.pop("this_run", None)
            f.write(json.dumps(entry, sort_keys=True) + "\n")
    os.unlink(out / "convert.json")
    (out / f".{os.path.basename(report['shards'][0]['output']['path'])}.partial").write_bytes(b"half")
    result = run_cli("convert", *sources, "-o", out, "-q", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["this_run"] == {"done": 0, "skipped": len(sources), "failed": 0}
    assert not partials(out)
