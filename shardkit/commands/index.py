"""Utterance index: one JSON line per utterance, read from audio headers, so later steps skip the shards.

A line (keys sorted)::

    {"audio": "spk/utt1.wav", "bytes": 115300, "channels": 1, "corpus": "aishell",
     "duration": 3.6, "format": "wav", "frames": 57600, "key": "spk/utt1",
     "members": [["spk/utt1.txt", 1536, 14], ["spk/utt1.wav", 2560, 115286]],
     "sample_rate": 16000, "shard": "/abs/shards_000000000.tar", "text_chars": 5}

``members`` lists every member of the utterance in shard order as ``[name, offset, size]``;
``offset`` is where the member's data starts in the *decompressed* tar stream (the plain file for
an uncompressed shard), so ``balance`` can copy members byte for byte without re-reading the
whole shard. ``bytes`` is the sum of the member sizes; ``text_chars`` counts the transcript's
characters. Building an index streams each shard once (tar is sequential) and keeps one shard's
records in memory at a time. The records are framed by completeness marks that also stamp each
source shard (size, mtime, a digest): a ``{"shardkit_index": ...}`` line first and last in JSON
lines, the footer's metadata in Parquet (``shardkit.io.indexmarks``).

A NeMo tarred dataset (its manifest) or a Lhotse Shar folder is indexed by :func:`build_layout_index`:
its records carry the transcript inline (``"text"``) and ``members`` holds only the audio member, named as
that layout names it (``spk_utt1.wav`` for key ``spk/utt1``); balance writes the text member from it.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

from shardkit.errors import AudioError, ShardkitError, UsageError, printable
from shardkit.io.audio import flac_total_samples, probe_file  # noqa: F401 - public names of this module
from shardkit.io.indexfile import (  # noqa: F401 - the index file names, importable from here as before
    REQUIRED_FIELDS,
    IndexWriter,
    dumps_line,
    is_index_file,
    is_parquet,
    iter_index,
    loads,
    open_index,
    parse_index_line,
)
from shardkit.io.tar import (
    AUDIO_EXTENSIONS,
    BLOCK,
    DEFAULT_MAX_MEMBER_BYTES,
    STREAM_MEMBER_BYTES,
    ChunkReader,
    MemberStream,
    group_samples,
    iter_tar_members,
    open_shard,
    split_key,
)
from shardkit.run.options import RunOptions


class _CountingChunkReader(ChunkReader):
    """A ChunkReader that knows how many decompressed bytes it has handed out."""

    __slots__ = ("position",)

    def __init__(self, chunks):
        super().__init__(chunks)
        self.position = 0

    def read(self, n: int) -> bytes:
        data = super().read(n)
        self.position += len(data)
        return data


# A member above STREAM_MEMBER_BYTES is not held. Its first HEAD_BYTES are read; an audio member whose
# head tells its length (a RIFF WAV header, checked against the member's size; a FLAC STREAMINFO with its
# total samples) is probed from them and the rest skipped. Any other audio member (Ogg Vorbis/Opus, MP3,
# RF64, a FLAC whose STREAMINFO leaves the total unknown) says its duration only at its end or not at all:
# it is spooled in chunks to a temporary file in the system temp folder, probed whole, and the file deleted.
HEAD_BYTES = 1 << 20
SPOOL_CHUNK = 1 << 20


@dataclass(frozen=True)
class SpooledProbe:
    """A large audio member probed whole while it streamed past: its head and ``probe_file``'s facts."""

    head: bytes
    info: dict

    def __len__(self) -> int:  # what group_samples counts as held: the head, as for a member probed from it
        return len(self.head)


def iter_members_with_offsets(path: str, *, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
                              ) -> Iterator[tuple[str, tuple[bytes, int, int]]]:
    """``(name, (data, offset, size))`` per member, offset = start of the data in the decompressed tar.

    ``data`` is the member's bytes, or for a member above STREAM_MEMBER_BYTES only its first
    HEAD_BYTES, or a SpooledProbe for a large audio member whose head does not tell its length
    (memory stays bounded whatever the member's size).
    """
    from shardkit.io.codecs import detect_codec, iter_decompressed

    with open_shard(path) as f:
        codec = detect_codec(f.peek(16)[:16])
        if codec == "none":
            source, where = f, f.tell
        else:
            source = _CountingChunkReader(iter_decompressed(f, shard=path, codec=codec))
            where = lambda: source.position  # noqa: E731
        # the reader yields after consuming the member's data and its padding to the 512-byte block;
        # a streamed member before its data
        for name, data in iter_tar_members(source, shard=path, max_member_bytes=max_member_bytes,
                                           stream_over=STREAM_MEMBER_BYTES):
            if isinstance(data, MemberStream):
                start = where()
                head = next(data.chunks(HEAD_BYTES), b"")
                if split_key(name)[1].lower() in AUDIO_EXTENSIONS and not head_tells_length(head, data.size):
                    head = SpooledProbe(head, spool_and_probe(data, head, shard=path, member=name))
                yield name, (head, start, data.size)
                continue
            size = len(data)
            yield name, (data, where() - size - (-size % BLOCK), size)


def head_tells_length(head: bytes, size: int | None = None) -> bool:
    """Whether an audio member's first bytes give its facts (or the finding that refuses it): a WAV or FLAC
    header that ends within them and a length its bytes can hold without a decode to count it."""
    from shardkit.io.audio import HeaderBeyondHead, header_facts

    try:
        header_facts(head, len(head) if size is None else size)
    except HeaderBeyondHead:
        return False
    except AudioError:
        return True  # the head is enough to refuse it
    return True


def spool_and_probe(stream: MemberStream, head: bytes, *, shard: str, member: str) -> dict:
    """``probe_file`` facts of a streamed member (``head`` already read from it), through a temporary file."""
    import tempfile

    def spool_error(err: OSError) -> ShardkitError:
        return ShardkitError(f"cannot spool the {stream.size}-byte member to a temporary file in "
                             f"{tempfile.gettempdir()} to probe it ({err.strerror or err})", shard=shard,
                             member=member)

    try:
        tmp = tempfile.NamedTemporaryFile(prefix="shardkit-index-", suffix="." + split_key(member)[1])
    except OSError as err:
        raise spool_error(err) from None
    with tmp:
        for chunk in itertools.chain((head,), stream.chunks(SPOOL_CHUNK)):
            try:
                tmp.write(chunk)
            except OSError as err:
                raise spool_error(err) from None
        try:
            tmp.flush()
        except OSError as err:
            raise spool_error(err) from None
        try:
            return _probe_spooled(tmp.name, stream.size)
        except AudioError as err:
            raise err.located(shard=shard, member=member)


def _probe_spooled(path: str, size: int) -> dict:
    """Header facts of a spooled member, its header walked through a memory map (the page cache holds it, not
    this process): a WAV whose data chunk follows a 33 MB JUNK chunk, a FLAC with large PADDING blocks."""
    import mmap

    from shardkit.io.audio import count_frames, header_facts

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        try:
            return header_facts(view, size, count=lambda: count_frames(path))
        finally:
            del view  # (no export may outlive the map)


def probe_member(data: bytes | SpooledProbe, size: int) -> dict:
    """``shardkit.io.audio.header_facts`` of a member of ``size`` bytes given whole, by its head, or spooled.

    Raises AudioError (AudioHeaderError naming its check) for a member whose header a decoder refuses or
    reads differently: the shard then fails, naming the member."""
    from shardkit.io.audio import HeaderBeyondHead, header_facts

    if isinstance(data, SpooledProbe):
        return data.info
    try:
        return header_facts(data, size)
    except HeaderBeyondHead as more:  # cannot happen: a head that does not tell is spooled
        raise AudioError(f"the audio header needs the first {more.needed} bytes") from None


def utterance_record(sample: dict, *, shard: str, corpus: str) -> dict:
    """The index line of one grouped utterance (members carry ``(data, offset)``)."""
    key = sample["__key__"]
    names = sample["__members__"]
    exts = [n[len(key) + 1:] for n in names]
    audio_ext = _audio_extension(key, names, exts, shard)
    audio_name = f"{key}.{audio_ext}"
    audio_data, _, audio_size = sample[audio_ext]
    try:
        info = probe_member(audio_data, audio_size)
    except AudioError as err:
        raise err.located(shard=shard, member=audio_name)
    text_chars = _text_chars(sample["txt"], shard, f"{key}.txt")
    members = [[name, sample[ext][1], sample[ext][2]] for name, ext in zip(names, exts)]
    return {"shard": shard, "key": key, "corpus": corpus, "audio": audio_name, "format": info["format"],
            "bytes": sum(m[2] for m in members), "sample_rate": info["sample_rate"], "channels": info["channels"],
            "frames": info["frames"], "duration": round(info["duration"], 6), "text_chars": text_chars,
            "members": members}


def _audio_extension(key: str, names: list[str], exts: list[str], shard: str) -> str:
    """The utterance's audio member's extension; no audio, no transcript or a repeated extension is an error."""
    audio_ext = next((e for e in exts if e.lower() in AUDIO_EXTENSIONS), None)
    if audio_ext is None:
        raise ShardkitError(f"utterance {key!r} has no audio member (members: {', '.join(names)})", shard=shard)
    if "txt" not in exts:
        raise ShardkitError(f"utterance {key!r} has no .txt transcript", shard=shard)
    if len(set(exts)) != len(exts):
        raise ShardkitError(f"utterance {key!r} repeats a member extension ({', '.join(names)})", shard=shard)
    return audio_ext


def _text_chars(txt: tuple[bytes, int, int], shard: str, member: str) -> int:
    """The transcript's length in characters (it must be held whole, and UTF-8)."""
    if txt[2] > len(txt[0]):
        raise ShardkitError(f"transcript member of {txt[2]} bytes is too large to index", shard=shard, member=member)
    try:
        return len(txt[0].decode("utf-8"))
    except UnicodeDecodeError:
        raise ShardkitError("transcript is not UTF-8", shard=shard, member=member) from None


def default_corpus_name(shard: str) -> str:
    """Without --corpus an utterance's corpus is the name of its shard's folder."""
    return os.path.basename(os.path.dirname(os.path.abspath(shard))) or "corpus"


def index_shard(shard: str, corpus: str | None = None, *,
                max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES) -> list[dict]:
    """Index records of every utterance in one shard, in shard order. Raises a located ShardkitError."""
    if printable(shard) != shard:
        raise ShardkitError("shard path is not UTF-8: index lines are UTF-8 JSON and could not name it; rename the "
                            "file", shard=printable(shard))
    corpus = corpus or default_corpus_name(shard)
    members = iter_members_with_offsets(shard, max_member_bytes=max_member_bytes)
    return [_record(s, shard, corpus) for s in group_samples(members, shard=shard, max_bytes=max_member_bytes)]


INDEX_ERROR = "index_error"  # reading an utterance raised what nobody foresaw: its shard fails, naming the key


def _record(sample: dict, shard: str, corpus: str) -> dict:
    try:
        return utterance_record(sample, shard=shard, corpus=corpus)
    except ShardkitError:
        raise
    except Exception as err:  # noqa: BLE001 - the shard's failure, naming the key, never the run's
        from shardkit.io.audio import stable_message

        raise ShardkitError(f"{INDEX_ERROR}: key {sample['__key__']!r}: {type(err).__name__}: "
                            f"{stable_message(err)}", shard=shard) from err


def _index_task(args) -> tuple[list[dict] | None, str | None]:
    shard, corpus, max_member_bytes = args
    try:
        return index_shard(shard, corpus, max_member_bytes=max_member_bytes), None
    except ShardkitError as err:
        return None, str(err.located(shard=shard))
    except OSError as err:
        return None, f"{shard}: {err.strerror or err}"


def _index_failed(task, error: ShardkitError) -> tuple[None, str]:
    """A task that raised (any library's exception) or whose worker died: that shard failed."""
    return None, str(error.located(shard=task[0]))


def iter_indexed_shards(shards: list[str], corpus: str | None = None, options: RunOptions | None = None, *,
                        max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
                        ) -> Iterator[tuple[str, list[dict] | None, str | None]]:
    """``(shard, records, error)`` per shard in list order; ``options``' jobs processes or Ray tasks, a
    bounded window ahead."""
    tasks = [(s, corpus, max_member_bytes) for s in shards]
    # results are handed back in list order and at most a window of them wait: memory stays a few shards
    for i, (records, error) in (options or RunOptions()).run_tasks(_index_task, tasks, ordered=True,
                                                                   on_error=_index_failed):
        yield tasks[i][0], records, error


def indexed_shards(shards: list[str], options: RunOptions, *, stage: str, corpus: str | None = None,
                   max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
                   ) -> Iterator[tuple[str, list[dict] | None, str | None]]:
    """:func:`iter_indexed_shards`, reported through ``options``' events: a stage ``stage`` of
    ``len(shards)`` shards, then a ``done`` per shard once its records were used (its result
    ``{"shard", "utterances"}``, its error)."""
    events = options.events
    events.stage(stage, total=len(shards))
    for shard, records, error in iter_indexed_shards(shards, corpus, options, max_member_bytes=max_member_bytes):
        yield shard, records, error
        events.done({"shard": shard, "utterances": len(records or ())}, error=error)


@dataclass
class IndexReport:
    """What ``index`` did: the index written, shards, utterances, audio seconds, member bytes and failures."""
    path: str | None
    shards: int = 0
    utterances: int = 0
    seconds: float = 0.0
    bytes: int = 0
    failures: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    converted_from: str | None = None  # ``index IN.jsonl -o OUT.parquet``: the index rewritten

    def summary(self) -> dict:
        """The ``--json`` document of the run (the figures above, the failures, the elapsed time)."""
        summary = {"command": "index", "index": self.path, "shards": self.shards, "utterances": self.utterances,
                   "audio_seconds": round(self.seconds, 3), "member_bytes": self.bytes,
                   "failed": len(self.failures), "failures": self.failures,
                   "elapsed_seconds": round(self.elapsed, 3)}
        if self.converted_from is not None:
            summary["converted_from"] = self.converted_from
        return summary

    @property
    def exit_code(self) -> int:
        """1 when a shard could not be indexed, else 0 (the CLI's exit status)."""
        return 1 if self.failures else 0

    def count(self, shard: str, records: list[dict] | None, error: str | None) -> None:
        """One shard's outcome: its failure, or its utterances, seconds and member bytes."""
        self.shards += 1
        if error is not None:
            self.failures.append({"shard": shard, "error": error})
            return
        self.utterances += len(records)
        self.seconds += sum(r["duration"] for r in records)
        self.bytes += sum(r["bytes"] for r in records)


def is_index_rewrite(shard_args: list[str], output: str) -> bool:
    """``index IN.jsonl -o OUT.parquet``: one JSON lines index given, a Parquet one asked for."""
    return len(shard_args) == 1 and shard_args[0].endswith(".jsonl") and output.endswith(".parquet")


def run_index(shard_args: list[str], output: str, corpus: str | None = None, options: RunOptions | None = None, *,
              max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES) -> IndexReport:
    """``shardkit index``: the shards ``shard_args`` name (files, folders, globs, data.list files) indexed
    into ``output`` (see :func:`build_index`), or one JSON lines index rewritten as Parquet
    (:func:`is_index_rewrite`, :func:`convert_index_file`; the report's ``converted_from``).

    The output may be none of the arguments (a data.list included, which :func:`build_index` never
    sees); a folder made for it is removed again when a shard failed (no empty folder that looks made).
    ``options``: jobs, executor, ``split`` (only slice I of N, into ``<stem>.slice-I-of-N.<suffix>``)
    and progress (a stage "index", a ``done`` per shard; a rewrite: a stage "convert" of rows).
    """
    options = options or RunOptions()
    if is_index_rewrite(shard_args, output):
        report = convert_index_file(shard_args[0], output, options)
        report.converted_from = shard_args[0]
        return report
    from shardkit.io.inputs import expand_shards
    from shardkit.run.lifecycle import claim_output_file
    from shardkit.run.split import slice_path

    if _datasets_given(shard_args):
        return build_layout_index(list(shard_args), output, corpus, options)
    folder = os.path.dirname(os.path.abspath(output))
    folder_existed = os.path.isdir(folder)
    # the arguments themselves too: build_index sees only the shards a data.list names, not the list
    claim_output_file(slice_path(output, *options.split) if options.split else output,
                      [s for s in shard_args if s != "-"])
    report = build_index(expand_shards(list(shard_args)), output, corpus, options, max_member_bytes=max_member_bytes)
    if report.failures and not folder_existed:
        try:
            os.rmdir(folder)
        except OSError:
            pass
    return report


def build_index(shards: list[str], out_path: str, corpus: str | None = None, options: RunOptions | None = None, *,
                max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES) -> IndexReport:
    """Index ``shards`` into ``out_path`` (shard order), atomically: Parquet when it ends in
    ``.parquet`` (``shardkit.io.indexfile``), else JSON lines.

    Lines stream to a temporary file beside ``out_path``; it is fsynced and renamed only when every
    shard was read. If any shard fails, no index is written (a partial index would make later
    steps lose utterances without a word) and the report lists each failure. The index carries its
    completeness marks and each local shard's stamp (size, mtime, digest; ``shardkit.io.indexmarks``),
    taken before the shard is read. ``options.split=(I, N)`` indexes only slice I of N of ``shards``
    into ``<out>.slice-I-of-N.jsonl``, one marked segment: the slices' files, concatenated in slice
    order, hold the records of the whole list's index in its order (and ``balance`` takes them as
    they are, comma-separated, as one corpus). Progress: a stage "index"
    and a ``done`` per shard (its result ``{"shard", "utterances"}``, its error).
    """
    import time

    from shardkit.io.indexmarks import stamp_files

    started = time.perf_counter()
    options = options or RunOptions()
    if options.split is not None:
        from shardkit.run.split import select_slice, slice_path

        shards = select_slice(shards, *options.split)
        out_path = slice_path(out_path, *options.split)
    out_path = os.path.abspath(out_path)
    _ready_output(out_path, shards)
    # stamped before they are read: a shard rewritten while (or after) it is indexed no longer matches
    sources = stamp_files(shards)
    indexed = indexed_shards(shards, options, stage="index", corpus=corpus, max_member_bytes=max_member_bytes)
    report = _write_index(out_path, sources, indexed)
    report.elapsed = time.perf_counter() - started
    return report


def _write_index(out_path: str, sources: dict, indexed) -> IndexReport:
    """``indexed``'s ``(shard, records, error)`` into ``out_path`` through a temporary file, committed only when
    no shard failed; the report."""
    from shardkit.io.files import AtomicFile
    from shardkit.io.files import output_error

    report = IndexReport(path=None)
    with AtomicFile(out_path, buffering=1 << 20) as out:
        writer = IndexWriter(out_path, out.file, sources)
        try:
            for shard, records, error in indexed:
                if error is None:
                    writer.write(records)
                report.count(shard, records, error)
        except OSError as err:
            writer.abandon()
            raise output_error(err, out_path) from None
        except BaseException:  # a shard's error, Ctrl-C, SIGTERM: the file goes, and its writer with it
            writer.abandon()
            raise
        if report.failures:  # leaving the block removes the temporary file
            writer.abandon()
        else:
            _commit(writer, out, out_path)
            report.path = out_path
    return report


def _datasets_given(shard_args: list[str]) -> bool:
    """Whether the arguments are NeMo tarred datasets and Shar folders (refused mixed with shards)."""
    from shardkit.io.layouts.sources import is_dataset

    given = [is_dataset(arg) for arg in shard_args]
    if any(given) and not all(given):
        raise UsageError("index either NeMo tarred datasets and Shar folders, or shards: not both in one index")
    return any(given)


def _dataset_corpus(dataset: str) -> str:
    """Without --corpus: the folder a manifest lies in, or the Shar folder's own name (as a shard's folder)."""
    return default_corpus_name(dataset if os.path.isfile(dataset) else os.path.join(dataset, "cuts"))


def build_layout_index(datasets: list[str], out_path: str, corpus: str | None = None,
                       options: RunOptions | None = None) -> IndexReport:
    """Index NeMo tarred datasets (their manifests) and Lhotse Shar folders into ``out_path``, as
    :func:`build_index` indexes shards: one record per utterance with its text inline (``text``) and its
    audio member alone in ``members``, the tars (and manifest, cuts files) stamped. Every finding of the
    reader (a line no tar holds, a member no line names, a segment, audio the header refuses) is a failure
    naming the shard, member or key, and then no index is written. Shards are read in order, in this process
    (a NeMo line may lie in any tar). Progress: a stage "index" of the datasets' tars, a ``done`` per tar.
    """
    import time

    from shardkit.io.indexmarks import stamp_files
    from shardkit.io.layouts.sources import dataset_shards, open_dataset

    started = time.perf_counter()
    options = options or RunOptions()
    if options.split is not None:
        raise UsageError("--split of a NeMo tarred dataset or Shar folder: index it whole (a NeMo line may lie "
                         "in any of its tars)")
    out_path = os.path.abspath(out_path)
    opened = [open_dataset(d) for d in datasets]
    every_file = [path for dataset in opened for path in dataset_shards(dataset)]
    _ready_output(out_path, every_file + [os.path.abspath(d) for d in datasets])
    sources = stamp_files(every_file)
    names = [corpus or _dataset_corpus(d) for d in datasets]
    report = _write_index(out_path, sources, _layout_indexed(opened, names, options))
    report.shards = sum(len(d.shards) for d in opened)  # a manifest's own findings are failures, not shards
    report.elapsed = time.perf_counter() - started
    return report


def _layout_indexed(datasets: list, corpora: list[str], options: RunOptions
                    ) -> Iterator[tuple[str, list[dict] | None, str | None]]:
    """``(shard, records, error)`` per tar of ``datasets`` (then per finding of a manifest: a bad line, a line
    no tar holds), reported through ``options``' events."""
    from shardkit.io.layouts.sources import NemoTarred

    events = options.events
    events.stage("index", total=sum(len(d.shards) for d in datasets))
    for dataset, corpus in zip(datasets, corpora):
        for finding in getattr(dataset, "findings", ()):
            yield finding.shard, None, str(finding)
        for tar in dataset.shards:
            records, error = _index_tar(dataset, tar, corpus)
            yield tar, None if error else records, error
            events.done({"shard": tar, "utterances": len(records)}, error=error)
        if isinstance(dataset, NemoTarred):
            for finding in dataset.unread_lines():
                yield finding.shard, None, str(finding)


def _index_tar(dataset, tar: str, corpus: str) -> tuple[list[dict], str | None]:
    """The records of one tar of a dataset, and its findings as one error (None when it has none)."""
    from shardkit.io.layouts.sources import SourceFinding, index_record

    records, errors = [], []
    for item in dataset.read_shard(tar):
        try:
            if isinstance(item, SourceFinding):
                raise item
            records.append(index_record(item, corpus))
        except ShardkitError as err:
            errors.append(str(err.located(shard=tar)))
    return records, "; ".join(errors) if errors else None


def _ready_output(out_path: str, shards: list[str]) -> None:
    """Before any shard is read: pyarrow for a Parquet index, the output none of the shards, its folder made."""
    from shardkit.io.files import output_error
    from shardkit.run.lifecycle import claim_output_file

    if is_parquet(out_path):
        from shardkit.io.indexparquet import require_pyarrow

        require_pyarrow()
    claim_output_file(out_path, shards)
    try:
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
    except OSError as err:
        raise output_error(err, out_path, "cannot create its folder") from None


def _commit(writer: IndexWriter, out, out_path: str) -> None:
    """The index's last rows (a Parquet footer) written, then the temporary file renamed onto ``out_path``."""
    from shardkit.io.files import output_error

    try:
        writer.close()
    except OSError as err:
        writer.abandon()
        raise output_error(err, out_path) from None
    out.commit()


def convert_index_file(src: str, out_path: str, options: RunOptions | None = None) -> IndexReport:
    """Rewrite the JSON lines index ``src`` as the Parquet index ``out_path`` without opening a shard.

    Streams (one row group in memory); every line ``balance`` accepts is accepted, a line with a bad
    field is an error naming the file and line, and then no output is written. Progress: a stage
    "convert" of rows (total unknown), a ``done`` per batch of rows written.
    """
    import time

    from shardkit.io.indexfile import convert_index
    from shardkit.io.indexparquet import require_pyarrow
    from shardkit.io.files import AtomicFile
    from shardkit.io.files import output_error
    from shardkit.run.lifecycle import claim_output_file

    started = time.perf_counter()
    require_pyarrow()
    if not is_parquet(out_path) or is_parquet(src):
        raise UsageError("converting an index goes from a .jsonl index to a .parquet one")
    out_path = os.path.abspath(out_path)
    claim_output_file(out_path, [src])
    events = (options or RunOptions()).events
    events.stage("convert", total=None, unit="utt")
    report = IndexReport(path=None)
    try:
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with AtomicFile(out_path, buffering=1 << 20) as out:
            report.utterances = convert_index(src, out.file, on_rows=lambda rows: events.done(count=rows))
            out.commit()
    except OSError as err:
        raise output_error(err, out_path) from None
    report.path = out_path
    report.elapsed = time.perf_counter() - started
    return report
