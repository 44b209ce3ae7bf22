"""Files written all or nothing, and the checks of finished outputs: the bottom of every writer.

``AtomicFile(dst)`` / ``atomic_write_*``: a temporary name unique to this write
(``.NAME.<random>.partial`` beside ``dst``; for a URL, in ``TMPDIR``), fsync, ``verify(tmp)`` before
the final name, rename (or publish to the store), fsync the folder. An ``OSError`` becomes
``OutputError`` naming the path and the temporary file is removed. ``remove_leftovers(outputs)``
deletes what killed runs left. The training side uses ``pid_alive`` and ``atomic_write_bytes`` from
here; the writers' run lifecycle (``shardkit.run.lifecycle``) builds on the rest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import sys
from typing import Callable, Iterable

from shardkit.errors import ShardkitError, UsageError

_UMASK = os.umask(0)
os.umask(_UMASK)

PARTIAL_SUFFIX = ".partial"

# a disk that is full or failing: the path is right and a rerun resumes once there is room (exit 1); any
# other OSError (read-only, no permission, a vanished folder) says the output path is unusable (exit 2)
FULL_OR_FAILING = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


class OutputError(UsageError):
    """An output cannot be written: no space, no permission, read-only, its folder vanished.

    ``exit_code``: 1 for a full or failing disk (ENOSPC, EDQUOT, EFBIG, EIO: the same command resumes once
    there is room), 2 for an unusable output path (EROFS, EACCES, a vanished folder)."""

    check = "output"
    os_errno: int | None = None  # the OSError's errno (kept: a ``raise ... from None`` drops the cause)

    @property
    def exit_code(self) -> int:
        return 1 if self.os_errno in FULL_OR_FAILING else 2


def os_reason(err: OSError) -> str:
    """The words for an OSError: ``No space left on device``, ``Read-only file system``, ..."""
    return err.strerror or str(err) or type(err).__name__


def output_error(err: OSError, path: str, doing: str = "cannot write") -> OutputError:
    """An :class:`OutputError` for a failed write of ``path``: ``doing`` and the OS's reason (or "its
    folder vanished" when the folder is gone), chained to ``err``.
    """
    reason = os_reason(err)
    if err.errno == errno.ENOENT:
        reason = "its folder vanished" if not os.path.isdir(os.path.dirname(os.path.abspath(path)) or ".") \
            else reason
    out = OutputError(f"{doing} ({reason})", shard=path)
    out.os_errno = err.errno
    out.__cause__ = err
    return out

def _local(path: str) -> bool:
    return "://" not in path and not path.startswith("pipe:") and not path.rstrip().endswith("|")

def pid_alive(pid: int) -> bool:
    """Whether a process of this id exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True

# --------------------------------------------------------------------------------- atomic files


def fsync_dir(path: str) -> None:
    """fsync the folder ``path`` itself, so a rename into it survives a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(dst: str) -> str:
    """A temporary name for ``dst`` unique to this write: ``.NAME.<random>.partial`` beside it
    (for a URL, in the local temporary folder)."""
    token = secrets.token_hex(6)
    if not _local(dst):
        import hashlib
        import tempfile

        digest = hashlib.sha256(dst.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return os.path.join(tempfile.gettempdir(), f".shardkit-{digest}-{os.path.basename(dst)}.{token}{PARTIAL_SUFFIX}")
    return os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.{token}{PARTIAL_SUFFIX}")


def is_temporary_of(name: str, outputs: set[str]) -> bool:
    """Whether ``name`` is a temporary file of one of these output names: ``.NAME.<hex>.partial``
    (what ``temp_path`` makes) or ``.NAME.partial`` (what versions before the random part made)."""
    if not (name.startswith(".") and name.endswith(PARTIAL_SUFFIX)):
        return False
    stem = name[1:-len(PARTIAL_SUFFIX)]
    base, dot, token = stem.rpartition(".")
    return stem in outputs or bool(dot and token and base in outputs and all(c in "0123456789abcdef" for c in token))


def remove_leftovers(outputs: Iterable[str], keep: Iterable[str] = ()) -> int:
    """Delete the temporary files killed runs left for ``outputs`` (``.NAME[.<random>].partial``),
    but those in ``keep`` (paths a resumed run continues).

    Only names of these outputs, so another slice writing into the same folder is untouched; call
    it while holding the folder's lock. Returns how many were removed.
    """
    keep = {os.path.abspath(path) for path in keep}
    import tempfile

    folders: dict[str, set[str]] = {}
    for dst in outputs:
        if _local(dst):
            folders.setdefault(os.path.dirname(os.path.abspath(dst)), set()).add(os.path.basename(dst))
        else:
            import hashlib

            digest = hashlib.sha256(dst.encode("utf-8", "surrogateescape")).hexdigest()[:16]
            folders.setdefault(tempfile.gettempdir(), set()).add(f"shardkit-{digest}-{os.path.basename(dst)}")
    removed = 0
    for folder, names in folders.items():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if is_temporary_of(entry.name, names) and entry.path not in keep:
                try:
                    os.unlink(entry.path)
                    removed += 1
                except OSError:
                    pass
    return removed


class AtomicFile:
    """Write ``dst`` all or nothing: ``with AtomicFile(dst) as f: ...; f.commit(verify)``.

    ``f.file`` is the open binary temporary file. ``commit(verify=None)`` flushes, fsyncs and
    closes it, calls ``verify(tmp_path)`` (which raises if the bytes are wrong), then renames it to
    ``dst`` and fsyncs the folder (a URL: published through fsspec). Leaving the block without
    ``commit`` (an exception, or on purpose) removes the temporary file. OSErrors while writing
    are the caller's; ``commit`` raises ``OutputError`` naming ``dst``.
    """

    def __init__(self, dst: str, *, buffering: int = -1):
        self.dst = os.fspath(dst)
        self.tmp = temp_path(self.dst)
        self._buffering = buffering
        self.file = None
        self.committed = False

    def __enter__(self) -> "AtomicFile":
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 & ~_UMASK)
        except OSError as err:
            raise output_error(err, self.dst) from None
        self.file = os.fdopen(fd, "wb", buffering=self._buffering)
        return self

    def write(self, data) -> int:
        """Write ``data`` to the temporary file; returns the bytes written."""
        return self.file.write(data)

    def flush(self) -> None:
        """Flush the temporary file's buffer (not an fsync: ``commit`` does that)."""
        self.file.flush()

    def commit(self, verify: Callable[[str], None] | None = None, *, sync_while_verifying: bool = False) -> None:
        """``sync_while_verifying``: the fsync runs in a thread while ``verify`` reads the file back
        (both see the same bytes: the read-back comes from the page cache either way), so the wait for
        the disk overlaps the read-back's work; the rename still waits for both."""
        syncing, written, stored = self._flush_and_sync(background=sync_while_verifying and verify is not None)
        try:
            if written != stored:
                from shardkit.errors import VerificationError

                raise VerificationError(f"{stored} bytes on disk after writing {written}", shard=self.dst)
            if verify is not None:
                verify(self.tmp)
        finally:
            failed = syncing.wait() if syncing is not None else None
        if syncing is not None:
            self._close_after_sync(failed)
        self._publish()
        self.committed = True

    def _flush_and_sync(self, *, background: bool) -> tuple["_Fsync | None", int, int]:
        """Flush and fsync (in a thread when ``background``; the file stays open for it), then close;
        (the fsync thread or None, bytes written, bytes the file holds)."""
        syncing = None
        try:
            self.file.flush()
            if background:
                syncing = _Fsync(self.file.fileno())
            else:
                os.fsync(self.file.fileno())
            written, stored = self.file.tell(), os.fstat(self.file.fileno()).st_size
            if syncing is None:
                self.file.close()
        except OSError as err:
            if syncing is not None:
                syncing.wait()
            raise output_error(err, self.dst) from None
        return syncing, written, stored

    def _close_after_sync(self, failed: OSError | None) -> None:
        try:
            if failed is not None:
                raise failed
            self.file.close()
        except OSError as err:
            raise output_error(err, self.dst) from None

    def _publish(self) -> None:
        """Rename to ``dst`` and fsync its folder; a URL is published through fsspec."""
        if _local(self.dst):
            try:
                os.replace(self.tmp, self.dst)
                fsync_dir(os.path.dirname(os.path.abspath(self.dst)))
            except OSError as err:
                raise output_error(err, self.dst) from None
        else:
            from shardkit.io.remote import publish_output

            publish_output(self.tmp, self.dst)

    def discard(self) -> None:
        """Close and remove the temporary file without publishing it; ``dst`` stays untouched."""
        if self.file is not None and not self.file.closed:
            try:
                self.file.close()
            except OSError:
                pass
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
        except OSError:
            pass

    def __exit__(self, *exc) -> None:
        if not self.committed:
            self.discard()


class NamedWrites:
    """A binary output whose ``write``/``flush`` OSErrors (a full disk, a failing one) become ``OutputError``
    naming ``path``, the final name being written: a codec or tar writer stacked on it fails with the file's
    name, wherever in the stack the write happened. Everything else is the wrapped file's."""

    def __init__(self, f, path: str):
        self._f = f
        self._path = path

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as err:
            raise output_error(err, self._path) from None

    def flush(self) -> None:
        try:
            self._f.flush()
        except OSError as err:
            raise output_error(err, self._path) from None

    def __getattr__(self, name):
        return getattr(self._f, name)


class _Fsync:
    """``os.fsync(fd)`` in a thread (it releases the GIL); ``wait()`` returns its OSError or None."""

    def __init__(self, fd: int):
        import threading

        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, args=(fd,), name="shardkit-fsync", daemon=True)
        self._thread.start()

    def _run(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as err:
            self.error = err

    def wait(self) -> OSError | None:
        self._thread.join()
        return self.error


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp name, fsync, rename, fsync the folder).

    Any OSError becomes an ``OutputError`` (exit 2) naming ``path``; no temporary file is left.
    """
    with AtomicFile(path) as f:
        try:
            f.write(data)
        except OSError as err:
            raise output_error(err, path) from None
        f.commit()


def atomic_write_json(path: str, obj) -> None:
    """``obj`` as indented, key-sorted UTF-8 JSON into ``path``, atomically (temp name, fsync, rename)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))


def atomic_write_lines(path: str, lines) -> None:
    """``lines`` into ``path``, one a line, atomically as :func:`atomic_write_bytes`; streamed, so millions of
    lines (a 20 M-utterance mix's repeats) are never one string in memory."""
    with AtomicFile(path, buffering=1 << 20) as f:
        try:
            for line in lines:
                f.write(f"{line}\n".encode("utf-8"))
        except OSError as err:
            raise output_error(err, path) from None
        f.commit()


def partial_list_path(path: str) -> str:
    """``OUT/data.list`` -> ``OUT/data.partial.list`` (and ``data.slice-1-of-2.partial.list``): the name of a
    list that lacks the shards a run failed, so that no one takes it for the finished list."""
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.partial.{ext}" if dot and "/" not in ext else f"{path}.partial"


def publish_list(path: str, lines, *, complete: bool) -> str:
    """Write a run's shard list; returns where it went.

    Complete: ``path`` (and a ``.partial`` list of an earlier failed run goes). Incomplete (some shard
    failed): the :func:`partial_list_path` name, and a ``path`` of an earlier run goes, since it would
    look finished next to outputs this run did not make. Local or URL alike.
    """
    keep, drop = (path, partial_list_path(path)) if complete else (partial_list_path(path), path)
    atomic_write_lines(keep, lines)
    _remove_quietly(drop)
    return keep


def _remove_quietly(path: str) -> None:
    try:
        if _local(path):
            os.unlink(path)
        else:
            from shardkit.io.remote import filesystem

            fs, inner = filesystem(path, None)
            if fs.exists(inner):
                fs.rm(inner)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, UsageError) as err:  # the list just written says what is true; this one is stale
        print(f"shardkit: note: could not remove the stale list {path}: {err}", file=sys.stderr)


def load_json(path: str) -> dict | None:
    """The JSON document in ``path``, or None when it is missing, unreadable as UTF-8 JSON, or a folder."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, IsADirectoryError):
        return None


class HashingFile:
    """Binary output that hashes and counts what passes through it."""

    def __init__(self, f):
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        """Write ``data`` through, adding it to ``sha256`` and ``size``; returns its length."""
        self._f.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        """Flush the wrapped file."""
        self._f.flush()


def member_digest(name: str, data: bytes) -> bytes:
    """The sha256 of a member's content. ``name`` is not hashed here: :func:`combine_digests` puts
    each name beside its digest.
    """
    return hashlib.sha256(data).digest()


def combine_digests(entries: list[tuple[str, bytes]]) -> str:
    """One digest over the ordered (name, content digest) pairs of a shard."""
    h = hashlib.sha256()
    for name, digest in entries:
        h.update(name.encode("utf-8", "surrogateescape") + b"\x00" + digest)
    return h.hexdigest()


def file_sha256(path: str) -> str:
    """sha256 of a local file, or of an object read back through fsspec."""
    from shardkit.io.remote import is_local, open_input

    h = hashlib.sha256()
    with open(path, "rb") if is_local(path) else open_input(path) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def local_size(path: str) -> int | None:
    """Size of a local file by a stat; None when there is none here (gone, or a URL: never fetched)."""
    try:
        return os.stat(path).st_size
    except (OSError, ValueError):
        return None


def output_size(path: str) -> int | None:
    """Size of a finished output (local file or URL); None if there is none."""
    from shardkit.io.remote import input_info, is_local

    try:
        return os.stat(path).st_size if is_local(path) else input_info(path)["size"]
    except (OSError, ShardkitError):
        return None


def output_unchanged(path: str, size: int, sha256: str) -> bool:
    """Whether a finished output (local file or URL) still has the recorded size and sha256 (a URL is
    read back to hash it: object stores' ETags are not sha256); False when it cannot be read."""
    if output_size(path) != size:
        return False
    try:
        return file_sha256(path) == sha256
    except (OSError, ShardkitError):
        return False


def load_report(path: str) -> dict | None:
    """A previous run's report, local or at a URL; None if there is none or it does not parse."""
    import json

    from shardkit.io.remote import is_local, open_input

    if is_local(path):
        return load_json(path)
    try:
        with open_input(path) as f:
            return json.loads(f.read())
    except (ShardkitError, ValueError):
        return None


def remove_temporary_keys(outputs: list[str]) -> None:
    """Delete the temporary keys a killed run left beside these outputs (``.NAME.<hex>.partial``).

    Only the names of these outputs: another job of the array may be publishing its own there now.
    """
    from shardkit.io.remote import filesystem

    folders: dict[str, set[str]] = {}
    for dst in outputs:
        folder, _, name = dst.rpartition("/")
        folders.setdefault(folder, set()).add(name)
    for folder, names in folders.items():
        fs, key = filesystem(folder, None)
        try:
            fs.invalidate_cache(key)
            listed = fs.ls(key, detail=False)
        except FileNotFoundError:
            continue
        except Exception as err:
            raise ShardkitError(f"cannot list the output folder ({type(err).__name__}: {err})", shard=folder) from err
        for path in listed:
            if is_temporary_of(path.rpartition("/")[2], names):
                fs.rm(path)
