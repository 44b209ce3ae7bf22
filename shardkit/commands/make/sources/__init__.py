"""Where speech data already lives: one reader module per manifest format, one entry model.

Each reader is a generator over a source (a manifest, Parquet files, WebDataset tars) that yields,
in source order, compact ``Entry`` tuples (one utterance each) and ``Skip`` tuples (an entry that
cannot become an utterance, with its key and the reason). Readers stream: they hold one manifest
line, one Parquet batch or one tar sample at a time. ``make.manifests`` turns the entries into a
columnar catalog, plans shards and writes them with ``make.write``.

Formats (the registry ``FORMATS``): ``kaldi`` (handled by ``make.from_kaldi.run_make``), ``wenet-raw``,
``nemo``, ``lhotse``, ``parquet``, ``wds``, ``shar`` (a Lhotse Shar folder), ``nemo-tarred`` (a NeMo
tarred dataset's manifest, its ``audio_K.tar`` beside it). ``detect_format`` names the format of a source that
identifies itself.
"""

from __future__ import annotations

import gzip
import os
import re
from typing import Iterator, NamedTuple

from shardkit.errors import UsageError
from shardkit.io.jsonlines import iter_json_objects


class Entry(NamedTuple):
    """One utterance as a source describes it; where its audio lies and which part of it.

    ``audio`` is a file path or URL, or, with ``container`` set, the member name inside a tar
    shard (``pos``/``size``: the member's data offset and size, ``pos`` -1 when the tar is
    compressed) or the audio's own name inside a Parquet file (``pos``/``size``: row group and row).
    ``start``/``duration`` in seconds (``duration`` None: to the end); ``segment`` True when the
    utterance is a part of its audio that must be cut out. ``total``/``rate``/``channels`` are
    header facts a reader already learned from bytes in hand (``total`` None: not known yet).
    """

    key: str
    text: str
    audio: str
    container: str | None = None
    pos: int = -1
    size: int = -1
    start: float = 0.0
    duration: float | None = None
    segment: bool = False
    channel: int | None = None
    total: float | None = None
    rate: int = 0
    channels: int = 0


class Skip(NamedTuple):
    """An entry left out, with its key (or its place in the source) and why."""

    key: str
    check: str
    reason: str


_NEEDS_MAPPING = re.compile(r"[.\\\x00-\x1f\x7f]|^/|//|/$|(^|/)\.\.(/|$)")


def member_key(key: str) -> str:
    """The key as it names tar members: unchanged unless a tar name or WeNet cannot carry it.

    '.' becomes '_' (WebDataset cuts a member name at the first '.', WeNet at the last, so a
    dot inside a key would split it differently), '\\' becomes '/', control characters '_',
    and the parts of a path that would escape the shard ('' from a leading '/', '..') are dropped
    or become '__'. '/' stays, as WeNet allows.
    """
    if not _NEEDS_MAPPING.search(key):
        return key
    parts = [p for p in key.replace("\\", "/").split("/") if p not in ("", ".")]
    mapped = "/".join("__" if p == ".." else p for p in parts).replace(".", "_")
    return re.sub(r"[\x00-\x1f\x7f]", "_", mapped)


FORMATS = ("kaldi", "wenet-raw", "nemo", "lhotse", "parquet", "wds", "shar", "nemo-tarred")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


class SourceOptions(NamedTuple):
    """Field names and choices the readers take from the command line (None: the format's default)."""

    key_field: str | None = None
    text_field: str | None = None
    audio_field: str | None = None
    channel: int | None = None
    allow_pipes: bool = False


def open_binary(path: str):
    """A manifest for reading lines as bytes, gzip-compressed or not; errors are UsageErrors."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        if magic == b"\x1f\x8b":
            return gzip.open(path, "rb")
        return open(path, "rb", buffering=1 << 20)
    except FileNotFoundError:
        raise UsageError("no such file", shard=path) from None
    except IsADirectoryError:
        raise UsageError("is a directory, not a manifest", shard=path) from None
    except OSError as err:
        raise UsageError(f"cannot read ({err.strerror or err})", shard=path) from None


def json_lines(path: str) -> Iterator[tuple[int, dict | None, str]]:
    """``(line number, object or None, error)`` for each non-blank line of a JSON-lines manifest."""
    with open_binary(path) as f:
        yield from iter_json_objects(f, path=path)


def _first_object(path: str) -> dict | None:
    try:
        for _, obj, _ in json_lines(path):
            return obj
    except UsageError:
        return None
    return None


# what the first object of a JSON-lines manifest holds, tried in order
_MANIFEST_KINDS = (
    ("nemo", lambda obj: "audio_filepath" in obj),
    ("wenet-raw", lambda obj: "key" in obj and "wav" in obj),
    ("lhotse-cuts", lambda obj: obj.get("type") in ("MonoCut", "MixedCut", "PaddingCut", "DataCut")
     or "recording" in obj),
    ("lhotse-recordings", lambda obj: "sources" in obj and "sampling_rate" in obj),
    ("lhotse-supervisions", lambda obj: "recording_id" in obj and "start" in obj and "duration" in obj),
)


def manifest_kind(path: str) -> str | None:
    """What a JSON-lines manifest holds, from its first object: wenet-raw, nemo, lhotse-cuts,
    lhotse-recordings, lhotse-supervisions, or None."""
    obj = _first_object(path)
    if obj is None:
        return None
    return next((kind for kind, holds in _MANIFEST_KINDS if holds(obj)), None)


def detect_format(paths: list[str]) -> str:
    """The format of a source that identifies itself; a UsageError saying why when it does not."""
    first = paths[0]
    if os.path.isdir(first):
        return _folder_format(first)
    if first.endswith(".parquet"):
        return "parquet"
    if first.endswith(TAR_SUFFIXES):
        return "wds"
    kind = manifest_kind(first)
    if kind is None:
        if not os.path.exists(first):
            raise UsageError("no such file", shard=first)
        raise UsageError("cannot tell the format of this file from its first line: name it with --from "
                         f"({', '.join(FORMATS)})", shard=first)
    if kind == "nemo":
        from shardkit.commands.make.sources.nemo_tarred import is_tarred_manifest

        return "nemo-tarred" if is_tarred_manifest(first, _first_object(first)) else "nemo"
    return "lhotse" if kind.startswith("lhotse") else kind


def _folder_format(folder: str) -> str:
    """A folder's format, from the files it holds: a Kaldi data directory, Parquet files or tars."""
    from shardkit.commands.make.sources.shar import is_shar_folder

    names = os.listdir(folder)
    if "wav.scp" in names and "text" in names:
        return "kaldi"
    if is_shar_folder(names):
        return "shar"
    if any(n.endswith(".parquet") for n in names):
        return "parquet"
    if any(n.endswith(TAR_SUFFIXES) for n in names):
        return "wds"
    raise UsageError("cannot tell the format of this folder (no wav.scp + text, no .parquet, no tars): "
                     "name it with --from", shard=folder)


def iter_entries(fmt: str, paths: list[str], options: SourceOptions) -> Iterator[Entry | Skip]:
    """The entries of a source in the named format, streamed."""
    if fmt == "wenet-raw":
        from shardkit.commands.make.sources.wenet_raw import read
    elif fmt == "nemo":
        from shardkit.commands.make.sources.nemo import read
    elif fmt == "lhotse":
        from shardkit.commands.make.sources.lhotse import read
    elif fmt == "parquet":
        from shardkit.commands.make.sources.parquet import read
    elif fmt == "wds":
        from shardkit.commands.make.sources.wds import read
    elif fmt == "shar":
        from shardkit.commands.make.sources.shar import read
    elif fmt == "nemo-tarred":
        from shardkit.commands.make.sources.nemo_tarred import read
    else:
        raise UsageError(f"unknown source format {fmt!r}; choose from {', '.join(FORMATS)}")
    return read(paths, options)


def expand_globs(paths: list[str]) -> list[str]:
    """Each argument holding ``*``, ``?`` or ``[`` replaced by its sorted matches, as every other
    command reads SHARDS; a pattern that matches nothing is a usage error. URLs are left alone."""
    import glob

    out = []
    for path in paths:
        if "://" in path or not set("*?[") & set(path) or os.path.exists(path):
            out.append(path)
            continue
        matches = sorted(glob.glob(path))
        if not matches:
            raise UsageError("glob pattern matches no file", shard=path)
        out += matches
    return out


def expand(paths: list[str], suffixes: tuple[str, ...]) -> list[str]:
    """Files named, with each folder replaced by its files ending in one of ``suffixes`` (sorted)."""
    out = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(suffixes))
            if not found:
                raise UsageError(f"holds no {' / '.join(suffixes)} files", shard=path)
            out += found
        else:
            out.append(path)
    return out
