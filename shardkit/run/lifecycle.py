"""The run lifecycle every command that writes goes through: claim, lock, atomic write, journal, report.

Layers: shared I/O (codecs, tar, audio, remote) below, one module per command above. A writing
command does, in this order:

1. ``claim_output(out_dir, inputs, outputs)`` (folders) or ``claim_output_file(path, inputs)``
   (single files: ``--report``, ``index -o``, ``list ... -o``): real paths are compared, so a
   symlinked or ``..``-spelled output folder that *is* an input's folder is refused (exit 2,
   naming both), and so is an output file that is an input file (same real path, or the same
   inode: a hard link). Outputs beside or below the inputs stay allowed.
2. ``OutputLock(out_dir, command, split)``: an exclusive ``flock`` on ``OUT_DIR/.shardkit-COMMAND
   [.slice-I-of-N].lock``, which holds the holder's pid, host and start time. A second run of the
   same command and slice refuses at once (exit 2) naming them; a lock file left by a dead run
   (the kernel dropped its lock with the process) is taken over with a note. Worker processes
   never hold it (the descriptor is close-on-exec and forkserver/Ray workers do not inherit it).
3. ``AtomicFile(dst)`` / ``atomic_write_*``: a temporary name unique to this write
   (``.NAME.<random>.partial`` beside ``dst``; for a URL, in ``TMPDIR``), fsync, ``verify(tmp)``
   before the final name, rename (or publish to the store), fsync the folder. An ``OSError``
   becomes ``OutputError`` naming the path (ENOSPC, EACCES, EROFS, a vanished folder) and the
   temporary file is removed. ``remove_leftovers(outputs)`` deletes what killed runs left.
4. ``Journal``: JSON lines, one per finished task, fsynced; a killed run resumes from it.
5. Report: each shard entry gets ``this_run``: ``done`` (this run wrote it), ``skipped`` (an
   earlier run wrote it and it still checks out) or ``failed`` (this run tried and failed);
   ``this_run_counts`` sums them.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Sequence

from shardkit.errors import UsageError
from shardkit.io.files import (
    _UMASK,
    _local,
    os_reason,
    output_error,
    pid_alive,
)

RUN_STATES = ("done", "skipped", "failed")


def note(message: str) -> None:
    """A one-line notice on stderr (never stdout: --json owns it)."""
    sys.stderr.write(f"note: {message}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------- claim


def claim_output(out_dir: str, inputs: Iterable[str], outputs: Sequence[str] = (), *,
                 what: str = "the output folder") -> None:
    """Refuse (UsageError, exit 2) an output folder that is, by real path, the folder of an input,
    or an output file that is an input file (the same inode: a hard link, or a symlink to it).

    ``inputs`` are shard or list files (URLs and pipes are skipped); ``outputs`` the planned files.
    A planned output in a sub-folder of ``out_dir`` (outputs that mirror the input folders) is
    refused the same way when that sub-folder is, by real path, an input's folder. Costs one
    ``realpath`` per distinct input or output folder and one ``lstat`` per planned output (and, only
    when an output is a symlink or has several links, one ``stat`` per input).
    """
    if not _local(out_dir):
        return
    inputs = [os.fspath(p) for p in inputs]
    inputs = [p for p in inputs if _local(p)]
    input_folders = _input_folders(out_dir, inputs, what)
    # outputs that mirror the input folders below OUT_DIR (--keep-tree) land in an input's folder when
    # OUT_DIR holds the inputs' folders: OUT_DIR itself passed, its sub-folder does not
    out_folders: dict[str, str] = {}
    for out in outputs:
        if not _local(out):
            continue
        parent = os.path.dirname(os.path.abspath(out))
        if parent in out_folders:
            continue
        real = out_folders[parent] = os.path.realpath(parent)
        if real in input_folders:
            raise UsageError(f"{what} would write {out} into the folder of input {input_folders[real]} ({real} "
                             f"by real path), so outputs could overwrite inputs; choose another folder",
                             shard=out_dir)
    _claim_files(outputs, inputs)


def _input_folders(out_dir: str, inputs: list[str], what: str) -> dict[str, str]:
    """Each input folder by real path -> the first input in it; refuses ``out_dir`` when it is one of them."""
    out_real = os.path.realpath(out_dir)
    real_folders: dict[str, str] = {}
    input_folders: dict[str, str] = {}  # real folder -> the first input in it
    for path in inputs:
        parent = os.path.dirname(os.path.abspath(path))
        real = real_folders.get(parent)
        if real is None:
            real = real_folders[parent] = os.path.realpath(parent)
        if real == out_real:
            raise UsageError(f"{what} holds input {path} (both are {out_real} by real path), so outputs could "
                             f"overwrite inputs; choose another folder", shard=out_dir)
        input_folders.setdefault(real, path)
    return input_folders


def claim_output_file(out_path: str, inputs: Iterable[str]) -> None:
    """Refuse a single output file that is one of ``inputs`` (real path or inode), or a folder."""
    if not _local(out_path):
        return
    if os.path.isdir(out_path):
        raise UsageError("names a folder; give a file name", shard=out_path)
    inputs = [p for p in map(os.fspath, inputs) if _local(p)]
    real = os.path.realpath(out_path)
    for path in inputs:
        if os.path.realpath(path) == real:
            raise UsageError(f"output {out_path} is input {path} (real path {real}); writing it would "
                             f"destroy the input: choose another output", shard=out_path)
    _claim_files([out_path], inputs)


def _claim_files(outputs: Sequence[str], inputs: Sequence[str]) -> None:
    # only an existing output that is a symlink, or a file with more than one link, can be an input
    # under another name: the inputs are stat'ed only if there is one (rare, so resumes stay cheap)
    existing = _linked_outputs(outputs)
    if not existing:
        return
    inodes = {}
    for path in inputs:
        try:
            st = os.stat(path)
        except OSError:
            continue
        inodes.setdefault((st.st_dev, st.st_ino), path)
    for out, ident in existing:
        if ident in inodes:
            how = "a symbolic link to it" if os.path.islink(out) else "the same file: a hard link"
            raise UsageError(f"output {out} is input {inodes[ident]} ({how}); writing it would destroy the input: "
                             f"choose another output", shard=out)


def _linked_outputs(outputs: Sequence[str]) -> list[tuple[str, tuple[int, int]]]:
    """(output, (device, inode)) of each existing local output that is a symlink or has several links."""
    import stat

    existing = []
    for out in outputs:
        if not _local(out):
            continue
        try:
            st = os.lstat(out)
            if not stat.S_ISLNK(st.st_mode) and st.st_nlink < 2:
                continue
            st = os.stat(out)
        except OSError:
            continue
        existing.append((out, (st.st_dev, st.st_ino)))
    return existing


def prepare_out_dir(out_dir: str) -> str:
    """Create OUT_DIR if needed and prove it is writable; a UsageError says why not."""
    out_dir = os.path.abspath(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f".write-probe.{secrets.token_hex(6)}")
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"output folder is not writable ({os_reason(err)})", shard=out_dir) from None
    return out_dir


# --------------------------------------------------------------------------------- lock

_HELD: set[str] = set()  # lock files this process holds: flock would let a second open in-process through


def lock_name(command: str, split: tuple[int, int] | None = None) -> str:
    """The lock file's name in an output folder: one per command, or one per ``--split`` slice
    (``(index, count)``) so that the slices of one job array run side by side.
    """
    return f".shardkit-{command}.lock" if split is None else f".shardkit-{command}.slice-{split[0]}-of-{split[1]}.lock"


class OutputLock:
    """Exclusive lock on an output folder for one command (and ``--split`` slice); a context manager.

    ``flock`` on a lock file that records pid, host, command and start time. On Linux NFS clients
    flock is carried as a whole-file POSIX lock (NLM on NFSv3, the protocol's own locks on v4), so
    runs on different nodes exclude each other; on a mount with ``nolock`` (or ``local_lock``)
    locks are only seen on one node. Where locking is refused (ENOLCK), the file's pid/host decide:
    a live holder on this host, or any holder on another host, refuses; a dead one is taken over.
    """

    def __init__(self, out_dir: str, command: str, split: tuple[int, int] | None = None):
        self.path = os.path.join(os.path.abspath(out_dir), lock_name(command, split))
        self.command = command
        self.split = split
        self._fd: int | None = None
        self.took_over: dict | None = None

    def _holder_text(self, holder: dict | None) -> str:
        if not holder:
            return "another process (no pid recorded yet)"
        started = holder.get("started")
        since = f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}" if started else ""
        return f"pid {holder.get('pid')} on host {holder.get('host')}{since}"

    @staticmethod
    def _read(fd: int) -> dict | None:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            data = os.read(fd, 4096)
            return json.loads(data) if data.strip() else None
        except (OSError, ValueError):
            return None

    def _holder_record(self, fd: int, wait: float = 1.0) -> dict | None:
        """The record of the run holding the lock. It writes it just after taking the lock, so an
        empty record, or one naming a process no longer running on this host (the previous holder's,
        not yet overwritten), is read again for up to ``wait`` seconds before it is believed."""
        deadline = time.monotonic() + wait
        while True:
            holder = self._read(fd)
            pid = int((holder or {}).get("pid") or 0)
            current = holder and (holder.get("host") != socket.gethostname() or (pid > 0 and pid_alive(pid)))
            if current or time.monotonic() >= deadline:
                return holder
            time.sleep(0.01)

    def _refuse(self, holder: dict | None) -> UsageError:
        slice_text = f" (slice {self.split[0]} of {self.split[1]})" if self.split else ""
        return UsageError(f"another shardkit {self.command} run{slice_text} is writing this folder: "
                          f"{self._holder_text(holder)} holds {os.path.basename(self.path)}; wait for it to "
                          f"finish or stop it, then run again", shard=os.path.dirname(self.path))

    def acquire(self) -> "OutputLock":
        """Take the lock or raise UsageError naming who holds it (pid, host) and what to do; a lock
        left by a process that is gone is taken over. Returns self.
        """
        if self.path in _HELD:
            raise self._refuse({"pid": os.getpid(), "host": socket.gethostname()})
        fd = self._locked_fd()
        previous = self._read(fd)
        if previous:
            self.took_over = previous
            note(f"{self.path}: took over a stale lock of {self._holder_text(previous)} "
                 f"(that run ended without releasing it)")
        self._write_record(fd)
        self._fd = fd
        _HELD.add(self.path)
        return self

    def _locked_fd(self) -> int:
        """The lock file, open and locked; opened again when the previous holder removed it between our
        open and our lock (we would hold a lock on a file nobody else sees)."""
        while True:
            fd = self._open_and_lock()
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def _open_and_lock(self) -> int:
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 & ~_UMASK)
        except OSError as err:
            raise output_error(err, self.path, "cannot create the lock file") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            return self._lock_refused(fd, err)
        return fd

    def _lock_refused(self, fd: int, err: OSError) -> int:
        """flock said no: a holder refuses this run; a filesystem without locks lets the recorded holder decide
        (the file is opened again, unlocked); any other error is the output's."""
        busy = err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        holder = self._holder_record(fd) if busy else self._read(fd)
        os.close(fd)
        if busy:
            raise self._refuse(holder) from None
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            self._without_flock(holder)
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 & ~_UMASK)
        raise output_error(err, self.path, "cannot lock") from None

    def _write_record(self, fd: int) -> None:
        """This run's pid, host, command, slice and start time in the lock file (the file is removed on failure)."""
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                  "split": list(self.split) if self.split else None, "started": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record, sort_keys=True) + "\n").encode(), 0)
            os.fsync(fd)
        except OSError as err:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            os.close(fd)
            raise output_error(err, self.path, "cannot write the lock file") from None

    def _without_flock(self, holder: dict | None) -> None:
        if holder and (holder.get("host") != socket.gethostname() or pid_alive(int(holder.get("pid") or 0))):
            raise UsageError(f"this filesystem refuses locks and {self._holder_text(holder)} is recorded in "
                             f"{self.path}; if that run is gone, remove the file and run again",
                             shard=os.path.dirname(self.path))

    def release(self) -> None:
        """Remove the lock file and unlock it (in that order, so a waiter retries on the new file); idempotent."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # before the unlock, so a waiter that got the old inode retries
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None
        _HELD.discard(self.path)

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# --------------------------------------------------------------------------------- claimed folder


def remote_journal_dir(out_url: str, command: str = "convert") -> str:
    """This machine's folder for the journal (and lock) of a run into ``out_url``: the same for every rerun."""
    import hashlib
    import tempfile

    digest = hashlib.sha256(out_url.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"shardkit-{command}-{digest}")


@contextmanager
def claimed_output_dir(out_dir: str, inputs: Iterable[str], command: str, split: tuple[int, int] | None = None, *,
                       outputs: Sequence[str] = (), what: str = "OUT_DIR", urls: bool = True):
    """Steps 1 and 2 for a command that writes into a folder: ``with claimed_output_dir(...) as (out_dir,
    journal_dir):`` runs the body while this run holds the folder.

    Refuses a pipe (``-``, ``pipe:CMD``), claims the folder against ``inputs`` and the planned
    ``outputs`` (:func:`claim_output`), creates it and proves it writable, and takes the
    :class:`OutputLock` of ``command`` and ``split``; the lock is released however the body ends.
    Yields the absolute folder and the folder for the journal and lock: the same folder, or for a
    URL ``out_dir`` (``urls=True``; else refused) the URL without its trailing ``/`` and a local
    folder (:func:`remote_journal_dir`, a store has no fsynced append nor locks), removed at the
    end unless another slice's journal is still in it.
    """
    from shardkit.io.remote import is_url

    _refuse_unwritable_kind(out_dir, what, urls)
    claim_output(out_dir, inputs, outputs, what=what)
    created = not is_url(out_dir) and not os.path.exists(out_dir)
    out_dir, journal_dir = _prepared_folders(out_dir, command)
    lock = OutputLock(journal_dir, command, split).acquire()
    try:
        yield out_dir, journal_dir
    except BaseException:
        lock.release()
        if created:  # a run that failed before writing anything leaves no empty folder that looks made
            _remove_if_empty(out_dir)
        raise
    finally:
        lock.release()
        if journal_dir != out_dir:
            try:
                os.rmdir(journal_dir)
            except OSError:  # another slice's journal is still there
                pass


def _refuse_unwritable_kind(out_dir: str, what: str, urls: bool) -> None:
    """A pipe is never an output folder; a URL only where the command writes to stores (``urls``)."""
    from shardkit.io.remote import is_pipe, is_url

    if is_pipe(out_dir):
        raise UsageError(f"{what} cannot be a pipe: command; give a folder{' or a URL' if urls else ''}",
                         shard=out_dir)
    if is_url(out_dir) and not urls:
        raise UsageError(f"{what} must be a local folder (this command does not write to URLs)", shard=out_dir)


def _prepared_folders(out_dir: str, command: str) -> tuple[str, str]:
    """(output folder, journal folder): a local folder, created and proved writable, is both; a URL keeps its
    journal and lock in this machine's :func:`remote_journal_dir`."""
    from shardkit.io.remote import is_url

    if not is_url(out_dir):
        out_dir = prepare_out_dir(out_dir)
        return out_dir, out_dir
    out_dir = out_dir.rstrip("/")
    journal_dir = remote_journal_dir(out_dir, command)
    os.makedirs(journal_dir, exist_ok=True)
    return out_dir, journal_dir


def _remove_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:  # something is in it (another run's lock, an earlier output): it stays
        pass


# --------------------------------------------------------------------------------- journal


class Journal:
    """Append-only JSON-lines record of finished tasks, fsynced per line, so a killed run resumes.

    One format for every command: one JSON object per line, the task's report entry. The
    journals of earlier versions were the same, so their folders resume as they are. A line cut
    by a kill ends the journal; what is before it is good.
    """

    def __init__(self, path: str):
        self.path = path
        self._f = None

    def load(self) -> list[dict]:
        """The entries of an earlier run, up to the first line a kill cut short; [] when there is no
        journal. Raises UsageError, naming the journal, when it cannot be read.
        """
        entries = []
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:
                        break
                    if isinstance(entry, dict):
                        entries.append(entry)
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read the journal of an earlier run ({err}); remove it to start over, "
                             f"or pass --overwrite", shard=self.path) from None
        return entries

    def append(self, entry: dict) -> None:
        """Add one task's entry as a JSON line and fsync it: a kill after this keeps it. Raises OutputError."""
        try:
            if self._f is None:
                self._f = open(self.path, "a", encoding="utf-8")
            self._f.write(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as err:
            raise output_error(err, self.path, "cannot write the journal") from None

    def close(self, *, remove: bool) -> None:
        """Close the journal; ``remove``: delete it too (the run is complete). Raises OutputError when it
        cannot be removed.
        """
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except OSError as err:
                raise output_error(err, self.path, "cannot remove the journal") from None


# --------------------------------------------------------------------------------- report


def this_run(status: str) -> str:
    """``done``, ``skipped`` or ``failed`` for a per-shard status of this run (ok/salvaged/empty: done)."""
    if status == "skipped":
        return "skipped"
    if status == "failed":
        return "failed"
    return "done"


def this_run_counts(entries: Iterable[dict]) -> dict:
    """``{"done": n, "skipped": n, "failed": n}`` over report entries: each entry's ``this_run``, else
    what its status counts as (:func:`this_run`).
    """
    counts = dict.fromkeys(RUN_STATES, 0)
    for entry in entries:
        counts[entry.get("this_run") or this_run(entry.get("status", ""))] += 1
    return counts


# --------------------------------------------------------------------------------- verification


class DigestingTar:
    """A ``TarWriter`` that remembers ``(name, sha256 of data)`` of every member it adds, for
    ``verify_members``; everything else is passed through."""

    def __init__(self, tar):
        self._tar = tar
        self.written: list[tuple[str, bytes]] = []

    def add(self, name: str, data: bytes, *args, **kwargs):
        """Add a member to the wrapped writer and remember its name and content sha256; returns the writer's result."""
        import hashlib

        result = self._tar.add(name, data, *args, **kwargs)
        self.written.append((name, hashlib.sha256(data).digest()))
        return result

    def __getattr__(self, name):
        return getattr(self._tar, name)


def verify_members(expected: list[tuple[str, bytes]], *, shard: str, max_member_bytes: int = 1 << 31,
                   raw_names: bool = False) -> Callable[[str], None]:
    """A ``verify`` for ``AtomicFile.commit``: the written shard must read back as ``expected``
    (member names and sha256 digests, in order), else ``VerificationError`` naming ``shard``.

    ``raw_names``: read with the standard library's tar reader, which takes any member name (a
    quarantine's rejects shard keeps unsafe ones on purpose); else with shardkit's checked reader.
    """

    def verify(tmp: str) -> None:
        from shardkit.io.tar import check_read_back

        back = _raw_member_digests(tmp) if raw_names else member_digests(tmp, max_member_bytes=max_member_bytes)
        check_read_back(back, expected, shard=shard)

    return verify


def member_digests(path: str, *, max_member_bytes: int = 1 << 31) -> list[tuple[str, bytes]]:
    """``(name, sha256 of data)`` per member, read with shardkit's checked reader; a member above
    ``tario.STREAM_MEMBER_BYTES`` is hashed in chunks, never held whole."""
    from shardkit.io.tar import STREAM_MEMBER_BYTES, iter_shard_members, member_sha256

    return [(name, member_sha256(data)) for name, data in
            iter_shard_members(path, max_member_bytes=max_member_bytes, stream_over=STREAM_MEMBER_BYTES)]


def _raw_member_digests(path: str) -> list[tuple[str, bytes]]:
    import hashlib
    import tarfile

    from shardkit.io.tar import open_shard, shard_reader

    out = []
    with open_shard(path) as f, tarfile.open(fileobj=shard_reader(f, shard=path), mode="r|",
                                             encoding="utf-8", errors="surrogateescape") as tar:
        for info in tar:
            data = tar.extractfile(info).read() if info.isreg() else b""
            out.append((info.name, hashlib.sha256(data).digest()))
    return out


class HashingReader:
    """Exact reads passed through from ``source``, with a running sha256 and count of every byte read."""

    __slots__ = ("_read", "sha256", "size")

    def __init__(self, source):
        import hashlib

        self._read = source.read
        self.sha256 = hashlib.sha256()
        self.size = 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes from the source, added to ``sha256`` and ``size``."""
        data = self._read(n)
        self.sha256.update(data)
        self.size += len(data)
        return data


def verify_stream(expected: list[tuple[str, int]], sha256: bytes, size: int, *, shard: str,
                  max_member_bytes: int = 1 << 31) -> Callable[[str], None]:
    """A ``verify`` for ``AtomicFile.commit`` as strong as ``verify_members``, at one hash per byte.

    The written shard must read back through shardkit's checked tar reader (decompressed when
    compressed) as the members ``expected`` (names and sizes, in order), and the tar stream that
    reader parses, from its first byte to its last, must have the ``sha256`` and ``size`` of the
    tar stream the writer produced (a digest computed while writing, ``TarWriter`` output before
    any compression). Equal streams that parse as the same names and sizes hold the same member
    bytes, so no member is hashed on its own on either side.
    """

    def verify(tmp: str) -> None:
        from shardkit.errors import VerificationError
        from shardkit.io.tar import iter_tar_members, open_shard, shard_reader

        with open_shard(tmp) as f:
            stream = HashingReader(shard_reader(f, shard=tmp))
            back = [(name, len(data)) for name, data in
                    iter_tar_members(stream, shard=shard, max_member_bytes=max_member_bytes)]
            while stream.read(1 << 20):  # whatever follows the end-of-archive blocks counts too
                pass
        if back != expected:
            mismatch = next((a[0] for a, b in zip(expected, back) if a != b), None)
            raise VerificationError(f"written shard does not read back as written "
                                    f"({len(back)} vs {len(expected)} members)", shard=shard, member=mismatch)
        if stream.size != size or stream.sha256.digest() != sha256:
            raise VerificationError(f"written shard does not read back as written (its tar stream reads back as "
                                    f"{stream.size} bytes with another sha256; {size} bytes were written)",
                                    shard=shard)

    return verify
