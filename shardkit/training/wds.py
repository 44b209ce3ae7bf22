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
stage in place of its reader) give the rest. Only :func:`WebDataset` imports webdataset; the
stages and the handler are plain callables.
"""

from __future__ import annotations

import os
import re
from typing import Callable
from urllib.parse import urlparse

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.tar import AUDIO_EXTENSIONS
from shardkit.training.reader import DTYPES, decode_fast

OUTPUTS = ("numpy", "torch")


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
    None, so WebDataset's next handler takes them). Raises AudioError with the cause; WebDataset
    wraps it in its ``DecodingError`` (``.key``, ``.url``; this error is its ``__cause__``).
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
    (chain WebDataset's ``.decode(partial=True)`` for them). Errors are ShardkitErrors naming the
    shard (``__url__``) and member (``__key__`` plus the field). Picklable, for DataLoader workers.
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
    """
    match = _WDS_NAME.match(name)
    return (match.group(1), match.group(2)) if match else (None, None)


def _reraise(err: Exception) -> bool:
    raise err


class tarfile_to_samples:  # noqa: N801  (a drop-in for wds.tarfile_to_samples())
    """A WebDataset pipeline stage: ``{"url": ...}`` dicts in, WebDataset samples out, read by shardkit.

    A drop-in for ``wds.tarfile_to_samples()`` in a ``wds.DataPipeline``, reading with shardkit's
    member reader (:func:`shardkit.training.reader.read_members`: any compression by magic bytes, zstd
    without a subprocess, a fast tar header parser, strict checks) instead of ``tarfile``.
    Samples are grouped exactly as WebDataset groups them (key up to the first '.' after the last
    '/', extension lower-cased, members of a sample adjacent): ``{"__key__", "__url__", ext:
    data}``. Audio data is bytes-like (a ``bytearray`` for large zstd members, to save a copy; pass
    ``bytes_only=True`` when WebDataset's own ``.decode()`` follows, as it asserts ``bytes``).

    ``handler`` is WebDataset's error policy: called with each error (ShardkitErrors naming shard
    and member); True goes on with the next shard, False stops; the default raises.

    Stateful (torchdata's protocol): ``state_dict()`` says how many shards of its input it has
    finished in this pass, the shard it is in and the tar-stream offset past the last sample it
    handed on; after ``load_state_dict()`` the next pass skips that many shards of its input
    unopened and starts the current one at the offset (no re-reading). The stages before it must
    give the same shards in the same order again (a fixed or seeded list: ``shardshuffle`` with a
    seed, the same epoch); a different shard there is refused. Stages after it that buffer
    (``.shuffle``, ``.batched``) keep no state of their own.
    """

    def __init__(self, handler: Callable[[Exception], bool] = _reraise, bytes_only: bool = False,
                 max_member_bytes: int | None = None):
        from shardkit.io.tar import DEFAULT_MAX_MEMBER_BYTES

        self.handler, self.bytes_only = handler, bytes_only
        self.max_member_bytes = max_member_bytes or DEFAULT_MAX_MEMBER_BYTES
        self._state = {"shards_done": 0, "url": None, "offset": 0}
        self._resume: dict | None = None

    def state_dict(self) -> dict:
        return dict(self._resume if self._resume is not None else self._state)

    def load_state_dict(self, state: dict) -> None:
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
        from shardkit.training.reader import ReadPosition, read_members

        parsed = urlparse(url)
        local = parsed.scheme in ("", "file")  # as WebDataset's opener decides
        path = parsed.path if local else url
        state["url"], state["offset"] = url, start
        try:
            position = ReadPosition()
            members = read_members(path, max_member_bytes=self.max_member_bytes, start=start, position=position)
            yield from self._samples(members, url, path if local else None, position, state)
        except Exception as err:  # noqa: BLE001  (WebDataset's policy decides)
            if isinstance(err, ShardkitError):
                err.located(shard=url)
            if not self.handler(err):
                return False
        return True

    def _samples(self, members, url, local_path, position, state):
        sample = None
        bytes_only = self.bytes_only
        end = 0
        for name, data in members:
            key, ext = webdataset_key(name)
            if key is None or (name[:2] == "__" and _WDS_META.match(name)):  # WebDataset skips both
                end = position.end
                continue
            ext = ext.lower()
            if sample is None or key != sample["__key__"]:
                if sample is not None:
                    state["offset"] = end
                    yield sample
                sample = {"__key__": key, "__url__": url}
                if local_path is not None:
                    sample["__local_path__"] = local_path
            end = position.end
            if ext in sample:
                raise ShardkitError(f"member extension {ext!r} appears twice for key {key!r}", shard=url,
                                    member=name)
            sample[ext] = bytes(data) if bytes_only and not isinstance(data, bytes) else data
        if sample is not None:
            state["offset"] = end
            yield sample


def _resumed_start(resume: dict | None, url: str) -> int:
    """Where the first shard after a restore is read from: the saved offset, in the saved shard (a different
    shard there means the shard order upstream changed: refused)."""
    if resume is None:
        return 0
    if resume["url"] is not None and url != resume["url"]:
        raise UsageError(f"resuming in shard {resume['url']!r} after {resume['shards_done']} shards, "
                         f"but the input now gives {url!r} there: the shard order upstream changed")
    return resume["offset"] if resume["url"] is not None else 0


def WebDataset(urls, **kwargs):  # noqa: N802  (a drop-in for the class it returns)
    """``webdataset.WebDataset(urls, **kwargs)`` whose shards are read by shardkit's reader.

    The same object, arguments and pipeline (shard list, ``nodesplitter``, ``workersplitter``,
    ``shardshuffle``, ``resampled``, ``.decode``, ``.map``, ``.batched``, ...), with WebDataset's
    open + ``tarfile`` + group stages replaced by :class:`tarfile_to_samples` (same samples,
    shardkit's speed; on zstd shards no hook or subprocess needed). With ``cache_dir``,
    ``select_files`` or ``rename_files`` WebDataset's own reader stays (shardkit's has no cache).
    Audio arrives as bytes, so ``.decode(...)`` with any handler works; ``.map(decode_audio())``
    is the fast way to decode it.
    """
    try:
        import webdataset
    except ImportError:
        raise UsageError("shardkit.training.wds.WebDataset needs webdataset: pip install 'shardkit[wds]'") from None

    dataset = webdataset.WebDataset(urls, **kwargs)
    if kwargs.get("cache_dir") or kwargs.get("select_files") or kwargs.get("rename_files") or \
            os.environ.get("WDS_CACHE"):
        return dataset
    from webdataset.cache import StreamingOpen

    stages = dataset.pipeline
    at = next((i for i, stage in enumerate(stages) if isinstance(stage, StreamingOpen)), None)
    if at is None or len(stages) < at + 3:  # a WebDataset whose pipeline differs: keep its reader
        return dataset
    stages[at:at + 3] = [tarfile_to_samples(handler=kwargs.get("handler", _reraise), bytes_only=True)]
    return dataset


def _locate(err: ShardkitError, sample: dict, field: str) -> ShardkitError:
    """The error with shard = ``__url__`` and member = ``__key__.field`` (what WebDataset read)."""
    key, url = sample.get("__key__"), sample.get("__url__")
    return err.located(shard=str(url) if url is not None else None,
                       member=f"{key}.{field}" if key is not None else field)


__all__ = ["OUTPUTS", "WebDataset", "audio_handler", "decode_audio", "tarfile_to_samples", "webdataset_key"]
