"""make from any source: WeNet raw lists, NeMo and Lhotse manifests, Parquet, WebDataset tars.

``run_make_from`` streams a source's entries (``shardkit.commands.make.sources``) into a ``Catalog``: columns of
numbers and packed strings, no object per utterance, so a manifest of millions of lines plans in
bounded memory. Then: file headers are probed for durations (in parallel; never a full decode),
entries are checked (missing, unreadable, shorter than stated, duplicate key), keys a tar name or
WeNet cannot carry are mapped (every mapping recorded in make.json), ``make.plan_cuts`` cuts the
good entries into duration-balanced shards, and ``make.write_shards`` writes them, building the
utterance dicts of one shard at a time.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from array import array
from dataclasses import replace
from typing import Callable

import numpy as np

from shardkit.commands.make import (
    DEFAULT_SHARD_SECONDS,
    MakeReport,
    MakeSettings,
    check_settings,
    claimed_run,
    finding,
    plan_cuts,
    write_shards,
)
from shardkit.commands.make.sources import Entry, SourceOptions, iter_entries, member_key
from shardkit.commands.make.sources._probe import probe_audio
from shardkit.errors import UsageError
from shardkit.io.remote import is_url
from shardkit.io.text import EMPTY_TEXT, text_problems
from shardkit.run.executor import run_tasks

# A stated duration may exceed the audio by this much (manifests round durations to 10 ms) before
# the entry counts as shorter than stated; the utterance then ends with its audio.
DURATION_TOLERANCE = 0.02
_PROBE_CHUNK = 2048


class StringColumn:
    """Many strings packed into one UTF-8 buffer with end offsets (about 1 + 8 bytes of overhead each)."""

    def __init__(self):
        self._data = bytearray()
        self._ends = array("q")

    def append(self, text: str) -> None:
        self._data += text.encode("utf-8", "surrogatepass")
        self._ends.append(len(self._data))

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str:
        start = self._ends[i - 1] if i else 0
        return self._data[start:self._ends[i]].decode("utf-8", "surrogatepass")

    def nbytes(self) -> int:
        return len(self._data) + 8 * len(self._ends)


class Catalog:
    """The entries of a source as columns (see ``sources.Entry`` for the meaning of each)."""

    def __init__(self):
        self.keys, self.texts = StringColumn(), StringColumn()
        # audio locations, a run of entries in one file (segments of a recording) stored once
        self.audio_names = StringColumn()
        self.audio_id = array("q")
        self._last_audio: str | None = None
        self.containers: list[str] = []
        self._container_ids: dict[str, int] = {}
        self.container = array("i")
        self.pos, self.size = array("q"), array("q")
        self.start, self.duration, self.total = array("d"), array("d"), array("d")
        self.segment = array("b")
        self.channel, self.channels = array("h"), array("h")
        self.rate = array("i")

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, e: Entry) -> None:
        self.keys.append(e.key)
        self.texts.append(e.text)
        if e.audio != self._last_audio:
            self.audio_names.append(e.audio)
            self._last_audio = e.audio
        self.audio_id.append(len(self.audio_names) - 1)
        if e.container is None:
            self.container.append(-1)
        else:
            cid = self._container_ids.get(e.container)
            if cid is None:
                cid = self._container_ids[e.container] = len(self.containers)
                self.containers.append(e.container)
            self.container.append(cid)
        self.pos.append(e.pos)
        self.size.append(e.size)
        self.start.append(e.start)
        self.duration.append(math.nan if e.duration is None else e.duration)
        self.segment.append(e.segment)
        self.channel.append(-1 if e.channel is None else e.channel)
        self.total.append(math.nan if e.total is None else e.total)
        self.rate.append(e.rate)
        self.channels.append(e.channels)

    def audio(self, i: int) -> str:
        return self.audio_names[self.audio_id[i]]

    def nbytes(self) -> int:
        columns = (self.audio_id, self.container, self.pos, self.size, self.start, self.duration, self.total,
                   self.segment, self.channel, self.channels, self.rate)
        return (self.keys.nbytes() + self.texts.nbytes() + self.audio_names.nbytes()
                + sum(a.itemsize * len(a) for a in columns))


# ---------------------------------------------------------------- keys

def _key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


# ---------------------------------------------------------------- reading and probing

def read_catalog(fmt: str, paths: list[str], options: SourceOptions,
                 on_entry: Callable[[int], None] | None = None) -> tuple[Catalog, list[dict]]:
    """Stream the source into a Catalog; entries the source itself rejects become findings."""
    catalog = Catalog()
    findings: list[dict] = []
    pick = options.channel if fmt != "lhotse" else None  # the lhotse reader applies --channel itself
    for item in iter_entries(fmt, paths, options):
        if isinstance(item, Entry) and (problems := text_problems(item.text)):  # a tokenizer could not take it
            findings += [finding(item.key, "empty_transcript" if check == EMPTY_TEXT else check, message)
                         for check, message in problems]
        elif isinstance(item, Entry):
            catalog.add(item if pick is None or item.channel is not None else item._replace(channel=pick))
        else:
            findings.append(finding(item.key, item.check, item.reason))
        if on_entry and (len(catalog) + len(findings)) % 10000 == 0:
            on_entry(len(catalog) + len(findings))
    if on_entry:
        on_entry(len(catalog) + len(findings))
    return catalog, findings


def _probe_chunk(locations: list[str]) -> list:
    return [probe_audio(p) for p in locations]


def probe_files(catalog: Catalog, *, jobs: int | None = None, executor: str = "local",
                ray_address: str | None = None, on_probe: Callable[[int], None] | None = None):
    """Header facts for every entry whose audio is a file, URL or command (tar members and
    Parquet cells were probed as they were read). Returns ``(size, mtime_ns, errors)``: two int64
    columns and ``{entry index: reason}``. Consecutive entries of one file are probed once."""
    n = len(catalog)
    fsize = np.zeros(n, np.int64)
    fmtime = np.zeros(n, np.int64)
    errors: dict[int, str] = {}
    todo = np.flatnonzero(np.frombuffer(catalog.container, np.int32) < 0) if n else np.zeros(0, np.int64)

    def chunk(start: int):
        idx = todo[start:start + _PROBE_CHUNK]
        unique, owner, last = [], [], -1
        for i in idx:
            aid = catalog.audio_id[int(i)]
            if not unique or last != aid:
                unique.append(catalog.audio_names[aid])
                last = aid
            owner.append(len(unique) - 1)
        return idx, unique, owner

    def apply(idx, owner, results):
        for i, o in zip(idx, owner):
            r = results[o]
            i = int(i)
            if isinstance(r, str):
                errors[i] = r
                continue
            catalog.total[i], catalog.rate[i], catalog.channels[i], fsize[i], fmtime[i] = r

    starts = list(range(0, len(todo), _PROBE_CHUNK))
    if len(starts) <= 1:
        jobs = 1
    # the chunks' file lists are built as they are submitted: only those in flight are held
    for k, results in run_tasks(_probe_chunk, starts, jobs=jobs, executor=executor, ray_address=ray_address,
                                ordered=True, prepare=lambda start: chunk(start)[1]):
        idx, _, owner = chunk(starts[k])
        apply(idx, owner, results)
        if on_probe:
            on_probe(len(idx))
    return fsize, fmtime, errors


# ---------------------------------------------------------------- checks (vectorised)

def check_entries(catalog: Catalog, errors: dict[int, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
    """Which entries become utterances. Returns ``(good, seconds, cut, findings)``: a bool mask, the
    seconds each utterance lasts, whether it must be cut out of its audio (segment or channel),
    and a finding per rejected entry."""
    n = len(catalog)
    total = np.frombuffer(catalog.total, np.float64) if n else np.zeros(0)
    start = np.frombuffer(catalog.start, np.float64) if n else np.zeros(0)
    duration = np.frombuffer(catalog.duration, np.float64) if n else np.zeros(0)
    segment = np.frombuffer(catalog.segment, np.int8).astype(bool) if n else np.zeros(0, bool)
    channel = np.frombuffer(catalog.channel, np.int16) if n else np.zeros(0, np.int16)
    channels = np.frombuffer(catalog.channels, np.int16) if n else np.zeros(0, np.int16)
    rate = np.frombuffer(catalog.rate, np.int32).astype(np.float64) if n else np.zeros(0)
    stated = ~np.isnan(duration)
    end = np.where(stated, start + np.where(stated, duration, 0), total)
    bad_probe = np.zeros(n, bool)
    bad_probe[list(errors)] = True
    with np.errstate(invalid="ignore"):
        starts_late = ~bad_probe & (start >= total)
        short = ~bad_probe & ~starts_late & stated & (end > total + DURATION_TOLERANCE)
        no_channel = ~bad_probe & (channel >= channels) & (channel >= 0)
    good = ~(bad_probe | starts_late | short | no_channel)
    end = np.minimum(end, total)
    seconds = np.where(segment, end - start, total - start)
    # a segment that is in fact the whole audio, or one channel of mono audio, is not cut
    whole = (start == 0) & (end >= total - 0.5 / np.maximum(rate, 1))
    cut = (segment & ~whole) | ((channel >= 0) & (channels > 1))
    findings = []
    for i in np.flatnonzero(~good):
        i = int(i)
        key = catalog.keys[i]
        if bad_probe[i]:
            findings.append(finding(key, getattr(errors[i], "check", "unreadable_audio"), errors[i]))
        elif starts_late[i]:
            findings.append(finding(key, "segment_out_of_range",
                                    f"starts at {start[i]:g} s, but its audio holds {total[i]:.3f} s"))
        elif short[i]:
            findings.append(finding(key, "short_audio", f"audio holds {total[i] - start[i]:.3f} s from {start[i]:g} s,"
                                                        f" shorter than the stated {duration[i]:g} s"))
        else:
            findings.append(finding(key, "no_such_channel",
                                    f"asks for channel {channel[i]}, the audio has {channels[i]}"))
    return good, seconds, cut, findings


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


# ---------------------------------------------------------------- per shard

class ShardBuilder:
    """Builds the utterance dicts ``make.write_shards`` writes, one shard at a time."""

    def __init__(self, catalog: Catalog, indices: np.ndarray, cuts: list[int], seconds: np.ndarray,
                 cut: np.ndarray, fsize: np.ndarray, fmtime: np.ndarray, fmt: str, options: SourceOptions):
        self.catalog, self.indices, self.cuts, self.seconds, self.cut = catalog, indices, cuts, seconds, cut
        self.fsize, self.fmtime = fsize, fmtime
        self.fmt, self.options = fmt, options
        self.container_stat = []
        for path in catalog.containers:
            st = os.stat(path)
            self.container_stat.append((st.st_size, st.st_mtime_ns))

    def __len__(self) -> int:
        return max(0, len(self.cuts) - 1)

    def source(self, i: int) -> dict:
        c = self.catalog
        audio = c.audio(i)
        cid = c.container[i]
        if cid < 0:
            if audio.startswith("pipe:"):
                return {"command": audio[5:]}
            if is_url(audio):
                return {"url": audio, "name": audio, "size": int(self.fsize[i])}  # checked when fetched
            return {"path": audio, "size": int(self.fsize[i]), "mtime_ns": int(self.fmtime[i])}
        path = c.containers[cid]
        size, mtime = self.container_stat[cid]
        if self.fmt == "wds":
            return {"tar": path, "member": audio, "name": audio, "offset": c.pos[i], "size": c.size[i],
                    "tar_size": size, "tar_mtime_ns": mtime}
        return {"parquet": path, "row_group": c.pos[i], "row": c.size[i], "column": self.options.audio_field or "audio",
                "name": audio, "file_size": size, "file_mtime_ns": mtime}

    def __call__(self, k: int) -> list[dict]:
        c = self.catalog
        out = []
        for i in self.indices[self.cuts[k]:self.cuts[k + 1]]:
            i = int(i)
            cut = bool(self.cut[i])
            start = c.start[i]
            out.append({"key": member_key(c.keys[i]), "text": c.texts[i], "source": self.source(i),
                        "start": start if cut else None,
                        "end": start + float(self.seconds[i]) if cut else None,
                        "channel": (c.channel[i] if c.channel[i] >= 0 and c.channels[i] > 1 else None),
                        "seconds": round(float(self.seconds[i]), 6), "sample_rate": int(c.rate[i])})
        return out


# ---------------------------------------------------------------- the run

def plan_source(fmt: str, paths: list[str], options: SourceOptions, settings: MakeSettings, *,
                jobs: int | None = None, executor: str = "local", ray_address: str | None = None,
                on_entry: Callable[[int], None] | None = None):
    """Read, probe, check and plan (no output written). Returns ``(builder, findings, key_map, needs_cut)``."""
    catalog, findings = read_catalog(fmt, paths, options, on_entry)
    fsize, fmtime, errors = probe_files(catalog, jobs=jobs, executor=executor, ray_address=ray_address)
    good, seconds, cut, bad = check_entries(catalog, errors)
    findings += bad
    key_map, bad = map_keys(catalog, good)
    findings += bad
    indices = np.flatnonzero(good)
    cuts = plan_cuts(seconds[indices], shard_duration=settings.shard_duration, utts_per_shard=settings.utts_per_shard)
    builder = ShardBuilder(catalog, indices, cuts, seconds, cut, fsize, fmtime, fmt, options)
    return builder, findings, key_map, bool(cut[indices].any())


def run_make_from(
    fmt: str,
    paths: list[str],
    out_dir: str,
    settings: MakeSettings,
    *,
    options: SourceOptions = SourceOptions(),
    jobs: int | None = None,
    overwrite: bool = False,
    on_plan: Callable[[int], None] | None = None,
    on_result: Callable[[dict], None] | None = None,
    on_entry: Callable[[int], None] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    split: tuple[int, int] | None = None,
) -> MakeReport:
    """Pack a source in format ``fmt`` (``sources.FORMATS`` but kaldi) into shards under ``out_dir``.

    ``settings.audio_format`` None picks ``keep`` unless some utterance must be cut out of its
    audio (a segment, one channel) or resampled, then ``wav``.
    """
    if not paths:
        raise UsageError("name the source: a manifest, Parquet files or WebDataset tars")
    auto = settings.audio_format is None
    check_settings(replace(settings, audio_format="wav" if auto else settings.audio_format), has_segments=False)
    if settings.shard_duration is None and settings.utts_per_shard is None:
        settings = replace(settings, shard_duration=DEFAULT_SHARD_SECONDS)
    started = time.perf_counter()
    builder, findings, key_map, needs_cut = plan_source(fmt, paths, options, settings, jobs=jobs, executor=executor,
                                                        ray_address=ray_address, on_entry=on_entry)
    if auto:
        settings = replace(settings, audio_format="wav" if needs_cut or settings.resample else "keep")
    elif settings.audio_format == "keep" and needs_cut:
        raise UsageError("--audio-format keep copies whole source files, but some utterances are cut out of "
                         "their audio (segments, or one channel): use --audio-format wav or flac")
    inputs = {"from": fmt, "sources": [p if is_url(p) else os.path.abspath(p) for p in paths],
              "options": {k: v for k, v in options._asdict().items() if v not in (None, False)}}
    names = builder.catalog.audio_names
    # no output may land on a source file, a tar holding audio, or an audio file
    claim_inputs = [p for p in paths if os.path.isfile(p)] + list(builder.catalog.containers)
    claim_inputs += [names[i] for i in range(len(names)) if "://" not in names[i] and not names[i].endswith("|")]
    return claimed_run(out_dir, claim_inputs, split, lambda out, journal_dir: write_shards(
        len(builder), builder, findings, [], inputs, claim_inputs, out, journal_dir, settings, overwrite=overwrite,
        on_plan=on_plan, on_result=on_result, started=started, jobs=jobs, executor=executor,
        ray_address=ray_address, split=split, extra={"key_map": key_map}))
