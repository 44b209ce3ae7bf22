"""The reading side of balance: each corpus' sources made into index files, and the checks on its keys.

A corpus is given as shards, folders, data.list files or indexes; every shard source is indexed
once (into the run's work folder, reused while the shards keep their sizes and mtimes); the
indexes are then read into columns (:mod:`.columns`). The checks that refuse a mix (a source in
two corpora, slices of an index missing, a key twice, a repeat named like a real key) live here,
before anything is written. A corpus spec (``NAME=SOURCES[:WEIGHT]``) and the source stamps are
``shardkit.io.mix``'s, shared with prep.
"""

from __future__ import annotations

import dataclasses

import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from shardkit.commands.balance.columns import CorpusColumns, IndexKeys, MixColumns
from shardkit.errors import ShardkitError, UsageError
from shardkit.io.mix import CorpusSource, source_stamps
from shardkit.planning.balance import BalancePlan, repeat_key

if TYPE_CHECKING:
    from shardkit.run.events import Events
    from shardkit.run.options import RunOptions


def take_keys(corpus: CorpusColumns, utts: np.ndarray) -> list[str]:
    """The key strings of utterances ``utts`` of ``corpus`` (read back from its index files if it holds none)."""
    if isinstance(corpus.keys, IndexKeys):
        return corpus.keys.take(utts)
    return [corpus.keys[int(u)] for u in utts]


def resolve_index_files(corpora: Sequence[CorpusSource], work_dir: str, options: RunOptions | None = None,
                        events: Events | None = None) -> list[list[str]]:
    """Index files per corpus: given indexes as they are, shard sources indexed into ``work_dir``.

    An index built by an earlier run over the same shards (same sizes and mtimes) is reused. Indexing
    runs as ``options`` say (jobs, executor, Ray address) and reports through ``events``: a stage
    "index CORPUS" per corpus indexed, a ``done`` per shard (its ``shard``, and the error of one that
    cannot be read).
    """
    from shardkit.run.options import RunOptions

    options = options or RunOptions()
    events = events or options.events
    owner: dict[str, str] = {}
    result = []
    for i, corpus in enumerate(corpora):
        indexes = _given_indexes(corpus)
        layouts = _layout_sources(corpus)
        shards = _shard_sources(corpus)
        for s in shards + indexes + layouts:
            if s in owner:
                raise UsageError(f"{s} is given to corpus {owner[s]!r} and to corpus {corpus.name!r}")
            owner[s] = corpus.name
        if shards:
            indexes.append(_built_index(corpus, os.path.join(work_dir, f"index-{i}{_built_suffix()}"), shards,
                                        options, events))
        if layouts:
            indexes.append(_built_index(corpus, os.path.join(work_dir, f"index-{i}-layouts{_built_suffix()}"),
                                        layouts, options, events, layouts=True))
        result.append(indexes)
    return result


def _given_indexes(corpus: CorpusSource) -> list[str]:
    """The index files among a corpus' sources (absolute), each there, slices all given."""
    from shardkit.io.indexfile import is_index_file

    indexes = [os.path.abspath(s) for s in corpus.sources if is_index_file(s)]
    for path in indexes:
        if not os.path.isfile(path):
            raise UsageError(f"corpus {corpus.name!r}: no such index file", shard=path)
    check_index_slices(corpus.name, indexes)
    return indexes


def _shard_sources(corpus: CorpusSource) -> list[str]:
    """The shards a corpus' other sources (shards, folders, data.list files) name."""
    from shardkit.io.indexfile import is_index_file
    from shardkit.io.inputs import expand_shards
    from shardkit.io.layouts.sources import is_dataset

    shard_args = [s for s in corpus.sources if not is_index_file(s) and not is_dataset(s)]
    return expand_shards(shard_args) if shard_args else []


def _layout_sources(corpus: CorpusSource) -> list[str]:
    """A corpus' NeMo tarred datasets (their manifests) and Lhotse Shar folders, absolute: indexed through
    ``index``, their text inline in the records."""
    from shardkit.io.layouts.sources import is_dataset

    return [os.path.abspath(s) for s in corpus.sources if is_dataset(s)]


def _layout_files(datasets: list[str]) -> list[str]:
    """Every file the datasets read (tars, manifest, cuts files): what decides that their index is current."""
    from shardkit.io.layouts.sources import dataset_shards, open_dataset

    return [path for dataset in datasets for path in dataset_shards(open_dataset(dataset))]


def _built_index(corpus: CorpusSource, built: str, shards: list[str], options: RunOptions, events: Events, *,
                 layouts: bool = False) -> str:
    """``built``, the index of a corpus' shards (``layouts``: its NeMo tarred datasets and Shar folders):
    reused when its stamp says the files are as they were, else built (``index``'s build_index or
    build_layout_index) and stamped; a shard that cannot be indexed stops the run."""
    from shardkit.commands.index import build_index, build_layout_index
    from shardkit.io.files import atomic_write_json, load_json
    from shardkit.io.indexmarks import stamp_files

    os.makedirs(os.path.dirname(built), exist_ok=True)
    stamp_path = built + ".sources.json"
    files = _layout_files(shards) if layouts else shards
    # with each shard's digest: a shard rewritten in place at the same size and mtime is indexed again too
    stamp = {"corpus": corpus.name, "sources": source_stamps(files), "stamps": stamp_files(files)}
    if os.path.exists(built) and load_json(stamp_path) == stamp:
        return built
    stage = f"index {corpus.name}"
    sink = events.sink
    # index's own progress, shown as this corpus' stage; never a slice of it (--split slices balance's output)
    on_event = (lambda event: sink(dataclasses.replace(event, stage=stage)))
    build = build_layout_index if layouts else build_index
    report = build(shards, built, corpus.name, options.replace(on_event=on_event, split=None))
    if report.failures:
        first = report.failures[0]["error"]
        raise ShardkitError(f"corpus {corpus.name!r}: {len(report.failures)} of {report.shards} shards "
                            f"cannot be indexed; first: {first}")
    atomic_write_json(stamp_path, stamp)
    return built


def check_index_marks(mix, events: Events) -> None:
    """Every index read whole (a file cut short was refused while it was read) and every shard it stamped
    as it was when indexed: a changed shard is a ShardkitError naming it and what changed (size, mtime,
    digest). An index that carries no marks (an older shardkit's) is a note: it cannot be checked."""
    for marks in mix.index_marks.values():
        note = marks.note()
        if note:
            events.note(f"note: {note}")
        marks.check_sources()


def recorded_stamps(mix, index_files: Sequence[str]) -> dict:
    """What a report records of a corpus' index files: the stamps of the sources it used (as the indexes
    recorded them, checked before use), and the index files that had none to check. Nothing for a mix
    given as columns (not read from index files by ``load_columns``)."""
    if not mix.index_marks:
        return {}
    stamps: dict = {}
    unchecked = []
    for path in index_files:
        marks = mix.index_marks.get(path)
        if marks is None or marks.note():
            unchecked.append(path)
        stamps.update((marks.sources or {}) if marks is not None else {})
    return {"source_stamps": stamps, **({"unchecked_indexes": unchecked} if unchecked else {})}


def _built_suffix() -> str:
    """The indexes balance builds itself are Parquet where pyarrow is installed (faster to load)."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return ".jsonl"
    return ".parquet"


def check_index_slices(corpus: str, index_files: Sequence[str]) -> None:
    """Slice files of an index (``x.slice-I-of-N.jsonl``, from ``index --split``) come all N or none."""
    import re

    groups: dict[tuple[str, int], set[int]] = {}
    for path in index_files:
        match = re.fullmatch(r"(.*)\.slice-(\d+)-of-(\d+)(\.jsonl|\.parquet)", path)
        if match:
            groups.setdefault((match.group(1) + match.group(4), int(match.group(3))), set()).add(int(match.group(2)))
    for (stem, count), have in sorted(groups.items()):
        missing = sorted(set(range(1, count + 1)) - have)
        if missing:
            raise UsageError(f"corpus {corpus!r}: index {stem} is given in slices without slice"
                             f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {count}")

def _hashes(corpus: CorpusColumns) -> np.ndarray:
    from shardkit.io.indexfile import hash_strings

    if corpus.key_hash is None:
        corpus.key_hash = corpus.keys.hashes() if isinstance(corpus.keys, IndexKeys) else \
            hash_strings(list(corpus.keys))
    return corpus.key_hash


def check_unique_keys(mix: MixColumns) -> None:
    """Two utterances with one key would be one sample to WeNet's grouping: refuse the mix.

    Keys are compared by their 64-bit hashes (one sort); equal hashes are confirmed on the strings.
    The key reported is the one whose second occurrence comes first (corpus order, then row order).
    """
    from shardkit.io.indexfile import duplicate_hashes

    every = _every_hash(mix)
    for corpus in mix.corpora:  # the per-corpus hashes of index files can be read again (peak memory)
        if isinstance(corpus.keys, IndexKeys):
            corpus.key_hash = None
    # one numpy sort (its vectorized quicksort): for 20 M hashes about half the CPU of runs sorted in threads and
    # then merged; the check runs beside the planner, whose pool has the cores
    every.sort()
    dups = duplicate_hashes(every, is_sorted=True)
    if not len(dups):
        # kept sorted for the repeat-name check (unless the keys it needs were collected while loading)
        mix.sorted_hashes = every if mix.repeat_like is None else None
        return
    del every
    _refuse_first_duplicate(mix, dups)


def _every_hash(mix: MixColumns) -> np.ndarray:
    """Every key's hash in corpus order, to be sorted in place: the load's pool itself when the corpora's
    hashes are its consecutive slices and can be read again from their files (no joined copy: at 100 M
    utterances, 0.8 GB fewer pages), else a joined copy."""
    pool, mix.hash_pool = mix.hash_pool, None
    readable = all(isinstance(corpus.keys, IndexKeys) for corpus in mix.corpora)
    if pool is not None and readable and _slices_of(pool, [corpus.key_hash for corpus in mix.corpora]):
        return pool
    return np.concatenate([_hashes(corpus) for corpus in mix.corpora] or [np.zeros(0, np.uint64)])


def _slices_of(pool: np.ndarray, parts: list) -> bool:
    """Whether ``parts`` are ``pool``'s consecutive slices, in order, covering it."""
    at = 0
    start = pool.__array_interface__["data"][0]
    for part in parts:
        if part is None or not np.may_share_memory(part, pool) or part.__array_interface__["data"][0] != start + 8 * at:
            return False
        at += len(part)
    return at == len(pool)


def _refuse_first_duplicate(mix: MixColumns, dups: np.ndarray) -> None:
    """A hash twice: find where, from the hashes in row order, and refuse the first key whose second
    occurrence comes first (equal hashes of different keys pass)."""
    hashes = [_hashes(corpus) for corpus in mix.corpora]
    every = np.concatenate(hashes)
    where = np.flatnonzero(np.isin(every, dups))
    del every
    starts = np.cumsum([0] + [len(h) for h in hashes])
    groups: dict[int, list[int]] = {}
    for position in where.tolist():
        c = int(np.searchsorted(starts, position, side="right") - 1)
        groups.setdefault(int(hashes[c][position - starts[c]]), []).append(position)
    for places in sorted(groups.values(), key=lambda p: p[1]):  # by second occurrence
        _refuse_equal_keys(mix, places, starts)


def _refuse_equal_keys(mix: MixColumns, places: list[int], starts: np.ndarray) -> None:
    """Of the rows ``places`` (positions over every corpus, ``starts`` apart), two with one key string: refused."""
    seen: dict[str, tuple[int, int]] = {}
    for position in places:
        c = int(np.searchsorted(starts, position, side="right") - 1)
        u = position - int(starts[c])
        key = take_keys(mix.corpora[c], np.array([u]))[0]
        if key in seen:
            oc, oi = seen[key]
            raise ShardkitError(
                f"key {key!r} appears twice: in {mix.shards[mix.corpora[oc].shard[oi]]} (corpus "
                f"{mix.names[oc]!r}) and in {mix.shards[mix.corpora[c].shard[u]]} (corpus {mix.names[c]!r}); "
                f"keys must be unique across the mix")
        seen[key] = (c, u)


REPEATS_CHUNK = 1 << 18  # repeats whose keys are read and checked at a time (bounded memory at any weight)


def repeated_keys(plan: BalancePlan, mix: MixColumns, known: dict | None = None) -> list[list[str]]:
    """``[original key, output key]`` for every repeat (in :func:`iter_repeated_keys`'s order), as one list
    (balance itself streams them); refuses a clash with a real key."""
    return [pair for pairs in iter_repeated_keys(plan, mix, known) for pair in pairs]


def iter_repeated_keys(plan: BalancePlan, mix: MixColumns, known: dict | None = None, chunk: int | None = None):
    """Lists of ``[original key, output key]`` for every repeat, ``chunk`` (default ``REPEATS_CHUNK``) at a
    time, corpus by corpus in the order of its index (an utterance's copies in order): the keys are then
    read from the index in one pass, each row group once, where output order would read every row group
    for every chunk. Each list is checked (a repeat named like a real key is refused) before it is yielded.

    ``known``: per corpus, (sorted utterances, their keys) read beforehand (balance reads the repeats'
    keys while the planner deals); the other corpora's keys are read here, a chunk at a time.
    """
    chunk = chunk or REPEATS_CHUNK
    repeated = plan.copy > 0
    for c, corpus in enumerate(mix.corpora):
        mine = repeated & (plan.corpus == c)
        utt, copy = plan.utt[mine], plan.copy[mine]
        order = np.lexsort((copy, utt))
        utt, copy = utt[order], copy[order]
        del mine, order
        for start in range(0, len(utt), chunk):
            utts, copies = utt[start:start + chunk], copy[start:start + chunk]
            if known and c in known:
                unique, found = known[c]
                keys = np.asarray(found, object)[np.searchsorted(unique, utts)].tolist()
            else:
                keys = take_keys(corpus, utts)
            pairs = [[key, repeat_key(key, k)] for key, k in zip(keys, copies.tolist())]
            _refuse_real_names(pairs, mix)
            yield pairs


def _refuse_real_names(pairs: list[list[str]], mix: MixColumns) -> None:
    """A repeat's new name must not be a key of the mix (WeNet would group the two as one sample)."""
    if not pairs:
        return
    if mix.repeat_like is not None:  # the keys that look like a repeat's name were collected while loading
        clash = next((p for p in pairs if p[1] in mix.repeat_like), None) if mix.repeat_like else None
        if clash:
            raise ShardkitError(f"repeat of {clash[0]!r} would be named {clash[1]!r}, which is already a key in "
                                "the mix")
        return
    _refuse_by_hash(pairs, mix)


def _refuse_by_hash(pairs: list[list[str]], mix: MixColumns) -> None:
    """The clash check without the collected keys: the new names' hashes looked up among every key's (sorted
    once, for every chunk); an equal hash is confirmed on the strings."""
    from shardkit.io.indexfile import hash_strings

    new = hash_strings([p[1] for p in pairs])
    if mix.sorted_hashes is None:  # sorted once, for every chunk
        mix.sorted_hashes = np.sort(np.concatenate([_hashes(corpus) for corpus in mix.corpora]))
    every = mix.sorted_hashes
    found = np.searchsorted(every, new).clip(0, max(len(every) - 1, 0))
    hit_hashes = set(new[every[found] == new].tolist()) if len(every) else set()
    for corpus in mix.corpora if hit_hashes else ():
        _refuse_equal_names(pairs, new, hit_hashes, corpus)


def _refuse_equal_names(pairs: list[list[str]], new: np.ndarray, hit_hashes: set[int], corpus: CorpusColumns) -> None:
    """The new names whose hash is one of ``corpus``' keys (``hit_hashes``): compared as strings, a clash refused."""
    existing = _hashes(corpus)
    for i in (i for i, h in enumerate(new.tolist()) if h in hit_hashes):  # equal hashes: compare strings
        utts = np.flatnonzero(existing == new[i])
        if pairs[i][1] in take_keys(corpus, utts):
            raise ShardkitError(f"repeat of {pairs[i][0]!r} would be named {pairs[i][1]!r}, which is already "
                                f"a key in the mix")
