"""convert: re-pack shards into another compression, every member kept and verified.

``convert_shard`` is one task (one shard in, one shard out, a result dict, never an exception for
bad data); ``run_convert`` plans outputs, skips what a previous run finished, spreads tasks over
processes, and writes ``data.list`` and ``convert.json``.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from shardkit import __version__
from shardkit.errors import ShardkitError, UsageError, printable
from shardkit.io.codecs import CODECS, bz2_fits_one_process, local_file_sizes, open_writer
from shardkit.io.files import (
    AtomicFile,
    HashingFile,
    atomic_write_json,
    combine_digests,
    load_report,
    member_digest,
    os_reason,
    output_unchanged,
    publish_list,
    remove_leftovers,
    remove_temporary_keys,
)
from shardkit.io.indexfile import ShardRecords, index_beside, with_side_parts
from shardkit.io.inputs import expand_shards, plan_output_paths
from shardkit.io.readback import ReadBackWhileWriting
from shardkit.io.remote import STDIN
from shardkit.io.tar import (
    DEFAULT_MAX_MEMBER_BYTES,
    STREAM_MEMBER_BYTES,
    MemberStream,
    TarWriter,
    iter_shard_members,
    split_key,
)
from shardkit.run.executor import usable_cores
from shardkit.run.lifecycle import (
    Journal,
    claimed_output_dir,
    note,
    remote_journal_dir,  # noqa: F401  (moved to lifecycle; still importable from here)
    this_run,
    this_run_counts,
)
from shardkit.run.options import RunOptions
from shardkit.run.split import slice_path, slice_record, with_list

MANIFEST = "convert.json"
JOURNAL = ".convert.journal.jsonl"
OK_STATUSES = ("ok", "salvaged")


@dataclass(frozen=True)
class ConvertSettings:
    """What ``convert`` makes: the output codec and level, read-back verification, salvage of damaged
    sources, the member size bound, decompressor threads, and what happens to audio (keep, wav, flac).
    """
    codec: str = "zst"
    level: int | None = 3
    verify: bool = True
    salvage: bool = False
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    # decompressor threads per task (bz2, gz); None: cores // min(jobs, shards not yet started),
    # decided as each task is submitted, so the last shards of a run decode on the cores others left idle
    threads: int | None = 1
    audio: str = "keep"
    flac_level: int | None = None
    max_decoded_seconds: float | None = 3600.0  # --audio: a member decoding to more is kept, a problem

    def output_affecting(self) -> dict:
        """The settings that change output bytes: a rerun with other values redoes the shard."""
        return {"codec": self.codec, "level": self.level, "salvage": self.salvage, "audio": self.audio,
                "flac_level": self.flac_level, "max_member_bytes": self.max_member_bytes,
                **({"max_decoded_seconds": self.max_decoded_seconds} if self.audio != "keep" else {})}


def copy_member(tar: TarWriter, name: str, body: MemberStream) -> bytes:
    """Copy a streamed member into ``tar`` chunk by chunk; its content digest."""
    h = hashlib.sha256()

    def hashed():
        for chunk in body.chunks():
            h.update(chunk)
            yield chunk

    tar.add_chunks(name, body.size, hashed())
    return h.digest()


def partial_path(dst: str) -> str:
    """The fixed temporary name earlier versions wrote ``dst`` under (``io.files.temp_path`` now
    gives one unique to each write); ``io.files.remove_leftovers`` removes both kinds.

    Beside a local ``dst``; for a URL, a local file named after it in the temporary folder.
    """
    from shardkit.io.remote import is_url

    if is_url(dst):
        import tempfile

        digest = hashlib.sha256(dst.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return os.path.join(tempfile.gettempdir(), f".shardkit-{digest}-{os.path.basename(dst)}.partial")
    return os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.partial")


def _source_info(src: str) -> dict:
    from shardkit.io.remote import input_info, is_local

    if not is_local(src):
        return input_info(src)
    try:
        st = os.stat(src)
    except FileNotFoundError:
        raise ShardkitError("no such file", shard=src) from None
    return {"path": src, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _empty_entry(src: str) -> dict:
    """A shard's manifest entry before it is converted: failed until the conversion says otherwise."""
    return {"source": {"path": src}, "output": None, "status": "failed", "error": None,
            "members": 0, "samples": 0, "tar_bytes": 0, "members_digest": None, "lost": None,
            "transcoded": None}


def convert_shard(src: str, dst: str, settings: ConvertSettings, transform: Callable | None = None) -> dict:
    """Convert one shard. Returns its manifest entry; data problems become ``status: failed``.

    Members are written one utterance behind the reader, so that ``--salvage`` can stop at the
    last complete utterance before damage. ``transform(shard, name, data)`` may replace a member
    (audio transcoding); it returns ``(name, data, info)`` with ``info`` recorded per member.
    """
    started = time.perf_counter()
    result = _empty_entry(src)
    from shardkit.io.remote import is_local

    try:
        if printable(src) != src:  # data.list and convert.json are UTF-8 text: they could not name it
            result["source"] = {"path": printable(src)}
            raise ShardkitError("shard path is not UTF-8: data.list and convert.json could not name it or its "
                                "output; rename the file", shard=printable(src))
        result["source"] = _source_info(src)
        if is_local(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
        _write_converted(src, dst, settings, transform, result)
        result["status"] = "salvaged" if result["lost"] else "ok"
    except ShardkitError as err:
        result["error"] = str(err.located(shard=src))
    except OSError as err:
        where = f" ({err.filename})" if err.filename else f" (writing {dst})"
        result["error"] = f"{src}: {os_reason(err)}{where}"
    result["seconds"] = round(time.perf_counter() - started, 4)
    return result


def _write_converted(src: str, dst: str, settings: ConvertSettings, transform: Callable | None, result: dict) -> None:
    """Copy ``src``'s members into ``dst`` under a temporary name, verify, publish; fills ``result`` in."""
    with AtomicFile(dst) as target:
        # the read-back runs beside the writing, over the file as it grows (io.readback): the same proof as
        # reading it back after the last byte, without that second pass as each shard's serial tail
        readback = ReadBackWhileWriting(target.tmp, settings.codec, shard=dst,
                                        max_member_bytes=max(settings.max_member_bytes, 1 << 31)) \
            if settings.verify else None
        try:
            hashing = HashingFile(readback.wrap(target.file) if readback else target.file)
            copy = _copy_into(src, dst, hashing, settings, transform, result)
            if readback is not None:
                readback.expected = copy.written
            # fsync, verify, then rename and fsync the folder (a URL: upload to a temporary key, move)
            target.commit(readback.verify if readback else None)
        finally:
            if readback is not None:
                readback.close()
    result["index_error"] = copy.indexed.save()
    result["output"] = {"path": dst, "size": hashing.size, "sha256": hashing.sha256.hexdigest()}


def _copy_into(src: str, dst: str, hashing: HashingFile, settings: ConvertSettings, transform: Callable | None,
               result: dict) -> "_MemberCopy":
    """Every member of ``src`` through the output codec into ``hashing``; fills ``result`` in."""
    from shardkit.io.remote import is_local

    out = open_writer(hashing, settings.codec, settings.level)
    # the index of what is written, as a by-product: each member's data offset and the audio header
    copy = _MemberCopy(TarWriter(out), ShardRecords.for_shard(dst), src, transform)
    try:
        copy.copy_all(iter_shard_members(src, max_member_bytes=settings.max_member_bytes,
                                         threads=settings.threads or 1,
                                         stream_over=None if transform else STREAM_MEMBER_BYTES))
    except ShardkitError as err:
        result["lost"] = copy.salvaged(err) if settings.salvage else None
        if result["lost"] is None:
            raise
    result["tar_bytes"] = copy.tar.close()
    out.close()
    result["members"] = len(copy.written)
    result["samples"] = copy.samples
    result["members_digest"] = combine_digests(copy.written)
    if copy.transcoded:
        result["transcoded"] = copy.transcoded
    if is_local(src) and _source_info(src) != result["source"]:
        raise ShardkitError("source changed while it was being converted; convert it again", shard=src)
    return copy


class _MemberCopy:
    """One shard's members into the output tar, written one utterance behind the reader.

    ``pending`` holds the members of the utterance being read (name, data, and the encoder's facts of a
    transcoded one, for the index: see ShardRecords.add_written); they are written when the next key
    begins (or together they pass ``STREAM_MEMBER_BYTES``), so that ``--salvage`` can drop an
    utterance that damage cut short. ``written`` is (name, digest) of every member written.
    """

    __slots__ = ("tar", "indexed", "src", "transform", "written", "transcoded", "pending", "pending_key", "samples",
                 "early")

    def __init__(self, tar: TarWriter, indexed: ShardRecords, src: str, transform: Callable | None):
        self.tar, self.indexed, self.src, self.transform = tar, indexed, src, transform
        self.written: list[tuple[str, bytes]] = []
        self.transcoded: list[dict] = []
        self.pending: list[tuple[str, bytes, dict | None]] = []
        self.pending_key = None
        self.samples = 0
        # the key of an utterance written before it was complete (a member too large to hold, or
        # members past STREAM_MEMBER_BYTES together): --salvage cannot take it back
        self.early: list = []

    def copy_all(self, members) -> None:
        pending = self.pending
        for name, data in members:
            key, _ = split_key(name)
            if key != self.pending_key:
                self.flush()
                self.pending_key = key
                self.samples += 1
            if isinstance(data, MemberStream):  # too large to hold: copied through in chunks
                self.flush()
                self.early[:] = [key]
                self.written.append((name, copy_member(self.tar, name, data)))
                self.indexed.add_written(self.tar.offset, name, None, data.size)
                continue
            pending.append(self._transformed(name, data) if self.transform is not None else (name, data, None))
            if sum(len(d) for _, d, _ in pending) > STREAM_MEMBER_BYTES:  # hold one utterance at most
                self.flush()
                self.early[:] = [key]
        self.flush()

    def _transformed(self, name: str, data: bytes) -> tuple[str, bytes, dict | None]:
        name, data, info = _transformed(self.transform, self.src, name, data)
        facts = None
        if info:
            self.transcoded.append(info)
            if info["action"] == "transcoded":  # the encoder's facts, for the index (see ShardRecords.add_written)
                facts = {"format": info["to"], "sample_rate": info["sample_rate"], "channels": info["channels"],
                         "frames": info["frames"]}
        return name, data, facts

    def flush(self) -> None:
        for name, data, facts in self.pending:
            self.tar.add(name, data)
            self.written.append((name, member_digest(name, data)))
            self.indexed.add_written(self.tar.offset, name, data, len(data), facts)
        self.pending.clear()

    def salvaged(self, err: ShardkitError) -> dict | None:
        """``--salvage``: what was lost when the read failed with ``err`` (the utterance it cut short is dropped),
        or None when nothing can be kept (nothing read yet, or that utterance is partly written already)."""
        if not self.written and not self.pending or self.early == [self.pending_key]:
            return None
        lost = {"error": str(err), "after_member": self.written[-1][0] if self.written else None,
                "dropped_members": [n for n, _, _ in self.pending]}
        self.samples -= 1 if self.pending else 0
        self.pending.clear()
        return lost


CONVERT_TASK = "convert_task"  # an exception nobody foresaw inside a shard's conversion: that shard fails


def _transformed(transform: Callable, src: str, name: str, data: bytes):
    """``transform``'s result; anything it raises beyond shardkit's errors fails this shard, naming the key."""
    try:
        return transform(src, name, data)
    except ShardkitError:
        raise
    except Exception as err:  # noqa: BLE001 - named as this shard's finding, never the run's abort
        raise ShardkitError(f"{CONVERT_TASK}: key {split_key(name)[0]!r}: {type(err).__name__}: {err}", shard=src,
                            member=name) from err


def _still_valid(entry: dict | None, src: str, dst: str, settings: ConvertSettings) -> bool:
    """Whether a previous run's entry proves ``dst`` is this source converted with these settings."""
    if not entry or entry.get("status") not in OK_STATUSES or not entry.get("output"):
        return False
    if src == STDIN:  # nothing to stat: another stream may come in under the same name
        return False
    if entry.get("settings") != settings.output_affecting():
        return False
    try:
        current = _source_info(src)
    except OSError:
        return False
    recorded = entry["source"]
    if (recorded.get("size"), recorded.get("mtime_ns")) != (current["size"], current["mtime_ns"]):
        return False
    return output_unchanged(dst, entry["output"]["size"], entry["output"]["sha256"])


def _task(args):
    src, dst, settings = args
    transform = None
    if settings.audio != "keep":
        from shardkit.io.transcode import make_transform

        transform = make_transform(settings)
    entry = convert_shard(src, dst, settings, transform)
    entry["settings"] = settings.output_affecting()
    return entry


def _task_failed(task, error: ShardkitError) -> dict:
    """The entry of a task that raised (any library's exception) or whose worker died: that shard failed."""
    src, _, settings = task
    return {"source": {"path": src}, "output": None, "status": "failed", "error": str(error.located(shard=src)),
            "members": 0, "samples": 0, "tar_bytes": 0, "members_digest": None, "lost": None, "transcoded": None,
            "seconds": 0.0, "settings": settings.output_affecting()}


def task_threads(cores: int, jobs: int, not_started: int) -> int:
    """Decoder threads for a task submitted while ``not_started`` tasks (itself included) wait:
    the cores shared among the tasks that can still run at once, so that while fewer shards remain
    than jobs, the last ones decode on the cores the finished jobs left idle."""
    return max(1, cores // max(1, min(jobs, not_started)))


def wave_threads(sizes: list[int], cores: int) -> list[int]:
    """Decoder threads of shards that all start at once (no shard waits for a job), by size: each its share
    of the cores, rounded, at least one. A shard three times the others' size then decodes on more threads and
    ends near them instead of alone on one core while the rest of the machine idles (16 unequal shards on 16
    cores: benchmarks/results/2026-11-28-sixteen-cores.md); equal shards get ``cores // shards`` each, as before."""
    total = sum(sizes)
    if total <= 0:
        return [max(1, cores // max(1, len(sizes)))] * len(sizes)
    return [min(cores, max(1, int(cores * size / total + 0.5))) for size in sizes]


def threads_per_task(tasks: list, jobs: int | None, executor: str) -> dict:
    """``run_tasks`` arguments that give each convert task its ``threads`` as it is submitted.

    Local processes: when every task starts at once (jobs >= tasks) and the sources are local files, each
    its share of the cores by size (:func:`wave_threads`); otherwise ``cores // min(jobs, tasks not yet
    submitted)``, with at most ``jobs`` tasks in flight, so that submitting a task is starting it. Ray: one
    thread per task (one CPU each). Decoder threads never change output bytes.
    """
    cores = os.cpu_count() or 1
    if executor == "ray":
        return {"prepare": lambda task: (*task[:2], replace(task[2], threads=1))}
    jobs_n = max(1, min(jobs or cores, len(tasks) or 1))
    position = {id(task): k for k, task in enumerate(tasks)}  # tasks are submitted in this order
    sizes = local_file_sizes([src for src, _, _ in tasks]) if 1 < len(tasks) <= jobs_n else None
    by_size = wave_threads(sizes, cores) if sizes else None

    def prepare(task):
        k = position[id(task)]
        threads = by_size[k] if by_size else task_threads(cores, jobs_n, len(tasks) - k)
        return (*task[:2], replace(task[2], threads=threads))

    return {"prepare": prepare, "max_in_flight": jobs_n}


@dataclass
class ConvertReport:
    """What ``convert`` did: per-shard entries (status, source, output, errors), the list and manifest written."""
    out_dir: str
    data_list: str
    manifest: str
    shards: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    audio: str = "keep"
    index: str | None = None  # index.parquet beside data.list (None: see index_note)
    index_note: str | None = None

    def summary(self) -> dict:
        """The ``--json`` document: counts by status, this run's counts, members, utterances, bytes in
        and out, throughput, failures and salvaged shards, the audio summary and the index.
        """
        tar_bytes = sum(e["tar_bytes"] for e in self.shards if e["status"] in ("ok", "salvaged"))
        return {
            "command": "convert",
            "out_dir": self.out_dir,
            "data_list": self.data_list,
            "manifest": self.manifest,
            "shards": len(self.shards),
            **{s: sum(1 for e in self.shards if e["status"] == s) for s in ("ok", "skipped", "salvaged", "failed")},
            "this_run": this_run_counts(self.shards),
            **self._totals(),
            "tar_bytes_converted": tar_bytes,
            "seconds": round(self.seconds, 3),
            "tar_mb_per_s": round(tar_bytes / self.seconds / 1e6, 2) if self.seconds > 0 else None,
            **self._problems(),
            **({"audio": self._audio_summary()} if self.audio != "keep" else {}),
            "index": self.index, **({"index_note": self.index_note} if self.index_note else {}),
        }

    def _totals(self) -> dict:
        """Members, utterances and bytes in and out over every shard (a pipe's input size is unknown: 0)."""
        return {
            "members": sum(e["members"] for e in self.shards),
            "samples": sum(e["samples"] for e in self.shards),
            "bytes_in": sum(e["source"].get("size") or 0 for e in self.shards),  # None: a pipe
            "bytes_out": sum((e["output"] or {}).get("size", 0) for e in self.shards),
        }

    def _problems(self) -> dict:
        """The failed shards with their errors, and the salvaged ones with what they lost."""
        return {
            "failures": [{"shard": e["source"]["path"], "error": e["error"]} for e in self.shards
                         if e["status"] == "failed"],
            "salvaged_shards": [{"shard": e["source"]["path"], **e["lost"]} for e in self.shards
                                if e["status"] == "salvaged"],
        }

    def _audio_summary(self) -> dict:
        from shardkit.io.transcode import summarize

        done = [e for e in self.shards if e["status"] != "failed"]
        problems = [{"shard": e["source"]["path"], "key": i["key"], "member": i["member"],
                     "check": i.get("check", "decode"), "reason": i["reason"]}
                    for e in done for i in e.get("transcoded") or [] if i.get("problem")]
        return {**summarize(done), "undecodable_kept": problems}

    @property
    def exit_code(self) -> int:
        """1 when a shard failed or was salvaged (it lost data), else 0 (the CLI's exit status)."""
        return 1 if any(e["status"] in ("failed", "salvaged") for e in self.shards) else 0


@dataclass(frozen=True)
class _RunFiles:
    """Where one run (or one ``--split`` slice) keeps its bookkeeping inside the claimed folder."""

    out_dir: str
    manifest: str  # convert.json, or convert.slice-I-of-N.json
    data_list: str
    journal: str
    reports: list[str]  # the reports an earlier run may have left: what to skip (a slice's own first)
    slice_info: dict | None  # the slice record (``run.split.slice_record``), None for a whole run


def _run_files(out_dir: str, journal_dir: str, split: tuple[int, int] | None, shards: list[str]) -> _RunFiles:
    from shardkit.io.remote import is_url

    join = (lambda name: f"{out_dir}/{name}") if is_url(out_dir) else (lambda name: os.path.join(out_dir, name))
    manifest_path, data_list = join(MANIFEST), join("data.list")
    journal_path = os.path.join(journal_dir, JOURNAL)
    if split is None:
        return _RunFiles(out_dir, manifest_path, data_list, journal_path, [manifest_path], None)
    sliced = [slice_path(path, *split) for path in (manifest_path, data_list, journal_path)]
    return _RunFiles(out_dir, sliced[0], sliced[1], sliced[2], [sliced[0], manifest_path], slice_record(shards, *split))


def run_convert(
    shard_args: list[str],
    out_dir: str,
    settings: ConvertSettings,
    options: RunOptions | None = None,
    *,
    keep_tree: bool | None = None,
    stdin_name: str | None = None,
) -> ConvertReport:
    """Convert every shard named by ``shard_args`` into ``out_dir``; see the module docstring.

    SOURCE ``-`` reads one shard from standard input; its output is ``OUT_DIR/stdin.tar<suffix>``,
    or ``stdin_name``'s stem (``--stdin-name``) in place of ``stdin``. A rerun always converts it
    again: a stream cannot be compared with what an earlier run converted.

    ``options`` (:class:`~shardkit.run.options.RunOptions`): jobs, executor, overwrite, progress (one
    stage, "convert", a ``done`` event per shard with its entry and tar bytes), and ``split=(I, N)``:
    only the I-th of N contiguous slices of the input list, reported as convert.slice-I-of-N.json and
    data.slice-I-of-N.list for ``shardkit merge-reports``. ``keep_tree``: the output layout, see
    :func:`shardkit.io.inputs.plan_output_paths` (None: mirror the input folders when file names repeat).
    """
    options = options or RunOptions()
    shards = expand_shards(shard_args)
    if stdin_name is not None and STDIN not in shards:
        raise UsageError("--stdin-name names the output of SOURCE - (standard input), and no SHARDS argument is -")
    suffix = ".tar" + CODECS[settings.codec].suffix
    outputs = plan_output_paths(shards, out_dir, suffix, keep_tree=keep_tree, stdin_name=stdin_name)
    # one run per folder and slice at a time; a URL's journal (and lock) stay on this machine (a
    # store has no fsynced append): a rerun elsewhere resumes from the convert.json the last run published
    with claimed_output_dir(out_dir, shards + [a for a in shard_args if os.path.isfile(a)], "convert", options.split,
                            outputs=outputs) as (out_dir, journal_dir):
        files = _run_files(out_dir, journal_dir, options.split, shards)
        if files.slice_info is not None:  # outputs were planned over the whole list, so slices cannot collide
            start, stop = files.slice_info["start"], files.slice_info["stop"]
            shards, outputs = shards[start:stop], outputs[start:stop]
        return _convert_claimed(shards, outputs, settings, files, options)


def _convert_claimed(shards: list[str], outputs: list[str], settings: ConvertSettings, files: _RunFiles,
                     options: RunOptions) -> ConvertReport:
    """The part of ``run_convert`` that runs while this run holds the output folder's lock."""
    from shardkit.io.remote import is_url

    journal = Journal(files.journal)
    previous = {} if options.overwrite else _previous_entries(files.reports, journal)
    remove_leftovers(with_side_parts(outputs))  # temporary files of a killed run (its lock died with it)
    if is_url(files.out_dir):
        remove_temporary_keys(outputs)

    options.events.stage("convert", len(shards))
    started = time.perf_counter()
    results, todo = _skip_finished(shards, outputs, settings, previous, options.events)
    try:
        _run_todo(todo, settings, options, journal, results)
    finally:
        journal.close(remove=False)
        # a task lost with its worker or node left its temporary file: none stays once the run ends
        remove_leftovers(with_side_parts(outputs))

    ordered = [results[i] for i in range(len(shards))]
    report = ConvertReport(out_dir=files.out_dir, data_list=files.data_list, manifest=files.manifest,
                           shards=ordered, seconds=time.perf_counter() - started, audio=settings.audio)
    listed = [e["output"]["path"] for e in ordered if e["status"] in ("ok", "salvaged", "skipped")]
    report.data_list = _publish_data_list(report.data_list, ordered)
    report.index, report.index_note = index_beside(report.data_list, listed)
    _write_manifest(files, settings, ordered, listed)
    journal.close(remove=True)
    return report


def _previous_entries(reports: list[str], journal: Journal) -> dict[str, dict]:
    """An earlier run's entry per output path: its reports, then the journal of a killed run."""
    previous = {}
    for entry in [e for path in reports for e in (load_report(path) or {}).get("shards", [])] + journal.load():
        if entry.get("output"):
            previous[entry["output"]["path"]] = entry
    return previous


def _skip_finished(shards: list[str], outputs: list[str], settings: ConvertSettings, previous: dict[str, dict],
                   events) -> tuple[dict[int, dict], list[tuple[int, tuple]]]:
    """The shards an earlier run finished (entries marked ``skipped``, reported at once) and the tasks left."""
    results: dict[int, dict] = {}
    todo = []
    for i, (src, dst) in enumerate(zip(shards, outputs)):
        entry = previous.get(dst)
        same_source = entry is not None and entry["source"].get("path") == src
        if same_source and src == STDIN:
            note(f"{dst}: standard input cannot be compared with the stream an earlier run converted into it; "
                 f"converting it again")
        if same_source and _still_valid(entry, src, dst, settings):
            results[i] = {**entry, "status": "skipped", "previous_status": entry["status"], "this_run": "skipped"}
            events.done(results[i])
        else:
            todo.append((i, (src, dst, settings)))
    return results, todo


def _run_todo(todo: list[tuple[int, tuple]], settings: ConvertSettings, options: RunOptions, journal: Journal,
              results: dict[int, dict]) -> None:
    """Run the tasks left; each finished entry is journaled, reported and stored in ``results``."""
    tasks = [args for _, args in todo]
    jobs = _jobs(tasks, settings, options)
    # threads=None: each task's decoder threads are chosen as it is submitted (see threads_per_task)
    extra = threads_per_task(tasks, jobs, options.executor) if settings.threads is None else {}
    # multiprocessing and its forkserver only for a run that has a pool (one job runs inline, importing neither)
    if options.executor == "local" and min(jobs or os.cpu_count() or 1, len(tasks)) > 1:
        from shardkit.run.executor import preload_in_forkserver

        preload_in_forkserver(worker_modules(settings.audio))
    if len(tasks) > 1:
        import_in_background(INDEX_MODULES)
    events = options.events
    for k, entry in options.run_tasks(_task, tasks, on_error=_task_failed, jobs=jobs, **extra):
        entry["this_run"] = this_run(entry["status"])
        results[todo[k][0]] = entry
        journal.append(entry)
        events.done(entry, nbytes=entry.get("tar_bytes") or 0)


def _jobs(tasks: list[tuple], settings: ConvertSettings, options: RunOptions) -> int | None:
    """``options.jobs``; unset, 1 for local bz2 files few enough for one process (``io.codecs.bz2_fits_one_process``):
    no pool, each shard's bz2 decoded on every core in turn (``threads_per_task`` gives it them all)."""
    if options.jobs is not None or options.executor != "local" or settings.threads is not None:
        return options.jobs
    return 1 if bz2_fits_one_process([src for src, _, _ in tasks], usable_cores()) else None


# What a pool worker imports to convert a shard. Imported once by the forkserver, every worker forked from it
# starts with them; before, each worker imported them itself, about 0.35 CPU-s each, while the run waited
# (benchmarks/results/2026-11-28-convert-reader.md). Optional ones missing are skipped by the forkserver.
WORKER_MODULES = ["shardkit.commands.convert", "indexed_bzip2", "pyzstd"]
# and, with --audio, the transcoder (soundfile and libsndfile, numpy, io.libflac): otherwise every worker loads it
AUDIO_WORKER_MODULES = ["shardkit.io.transcode"]


def worker_modules(audio: str) -> list[str]:
    """What the forkserver imports for a run with ``--audio audio``."""
    return WORKER_MODULES + (AUDIO_WORKER_MODULES if audio != "keep" else [])
# What index.parquet's assembly imports after the last shard: imported while the shards convert, so the
# run's serial tail (one core busy, the others idle) does not include it.
INDEX_MODULES = ["pyarrow.parquet"]


def import_in_background(modules: list[str]) -> None:
    """Import ``modules`` in a daemon thread (a missing one is left to its user to report)."""
    import importlib
    import threading

    def load():
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError:
                pass

    threading.Thread(target=load, name="shardkit-imports", daemon=True).start()


def _write_manifest(files: _RunFiles, settings: ConvertSettings, ordered: list[dict], listed: list[str]) -> None:
    """convert.json (or the slice's): each entry with the status its run gave it (a skip names the earlier one);
    a slice's record holds the lines of its list (``listed``), which merge-reports checks."""
    recorded = [{**e, "status": e.get("previous_status", e["status"])} if e["status"] == "skipped" else e
                for e in ordered]
    for e in recorded:
        e.pop("previous_status", None)
    libraries = {}
    if settings.audio != "keep":  # transcoded bytes depend on the encoder's version
        from shardkit.io.transcode import libsndfile_version

        libraries["libsndfile"] = libsndfile_version()
    write_report_file(files.manifest, atomic_write_json, {
        "tool": "shardkit", "version": __version__, "command": "convert", "settings": {**asdict(settings)},
        "libraries": libraries, "shards": recorded,
        **({"slice": with_list(files.slice_info, listed)} if files.slice_info else {})})


def _publish_data_list(path: str, ordered: list[dict]) -> str:
    """The outputs that are there, in input order; after a failed shard under data.partial.list, so that
    nothing that looks finished points at a partial corpus. Returns where the list went."""
    listed = [e["output"]["path"] for e in ordered if e["status"] in ("ok", "salvaged", "skipped")]
    return publish_list(path, listed, complete=len(listed) == len(ordered))


# --- URL outputs (any fsspec store) ------------------------------------------------------------


def write_report_file(path: str, write: Callable[[str, object], None], payload) -> None:
    """``write(path, payload)`` with a ``lifecycle.atomic_write_*``: a local path or a URL alike."""
    write(path, payload)

