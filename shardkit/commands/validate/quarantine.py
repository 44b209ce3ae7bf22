"""Quarantine: each shard with findings in, a cleaned copy and a rejects shard out, then the run's lists.

:func:`quarantine_shard` reads a shard a second time and routes every member, bytes untouched, by
what ``validate_shard`` found: to ``<stem>.tar[.ext]`` (the good utterances, in source order) or
to ``<stem>.rejects.tar[.ext]`` (every other member, unsafe names included: never extract it),
both in the source's codec, verified, fsynced and renamed into place. :func:`write_quarantine_lists`
then writes the run's ``rejects.jsonl`` (one line per rejected member, with its reasons) and
``data.list`` (clean sources as they are, cleaned copies in place of the others).
"""

from __future__ import annotations

import os

from shardkit.commands.validate.names import DUPLICATE_KEY, TAR_NAME_ENCODING, TASK
from shardkit.commands.validate.options import ValidateOptions
from shardkit.commands.validate.shard import _stamp
from shardkit.errors import ShardkitError
from shardkit.io.codecs import CODECS, detect_codec, open_writer
from shardkit.io.inputs import plan_output_paths
from shardkit.io.tar import TarWriter, iter_tar_members, open_shard, shard_reader, split_key
from shardkit.io.files import AtomicFile, NamedWrites, OutputError, output_error
from shardkit.io.files import atomic_write_lines, fsync_dir
from shardkit.run.lifecycle import DigestingTar, verify_members
from shardkit.run.split import slice_path

REJECTS_JSONL = "rejects.jsonl"


class _TapReader:
    """Passes reads through; can capture the data of a member the tar reader skips (an unsafe one)."""

    def __init__(self, source):
        self._read = source.read
        self.capture_left = 0
        self.captured: list[bytes] = []

    def read(self, n: int) -> bytes:
        data = self._read(n)
        if self.capture_left:
            take = data[:self.capture_left]
            self.captured.append(take)
            self.capture_left -= len(take)
        return data


class _ShardOut:
    """A shard written through ``lifecycle.AtomicFile``; ``finish`` verifies, fsyncs and renames,
    or removes it if empty."""

    def __init__(self, path: str, codec: str, *, raw_names: bool = False):
        self.path = path
        self.raw_names = raw_names
        self._file = AtomicFile(path).__enter__()
        # a full disk names this file, and ends the run (see _quarantine_failed), never only this shard's quarantine
        self._out = open_writer(NamedWrites(self._file.file, path), codec, CODECS[codec].default_level)
        self.tar = DigestingTar(TarWriter(self._out))

    def finish(self) -> str | None:
        self.tar.close()
        self._out.close()
        if self.tar.members == 0:
            self._file.discard()
            return None
        self._file.commit(verify_members(self.tar.written, shard=self.path, raw_names=self.raw_names))
        return self.path

    def abort(self) -> None:
        self._file.discard()


def quarantine_shard(src: str, out_dir: str, stem: str, rejected: list[list], reject_keys: list[str],
                     options: ValidateOptions, stamp: list | None = None) -> dict:
    """Split ``src`` into ``<stem>.tar[.ext]`` (kept) and ``<stem>.rejects.tar[.ext]`` in ``out_dir``.

    ``rejected`` comes from ``validate_shard``; ``reject_keys`` are keys found in an earlier shard
    (every member with such a key is rejected). Returns ``{"shard", "cleaned", "rejects",
    "kept_members", "rejected_members", "lines"}``; ``lines`` are the rejects.jsonl entries.
    ``stamp``: the source's ``[size, mtime_ns]`` when it was validated; a source that changed since
    is not quarantined (its findings would route the wrong members).
    """
    try:
        if stamp is not None and _stamp(src) != stamp:
            raise ShardkitError("source changed or vanished since it was validated; validate it again", shard=src)
        with open_shard(src) as f:
            codec = detect_codec(f.read(16))
    except ShardkitError as err:  # this shard's quarantine fails; the run goes on
        return _nothing_quarantined(src, err.check, err.reason)
    job = _Quarantine(src, rejected, reject_keys)
    try:
        return job.run(out_dir, stem, codec, options, stamp)
    except BaseException as err:
        job.abort()
        if isinstance(err, OSError):  # the output folder: the run's error (see _quarantine_failed)
            raise output_error(err, os.path.join(out_dir, stem), f"cannot write the quarantine of {src}") from None
        if isinstance(err, ShardkitError) and err.reason.startswith("source changed"):
            return _nothing_quarantined(src, err.check, err.reason)
        raise


def _nothing_quarantined(src: str, check: str, reason: str) -> dict:
    """The outcome of a shard none of whose members could be routed: one rejects.jsonl line that says why."""
    return {"shard": src, "cleaned": None, "rejects": None, "kept_members": 0, "rejected_members": 0,
            "lines": [{"shard": src, "member": None, "key": None, "checks": [check],
                       "reasons": [f"{check}: {reason}; nothing of this shard was quarantined"],
                       "rejects_shard": None}]}


class _Quarantine:
    """One shard's second pass: every member routed to the cleaned or the rejects shard as it streams by.

    A member the tar reader refuses (an unsafe name, a link) is not yielded: ``_on_unsafe`` holds it as
    ``pending`` while the tap captures its data bytes, and ``_flush_unsafe`` stores it in the rejects
    shard once the next member (or the end) shows its bytes were all there.
    """

    def __init__(self, src: str, rejected: list[list], reject_keys: list[str]):
        self.src = src
        self.by_index = {entry[0]: entry for entry in rejected}
        self.drop_keys = set(reject_keys)
        self.cleaned: _ShardOut | None = None
        self.rejects: _ShardOut | None = None
        self.tap: _TapReader | None = None
        self.lines: list[dict] = []
        self.counts = {"kept": 0, "rejected": 0}
        self.pending: tuple | None = None  # (index, err, regular member size or None) while its bytes are skipped
        self.index_of = iter(range(1 << 62))  # member indexes, refused members included, as validate_shard counts

    def run(self, out_dir: str, stem: str, codec: str, options: ValidateOptions, stamp: list | None) -> dict:
        folder = os.path.dirname(os.path.join(out_dir, stem))
        os.makedirs(folder, exist_ok=True)
        suffix = ".tar" + CODECS[codec].suffix
        self.cleaned = _ShardOut(os.path.join(out_dir, stem + suffix), codec)
        self.rejects = _ShardOut(os.path.join(out_dir, stem + ".rejects" + suffix), codec, raw_names=True)
        with open_shard(self.src) as f:
            self.tap = _TapReader(shard_reader(f, shard=self.src, threads=options.threads))
            self._route_members(options.max_member_bytes)
        if stamp is not None and _stamp(self.src) != stamp:
            raise ShardkitError("source changed while it was quarantined; validate it again", shard=self.src)
        result = {"shard": self.src, "cleaned": self.cleaned.finish(), "rejects": self.rejects.finish(),
                  "kept_members": self.counts["kept"], "rejected_members": self.counts["rejected"],
                  "lines": self.lines}
        fsync_dir(folder)
        return result

    def _route_members(self, max_member_bytes: int) -> None:
        """The per-member loop (kept in one body, with locals, as it runs once per member); a container
        error ends it with a line saying the rest of the shard is in neither output."""
        by_index, drop_keys, index_of, counts = self.by_index, self.drop_keys, self.index_of, self.counts
        cleaned, rejects, flush = self.cleaned.tar, self.rejects.tar, self._flush_unsafe
        try:
            for name, data in iter_tar_members(self.tap, shard=self.src, max_member_bytes=max_member_bytes,
                                               on_error=self._on_unsafe):
                flush(True)
                index = next(index_of)
                key = split_key(name)[0]
                entry = by_index.get(index)
                if entry is None and key in drop_keys:
                    entry = [index, name, key, [DUPLICATE_KEY], [f"{DUPLICATE_KEY}: key is in an earlier shard"]]
                if entry is None:
                    cleaned.add(name, data)
                    counts["kept"] += 1
                else:
                    rejects.add(name, data)
                    self._line(name, key, entry[3], entry[4], True)
                    counts["rejected"] += 1
            flush(True)
        except ShardkitError as err:
            flush(False)
            self._line(None, None, [err.check], [f"{err.check}: {err.reason}; the rest of the shard cannot be read "
                                                 f"and is not in either output"], False)

    def _on_unsafe(self, err: ShardkitError) -> None:
        self._flush_unsafe(True)
        # the parser says how many data bytes follow a refused regular member (None: none to keep)
        size = getattr(err, "member_size", None)
        self.pending = (next(self.index_of), err, size)
        self.tap.captured = []
        self.tap.capture_left = size or 0

    def _flush_unsafe(self, complete: bool) -> None:
        """Route the refused member held in ``pending``: to the rejects shard when its bytes were all
        captured (``complete``: the reader went past them), else only a rejects.jsonl line."""
        if self.pending is None:
            return
        _, err, size = self.pending
        self.pending = None
        data = b"".join(self.tap.captured)
        reason = f"{err.check}: {err.reason}"
        if err.check == TAR_NAME_ENCODING:  # err.member is the escaped name: writing it would rename the member
            self._line(err.member, None, [err.check], [reason, "not kept: its name cannot be written unchanged"],
                       False)
        elif size is not None and complete and len(data) == size:
            self.rejects.tar.add(err.member, data)
            self._line(err.member, None, [err.check], [reason], True)
        else:
            why = "no data to keep (not a regular file)" if size is None else "its bytes could not be kept"
            self._line(err.member, None, [err.check], [reason, why], False)
        self.counts["rejected"] += 1

    def _line(self, member: str | None, key: str | None, checks: list[str], reasons: list[str], stored: bool) -> None:
        self.lines.append({"shard": self.src, "member": member, "key": key, "checks": checks, "reasons": reasons,
                           "rejects_shard": self.rejects.path if stored else None})

    def abort(self) -> None:
        """Remove whatever was written: a quarantine that did not finish leaves no output."""
        for out in (self.cleaned, self.rejects):
            if out is not None:
                out.abort()


def _quarantine_task(args):
    return quarantine_shard(*args)


def _quarantine_failed(task, error: ShardkitError) -> dict:
    """The outcome of a shard whose quarantine task raised or whose worker died. An output that cannot be written
    (a full disk) is the run's error, not this shard's: data.list would silently lose the shard's good utterances."""
    if isinstance(error, OutputError):
        raise error
    return _nothing_quarantined(task[0], TASK, error.reason)


def plan_quarantine(shards: list[str], out_dir: str, keep_tree: bool | None = None) -> list[str]:
    """Output stem per shard, relative to ``out_dir`` (pure): ``<stem>``, or ``<folder>/<stem>`` when
    the outputs mirror the input folders (see :func:`shardkit.io.inputs.plan_output_paths`)."""
    out_dir = os.path.abspath(out_dir)
    return [os.path.relpath(p, out_dir) for p in plan_output_paths(shards, out_dir, "", keep_tree=keep_tree)]


def quarantine_names(quarantine_dir: str, split: tuple[int, int] | None) -> tuple[str, str]:
    """``(rejects.jsonl, data.list)`` paths of a run, or of slice I of N (merged by merge-reports)."""
    names = (os.path.join(quarantine_dir, REJECTS_JSONL), os.path.join(quarantine_dir, "data.list"))
    return names if split is None else tuple(slice_path(p, *split) for p in names)


def quarantine_outputs(quarantine_dir: str, stems: list[str]) -> list[str]:
    """Every name quarantine may write for these stems (cleaned and rejects shard, in any codec: a
    shard keeps its source's)."""
    return [os.path.join(quarantine_dir, stem + part + ".tar" + codec.suffix) for stem in stems
            for part in ("", ".rejects") for codec in CODECS.values()]


def write_quarantine_lists(quarantine_dir: str, shards: list[str], results: list[dict], outcomes: list[dict],
                           *, split: tuple[int, int] | None = None, keep_tree: bool | None = None) -> dict:
    """Write rejects.jsonl and data.list for ``outcomes`` (quarantine results, in shard order); the summary."""
    rejects_path, list_path = quarantine_names(quarantine_dir, split)
    atomic_write_lines(rejects_path, [_json_line(line) for out in outcomes for line in out["lines"]])
    atomic_write_lines(list_path, _trainable(shards, results, outcomes))
    return {"dir": quarantine_dir, "data_list": list_path, "rejects_jsonl": rejects_path, "keep_tree": keep_tree,
            **_member_counts(outcomes)}


def _trainable(shards: list[str], results: list[dict], outcomes: list[dict]) -> list[str]:
    """data.list's lines, in shard order: each source without findings as it is, the cleaned copy of each
    quarantined one (none when nothing of it was kept); a shard with findings that was not quarantined
    (it could not be read) is left out."""
    by_shard = {out["shard"]: out for out in outcomes}
    data_list = []
    for src, r in zip(shards, results):
        if src in by_shard:
            if by_shard[src]["cleaned"]:
                data_list.append(by_shard[src]["cleaned"])
        elif not r["findings"]:
            data_list.append(src)
    return data_list


def _member_counts(outcomes: list[dict]) -> dict:
    """The summary's per-shard outcomes (without their rejects.jsonl lines) and members kept and set apart."""
    return {"shards": [{k: v for k, v in out.items() if k != "lines"} for out in outcomes],
            "kept_members": sum(out["kept_members"] for out in outcomes),
            "rejected_members": sum(out["rejected_members"] for out in outcomes)}


def _json_line(obj: dict) -> str:
    import json

    return json.dumps(obj, sort_keys=True, ensure_ascii=False)
