"""The sizes of an existing NeMo tarred dataset or Lhotse Shar folder, per shard, for ``plan``.

Only metadata is read: NeMo's manifest (``duration`` and ``shard_id`` per line; the tars' member names
only for a manifest without ``shard_id``) and Shar's ``cuts.NNNNNN.jsonl.gz`` files (no audio).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

from shardkit.errors import ShardkitError, UsageError


@dataclass
class DatasetSizes:
    """Per shard, in the order the trainer lists them: its name, utterances and seconds; ``unsharded``:
    manifest lines no tar holds (NeMo counts them in the dataset's length, never reads them)."""

    layout: str
    names: list[str]
    utterances: np.ndarray
    seconds: np.ndarray
    unsharded: dict = field(default_factory=lambda: {"utterances": 0, "seconds": 0.0})


def expand_tar_pattern(pattern: str) -> list[str]:
    """NeMo's ``tarred_audio_filepaths``: ``(``, ``[``, ``<``, ``_OP_`` open and ``)``, ``]``, ``>``, ``_CL_``
    close a brace, then brace expansion (``audio_{0..511}.tar``)."""
    try:
        import braceexpand
    except ImportError:
        raise UsageError("reading a tar pattern needs braceexpand (pip install 'shardkit[nemo]')") from None
    pattern = re.sub(r"\)|\]|>|_CL_", "}", re.sub(r"\(|\[|<|_OP_", "{", pattern))
    return list(braceexpand.braceexpand(pattern, escape=False))


def _manifest_lines(manifest: str):
    try:
        f = open(manifest, "rb")
    except OSError as err:
        raise UsageError(f"{manifest}: cannot read the manifest ({err.strerror or err})") from None
    with f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line.decode("utf-8"))
                yield entry, float(entry["duration"])
            except (ValueError, KeyError, TypeError) as err:
                raise ShardkitError(f"line {number} is not a manifest entry with a duration ({err})",
                                    shard=manifest) from None


def nemo_sizes(manifest: str, tars: str | None = None) -> DatasetSizes:
    """A NeMo tarred dataset's sizes per ``audio_K.tar``: by each line's ``shard_id`` (NeMo's converter
    writes it), else by finding each line's file id among the tars' members (``tars`` needed then).
    ``tars``: NeMo's ``tarred_audio_filepaths`` (default: ``audio_K.tar`` beside the manifest, K up to the
    largest ``shard_id``)."""
    lines = [(entry.get("shard_id"), entry.get("audio_filepath", ""), seconds)
             for entry, seconds in _manifest_lines(manifest)]
    names = expand_tar_pattern(tars) if tars else None
    if lines and all(isinstance(shard, int) for shard, _, _ in lines):
        names = _tars_by_shard_id(manifest, names, max(shard for shard, _, _ in lines) + 1)
        return _sized("nemo", names, [(shard, seconds) for shard, _, seconds in lines], manifest)
    if names is None:
        raise UsageError(f"{manifest}: lines without shard_id: give the tars (--tars 'audio_{{0..N}}.tar')")
    return _sized("nemo", names, _shards_by_member(lines, names), manifest)


def _tars_by_shard_id(manifest: str, names: list[str] | None, count: int) -> list[str]:
    """The tars of a manifest whose lines carry shard ids up to ``count - 1``: ``names``, or audio_K.tar beside it."""
    if names is None:
        folder = os.path.dirname(os.path.abspath(manifest))
        return [os.path.join(folder, f"audio_{k}.tar") for k in range(count)]
    if count > len(names):
        raise UsageError(f"{manifest}: shard_id {count - 1} but the tar pattern names {len(names)} tars")
    return names


def _shards_by_member(lines: list, names: list[str]) -> list[tuple[int | None, float]]:
    """Each line's shard, found as NeMo finds it: the line whose file id is the member's."""
    from shardkit.io.tar import iter_shard_members

    where: dict[str, int] = {}
    for k, tar in enumerate(names):
        for member, _ in iter_shard_members(tar):
            where.setdefault(os.path.splitext(os.path.basename(member))[0], k)
    return [(where.get(os.path.splitext(os.path.basename(path))[0]), seconds) for _, path, seconds in lines]


def _sized(layout: str, names: list[str], placed: list[tuple[int | None, float]], source: str) -> DatasetSizes:
    utts = np.zeros(len(names), np.int64)
    secs = np.zeros(len(names), np.float64)
    unsharded = {"utterances": 0, "seconds": 0.0}
    for shard, seconds in placed:
        if shard is None:
            unsharded["utterances"] += 1
            unsharded["seconds"] += seconds
        elif not 0 <= shard < len(names):
            raise ShardkitError(f"shard_id {shard} outside 0..{len(names) - 1}", shard=source)
        else:
            utts[shard] += 1
            secs[shard] += seconds
    unsharded["seconds"] = round(unsharded["seconds"], 3)
    return DatasetSizes(layout, names, utts, secs, unsharded)


def shar_sizes(folder: str) -> DatasetSizes:
    """A Shar folder's sizes per shard, from its cuts files, in the order lhotse lists them (sorted)."""
    if not os.path.isdir(folder):
        raise UsageError(f"{folder}: not a folder (a Lhotse Shar folder holds cuts.NNNNNN.jsonl.gz files)")
    cuts = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                  if name.split(".")[0] == "cuts" and ".jsonl" in name)
    if not cuts:
        raise UsageError(f"{folder}: no cuts.NNNNNN.jsonl[.gz] file (not a Lhotse Shar folder)")
    utts = np.zeros(len(cuts), np.int64)
    secs = np.zeros(len(cuts), np.float64)
    for k, path in enumerate(cuts):
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                for line in f:
                    utts[k] += 1
                    secs[k] += float(json.loads(line)["duration"])
        except (OSError, EOFError, ValueError, KeyError, TypeError, zlib.error) as err:
            raise ShardkitError(f"cannot read its cuts ({err})", shard=path) from None
    return DatasetSizes("shar", cuts, utts, secs)
