"""The reading side of balance: corpus specs, their index files, and the columns the planner needs.

A corpus is given as shards, folders, data.list files or indexes; every shard source is indexed
once (into the run's work folder, reused while the shards keep their sizes and mtimes), and the
indexes are read into arrays, not per-utterance dicts, because a dry run over a million
utterances is bound by this loop. The checks that refuse a mix (a source in two corpora, slices
of an index missing, a key twice, a repeat named like a real key) live here, before anything is
written.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from shardkit.commands.balance.plan import BalancePlan, repeat_key
from shardkit.errors import ShardkitError, UsageError
from shardkit.planning.plausible import impossible_duration


@dataclass(frozen=True)
class CorpusSource:
    name: str
    sources: tuple[str, ...]
    weight: float = 1.0


def parse_corpus_spec(text: str) -> CorpusSource:
    """``NAME=SOURCE[,SOURCE...][:WEIGHT]`` -> CorpusSource. Raises UsageError."""
    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq or not name or not rest:
        raise UsageError(f"--corpus {text!r}: expected NAME=SOURCES[:WEIGHT]")
    weight = 1.0
    head, colon, tail = rest.rpartition(":")
    if colon and "/" not in tail and "," not in tail:
        try:
            weight = float(tail)
        except ValueError:
            raise UsageError(f"--corpus {text!r}: weight {tail!r} is not a number") from None
        rest = head
    if not math.isfinite(weight) or weight <= 0:
        raise UsageError(f"corpus {name!r}: weight must be a number > 0 (got {tail})")
    sources = tuple(s for s in rest.split(",") if s)
    if not sources:
        raise UsageError(f"--corpus {name!r}: no sources given")
    return CorpusSource(name, sources, weight)


def check_corpora(corpora: Sequence[CorpusSource]) -> None:
    if not corpora:
        raise UsageError("no --corpus given")
    seen = set()
    for c in corpora:
        if c.name in seen:
            raise UsageError(f"corpus {c.name!r} is given twice")
        seen.add(c.name)
        if not (math.isfinite(c.weight) and c.weight > 0):
            raise UsageError(f"corpus {c.name!r}: weight must be a number > 0 (got {c.weight})")


@dataclass
class CorpusColumns:
    """What planning and writing need of a corpus' utterances, as arrays (no per-utterance dicts)."""

    durations: np.ndarray
    keys: list[str]
    shard: np.ndarray  # index into MixColumns.shards
    line_file: np.ndarray  # index into MixColumns.index_files
    line_offset: np.ndarray  # byte offset of the utterance's line in that index file


@dataclass
class MixColumns:
    names: list[str]
    corpora: list[CorpusColumns]
    shards: list[str]
    index_files: list[str]


def source_stamps(paths: Sequence[str]) -> list[list]:
    """``[path, size, mtime_ns]`` per path (None, None if gone): what decides that an index or an
    output shard built from these sources is still current."""
    stamps = []
    for p in paths:
        try:
            st = os.stat(p)
            stamps.append([p, st.st_size, st.st_mtime_ns])
        except OSError:
            stamps.append([p, None, None])
    return stamps


def resolve_index_files(corpora: Sequence[CorpusSource], work_dir: str, *, jobs: int = 1,
                        on_index: Callable[[str, int, str | None], None] | None = None,
                        on_corpus: Callable[[str, int], None] | None = None, executor: str = "local",
                        ray_address: str | None = None) -> list[list[str]]:
    """Index files per corpus: given indexes as they are, shard sources indexed into ``work_dir``.

    An index built by an earlier run over the same shards (same sizes and mtimes) is reused.
    """
    from shardkit.commands.index import build_index, is_index_file
    from shardkit.io.inputs import expand_shards
    from shardkit.run.manifest import atomic_write_json, load_json

    owner: dict[str, str] = {}
    result = []
    for i, corpus in enumerate(corpora):
        indexes = [os.path.abspath(s) for s in corpus.sources if is_index_file(s)]
        for path in indexes:
            if not os.path.isfile(path):
                raise UsageError(f"corpus {corpus.name!r}: no such index file", shard=path)
        check_index_slices(corpus.name, indexes)
        shard_args = [s for s in corpus.sources if not is_index_file(s)]
        shards = expand_shards(shard_args) if shard_args else []
        for s in shards + indexes:
            if s in owner:
                raise UsageError(f"{s} is given to corpus {owner[s]!r} and to corpus {corpus.name!r}")
            owner[s] = corpus.name
        if shards:
            os.makedirs(work_dir, exist_ok=True)
            built = os.path.join(work_dir, f"index-{i}.jsonl")
            stamp_path = built + ".sources.json"
            stamp = {"corpus": corpus.name, "sources": source_stamps(shards)}
            if not (os.path.exists(built) and load_json(stamp_path) == stamp):
                if on_corpus:
                    on_corpus(corpus.name, len(shards))
                report = build_index(shards, built, corpus.name, jobs=jobs, on_shard=on_index, executor=executor,
                                     ray_address=ray_address)
                if report.failures:
                    first = report.failures[0]["error"]
                    raise ShardkitError(f"corpus {corpus.name!r}: {len(report.failures)} of {report.shards} shards "
                                        f"cannot be indexed; first: {first}")
                atomic_write_json(stamp_path, stamp)
            indexes.append(built)
        result.append(indexes)
    return result


def check_index_slices(corpus: str, index_files: Sequence[str]) -> None:
    """Slice files of an index (``x.slice-I-of-N.jsonl``, from ``index --split``) come all N or none."""
    import re

    groups: dict[tuple[str, int], set[int]] = {}
    for path in index_files:
        match = re.fullmatch(r"(.*)\.slice-(\d+)-of-(\d+)\.jsonl", path)
        if match:
            groups.setdefault((match.group(1), int(match.group(3))), set()).add(int(match.group(2)))
    for (stem, count), have in sorted(groups.items()):
        missing = sorted(set(range(1, count + 1)) - have)
        if missing:
            raise UsageError(f"corpus {corpus!r}: index {stem}.jsonl is given in slices without slice"
                             f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {count}")


def load_columns(names: Sequence[str], index_files: Sequence[Sequence[str]]) -> MixColumns:
    """Read each corpus' index files into arrays; one line parsed at a time (the hot loop of a dry run)."""
    from shardkit.commands.index import loads, open_index, parse_index_line

    shards: list[str] = []
    shard_ids: dict[str, int] = {}
    shard_corpus: list[str] = []
    files: list[str] = []
    corpora = []
    for name, paths in zip(names, index_files):
        durations, keys, shard_col, file_col, offsets = [], [], [], [], []
        for path in paths:
            file_id = len(files)
            files.append(path)
            offset = 0
            with open_index(path) as f:
                for number, line in enumerate(f, 1):
                    try:
                        record = loads(line)
                        shard, key, duration = record["shard"], record["key"], float(record["duration"])
                        record["members"]
                    except (ValueError, KeyError, TypeError):
                        if line.strip():
                            parse_index_line(line, path=path, number=number)  # raises the precise error
                            raise ShardkitError(f"line {number} is not an index record", shard=path) from None
                        offset += len(line)
                        continue
                    if (why := impossible_duration(duration, record.get("sample_rate"), record.get("bytes"))):
                        raise ShardkitError(f"utterance {key!r} of shard {shard} in corpus {name!r}: {why}; "
                                            "no plan is built on it (validate that shard)", shard=path)
                    sid = shard_ids.get(shard)
                    if sid is None:
                        sid = shard_ids[shard] = len(shards)
                        shards.append(shard)
                        shard_corpus.append(name)
                    elif shard_corpus[sid] != name:
                        raise UsageError(f"{shard} is in corpus {shard_corpus[sid]!r} and in corpus {name!r}")
                    durations.append(duration)
                    keys.append(key)
                    shard_col.append(sid)
                    file_col.append(file_id)
                    offsets.append(offset)
                    offset += len(line)
        corpora.append(CorpusColumns(np.array(durations, np.float64), keys, np.array(shard_col, np.int64),
                                     np.array(file_col, np.int64), np.array(offsets, np.int64)))
    return MixColumns(list(names), corpora, shards, files)


def check_unique_keys(mix: MixColumns) -> None:
    """Two utterances with one key would be one sample to WeNet's grouping: refuse the mix."""
    seen: set[str] = set()
    for c, corpus in enumerate(mix.corpora):
        for i, key in enumerate(corpus.keys):
            if key in seen:
                oc, oi = next((oc, corpus_o.keys.index(key)) for oc, corpus_o in enumerate(mix.corpora)
                              if key in corpus_o.keys)
                raise ShardkitError(
                    f"key {key!r} appears twice: in {mix.shards[mix.corpora[oc].shard[oi]]} (corpus "
                    f"{mix.names[oc]!r}) and in {mix.shards[corpus.shard[i]]} (corpus {mix.names[c]!r}); "
                    f"keys must be unique across the mix")
            seen.add(key)


def repeated_keys(plan: BalancePlan, mix: MixColumns) -> list[list[str]]:
    """``[original key, output key]`` for every repeat, in output order; refuses a clash with a real key."""
    pairs = []
    for i in np.flatnonzero(plan.copy > 0):
        key = mix.corpora[plan.corpus[i]].keys[plan.utt[i]]
        pairs.append([key, repeat_key(key, int(plan.copy[i]))])
    if pairs:
        originals = {k for corpus in mix.corpora for k in corpus.keys}
        clash = next((p for p in pairs if p[1] in originals), None)
        if clash:
            raise ShardkitError(f"repeat of {clash[0]!r} would be named {clash[1]!r}, which is already a key "
                                f"in the mix")
    return pairs
