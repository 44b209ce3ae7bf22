"""Inputs and outputs beyond local files: fsspec URLs (s3://, gs://, hdfs://, http(s)://) and pipes.

- ``open_input(path)``: a local path, an fsspec URL, ``pipe:CMD`` (WebDataset's convention:
  the command's stdout is the shard, e.g. ``pipe:aws s3 cp s3://b/x.tar -``) or ``-`` (standard
  input). Returns a binary
  file object with ``peek``; failures raise ``ShardkitError`` naming the path or command. Every
  remote read has a deadline and transient failures are retried (``IOSettings``, set by the CLI's
  --io-timeout/--io-retries through ``configure_io``); a failure is an ``InputError`` saying what
  happened (HTTP status, stalled N s, closed after X of Y bytes, redirect loop, exit status). A
  ``pipe:`` command runs only when allowed (--allow-pipes, SHARDKIT_ALLOW_PIPES=1,
  ``allow_pipes=True``), in its own process group, killed when its shard ends early or fails.
- ``publish_output(local_tmp, dest)``: the last step of an atomic write. Local: ``os.replace``.
  URL: upload to a temporary key beside the destination, then move it onto the final key
  (rename where the store has one; copy + delete on object stores, where the copy appears whole),
  so readers never see a partial object under the final name.

Credentials and endpoints come from the store's usual configuration (``AWS_*`` variables,
``~/.aws``, ``FSSPEC_S3_ENDPOINT_URL=...`` for an S3-compatible endpoint) or ``storage_options``.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace

from shardkit.errors import InputError, InputMissingError, ShardkitError, UsageError

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
    """Whether ``path`` is a local file path: neither a URL (``scheme://``) nor a ``pipe:`` command."""
    return not is_url(path) and not is_pipe(path)


def _fsspec():
    try:
        import fsspec
    except ImportError:
        raise UsageError("URL inputs and outputs need fsspec: pip install 'shardkit[remote]'") from None
    return fsspec


def filesystem(url: str, storage_options: dict | None):
    """``(fsspec filesystem, path inside it)`` for ``url``, with fsspec's configured options for its
    protocol, then ``storage_options``, and shardkit's connect/read deadlines.

    Raises UsageError naming the URL when fsspec or the protocol's driver (s3fs, gcsfs, ...) is missing,
    or fsspec does not know the URL.
    """
    fsspec = _fsspec()
    protocol = _protocol(url)
    options = {**fsspec.config.conf.get(protocol, {}), **(storage_options or {})}
    try:
        return fsspec.core.url_to_fs(url, **_with_deadlines(protocol, options))
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


# --- the input layer's settings: deadlines, retries, pipes ----------------------------------------

ALLOW_PIPES_ENV = "SHARDKIT_ALLOW_PIPES"
DEFAULT_CONNECT_TIMEOUT = 30.0
DEFAULT_READ_TIMEOUT = 120.0
DEFAULT_RETRIES = 3
PIPE_REFUSED = (f"refusing to run the command of a pipe: input (a list can name any command); allow it with "
                f"--allow-pipes, or {ALLOW_PIPES_ENV}=1 in the environment (readers: allow_pipes=True)")


@dataclass(frozen=True)
class IOSettings:
    """How every remote read behaves. ``connect_timeout``: seconds to open a connection;
    ``read_timeout``: seconds a read may wait for its next byte (an HTTP/S3 body or a ``pipe:``
    command's output) before the input is called stalled; ``retries``: further attempts after a
    transient failure (5xx, reset, short body, stall), ``backoff`` seconds apart, doubling;
    ``allow_pipes``: run the commands of ``pipe:`` inputs (else refused, unless SHARDKIT_ALLOW_PIPES=1)."""

    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    retries: int = DEFAULT_RETRIES
    backoff: float = 0.5
    allow_pipes: bool = False


_SETTINGS = IOSettings()


def io_settings() -> IOSettings:
    """The process's current :class:`IOSettings` (as :func:`configure_io` last set them)."""
    return _SETTINGS


def configure_io(settings: IOSettings | None = None, **changes) -> IOSettings:
    """Set this process's input settings (the CLI's --io-timeout, --io-retries, --allow-pipes); the
    executor hands them to every worker process and Ray task. Returns the previous settings."""
    global _SETTINGS
    previous = _SETTINGS
    _SETTINGS = replace(settings or _SETTINGS, **changes)
    return previous


def pipes_allowed(allow_pipes: bool | None = None) -> bool:
    """Whether a ``pipe:`` command may run: asked for by the caller, the CLI or SHARDKIT_ALLOW_PIPES=1."""
    return bool(allow_pipes) or _SETTINGS.allow_pipes or os.environ.get(ALLOW_PIPES_ENV, "") == "1"


def settings_for_workers() -> IOSettings:
    """The settings with the environment's pipe permission resolved here, for processes that may not share it."""
    return replace(_SETTINGS, allow_pipes=pipes_allowed())


def parse_io_timeout(text: str) -> tuple[float, float]:
    """``READ`` or ``CONNECT:READ`` seconds (``30:120``) -> (connect, read); UsageError otherwise."""
    parts = str(text).split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(not v > 0 for v in values):
        raise UsageError(f"--io-timeout takes READ or CONNECT:READ seconds above 0 (e.g. 30:120), not {text!r}")
    return (values[0], values[1]) if len(values) == 2 else (min(DEFAULT_CONNECT_TIMEOUT, values[0]), values[0])


def _with_deadlines(protocol: str, options: dict) -> dict:
    """Storage options with this process's deadlines added where the caller set none.

    HTTP(S): aiohttp's connect and per-read (socket) timeouts; the body is taken as stored
    (``auto_decompress`` off, ``Accept-Encoding: identity``): a Content-Encoding the body does not
    have cannot break it, and a body a server did compress is a gzip stream shardkit's reader
    recognises. S3: botocore's connect and read timeouts."""
    s = _SETTINGS
    if protocol in ("http", "https"):
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=s.connect_timeout,
                                                           sock_read=s.read_timeout))
        client.setdefault("auto_decompress", False)  # each request asks for identity (RemoteReader._open)
        return {**options, "client_kwargs": client}
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", s.connect_timeout)
        config.setdefault("read_timeout", s.read_timeout)
        return {**options, "config_kwargs": config}
    return options


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def open_input(path: str, *, storage_options: dict | None = None,
               allow_pipes: bool | None = None) -> io.BufferedIOBase:
    """Open a shard for streaming reads: local path, fsspec URL or ``pipe:CMD``.

    Every read has a deadline (``io_settings()``), transient failures are retried, and every
    failure is an ``InputError`` naming the URL or command and the reason. A ``pipe:`` command
    runs only when allowed (``allow_pipes``, --allow-pipes or SHARDKIT_ALLOW_PIPES=1).
    """
    path = os.fspath(path)
    if path == STDIN:  # a duplicate of fd 0: closing the shard leaves the process's stdin open
        return os.fdopen(os.dup(0), "rb", buffering=_READ_BUFFER)
    if is_pipe(path):
        if not pipes_allowed(allow_pipes):
            raise InputError(PIPE_REFUSED, shard=path)
        return io.BufferedReader(PipeReader(path[len(PIPE_PREFIX):], _SETTINGS), buffer_size=_READ_BUFFER)
    if not is_url(path):
        try:
            return open(path, "rb", buffering=_READ_BUFFER)
        except IsADirectoryError:
            raise ShardkitError("is a directory, not a shard", shard=path) from None
        except OSError as err:
            raise ShardkitError(f"cannot open ({_describe(err)})", shard=path) from None
    return io.BufferedReader(RemoteReader(path, storage_options, _SETTINGS), buffer_size=_READ_BUFFER)


# --- what went wrong, in words ----------------------------------------------------------------------


def _chain(err: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while err is not None and err not in seen and len(seen) < 8:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def classify_failure(err: BaseException, *, where: str, settings: IOSettings,
                     body_start: int = 0) -> tuple[bool, bool, str]:
    """``(transient, missing, reason)`` of a failed remote open or read; ``where`` says how far it got,
    ``body_start`` where the failed response's body began in the file (a resumed range, else 0).

    Drivers raise their own families (aiohttp, botocore, OSError) and fsspec often hides the cause
    behind a FileNotFoundError: the whole chain is read, most specific cause first."""
    chain = _chain(err)
    for e in chain:
        for classify in _CLASSIFIERS:
            verdict = classify(e, where, settings, body_start)
            if verdict is not None:
                return verdict
    if any(isinstance(e, FileNotFoundError) for e in chain):
        return False, True, "no such file or object"
    if any(isinstance(e, PermissionError) for e in chain):
        return False, False, "permission denied"
    return False, False, _describe(err)


# Each classifier reads one exception of the chain: ``(transient, missing, reason)``, or None when it is
# not of the classifier's family. Tried in this order, for each exception of the chain in turn.

def _redirect_loop(e: BaseException, where: str, settings: IOSettings, body_start: int):
    if type(e).__name__ == "TooManyRedirects":
        return False, False, f"redirect loop (gave up after {len(getattr(e, 'history', ()) or ())} redirects)"
    return None


def _http_status(e: BaseException, where: str, settings: IOSettings, body_start: int):
    name = type(e).__name__
    status = getattr(e, "status", None)
    if name == "ClientResponseError" or (isinstance(status, int) and 100 <= status < 600 and "Response" in name):
        status = int(status or 0)
        message = getattr(e, "message", "") or ""
        return (status >= 500 or status in (408, 429)), status in (404, 410), f"HTTP {status} {message}".strip()
    return None


def _s3_error(e: BaseException, where: str, settings: IOSettings, body_start: int):
    if type(e).__name__ == "ClientError" and hasattr(e, "response"):  # botocore
        code = str(e.response.get("Error", {}).get("Code", ""))
        http = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return (http >= 500 or code in ("SlowDown", "RequestTimeout", "InternalError")), \
            code in ("NoSuchKey", "404", "NoSuchBucket"), f"S3 {code or http}: {_first_line(e)}"
    return None


def _timeout_errors() -> tuple[type, ...]:
    """TimeoutError, and asyncio's own before Python 3.11 (its alias since). asyncio is not imported for it: a
    run that never loaded asyncio (no fsspec store) cannot have raised one, and a local run skips its import."""
    asyncio = sys.modules.get("asyncio")
    return (TimeoutError, asyncio.TimeoutError) if asyncio is not None else (TimeoutError,)


def _timeout(e: BaseException, where: str, settings: IOSettings, body_start: int):
    name = type(e).__name__
    if name in ("ConnectionTimeoutError", "ConnectTimeoutError"):
        return True, False, f"no connection within {settings.connect_timeout:g} s"
    if name in ("SocketTimeoutError", "ServerTimeoutError", "ReadTimeoutError", "ReadTimeout") \
            or isinstance(e, _timeout_errors()):
        return True, False, f"stalled: no data for {settings.read_timeout:g} s {where}"
    return None


def _short_body(e: BaseException, where: str, settings: IOSettings, body_start: int):
    if type(e).__name__ not in ("ClientPayloadError", "ContentLengthError", "TransferEncodingError",
                                "IncompleteRead", "ResponseStreamingError"):
        return None
    if "encoding" in str(e).lower() and "content-length" not in str(e).lower():
        return False, False, f"body does not decode as its Content-Encoding ({_first_line(e)})"
    received = re.search(r"received (\d+) of (\d+) bytes", str(e))
    if received:
        got, total = body_start + int(received.group(1)), body_start + int(received.group(2))
        return True, False, f"connection closed after {got} of {total} bytes"
    return True, False, f"connection closed {where} ({_first_line(e)})"


def _connection_failed(e: BaseException, where: str, settings: IOSettings, body_start: int):
    if type(e).__name__ in ("ServerDisconnectedError", "ClientOSError", "ClientConnectorError",
                            "EndpointConnectionError", "ConnectionClosedError") or isinstance(e, ConnectionError):
        return True, False, f"connection failed ({_first_line(e)})"
    return None


_CLASSIFIERS = (_redirect_loop, _http_status, _s3_error, _timeout, _short_body, _connection_failed)


class RemoteReader(io.RawIOBase):
    """A URL read front to back through fsspec, with deadlines and bounded retries.

    HTTP(S) is one streamed GET (a retry resumes with a Range request, or reads again from the start
    and skips what was read when the server ignores ranges); other stores open a file and seek.
    A body shorter than its size is retried as a transient failure; the last failure raises
    ``InputError`` (``InputMissingError`` for a 404 or missing key) naming the URL and the reason.
    """

    def __init__(self, url: str, storage_options: dict | None, settings: IOSettings):
        super().__init__()
        self.url = url
        self.settings = settings
        self._options = storage_options
        self._http = _protocol(url) in ("http", "https")
        self._raw = None
        self._fs = self._key = None
        self.pos = 0
        self.size: int | None = None
        self._body_start = 0  # where the current response's body begins in the file
        self._attempt(self._open)

    @property
    def name(self) -> str:
        """The URL, as error messages and reports name the input."""
        return self.url

    def readable(self) -> bool:
        """Always True: a reader reads (``io.BufferedReader`` asks)."""
        return True

    def tell(self) -> int:
        """Bytes handed out so far (the position in the object)."""
        return self.pos

    def _where(self) -> str:
        of = f" of {self.size}" if self.size is not None else ""
        return f"after {self.pos}{of} bytes"

    def _open(self) -> None:
        if self._fs is None:
            self._fs, self._key = filesystem(self.url, self._options)
        if not self._http:
            raw = self._fs.open(self._key, "rb", block_size=_READ_BUFFER)
            self.size = getattr(raw, "size", None)
            if self.pos:
                raw.seek(self.pos)
            self._raw = raw
            return
        if self.size is None and self.pos == 0:
            self.size = self._fs.info(self._key).get("size")
        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={self.pos}-"} if self.pos else {})}
        raw = self._fs.open(self._key, "rb", block_size=0, size=self.size, headers=headers)
        self._raw = raw
        response = getattr(raw, "r", None)
        self._body_start = self.pos if getattr(response, "status", 206) == 206 else 0
        if self.pos and not self._body_start:  # the server ignored the range: skip ahead
            self._skip_read_bytes(raw)

    def _skip_read_bytes(self, raw) -> None:
        """Read past the ``pos`` bytes read before, of a response that starts at the beginning again."""
        left = self.pos
        while left:
            skipped = raw.read(min(left, _READ_BUFFER))
            if not skipped:
                raise ConnectionResetError(f"body ended before the {self.pos} bytes read before")
            left -= len(skipped)

    def _drop(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            try:
                raw.close()
            except Exception:  # a broken connection may fail to close; the failure is already known
                pass

    def _attempt(self, step):
        """Run ``step`` with the retry policy; returns its result or raises InputError."""
        attempts = 0
        while True:
            try:
                return step()
            except Exception as err:  # drivers raise their own families; each is classified
                transient, missing, reason = classify_failure(err, where=self._where(), settings=self.settings,
                                                              body_start=self._body_start)
                cause = err
            self._drop()
            attempts += 1
            if not transient or attempts > self.settings.retries:
                tried = f" (tried {attempts} times)" if attempts > 1 else ""
                kind = InputMissingError if missing else InputError
                raise kind(f"{reason}{tried}", shard=self.url) from cause
            time.sleep(self.settings.backoff * 2 ** (attempts - 1))

    def _read_some(self, n: int) -> bytes:
        if self._raw is None:
            self._open()
        data = self._raw.read(n)
        if not data and self.size is not None and self.pos < self.size:
            raise ConnectionResetError("the body ended early")
        return data

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` with the next bytes; 0 at the end. A transient failure is retried (resuming
        at this position); the last one raises InputError naming the URL.
        """
        data = self._attempt(lambda: self._read_some(len(buffer)))
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        """The rest of the object in reads of 1 MiB (RawIOBase's would ask for 8 KiB at a time)."""
        chunks = []
        while data := self._attempt(lambda: self._read_some(_READ_BUFFER)):
            self.pos += len(data)
            chunks.append(data)
        return b"".join(chunks)

    def close(self) -> None:
        """Drop the connection or open file; idempotent."""
        if not self.closed:
            self._drop()
        super().close()


_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class PipeReader(io.RawIOBase):
    """The stdout of a shell command as a raw binary file; a failing command raises InputError.

    The command runs in its own process group. A read that waits longer than the read timeout
    for output kills the group and raises ("stalled"). The exit status is checked at end of stream
    and on close. Closing before the end kills the group, which is then not an error: the reader
    had what it needed.
    """

    def __init__(self, command: str, settings: IOSettings | None = None):
        super().__init__()
        self.command = command
        self.settings = settings or _SETTINGS
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: a chatty command can't block
        try:
            self._proc = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=self._stderr, bufsize=0, start_new_session=True)
        except OSError as err:
            self._stderr.close()
            raise InputError(f"cannot start command ({_describe(err)})", shard=f"pipe:{command}") from err
        self._fd = self._proc.stdout.fileno()
        try:  # a larger pipe: fewer wake-ups per MiB (Linux F_SETPIPE_SZ; the default is 64 KiB)
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, _READ_BUFFER)
        except OSError:  # above /proc/sys/fs/pipe-max-size for this user: the default works
            pass
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self.pos = 0
        self._at_eof = False
        self._checked = False

    @property
    def name(self) -> str:
        """``pipe:COMMAND``, as the list line named it."""
        return f"pipe:{self.command}"

    def readable(self) -> bool:
        """Always True: a reader reads (``io.BufferedReader`` asks)."""
        return True

    def tell(self) -> int:
        """Bytes of the command's output read so far."""
        return self.pos

    def _kill_group(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` from the command's output; 0 at its end, once the command exited with 0.

        Raises InputError when no byte comes within the read timeout (the command's process group is
        killed) or the command fails (its status and the last line it wrote to stderr).
        """
        if self._at_eof or not len(buffer):
            return 0
        if not self._poll.poll(int(self.settings.read_timeout * 1000)):
            self._kill_group()
            self._proc.wait()
            self._checked = True
            raise InputError(f"command stalled: no output for {self.settings.read_timeout:g} s after {self.pos} "
                             f"bytes (its process group was killed)", shard=self.name)
        n = os.readv(self._fd, [buffer])
        if n == 0:
            self._at_eof = True
            self._check(self._wait_exit())
        self.pos += n
        return n

    def _wait_exit(self) -> int:
        try:
            return self._proc.wait(timeout=self.settings.read_timeout)
        except subprocess.TimeoutExpired:  # stdout closed, but the command goes on: stop it
            self._kill_group()
            self._proc.wait()
            self._checked = True
            raise InputError(f"command closed its output after {self.pos} bytes but did not exit within "
                             f"{self.settings.read_timeout:g} s (its process group was killed)",
                             shard=self.name) from None

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
        raise InputError(f"command {how} after writing {self.pos} bytes{said}", shard=self.name)

    def close(self) -> None:
        """Stop the command if it still runs (its whole process group) and check how it ended: closing
        before the end is normal (SIGPIPE), any other failure raises InputError.
        """
        if self.closed:
            return
        try:
            returncode = self._proc.poll()
            if returncode is None:  # stopped reading before the end (or a failure above): stop the command
                self._kill_group()
                self._proc.wait()
                self._checked = True
            else:
                self._kill_group()  # anything it left running in its group
                self._check(returncode)
        finally:
            self._proc.stdout.close()
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
    except Exception as err:  # in words (HTTP status, redirect loop, no such object), as open_input says it
        _, missing, reason = classify_failure(err, where="before its first byte", settings=_SETTINGS)
        raise (InputMissingError if missing else InputError)(reason, shard=path) from err
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
