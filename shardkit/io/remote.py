"""Inputs and outputs beyond local files: fsspec URLs (s3://, gs://, hdfs://, http(s)://) and pipes.

- ``open_input(path)``: a local path, an fsspec URL, ``pipe:CMD`` (WebDataset's convention:
  the command's stdout is the shard, e.g. ``pipe:aws s3 cp s3://b/x.tar -``) or ``-`` (standard
  input). Returns a binary
  file object with ``peek``; failures raise ``ShardkitError`` naming the path or command.
- ``publish_output(local_tmp, dest)``: the last step of an atomic write. Local: ``os.replace``.
  URL: upload to a temporary key beside the destination, then move it onto the final key
  (rename where the store has one; copy + delete on object stores, where the copy appears whole),
  so readers never see a partial object under the final name.

Credentials and endpoints come from the store's usual configuration (``AWS_*`` variables,
``~/.aws``, ``FSSPEC_S3_ENDPOINT_URL=...`` for an S3-compatible endpoint) or ``storage_options``.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import tempfile
import uuid

from shardkit.errors import ShardkitError, UsageError

PIPE_PREFIX = "pipe:"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_READ_BUFFER = 1 << 20


def is_url(path: str) -> bool:
    """``s3://b/k``, ``https://h/x``, ``file:///x``: anything with a scheme (not ``pipe:``)."""
    return bool(_URL.match(os.fspath(path)))


STDIN = "-"


def is_pipe(path: str) -> bool:
    """``pipe:CMD``, or ``-`` (standard input): an explicit stream, read once, front to back."""
    path = os.fspath(path)
    return path == STDIN or path.startswith(PIPE_PREFIX)


def is_local(path: str) -> bool:
    return not is_url(path) and not is_pipe(path)


def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise UsageError("URL inputs and outputs need fsspec: pip install 'shardkit[remote]'") from None
    return fsspec


def filesystem(url: str, storage_options: dict | None):
    fsspec = _fsspec()
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as err:  # the protocol's driver (s3fs, gcsfs, ...) is missing
        raise UsageError(f"cannot handle this URL: {err}", shard=url) from None
    except ValueError as err:
        raise UsageError(f"not a URL fsspec knows ({err})", shard=url) from None


def _describe(err: BaseException) -> str:
    if isinstance(err, FileNotFoundError):
        return "no such file or object"
    if isinstance(err, PermissionError):
        return "permission denied"
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def open_input(path: str, *, storage_options: dict | None = None) -> io.BufferedIOBase:
    """Open a shard for streaming reads: local path, fsspec URL or ``pipe:CMD``."""
    path = os.fspath(path)
    if path == STDIN:  # a duplicate of fd 0: closing the shard leaves the process's stdin open
        return os.fdopen(os.dup(0), "rb", buffering=_READ_BUFFER)
    if is_pipe(path):
        return PipeReader(path[len(PIPE_PREFIX):])
    if not is_url(path):
        try:
            return open(path, "rb", buffering=_READ_BUFFER)
        except IsADirectoryError:
            raise ShardkitError("is a directory, not a shard", shard=path) from None
        except OSError as err:
            raise ShardkitError(f"cannot open ({_describe(err)})", shard=path) from None
    fs, key = filesystem(path, storage_options)
    try:
        raw = fs.open(key, "rb", block_size=_READ_BUFFER)
    except Exception as err:  # drivers raise their own families (botocore, aiohttp, OSError)
        raise ShardkitError(f"cannot open ({_describe(err)})", shard=path) from err
    # a peek()-able buffered file is what shardkit's readers sniff the codec from
    return raw if hasattr(raw, "peek") else _NamedBufferedReader(raw, path)


class _NamedBufferedReader(io.BufferedReader):
    """BufferedReader over an fsspec file; read errors name the URL instead of a driver's internals."""

    def __init__(self, raw, url: str):
        super().__init__(raw, buffer_size=_READ_BUFFER)
        self.url = url

    def read(self, size=-1):
        try:
            return super().read(size)
        except Exception as err:
            raise ShardkitError(f"read failed ({_describe(err)})", shard=self.url) from err

    def read1(self, size=-1):
        try:
            return super().read1(size)
        except Exception as err:
            raise ShardkitError(f"read failed ({_describe(err)})", shard=self.url) from err


class PipeReader(io.RawIOBase):
    """The stdout of a shell command as a binary file; a failing command raises ShardkitError.

    The exit status is checked at end of stream and on close. Closing before the end stops the
    command (it gets SIGPIPE), which is then not an error: the reader had what it needed.
    """

    def __init__(self, command: str):
        super().__init__()
        self.command = command
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: a chatty command can't block
        try:
            self._proc = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=self._stderr, bufsize=_READ_BUFFER)
        except OSError as err:
            self._stderr.close()
            raise ShardkitError(f"cannot start command ({_describe(err)})", shard=f"pipe:{command}") from err
        self._out = self._proc.stdout
        self._at_eof = False
        self._checked = False

    @property
    def name(self) -> str:
        return f"pipe:{self.command}"

    def readable(self) -> bool:
        return True

    def peek(self, size: int = 0) -> bytes:
        return self._out.peek(size)

    def readinto(self, buffer) -> int:
        n = self._out.readinto(buffer)
        if n == 0 and len(buffer):
            self._at_eof = True
            self._check(self._proc.wait())
        return n

    def read(self, size: int = -1) -> bytes:
        data = self._out.read(size) if size is not None and size >= 0 else self._out.read()
        if not data and size != 0:
            self._at_eof = True
            self._check(self._proc.wait())
        return data

    def read1(self, size: int = -1) -> bytes:
        data = self._out.read1(size)
        if not data and size != 0:
            self._at_eof = True
            self._check(self._proc.wait())
        return data

    def _check(self, returncode: int) -> None:
        if self._checked:
            return
        self._checked = True
        # closed before the end: the command dies of SIGPIPE (the shell reports it as 128 + 13)
        if returncode == 0 or (not self._at_eof and returncode in (-signal.SIGPIPE, 128 + signal.SIGPIPE)):
            return
        self._stderr.seek(0, io.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 2000))
        tail = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        said = f": {tail[-1]}" if tail else ""
        how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with status {returncode}"
        raise ShardkitError(f"command {how}{said}", shard=self.name)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._out.close()
            try:
                returncode = self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # it ignores SIGPIPE: stop it
                self._proc.kill()
                returncode = self._proc.wait()
            self._check(returncode)
        finally:
            self._stderr.close()
            super().close()


def input_info(path: str, *, storage_options: dict | None = None) -> dict:
    """``{"path", "size", "mtime_ns"}`` of an input (``None`` where unknown: pipes, some stores)."""
    path = os.fspath(path)
    if is_pipe(path):
        return {"path": path, "size": None, "mtime_ns": None}
    if not is_url(path):
        try:
            st = os.stat(path)
        except OSError as err:
            raise ShardkitError(_describe(err), shard=path) from None
        return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    fs, key = filesystem(path, storage_options)
    try:
        info = fs.info(key)
    except Exception as err:
        raise ShardkitError(_describe(err), shard=path) from err
    modified = info.get("LastModified") or info.get("mtime") or info.get("updated")
    mtime_ns = None
    if hasattr(modified, "timestamp"):
        mtime_ns = int(modified.timestamp() * 1e9)
    elif isinstance(modified, (int, float)):
        mtime_ns = int(modified * 1e9)
    return {"path": path, "size": info.get("size"), "mtime_ns": mtime_ns}


def publish_output(local_tmp_path: str, dest: str, *, storage_options: dict | None = None) -> None:
    """Move a finished, fsynced local temp file onto ``dest`` (path or URL), all or nothing.

    The local temp file is consumed (renamed, or deleted once uploaded). On failure nothing is
    left under ``dest`` or the temporary key, and the local file is kept for a retry.
    """
    dest = os.fspath(dest)
    if is_pipe(dest):
        raise UsageError("an output cannot be a pipe: command", shard=dest)
    if not is_url(dest):
        try:
            os.replace(local_tmp_path, dest)
            folder = os.open(os.path.dirname(os.path.abspath(dest)), os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError as err:
            raise ShardkitError(f"cannot publish ({_describe(err)})", shard=dest) from err
        return
    fs, key = filesystem(dest, storage_options)
    folder, name = key.rsplit("/", 1) if "/" in key else ("", key)
    temp_key = f"{folder}/.{name}.{uuid.uuid4().hex}.partial" if folder else f".{name}.{uuid.uuid4().hex}.partial"
    try:
        fs.put_file(local_tmp_path, temp_key)
        fs.mv(temp_key, key)
    except Exception as err:
        try:
            if fs.exists(temp_key):
                fs.rm(temp_key)
        except Exception:  # the original failure is the one worth reporting
            pass
        raise ShardkitError(f"cannot publish ({_describe(err)})", shard=dest) from err
    os.unlink(local_tmp_path)
