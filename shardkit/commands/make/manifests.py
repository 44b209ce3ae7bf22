"""make from any source: WeNet raw lists, NeMo and Lhotse manifests, Parquet, WebDataset tars.

``run_make_from`` streams a source's entries (``shardkit.commands.make.sources``) into a ``Catalog``: columns of
numbers and packed strings, no object per utterance, so a manifest of millions of lines plans in
bounded memory. Then: file headers are probed for durations (in parallel; never a full decode),
entries are checked (missing, unreadable, shorter than stated, duplicate key), keys a tar name or
WeNet cannot carry are mapped (every mapping recorded in make.json), ``planning.shard_cuts.plan_cuts``
cuts the good entries into duration-balanced shards, and ``write.write_shards`` writes them, building
the utterance dicts of one shard at a time.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from shardkit.commands.make.catalog import Catalog, EntryPlan, FileFacts, ShardBuilder
from shardkit.commands.make.report import MakeReport
from shardkit.commands.make.settings import DEFAULT_SHARD_SECONDS, MakeSettings, check_settings, finding
from shardkit.commands.make.sources import Entry, SourceOptions, iter_entries, member_key
from shardkit.commands.make.sources._probe import probe_audio
from shardkit.commands.make.write import PlannedShards, claimed_run, write_shards
from shardkit.errors import UsageError
from shardkit.io.remote import is_url
from shardkit.io.text import EMPTY_TEXT, text_problems
from shardkit.planning.shard_cuts import plan_cuts
from shardkit.run.events import Events
from shardkit.run.options import RunOptions

# A stated duration may exceed the audio by this much (manifests round durations to 10 ms) before
# the entry counts as shorter than stated; the utterance then ends with its audio.
DURATION_TOLERANCE = 0.02
_PROBE_CHUNK = 2048
READ_REPORT_EVERY = 10000  # entries read between two progress events of the reading stage


# ---------------------------------------------------------------- keys

def _key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


# ---------------------------------------------------------------- reading and probing

def read_catalog(fmt: str, paths: list[str], options: SourceOptions,
                 events: Events | None = None) -> tuple[Catalog, list[dict]]:
    """Stream the source into a Catalog; entries the source itself rejects become findings.

    Progress: a stage ``make: reading FMT`` of unknown total, counting entries read (kept and rejected)."""
    catalog = Catalog()
    findings: list[dict] = []
    events = events or Events()
    events.stage(f"make: reading {fmt}", None, unit=" entries")
    pick = options.channel if fmt != "lhotse" else None  # the lhotse reader applies --channel itself
    read = 0
    for item in iter_entries(fmt, paths, options):
        if not isinstance(item, Entry):
            findings.append(finding(item.key, item.check, item.reason))
        elif problems := text_problems(item.text):  # a tokenizer could not take it
            findings += _text_findings(item.key, problems)
        else:
            catalog.add(item if pick is None or item.channel is not None else item._replace(channel=pick))
        read += 1
        if read % READ_REPORT_EVERY == 0:
            events.done(count=READ_REPORT_EVERY)
    events.done(count=read % READ_REPORT_EVERY)
    return catalog, findings


def _text_findings(key: str, problems: list[tuple[str, str]]) -> list[dict]:
    return [finding(key, "empty_transcript" if check == EMPTY_TEXT else check, message) for check, message in problems]


def _probe_chunk(locations: list[str]) -> list:
    return [probe_audio(p) for p in locations]


def probe_files(catalog: Catalog, options: RunOptions | None = None) -> FileFacts:
    """Header facts for every entry whose audio is a file, URL or command (tar members and
    Parquet cells were probed as they were read), filled into the catalog's columns. Returns
    ``FileFacts`` (``(size, mtime_ns, errors)``: two int64 columns and ``{entry index: reason}``).
    Consecutive entries of one file are probed once."""
    options = options or RunOptions()
    n = len(catalog)
    facts = FileFacts(np.zeros(n, np.int64), np.zeros(n, np.int64), {})
    todo = np.flatnonzero(np.frombuffer(catalog.container, np.int32) < 0) if n else np.zeros(0, np.int64)
    starts = list(range(0, len(todo), _PROBE_CHUNK))
    # the chunks' file lists are built as they are submitted: only those in flight are held
    for k, results in options.run_tasks(_probe_chunk, starts, jobs=1 if len(starts) <= 1 else options.jobs,
                                        ordered=True, prepare=lambda start: _chunk(catalog, todo, start)[1]):
        idx, _, owner = _chunk(catalog, todo, starts[k])
        _apply(catalog, facts, idx, owner, results)
    return facts


def _chunk(catalog: Catalog, todo: np.ndarray, start: int) -> tuple[np.ndarray, list[str], list[int]]:
    """The entries of one probe chunk, the files they name (a run of entries in one file once), and
    which of those files each entry's is."""
    idx = todo[start:start + _PROBE_CHUNK]
    unique, owner, last = [], [], -1
    for i in idx:
        aid = catalog.audio_id[int(i)]
        if not unique or last != aid:
            unique.append(catalog.audio_names[aid])
            last = aid
        owner.append(len(unique) - 1)
    return idx, unique, owner


def _apply(catalog: Catalog, facts: FileFacts, idx: np.ndarray, owner: list[int], results: list) -> None:
    """A chunk's probe results into the catalog's columns and ``facts`` (an error string per unreadable entry)."""
    for i, o in zip(idx, owner):
        r = results[o]
        i = int(i)
        if isinstance(r, str):
            facts.errors[i] = r
            continue
        catalog.total[i], catalog.rate[i], catalog.channels[i], facts.size[i], facts.mtime_ns[i] = r


# ---------------------------------------------------------------- checks (vectorised)

class _Columns(NamedTuple):
    """The catalog's numeric columns as numpy views (empty arrays for an empty catalog)."""

    total: np.ndarray
    start: np.ndarray
    duration: np.ndarray
    segment: np.ndarray
    channel: np.ndarray
    channels: np.ndarray
    rate: np.ndarray

    @classmethod
    def of(cls, catalog: Catalog) -> _Columns:
        if not len(catalog):
            return cls(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int16),
                       np.zeros(0, np.int16), np.zeros(0))
        return cls(np.frombuffer(catalog.total, np.float64), np.frombuffer(catalog.start, np.float64),
                   np.frombuffer(catalog.duration, np.float64), np.frombuffer(catalog.segment, np.int8).astype(bool),
                   np.frombuffer(catalog.channel, np.int16), np.frombuffer(catalog.channels, np.int16),
                   np.frombuffer(catalog.rate, np.int32).astype(np.float64))


def check_entries(catalog: Catalog, errors: dict[int, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
    """Which entries become utterances. Returns ``(good, seconds, cut, findings)``: a bool mask, the
    seconds each utterance lasts, whether it must be cut out of its audio (segment or channel),
    and a finding per rejected entry."""
    col = _Columns.of(catalog)
    stated = ~np.isnan(col.duration)
    end = np.where(stated, col.start + np.where(stated, col.duration, 0), col.total)
    bad_probe = np.zeros(len(catalog), bool)
    bad_probe[list(errors)] = True
    with np.errstate(invalid="ignore"):
        starts_late = ~bad_probe & (col.start >= col.total)
        short = ~bad_probe & ~starts_late & stated & (end > col.total + DURATION_TOLERANCE)
        no_channel = ~bad_probe & (col.channel >= col.channels) & (col.channel >= 0)
    good = ~(bad_probe | starts_late | short | no_channel)
    end = np.minimum(end, col.total)
    seconds = np.where(col.segment, end - col.start, col.total - col.start)
    # a segment that is in fact the whole audio, or one channel of mono audio, is not cut
    whole = (col.start == 0) & (end >= col.total - 0.5 / np.maximum(col.rate, 1))
    cut = (col.segment & ~whole) | ((col.channel >= 0) & (col.channels > 1))
    findings = [_rejection(catalog.keys[int(i)], int(i), col, errors, bad_probe, starts_late, short)
                for i in np.flatnonzero(~good)]
    return good, seconds, cut, findings


def _rejection(key: str, i: int, col: _Columns, errors: dict[int, str], bad_probe: np.ndarray,
               starts_late: np.ndarray, short: np.ndarray) -> dict:
    """The finding of rejected entry ``i``: unreadable, starting past its audio, shorter than stated, or
    asking for a channel its audio lacks (in that order)."""
    if bad_probe[i]:
        return finding(key, getattr(errors[i], "check", "unreadable_audio"), errors[i])
    if starts_late[i]:
        return finding(key, "segment_out_of_range",
                       f"starts at {col.start[i]:g} s, but its audio holds {col.total[i]:.3f} s")
    if short[i]:
        return finding(key, "short_audio", f"audio holds {col.total[i] - col.start[i]:.3f} s from {col.start[i]:g} s,"
                                           f" shorter than the stated {col.duration[i]:g} s")
    return finding(key, "no_such_channel", f"asks for channel {col.channel[i]}, the audio has {col.channels[i]}")


def map_keys(catalog: Catalog, good: np.ndarray) -> tuple[dict[str, str], list[dict]]:
    """Member keys of the good entries: mappings where changed, and a finding for each key that
    is empty or repeats an earlier entry's (after mapping); those entries are dropped from ``good``."""
    key_map: dict[str, str] = {}
    findings: list[dict] = []
    idx = np.flatnonzero(good)
    hashes = np.empty(len(idx), np.uint64)
    for j, i in enumerate(idx):
        key = catalog.keys[int(i)]
        mapped = member_key(key)
        if mapped != key:
            key_map[key] = mapped
        hashes[j] = _key_hash(mapped)
        if not mapped:
            good[i] = False
            findings.append(finding(key, "bad_key", "the key names nothing a tar member can carry"))
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    repeats = np.flatnonzero(ordered[1:] == ordered[:-1]) + 1
    first_of: dict[str, int] = {}
    for r in repeats:
        for j in (order[r - 1], order[r]):
            i = int(idx[j])
            mapped = member_key(catalog.keys[i])
            first = first_of.setdefault(mapped, i)
            if first != i and good[i]:
                good[i] = False
                original = catalog.keys[first]
                findings.append(finding(catalog.keys[i], "duplicate_key",
                                        f"key {mapped!r} already names entry {first + 1}"
                                        + (f" ({original!r})" if original != mapped else "")))
    return key_map, findings


# ---------------------------------------------------------------- the run

def plan_source(fmt: str, paths: list[str], source_options: SourceOptions, settings: MakeSettings,
                options: RunOptions | None = None):
    """Read, probe, check and plan (no output written). Returns ``(builder, findings, key_map, needs_cut)``."""
    options = options or RunOptions()
    catalog, findings = read_catalog(fmt, paths, source_options, options.events)
    files = probe_files(catalog, options)
    good, seconds, cut, bad = check_entries(catalog, files.errors)
    findings += bad
    key_map, bad = map_keys(catalog, good)
    findings += bad
    indices = np.flatnonzero(good)
    cuts = plan_cuts(seconds[indices], shard_duration=settings.shard_duration, utts_per_shard=settings.utts_per_shard)
    builder = ShardBuilder(catalog, EntryPlan(indices, cuts, seconds, cut), files, fmt, source_options)
    return builder, findings, key_map, bool(cut[indices].any())


def run_make_from(fmt: str, paths: list[str], out_dir: str, settings: MakeSettings, options: RunOptions | None = None,
                  *, source_options: SourceOptions = SourceOptions()) -> MakeReport:
    """Pack a source in format ``fmt`` (``sources.FORMATS`` but kaldi) into shards under ``out_dir``.

    ``settings.audio_format`` None picks ``keep`` unless some utterance must be cut out of its
    audio (a segment, one channel) or resampled, then ``wav``. ``source_options``: the fields and
    channel the readers take. ``options`` (:class:`~shardkit.run.options.RunOptions`): as for
    ``run_make``; progress is the reading stage (``read_catalog``), then the shards' stage, ``make``.
    """
    options = options or RunOptions()
    if not paths:
        raise UsageError("name the source: a manifest, Parquet files or WebDataset tars")
    auto = settings.audio_format is None
    settings = _checked(settings, auto)
    started = time.perf_counter()
    builder, findings, key_map, needs_cut = plan_source(fmt, paths, source_options, settings, options)
    settings = _settled_audio_format(settings, auto, needs_cut)
    claim_inputs = _claim_inputs(paths, builder.catalog)
    planned = PlannedShards(len(builder), builder, findings, [], _recorded_inputs(fmt, paths, source_options),
                            claim_inputs, started, extra={"key_map": key_map})
    return claimed_run(out_dir, claim_inputs, options.split,
                       lambda out, journal_dir: write_shards(planned, out, journal_dir, settings, options))


def _checked(settings: MakeSettings, auto: bool) -> MakeSettings:
    """The settings checked (an audio format still to choose checked as wav), with the default shard duration
    when no shard size is given."""
    check_settings(replace(settings, audio_format="wav" if auto else settings.audio_format), has_segments=False)
    if settings.shard_duration is None and settings.utts_per_shard is None:
        settings = replace(settings, shard_duration=DEFAULT_SHARD_SECONDS)
    return settings


def _settled_audio_format(settings: MakeSettings, auto: bool, needs_cut: bool) -> MakeSettings:
    """wav when utterances are cut or resampled and no format was asked for, else keep; keep refused when cutting."""
    if auto:
        return replace(settings, audio_format="wav" if needs_cut or settings.resample else "keep")
    if settings.audio_format == "keep" and needs_cut:
        raise UsageError("--audio-format keep copies whole source files, but some utterances are cut out of "
                         "their audio (segments, or one channel): use --audio-format wav or flac")
    return settings


def _recorded_inputs(fmt: str, paths: list[str], source_options: SourceOptions) -> dict:
    return {"from": fmt, "sources": [p if is_url(p) else os.path.abspath(p) for p in paths],
            "options": {k: v for k, v in source_options._asdict().items() if v not in (None, False)}}


def _claim_inputs(paths: list[str], catalog: Catalog) -> list[str]:
    """No output may land on a source file, a tar holding audio, or an audio file."""
    names = catalog.audio_names
    claim_inputs = [p for p in paths if os.path.isfile(p)] + list(catalog.containers)
    return claim_inputs + [names[i] for i in range(len(names)) if "://" not in names[i] and not names[i].endswith("|")]
