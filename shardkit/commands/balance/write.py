"""The writing side of balance: each output shard assembled from its sources by positioned reads.

Where each member lives comes from the index (offset in the decompressed tar), so an output shard
is written by ``os.pread`` in the planned order, one member in memory at a time, with a bounded
set of open files. Plain sources are read in place; a compressed source is first decompressed
once to a spool file (the only way to reach its members without re-decompressing it for every
output shard). Each output shard is an independent task (local processes or Ray), written to a
temporary name, read back and verified, fsynced and renamed; its spec lets a rerun skip it.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

from shardkit.errors import ShardkitError
from shardkit.io.mix import source_stamps
from shardkit.planning.balance import repeat_key

MAX_OPEN_SOURCES = 64


@dataclass(frozen=True)
class WriteSettings:
    """How every output shard is encoded and whether it is read back; part of each shard's spec."""

    codec: str = "zst"
    level: int | None = 3
    verify: bool = True
    layout: str = "wenet"


def _spool_task(args) -> tuple[str, str | None]:
    """Decompress one compressed source into a plain tar spool (atomic); (source, error)."""
    src, dst = args
    if os.path.exists(dst):
        return src, None
    from shardkit.io.codecs import iter_decompressed
    from shardkit.io.files import AtomicFile, NamedWrites, OutputError
    from shardkit.io.tar import open_shard

    try:
        with open_shard(src) as f, AtomicFile(dst) as out:
            spool = NamedWrites(out.file, dst)  # a full disk names the spool file, not the source
            for chunk in iter_decompressed(f, shard=src):
                spool.write(chunk)
            out.commit()
        return src, None
    except OutputError:  # the output folder's disk, not this source: the run's error (see _spool_failed)
        raise
    except ShardkitError as err:
        return src, str(err.located(shard=src))
    except OSError as err:
        return src, f"{src}: {err.strerror or err}"


def spool_path(spool_dir: str, src: str) -> str:
    """Where a remote or compressed source ``src`` is spooled as plain tar in ``spool_dir``: named by a
    hash of its path, size and mtime, so a changed source is spooled anew and a rerun reuses an unchanged one.
    """
    try:
        st = os.stat(src)
        stamp = f"{src}\0{st.st_size}\0{st.st_mtime_ns}"
    except OSError:
        stamp = src
    return os.path.join(spool_dir, hashlib.sha1(stamp.encode("utf-8", "surrogateescape")).hexdigest() + ".tar")


def spool_dir_name(split: tuple[int, int] | None) -> str:
    """Each slice of a job array spools into its own folder: slices run at once and finish apart."""
    return "spool" if split is None else f"spool.slice-{split[0]}-of-{split[1]}"


def _is_compressed(path: str) -> bool:
    """Whether a source must be spooled: compressed, or a URL or ``pipe:`` input (a stream has no
    positioned reads: it is copied, decompressed, to a local spool file in bounded memory, and
    balance shows it as a "decompress" step on stderr)."""
    from shardkit.io.codecs import detect_codec
    from shardkit.io.remote import is_local
    from shardkit.io.tar import open_shard

    if not is_local(path):
        return True
    try:
        with open_shard(path) as f:
            return detect_codec(f.read(16)) != "none"
    except ShardkitError:  # gone or not a file: the shards that need it fail when they read it
        return False


class _SourceReader:
    """Positioned reads of members, through at most MAX_OPEN_SOURCES open files."""

    def __init__(self, read_paths: dict[str, str]):
        self._read_paths = read_paths
        self._fds: dict[str, int] = {}

    def member(self, shard: str, name: str, offset: int, size: int) -> bytes:
        fd = self._fd(shard)
        block = os.pread(fd, 512 + size, offset - 512) if offset >= 512 else b""
        header, data = block[:512], block[512:]
        # the header just before the data must name this member with this size: otherwise the
        # shard changed since it was indexed and the offsets point elsewhere
        if len(data) != size or not _header_names(header, name, size):
            raise ShardkitError("member is not where the index says (the shard changed since it was indexed; "
                                "index it again)", shard=shard, member=name)
        return data

    def _fd(self, shard: str) -> int:
        """The open file of ``shard`` (or of its spool), opened now if it is not (the least recently used
        one closed when MAX_OPEN_SOURCES are)."""
        from shardkit.io.tar import open_regular

        fd = self._fds.pop(shard, None)
        if fd is None:
            if len(self._fds) >= MAX_OPEN_SOURCES:
                os.close(self._fds.pop(next(iter(self._fds))))
            try:
                fd = open_regular(self._read_paths.get(shard, shard))  # a FIFO or device fails at once, never blocks
            except ShardkitError as err:
                raise ShardkitError(f"cannot open source ({err.reason})", shard=shard) from None
        self._fds[shard] = fd  # most recently used last
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _header_names(header: bytes, name: str, size: int) -> bool:
    """Whether a tar header (the one tar parser's reading of it, ``io.tar.parse_header``) is a regular
    member's named ``name`` with ``size`` bytes; a long name's header holds its first 100 bytes: a prefix."""
    from shardkit.io.tar import parse_header

    try:
        typeflag, stored, stored_size = parse_header(header) if len(header) == 512 else (b"", b"", -1)
    except ShardkitError:
        return False
    return bool(typeflag in (b"0", b"\x00", b"7") and stored
                and name.encode("utf-8", "surrogateescape").startswith(stored) and stored_size == size)


_WORKER: dict = {}


def _init_worker(index_files: list[str], read_paths: dict[str, str]) -> None:
    _WORKER.clear()
    _WORKER.update(index_files=index_files, read_paths=read_paths)


def _read_index_line(fds: dict, path: str, offset: int) -> dict:
    from shardkit.io.indexfile import parse_index_line

    f = fds.get(path)
    if f is None:
        f = fds[path] = open(path, "rb")
    f.seek(offset)
    return parse_index_line(f.readline(), path=path, number=0)


def _shard_spec(records: list[tuple[dict, int]], settings: WriteSettings) -> str:
    """Digest of what an output shard is made of: sources (with size and mtime), members, copies, codec."""
    h = hashlib.sha256(repr((settings.codec, settings.level)).encode())
    if settings.layout != "wenet":  # (WeNet's specs stay those of earlier runs, which a rerun then skips)
        h.update(settings.layout.encode())
    stamps: dict[str, list] = {}
    for record, copy in records:
        shard = record["shard"]
        if shard not in stamps:
            stamps[shard] = source_stamps([shard])[0]
        h.update(repr((stamps[shard], record["key"], record["members"], copy)).encode("utf-8", "surrogateescape"))
        if record.get("text") is not None:  # inline text (a NeMo or Shar source): an edited line makes a new shard
            h.update(record["text"].encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def write_output_shard(dst: str, refs: list[tuple[int, int, int]], settings: WriteSettings,
                       previous: dict | None) -> dict:
    """Write one output shard from ``refs`` = (index file id, line offset, copy), in order.

    Returns its manifest entry; data problems become ``status: failed`` with the error. When
    ``previous`` (a finished run's entry) has the same spec and the file still has its digest,
    nothing is written (``status: skipped``).
    """
    from shardkit.io.files import os_reason

    started = time.perf_counter()
    entry = {"path": dst, "spec": None, "status": "failed", "error": None}
    index_files, read_paths = _WORKER["index_files"], _WORKER["read_paths"]
    reader = _SourceReader(read_paths)
    index_fds: dict = {}
    try:
        records = [(_read_index_line(index_fds, index_files[file_id], offset), copy) for file_id, offset, copy in refs]
        entry["spec"] = spec = _shard_spec(records, settings)
        if previous and previous.get("spec") == spec and previous.get("status") == "ok" and \
                _output_unchanged(dst, previous, settings):
            return {**previous, "status": "skipped"}
        _write_records(dst, records, settings, reader, entry)
    except ShardkitError as err:
        entry["error"] = str(err)
    except OSError as err:
        entry["error"] = f"{dst}: {os_reason(err)}" + (f" ({err.filename})" if err.filename else "")
    finally:
        reader.close()
        for f in index_fds.values():
            f.close()
    entry["seconds_taken"] = round(time.perf_counter() - started, 4)
    return entry


def _write_records(dst: str, records: list[tuple[dict, int]], settings: WriteSettings, reader: _SourceReader,
                   entry: dict) -> None:
    """The shard's utterances (records and copy numbers, in order) written to ``dst`` through a temporary
    file: fsynced, read back (unless settings.verify is off), renamed; what was written goes into ``entry``."""
    if settings.layout != "wenet":
        return _write_layout_records(dst, records, settings, reader, entry)
    from shardkit.io.codecs import open_writer
    from shardkit.io.files import HashingFile, combine_digests
    from shardkit.io.tar import TarWriter
    from shardkit.io.files import AtomicFile
    from shardkit.run.lifecycle import verify_members

    written = []
    with AtomicFile(dst) as target:
        hashing = HashingFile(target.file)
        out = open_writer(hashing, settings.codec, settings.level)
        tar = TarWriter(out)
        for record, copy in records:
            _add_utterance(tar, reader, record, copy, written)
        entry["tar_bytes"] = tar.close()
        out.close()
        # fsync, read back (unless --no-verify), rename, fsync the folder
        target.commit(verify_members(written, shard=dst) if settings.verify else None)
    entry.update(status="ok", size=hashing.size, sha256=hashing.sha256.hexdigest(), members=len(written),
                 members_digest=combine_digests(written))


def _output_unchanged(dst: str, previous: dict, settings: WriteSettings) -> bool:
    """Whether a finished shard is still as recorded, with the files a layout writes beside its tar (Shar's cuts)."""
    from shardkit.io.files import output_unchanged

    if not output_unchanged(dst, previous["size"], previous["sha256"]):
        return False
    if settings.layout == "wenet":
        return True
    from shardkit.io.layouts import companion_paths

    return all(os.path.exists(p) for p in companion_paths(settings.layout, dst))


def _write_layout_records(dst: str, records: list[tuple[dict, int]], settings: WriteSettings,
                          reader: _SourceReader, entry: dict) -> None:
    """``_write_records`` for a trainer's layout (``shardkit.io.layouts``): the same utterances in the same
    order, their audio copied byte for byte into the layout's tar, their text into its metadata."""
    from shardkit.io.layouts import open_layout_shard
    from shardkit.run.lifecycle import verify_members

    with open_layout_shard(settings.layout, dst) as shard:
        for record, copy in records:
            new_key = repeat_key(record["key"], copy)
            shard.add(new_key, *_utterance_members(record, new_key, reader))
        entry.update(shard.commit((lambda written: verify_members(written, shard=dst)) if settings.verify else None))
    entry["status"] = "ok"


def _add_utterance(tar, reader: _SourceReader, record: dict, copy: int, written: list) -> None:
    """One utterance's members into ``tar``, renamed for its copy (``key-repN``); each (name, digest) into
    ``written``."""
    from shardkit.io.files import member_digest
    from shardkit.io.tar import split_key

    key = record["key"]
    new_key = repeat_key(key, copy)
    if record.get("text") is not None:
        for out_name, data in _utterance_members(record, new_key, reader)[1]:
            tar.add(out_name, data)
            written.append((out_name, member_digest(out_name, data)))
        return
    for name, member_offset, size in record["members"]:
        data = reader.member(record["shard"], name, member_offset, size)
        out_name = new_key + name[len(key):] if copy else name
        if split_key(out_name)[0] != new_key:
            raise ShardkitError(f"member {name!r} does not belong to key {key!r}", shard=record["shard"])
        tar.add(out_name, data)
        written.append((out_name, member_digest(out_name, data)))


def _utterance_members(record: dict, new_key: str, reader: _SourceReader) -> tuple[dict, list[tuple[str, bytes]]]:
    """``(record, members)`` of one utterance written as ``new_key``: its members read and renamed for it. A
    record whose text is inline (``text``: indexed from a NeMo tarred dataset or a Shar folder, whose audio
    member is named as that layout names it) becomes ``new_key.txt`` from its text and ``new_key.EXT`` from its
    one audio member; the record handed on names that audio as its key's (what a layout's writer reads)."""
    key, shard = record["key"], record["shard"]
    if record.get("text") is None:
        return record, [(new_key + name[len(key):], reader.member(shard, name, offset, size))
                        for name, offset, size in record["members"]]
    if len(record["members"]) != 1:
        raise ShardkitError(f"a record with inline text names {len(record['members'])} members, not its audio "
                            "alone (index the source again)", shard=shard, member=key)
    (name, offset, size), = record["members"]
    base = name.rsplit("/", 1)[-1]
    ext = base.rsplit(".", 1)[1] if "." in base.lstrip(".") else record.get("format") or "wav"
    audio = reader.member(shard, name, offset, size)
    return {**record, "audio": f"{key}.{ext}"}, [(f"{new_key}.txt", record["text"].encode("utf-8")),
                                                 (f"{new_key}.{ext}", audio)]


def _write_task(args) -> dict:
    return write_output_shard(*args)
