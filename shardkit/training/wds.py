"""shardkit's decoding inside a WebDataset pipeline: one line to change, most of the reader's speed.

WebDataset (``import webdataset as wds``) reads shardkit's shards as they are: plain ``.tar``,
FLAC members in a plain tar, and ``.tar.zst`` (through the tarfile zstd hook that
``shardkit wenet enable-zstd`` installs, or a ``pipe:zstd -dc < shard`` URL). Its samples are
dicts ``{"__key__", "__url__", "txt": bytes, "wav": bytes, ...}``; this module turns the audio
bytes into samples with shardkit's decoder (:func:`shardkit.training.reader.decode_fast`: 16-bit PCM WAV
by one numpy cast, everything else through soundfile), which is what makes shardkit's own reader
fast. Each is one line in a WebDataset pipeline::

    ds = wds.WebDataset(urls, shardshuffle=100, nodesplitter=wds.split_by_node)
    ds = ds.map(shardkit.training.wds.decode_audio())          # instead of .decode(wds.torch_audio)
    ds = ds.decode(shardkit.training.wds.audio_handler())      # or as a handler of WebDataset's .decode()
    ds = shardkit.training.wds.WebDataset(urls, ...)           # the same pipeline, tar read by shardkit

:func:`decode_audio` is a sample stage (for ``.map``): audio fields become ``(samples,
sample_rate)``, ``txt`` becomes ``str``, other fields stay bytes; every error is a
:class:`~shardkit.errors.ShardkitError` naming the shard (``__url__``) and the member
(``__key__`` and extension). :func:`audio_handler` plugs into WebDataset's own decoder next to its
other handlers; a handler sees only the extension and the bytes, so its errors (an
:class:`~shardkit.errors.AudioError`) reach the caller inside WebDataset's ``DecodingError``,
which carries ``key`` and ``url``.

``output="numpy"`` gives float32 arrays of shape (frames, channels), as
:func:`shardkit.iter_samples`; ``output="torch"`` gives tensors of shape (channels, frames), as
``torchaudio.load`` and ``wds.torch_audio`` do.

WebDataset's own ``tarfile`` reader costs more than shardkit's whole reader on plain WAV, so the
decoder alone reaches about half of shardkit's speed there; :class:`tarfile_to_samples` (a
drop-in for ``wds.tarfile_to_samples()``) and :func:`WebDataset` (a ``wds.WebDataset`` with that
stage in place of its reader) give the rest. "Drop-in" means: every argument of the replaced
objects, the same samples, the same error policy (``handler``) and exception types callers catch
(``tarfile.ReadError``, ``OSError``, ``ValueError``); webdataset 1.0.2's own test suite passes
with them in place (tests/webdataset_suite). Where shardkit differs on purpose, a named policy
with an option says so: ``allow_pipes`` (``pipe:`` URLs run only when allowed) and
``unsafe_names`` ('..'/absolute member names refused unless ``"read"``); see
:class:`tarfile_to_samples`. Only :func:`WebDataset` and URLs other than local files and ``pipe:``
(opened by webdataset's ``gopen``) need webdataset; the stages and the handler are plain callables.
"""

from __future__ import annotations

import os
import re
from typing import Callable
from urllib.parse import urlparse

import numpy as np

from shardkit.errors import (
    DuplicateMemberError,
    EmptyTarError,
    NonRegularMemberError,
    ShardkitError,
    UnsafeNameError,
    UsageError,
)
from shardkit.io.tar import AUDIO_EXTENSIONS
from shardkit.training.reader import DTYPES, decode_fast

OUTPUTS = ("numpy", "torch")
# tarfile_to_samples' policies for member names that would leave the folder if extracted ('..', '/x').
UNSAFE_NAME_POLICIES = ("refuse", "read")


def _check(dtype: str, output: str) -> None:
    if dtype not in DTYPES:
        raise UsageError(f"unsupported dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if output not in OUTPUTS:
        raise UsageError(f"unsupported output {output!r}; choose from {', '.join(OUTPUTS)}")


def _to_torch(samples: np.ndarray):
    import torch

    tensor = torch.from_numpy(samples.T)  # (channels, frames); a view, contiguous for mono
    return tensor if samples.shape[1] == 1 else tensor.contiguous()


def _extension(field: str) -> str:
    """The audio extension of a WebDataset field: the text after its last '.' (``b.wav`` -> ``wav``)."""
    return field.rsplit(".", 1)[-1].lower()


def _converter(dtype: str, output: str) -> Callable[[object], tuple]:
    _check(dtype, output)
    if output == "numpy":
        def convert(data):
            return decode_fast(data, dtype)
    else:
        def convert(data):
            samples, rate = decode_fast(data, dtype)
            return _to_torch(samples), rate
    return convert


def audio_handler(dtype: str = "float32", output: str = "numpy",
                  extensions=AUDIO_EXTENSIONS) -> Callable[[str, bytes], tuple | None]:
    """A handler for WebDataset's ``.decode(...)``: audio bytes -> ``(samples, sample_rate)``.

    Answers fields whose last extension is in ``extensions`` (wav, flac, mp3, ...; others return
    None, so WebDataset's next handler takes them).

    Args:
        dtype: sample type of the arrays: ``float32`` (in [-1, 1)), ``int16`` or ``float64``.
        output: ``numpy`` (float arrays of shape (frames, channels)) or ``torch`` (tensors of shape
            (channels, frames), as ``torchaudio.load`` and ``wds.torch_audio``).
        extensions: the audio extensions it answers.

    Returns:
        A handler ``(key, data) -> (samples, sample_rate)`` or None for other fields.

    Raises:
        UsageError: an unknown ``dtype`` or ``output``. The handler raises AudioError (naming the
            field) for audio that does not decode; WebDataset wraps it in its ``DecodingError``
            (``.key``, ``.url``; this error is its ``__cause__``).

    Example:
        >>> import webdataset as wds
        >>> from shardkit.training.wds import audio_handler
        >>> ds = wds.WebDataset("shards/train-{000000..000009}.tar", shardshuffle=100).decode(audio_handler())
    """
    convert = _converter(dtype, output)
    wanted = frozenset(extensions)

    def handler(key: str, data: bytes):
        ext = _extension(key)
        if ext not in wanted:
            return None
        try:
            return convert(data)
        except ShardkitError as err:
            raise err.located(member=key.lstrip(".")) from None

    handler.__name__ = handler.__qualname__ = f"shardkit_audio_handler_{dtype}_{output}"
    return handler


class decode_audio:  # noqa: N801  (used like a function: .map(shardkit.training.wds.decode_audio()))
    """A WebDataset sample stage (``.map(...)``): decode audio and transcript with shardkit's decoder.

    Every field whose last extension is an audio one (``wav``, ``flac``, ...) becomes
    ``(samples, sample_rate)``; ``txt`` becomes ``str`` (UTF-8); other fields are left as they are
    (chain WebDataset's ``.decode(partial=True)`` for them). Picklable, for DataLoader workers.

    Args:
        dtype: sample type of the arrays: ``float32``, ``int16`` or ``float64``.
        output: ``numpy`` ((frames, channels) arrays) or ``torch`` ((channels, frames) tensors).
        extensions: the audio extensions it decodes.
        text: decode ``txt`` fields to ``str``.

    Returns:
        A stage: ``stage(sample)`` returns the sample with its fields decoded (in place).

    Raises:
        UsageError: an unknown ``dtype`` or ``output``. The stage raises AudioError (audio that does
            not decode) or ShardkitError (a transcript that is not UTF-8), naming the shard
            (``__url__``) and member (``__key__`` plus the field).

    Example:
        >>> import webdataset as wds
        >>> from shardkit.training.wds import decode_audio
        >>> ds = wds.WebDataset("shards/train-{000000..000009}.tar", shardshuffle=100).map(decode_audio())
    """

    def __init__(self, dtype: str = "float32", output: str = "numpy", extensions=AUDIO_EXTENSIONS,
                 text: bool = True):
        _check(dtype, output)
        self.dtype, self.output, self.extensions, self.text = dtype, output, frozenset(extensions), text
        self._convert = _converter(dtype, output)

    def __getstate__(self):
        return {"dtype": self.dtype, "output": self.output, "extensions": self.extensions, "text": self.text}

    def __setstate__(self, state):
        self.__init__(**state)

    def __call__(self, sample: dict) -> dict:
        convert, wanted = self._convert, self.extensions
        for field, value in sample.items():
            if field[:2] == "__" or not isinstance(value, (bytes, bytearray, memoryview)):
                continue
            ext = field[field.rfind(".") + 1:]
            if ext in wanted:
                try:
                    sample[field] = convert(value)
                except ShardkitError as err:
                    raise _locate(err, sample, field) from None
            elif ext == "txt" and self.text:
                try:
                    sample[field] = value.decode("utf-8") if isinstance(value, bytes) else bytes(value).decode("utf-8")
                except UnicodeDecodeError as err:
                    raise _locate(ShardkitError(f"transcript is not UTF-8 ({err.reason} at byte {err.start})"),
                                  sample, field) from None
        return sample


# WebDataset's ``base_plus_ext`` (tariterators.py): the key ends at the first '.' after the last '/'.
_WDS_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_WDS_META = re.compile(r"__[^/]*__($|/)")  # tar_file_iterator's skip_meta


def webdataset_key(name: str) -> tuple[str | None, str | None]:
    """``(key, extension)`` of a member name as WebDataset splits it; ``(None, None)`` when it skips it.

    WeNet splits at the last '.': ``a/b.c.wav`` is key ``a/b.c`` to WeNet, ``a/b`` with the field
    ``c.wav`` to WebDataset (``shardkit validate`` warns about such keys: check ``key_dot``).

    Args:
        name: a tar member name.

    Returns:
        ``(key, extension)``, the extension as it stands (WebDataset lower-cases it when grouping).

    Raises:
        Nothing: a name WebDataset cannot split gives ``(None, None)``.

    Example:
        >>> webdataset_key("a/b.c.wav")
        ('a/b', 'c.wav')
    """
    match = _WDS_NAME.match(name)
    return (match.group(1), match.group(2)) if match else (None, None)


def _reraise(err: Exception) -> bool:
    raise err


class _StopStream(Exception):
    """The handler answered False: the stream ends here (after the sample already complete)."""


class tarfile_to_samples:  # noqa: N801  (a drop-in for wds.tarfile_to_samples())
    """A WebDataset pipeline stage: ``{"url": ...}`` dicts in, WebDataset samples out, read by shardkit.

    A drop-in for ``wds.tarfile_to_samples(handler, select_files, rename_files)`` in a
    ``wds.DataPipeline``: the same arguments, the same samples, read with shardkit's member reader
    (:func:`shardkit.training.reader.read_members`: any compression by magic bytes, zstd without a
    subprocess, a fast tar header parser, strict checks) instead of ``tarfile``. Samples are grouped
    as WebDataset groups them (key up to the first '.' after the last '/', extension lower-cased,
    members of a sample adjacent, ``__``-meta members skipped, ``rename_files`` then
    ``select_files`` applied to each member name): ``{"__key__", "__url__", ext: data}``.

    What holds as in WebDataset (its own test suite, tests/webdataset_suite/, runs against it):
    members that are not regular files (directories, links, devices, FIFOs) are skipped (never
    followed; counted in ``skipped_members``); a member error (a duplicated extension, an
    oversized or badly named member) goes to ``handler`` and, when it answers True, only that
    member is dropped and the shard goes on; a stream error (truncated or damaged shard) first
    hands on the last sample before the break when the break lies in a member of a later key
    (never a sample that may miss members: WebDataset hands that one on too), then goes to
    ``handler`` (True: next shard, False: the stream ends, the default raises); a tar holding only its end blocks gives no
    sample. Errors are ShardkitErrors naming shard and member, and also the standard types
    WebDataset's callers catch: a damaged stream or tar is a ``tarfile.ReadError``, a missing
    shard a ``FileNotFoundError`` (an ``OSError``), a duplicated extension a ``ValueError``.

    Policies where shardkit differs on purpose:

    - ``pipe:CMD`` URLs run their command only when allowed: ``allow_pipes=True``, or
      SHARDKIT_ALLOW_PIPES=1 in the environment (a shard list of untrusted origin can name any
      command); refused, the shard fails with an ``InputError`` (an ``OSError``) that says so.
    - ``unsafe_names``: member names that are absolute or hold ``..`` or a backslash (names
      that would leave the folder if extracted) are, by default (``"refuse"``), a member error
      (``UnsafeNameError``): the handler decides, and ``wds.warn_and_continue`` /
      ``ignore_and_continue`` skip only that member. ``"read"`` reads them as names, as WebDataset
      does (neither ever extracts; code after the reader that writes files by key must not trust them).
    - Other URLs (``http:``, ``gs:``, ``hf:``, ``ais:``, ...) are opened by WebDataset's own
      ``gopen`` (its ``GOPEN_REWRITE`` and handlers apply), so webdataset must be installed for them.
    - ``__local_path__`` is added only with ``local_path=True`` (:func:`WebDataset` sets it, as
      ``wds.WebDataset`` does; ``wds.tarfile_to_samples()`` does not add it).

    Args:
        handler: WebDataset's error policy (``wds.reraise_exception``, ``wds.warn_and_continue``,
            ``wds.ignore_and_stop``, ...): called with each error; True goes on, False ends the stream.
        select_files: ``name -> bool``: keep only the members it accepts (after ``rename_files``).
        rename_files: ``name -> name``: the member name used for grouping.
        bytes_only: give ``bytes`` always (large zstd members otherwise come as ``bytearray``,
            saving a copy; WebDataset's ``.decode()`` asserts ``bytes``).
        max_member_bytes: members above this size are a member error (memory stays bounded).
        allow_pipes: run the commands of ``pipe:`` URLs (see above).
        local_path: add ``__local_path__`` to the samples of local shards.
        unsafe_names: ``"refuse"`` or ``"read"`` (see above).

    Returns:
        A callable stage: ``stage(src)`` yields samples from an iterable of ``{"url": ...}`` dicts
        (or URL strings).

    Raises:
        UsageError: ``unsafe_names`` is not a policy.

    Stateful (torchdata's protocol): ``state_dict()`` says how many shards of its input it has
    finished in this pass, the shard it is in and the tar-stream offset past the last sample it
    handed on; after ``load_state_dict()`` the next pass skips that many shards of its input
    unopened and starts the current one at the offset (no re-reading). The stages before it must
    give the same shards in the same order again (a fixed or seeded list: ``shardshuffle`` with a
    seed, the same epoch); a different shard there is refused. Stages after it that buffer
    (``.shuffle``, ``.batched``) keep no state of their own.

    Example:
        >>> import webdataset as wds
        >>> from shardkit.training.wds import tarfile_to_samples
        >>> pipeline = wds.DataPipeline(wds.SimpleShardList(["a.tar"]),
        ...                             tarfile_to_samples(handler=wds.warn_and_continue))
    """

    def __init__(self, handler: Callable[[Exception], bool] = _reraise,
                 select_files: Callable[[str], bool] | None = None,
                 rename_files: Callable[[str], str] | None = None, *, bytes_only: bool = False,
                 max_member_bytes: int | None = None, allow_pipes: bool | None = None, local_path: bool = False,
                 unsafe_names: str = "refuse"):
        from shardkit.io.tar import DEFAULT_MAX_MEMBER_BYTES

        if unsafe_names not in UNSAFE_NAME_POLICIES:
            raise UsageError(f"unsafe_names={unsafe_names!r}; choose from {', '.join(UNSAFE_NAME_POLICIES)}")
        self.unsafe_names = unsafe_names

        self.handler, self.bytes_only = handler, bytes_only
        self.select_files, self.rename_files = select_files, rename_files
        self.allow_pipes, self.local_path = allow_pipes, local_path
        self.max_member_bytes = max_member_bytes or DEFAULT_MAX_MEMBER_BYTES
        self.skipped_members = 0
        self._state = {"shards_done": 0, "url": None, "offset": 0}
        self._resume: dict | None = None

    def state_dict(self) -> dict:
        """Where this pass stands: ``{"shards_done", "url", "offset"}`` (see the class docstring)."""
        return dict(self._resume if self._resume is not None else self._state)

    def load_state_dict(self, state: dict) -> None:
        """Resume the next pass where ``state`` (a ``state_dict()``) stood; UsageError if it is not one."""
        if not isinstance(state, dict) or set(state) != {"shards_done", "url", "offset"}:
            raise UsageError(f"not a tarfile_to_samples state: {state!r}")
        self._resume = dict(state)

    def __call__(self, src):
        resume, self._resume = self._resume, None
        state = self._state = {"shards_done": 0, "url": None, "offset": 0}
        for source in src:
            url = source["url"] if isinstance(source, dict) else source
            if resume is not None and state["shards_done"] < resume["shards_done"]:
                state["shards_done"] += 1  # finished before the save: not opened again
                continue
            start = _resumed_start(resume, url)
            resume = None
            if not (yield from self._shard(url, start, state)):
                return
            state["shards_done"] += 1
            state["url"], state["offset"] = None, 0

    def _shard(self, url: str, start: int, state: dict):
        """The samples of one shard from tar offset ``start``; returns False when the handler ends the stream."""
        from shardkit.training.reader import ReadPosition

        state["url"], state["offset"] = url, start
        pending: list = [None, 0]  # the sample being grouped, and the offset past its last member
        try:
            position = ReadPosition()
            yield from self._samples(self._members(url, start, position), url, position, state, pending)
        except _StopStream:
            yield from self._flush(pending, state, None)
            return False
        except EmptyTarError:
            return True  # end blocks only: no sample, as tarfile reads it
        except Exception as err:  # noqa: BLE001  (WebDataset's policy decides)
            if isinstance(err, ShardkitError):
                err.located(shard=url)
            yield from self._flush(pending, state, err)
            if getattr(err, "_handled", False):
                raise  # the handler already saw it (a member error) and raised it
            if not self.handler(err):
                return False
        return True

    def _flush(self, pending: list, state: dict, err: Exception | None):
        """Hand on the sample grouped before a stream ended early, unless the break fell inside it."""
        sample = pending[0]
        if sample is not None and not self._broken_in(sample, err):
            state["offset"] = pending[1]
            yield sample
        pending[0] = None

    def _broken_in(self, sample: dict, err: Exception | None) -> bool:
        """Whether the break may lie inside ``sample``: yes unless the error names a member of another key (a
        break between headers could hide one more member of it; WebDataset hands such a sample on)."""
        if err is None:
            return False
        member = getattr(err, "member", None)
        if not member:
            return True
        try:
            key, _ = webdataset_key(self.rename_files(member) if self.rename_files else member)
        except Exception:  # noqa: BLE001  (a rename that fails on this name: count the sample broken)
            return True
        return key == sample["__key__"]

    def _members(self, url: str, start: int, position):
        """``(name, data)`` of the shard at ``url``: local and ``pipe:`` by shardkit, other URLs through gopen."""
        from shardkit.training.reader import read_members

        parsed = urlparse(url)
        common = {"max_member_bytes": self.max_member_bytes, "start": start, "position": position,
                  "on_error": self._member_problem}
        if parsed.scheme in ("", "file"):  # as WebDataset's opener decides
            return read_members(parsed.path, **common)
        if parsed.scheme == "pipe":
            return read_members(url, allow_pipes=self.allow_pipes, **common)
        return _gopen_members(url, **common)

    def _member_problem(self, problem: ShardkitError) -> str | None:
        """A member the reader refuses: non-regular ones skipped (counted), unsafe names read under the "read"
        policy, others as the handler says."""
        if isinstance(problem, NonRegularMemberError):
            self.skipped_members += 1
            return None
        if self.unsafe_names == "read" and isinstance(problem, UnsafeNameError):
            from shardkit.io.tar import KEEP_MEMBER

            return KEEP_MEMBER
        self._member_error(problem)
        return None

    def _member_error(self, err: Exception) -> None:
        err._handled = True
        if not self.handler(err):
            raise _StopStream

    def _samples(self, members, url, position, state, pending):
        bytes_only, rename, select = self.bytes_only, self.rename_files, self.select_files
        parsed = urlparse(url)
        local_path = parsed.path if self.local_path and parsed.scheme in ("", "file") else None
        for name, data in members:
            if name[:2] == "__" and _WDS_META.match(name):  # WebDataset skips meta members
                pending[1] = position.end if pending[0] is not None else pending[1]
                continue
            if rename is not None or select is not None:
                try:
                    name = rename(name) if rename is not None else name
                    if select is not None and not select(name):
                        continue
                except Exception as err:  # noqa: BLE001  (the caller's function: WebDataset's policy decides)
                    self._member_error(err)
                    continue
            key, ext = webdataset_key(name)
            if key is None:
                continue
            ext = ext.lower()
            sample = pending[0]
            if sample is None or key != sample["__key__"]:
                if sample is not None:
                    state["offset"] = pending[1]
                    yield sample
                sample = pending[0] = {"__key__": key, "__url__": url}
                if local_path is not None:
                    sample["__local_path__"] = local_path
            if ext in sample:
                self._member_error(DuplicateMemberError(f"member extension {ext!r} appears twice for key {key!r}",
                                                        shard=url, member=name))
                continue
            pending[1] = position.end
            sample[ext] = bytes(data) if bytes_only and not isinstance(data, bytes) else data
        if pending[0] is not None:
            state["offset"] = pending[1]
            sample, pending[0] = pending[0], None
            yield sample


def _gopen_members(url: str, **read):
    """The members of a shard WebDataset's ``gopen`` opens (its URL schemes, rewrites and handlers)."""
    try:
        from webdataset.gopen import gopen
    except ImportError:
        raise UsageError(f"opening {url!r} needs webdataset (its gopen handles this scheme): "
                         "pip install 'shardkit[wds]'", shard=url) from None
    from shardkit.training.reader import read_stream_members

    with gopen(url, "rb") as stream:
        yield from read_stream_members(stream, url, **read)


def _resumed_start(resume: dict | None, url: str) -> int:
    """Where the first shard after a restore is read from: the saved offset, in the saved shard (a different
    shard there means the shard order upstream changed: refused)."""
    if resume is None:
        return 0
    if resume["url"] is not None and url != resume["url"]:
        raise UsageError(f"resuming in shard {resume['url']!r} after {resume['shards_done']} shards, "
                         f"but the input now gives {url!r} there: the shard order upstream changed")
    return resume["offset"] if resume["url"] is not None else 0


def WebDataset(urls, *, allow_pipes: bool | None = None, unsafe_names: str = "refuse", **kwargs):  # noqa: N802  (a drop-in for the class)
    """``webdataset.WebDataset(urls, **kwargs)`` whose shards are read by shardkit's reader.

    The same object, arguments and pipeline (shard list, ``nodesplitter``, ``workersplitter``,
    ``shardshuffle``, ``resampled``, ``handler``, ``select_files``, ``rename_files``, ``.decode``,
    ``.map``, ``.batched``, ...), with WebDataset's open + ``tarfile`` + group stages replaced by
    :class:`tarfile_to_samples` (same samples, with ``__local_path__`` for local shards as
    WebDataset gives it; shardkit's speed; zstd shards need no hook or subprocess). What holds and
    the policies where shardkit differs (``pipe:`` URLs, ``..``/absolute member names) are those of
    :class:`tarfile_to_samples`. With ``cache_dir`` (or ``WDS_CACHE``) WebDataset's own reader
    stays: its cache writes whole shards to disk, which shardkit's reader does not do. Audio
    arrives as bytes, so ``.decode(...)`` with any handler works; ``.map(decode_audio())`` is the
    fast way to decode it.

    Args:
        urls: what ``wds.WebDataset`` takes (a brace pattern, a list, a shard list object).
        allow_pipes: run the commands of ``pipe:`` URLs (else refused unless SHARDKIT_ALLOW_PIPES=1).
        unsafe_names: ``"refuse"`` (a member error) or ``"read"`` ('..'/absolute member names as names).
        **kwargs: every argument of ``wds.WebDataset``, passed on unchanged.

    Returns:
        The ``webdataset.WebDataset`` pipeline, its reading stages replaced.

    Raises:
        UsageError: webdataset is not installed, or ``unsafe_names`` is not a policy.

    Example:
        >>> from shardkit.training.wds import WebDataset, decode_audio
        >>> ds = WebDataset("shards/train-{000000..000009}.tar", shardshuffle=100).map(decode_audio())
    """
    if unsafe_names not in UNSAFE_NAME_POLICIES:
        raise UsageError(f"unsafe_names={unsafe_names!r}; choose from {', '.join(UNSAFE_NAME_POLICIES)}")
    try:
        from webdataset.cache import StreamingOpen
        from webdataset.compat import WebDataset as WdsWebDataset  # the class itself, wherever wds.WebDataset points
    except ImportError:
        raise UsageError("shardkit.training.wds.WebDataset needs webdataset: pip install 'shardkit[wds]'") from None

    dataset = WdsWebDataset(urls, **kwargs)
    if kwargs.get("cache_dir") or os.environ.get("WDS_CACHE"):
        return dataset
    stages = dataset.pipeline
    at = next((i for i, stage in enumerate(stages) if isinstance(stage, StreamingOpen)), None)
    if at is None or len(stages) < at + 3:  # a WebDataset whose pipeline differs: keep its reader
        return dataset
    stages[at:at + 3] = [tarfile_to_samples(handler=kwargs.get("handler", _reraise),
                                            select_files=kwargs.get("select_files"),
                                            rename_files=kwargs.get("rename_files"), bytes_only=True,
                                            allow_pipes=allow_pipes, local_path=True, unsafe_names=unsafe_names)]
    return dataset


def _locate(err: ShardkitError, sample: dict, field: str) -> ShardkitError:
    """The error with shard = ``__url__`` and member = ``__key__.field`` (what WebDataset read)."""
    key, url = sample.get("__key__"), sample.get("__url__")
    return err.located(shard=str(url) if url is not None else None,
                       member=f"{key}.{field}" if key is not None else field)


__all__ = ["OUTPUTS", "UNSAFE_NAME_POLICIES", "WebDataset", "audio_handler", "decode_audio", "tarfile_to_samples", "webdataset_key"]
