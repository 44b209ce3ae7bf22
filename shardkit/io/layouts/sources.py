"""Existing NeMo tarred datasets and Lhotse Shar folders, read as shards of utterances (the input side of
:mod:`shardkit.io.layouts`, shared by make, index, validate and balance, which must not import each other).

A dataset is a sequence of SHARDS (a NeMo ``audio_K.tar``; a Shar ``recording.NNNNNN.tar`` with its
``cuts.NNNNNN.jsonl.gz``); :meth:`read_shard` streams one shard's tar once, through shardkit's own tar
parser, and yields per utterance a plain dict::

    {"shard": tar path, "key", "text" (None: the line/cut has none), "member" (the audio member's name),
     "offset" (its data's offset in the decompressed tar), "size", "compressed" (the tar is),
     "data" (the member's bytes), "start"/"duration" (a segment of the member, seconds; duration None:
     the whole member), "channel", "source" (manifest or cuts file), "line" (its line number),
     "fields" (the manifest line or the cut, for what else it keeps)}

and a :class:`SourceFinding` (never raised by the reader: the caller reports it) for what cannot be an
utterance: a line without a usable audio name, a line no tar holds (:meth:`NemoTarred.unread_lines`,
once every shard was read: NeMo counts such a line in the dataset's length and never reads it), a tar
member no line or cut names, a cut whose audio is not in its place, a damaged tar (its remaining
members are lost, and the finding says so). Nothing is skipped silently.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Iterator, NamedTuple

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.jsonlines import iter_json_objects
from shardkit.io.tar import iter_members_with_offsets



class SourceFinding(ShardkitError):
    """What a dataset holds that cannot be an utterance, with where (shard, member or key) and why; ``check``
    names the kind: ``bad_line``, ``no_audio`` (a line no tar holds; a cut without a recording), ``no_line``
    (a tar member no line or cut names), ``no_transcript``, ``misplaced`` (a cut whose audio is not in its
    place: the shard's cuts after it are lost), or the tar parser's own check (the tar's rest is lost)."""

    def __init__(self, reason: str, *, check: str, shard: str | None = None, member: str | None = None):
        self.check = check
        super().__init__(reason, shard=shard, member=member)


def _tar_broke(err: ShardkitError, path: str, what: str) -> SourceFinding:
    return SourceFinding(f"{err.reason} (the {what} after it are lost)", check=err.check, shard=err.shard or path,
                         member=err.member)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _utterance(shard: str, key: str, text, name: str, data: bytes, offset: int, compressed: bool, **rest) -> dict:
    return {"shard": shard, "key": key, "text": text, "member": name, "offset": offset, "size": len(data),
            "compressed": compressed, "data": data, "start": 0.0, "duration": None, "channel": None, **rest}


# --- NeMo tarred datasets --------------------------------------------------------------------------


def file_id(path: str) -> str:
    """NeMo's name for a member and its line: ``os.path.splitext(os.path.basename(path))[0]``."""
    return os.path.splitext(os.path.basename(path))[0]


def first_json_line(path: str) -> object:
    """The first line of ``path`` parsed as JSON when the file starts with ``{`` (a manifest), else None: a shard
    or list given where a manifest may be is judged by its first bytes, never read whole."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16).lstrip()
        if not head.startswith(b"{"):
            return None
        return json.loads(head.split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None


def is_nemo_manifest(path: str) -> bool:
    """Whether ``path`` is a NeMo tarred dataset's manifest: its first line carries ``audio_filepath`` and
    ``shard_id``, and ``audio_0.tar`` lies beside it."""
    obj = first_json_line(path)
    return isinstance(obj, dict) and "audio_filepath" in obj and "shard_id" in obj and \
        os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), "audio_0.tar"))


class NemoLine(NamedTuple):
    """What an utterance needs of one manifest line (its key, text, segment and line number), and the line."""

    key: str
    text: object
    offset: object
    duration: object
    number: int
    fields: dict


class NemoTarred:
    """A NeMo tarred dataset: ``manifest`` (JSON lines; ``audio_filepath`` names the member) and its tars
    (``tars``, a list or NeMo's ``tarred_audio_filepaths`` pattern; default: ``audio_K.tar`` beside the
    manifest, K up to the largest ``shard_id``). Lines are found as NeMo finds them: by the member's file id.

    Keys: ``key_field``'s value, else the ``key`` field shardkit's NeMo layout keeps, else the file id (with a
    segment's offset in milliseconds: ``stem-12340``). Loading keeps each line's fields (one manifest in memory).
    """

    def __init__(self, manifest: str, tars=None, *, key_field: str | None = None, text_field: str = "text",
                 audio_field: str = "audio_filepath"):
        self.manifest = os.path.abspath(manifest)
        self.lines: dict[str, list[NemoLine]] = {}
        self.findings: list[SourceFinding] = []
        count = self._load(key_field, text_field, audio_field)
        if isinstance(tars, str):
            from shardkit.io.layouts.read import expand_tar_pattern

            tars = expand_tar_pattern(tars)
        if tars is None:
            if count == 0:
                raise UsageError("a NeMo tarred manifest's lines carry shard_id (the K of audio_K.tar)",
                                 shard=manifest)
            lines = sum(len(rest) for rest in self.lines.values())
            if count > lines:  # every tar holds a line's member: a larger shard_id is damage, not 10^9 tars
                raise UsageError(f"shard_id {count - 1} names more tars than the manifest has lines ({lines})",
                                 shard=manifest)
            folder = os.path.dirname(self.manifest)
            tars = [os.path.join(folder, f"audio_{k}.tar") for k in range(count)]
        self.shards: list[str] = [os.path.abspath(t) for t in tars]

    def _load(self, key_field, text_field, audio_field) -> int:
        count = 0
        for number, obj, error in _json_lines(self.manifest):
            audio = obj.get(audio_field) if obj is not None else None
            if not isinstance(audio, str) or not audio:
                self.findings.append(SourceFinding(error or f"line {number} has no {audio_field!r}",
                                                   check="bad_line", shard=self.manifest,
                                                   member=f"{self.manifest}:{number}"))
                continue
            shard_id = obj.get("shard_id")
            if isinstance(shard_id, int) and not isinstance(shard_id, bool) and shard_id >= 0:
                count = max(count, shard_id + 1)
            fid = file_id(audio)
            self.lines.setdefault(fid, []).append(NemoLine(_line_key(obj, fid, key_field), obj.get(text_field),
                                                           obj.get("offset"), obj.get("duration"), number, obj))
        return count

    def read_shard(self, tar: str) -> Iterator[dict | SourceFinding]:
        """One tar's utterances (a member's lines taken from :attr:`lines`), and its findings."""
        try:
            for name, data, offset, compressed in iter_members_with_offsets(tar):
                member_lines = self.lines.pop(file_id(name), None)
                if member_lines is None:
                    yield SourceFinding("no manifest line names this member (NeMo never reads it)", check="no_line",
                                        shard=tar, member=name)
                    continue
                for line in member_lines:
                    yield self._line_utterance(line, tar, name, data, offset, compressed)
        except ShardkitError as err:
            yield _tar_broke(err, tar, "tar's members")

    def _line_utterance(self, line: NemoLine, tar: str, name: str, data: bytes, offset: int,
                        compressed: bool) -> dict | SourceFinding:
        if not isinstance(line.text, str):
            return SourceFinding(f"line {line.number} has no text", check="no_transcript", shard=tar, member=line.key)
        utterance = _utterance(tar, line.key, line.text, name, data, offset, compressed, source=self.manifest,
                               line=line.number, fields=line.fields)
        if line.offset is not None:
            if not (_number(line.offset) and _number(line.duration)):
                return SourceFinding(f"member {name!r}: a segment needs a numeric offset and duration (got "
                                     f"{line.offset!r}, {line.duration!r})", check="bad_line", shard=tar,
                                     member=line.key)
            utterance.update(start=float(line.offset), duration=float(line.duration))
        return utterance

    def unread_lines(self, taken=None) -> Iterator[SourceFinding]:
        """Once every shard was read: each line no tar held (NeMo counts it in the length, never reads it).
        ``taken``: the file ids some tar held, when the tars were read through other views of this dataset
        (prep's workers) and :attr:`lines` still holds every line."""
        for fid, rest in self.lines.items():
            if taken is not None and fid in taken:
                continue
            for line in rest:
                yield SourceFinding(f"no tar holds member {fid!r} (NeMo never reads line {line.number})",
                                    check="no_audio", shard=self.manifest, member=line.key)

    def __iter__(self) -> Iterator[dict | SourceFinding]:
        yield from self.findings
        for tar in self.shards:
            yield from self.read_shard(tar)
        yield from self.unread_lines()


def _line_key(obj: dict, fid: str, key_field: str | None) -> str:
    key = obj.get(key_field) if key_field else obj.get("key")
    if isinstance(key, str) and key:
        return key
    offset = obj.get("offset")
    return f"{fid}-{round(float(offset) * 1000)}" if _number(offset) else fid


def _json_lines(path: str) -> Iterator[tuple[int, dict | None, str]]:
    """``(line number, object or None, why not)`` per non-blank line; an unreadable file is a UsageError."""
    try:
        f = gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb", buffering=1 << 20)
    except OSError as err:
        raise UsageError(f"cannot read the manifest ({err.strerror or err})", shard=path) from None
    with f:
        yield from iter_json_objects(f, path=path, what=" the manifest")


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


# --- Lhotse Shar -----------------------------------------------------------------------------------


def is_shar_folder(path: str) -> bool:
    """Whether ``path`` is a folder holding Shar cuts and recording files."""
    return os.path.isdir(path) and holds_shar_files(os.listdir(path))


def holds_shar_files(names: list[str]) -> bool:
    """Whether a folder's file names hold Shar cuts and recording files."""
    return any(n.startswith("cuts.") and ".jsonl" in n for n in names) and \
        any(n.startswith("recording.") and ".tar" in n for n in names)


class SharFolder:
    """A Lhotse Shar folder: per shard a cuts file and a recording tar (audio ``{cut_id}.{ext}``, then its
    ``Recording`` as ``{cut_id}.json``; ``.nodata`` for a cut without audio), in lhotse's order (sorted
    names). Every supervision is one utterance (key: its id; text: its text, stripped), with its part of the
    cut's audio (``start``/``duration`` set when it covers less than the whole member)."""

    def __init__(self, folder: str):
        self.folder = os.path.abspath(folder)
        self.pairs = _shar_pairs(self.folder)
        self.shards: list[str] = [r for _, r in self.pairs]
        self.findings: list[SourceFinding] = []
        self._cuts_of = {r: c for c, r in self.pairs}

    def read_shard(self, tar: str) -> Iterator[dict | SourceFinding]:
        """One shard's utterances, its cuts paired with its tar's members in order, and its findings."""
        cuts_path = self._cuts_of[tar]
        members = _audio_members(tar)
        try:
            for number, cut in enumerate(_cuts(cuts_path), 1):
                name, data, offset, compressed = next(members, (None, b"", -1, False))
                if name is None or os.path.splitext(name)[0] != cut.get("id"):
                    yield SourceFinding(f"cut {cut.get('id')!r} has no audio member in its place (found {name!r}; "
                                        "the shard's cuts after it are lost)", check="misplaced", shard=tar,
                                        member=name)
                    return
                yield from _cut_utterances(cut, number, name, data, offset, compressed, tar, cuts_path)
            for name, *_ in members:
                yield SourceFinding("no cut names this member", check="no_line", shard=tar, member=name)
        except ShardkitError as err:
            yield err if isinstance(err, SourceFinding) else _tar_broke(err, tar, "shard's cuts")

    def __iter__(self) -> Iterator[dict | SourceFinding]:
        for tar in self.shards:
            yield from self.read_shard(tar)


def _shar_pairs(folder: str) -> list[tuple[str, str]]:
    """(cuts file, recording tar) per shard, in lhotse's order (sorted names); as many of each, or a UsageError."""
    names = os.listdir(folder)
    cuts = sorted(n for n in names if n.split(".")[0] == "cuts" and ".jsonl" in n)
    recordings = sorted(n for n in names if n.split(".")[0] == "recording" and ".tar" in n)
    if not cuts or len(cuts) != len(recordings):
        raise UsageError(f"a Lhotse Shar folder holds as many cuts.NNNNNN.jsonl.gz as recording.NNNNNN.tar "
                         f"files (found {len(cuts)} and {len(recordings)})", shard=folder)
    return [(os.path.join(folder, c), os.path.join(folder, r)) for c, r in zip(cuts, recordings)]


def _audio_members(path: str) -> Iterator[tuple[str, bytes, int, bool]]:
    """The audio (or ``.nodata``) member of each cut; the JSON after each is its Recording, whose facts the
    audio's own header gives again."""
    for index, member in enumerate(iter_members_with_offsets(path)):
        if index % 2 == 0:
            yield member


def _cuts(path: str) -> Iterator[dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)
    except (OSError, EOFError, ValueError, zlib.error) as err:
        raise SourceFinding(f"cannot read its cuts ({err}; the shard's cuts after it are lost)", check="bad_line",
                            shard=path) from None


def _cut_utterances(cut: dict, number: int, name: str, data: bytes, offset: int, compressed: bool, tar: str,
                    cuts_path: str) -> Iterator[dict | SourceFinding]:
    supervisions = cut.get("supervisions") or []
    if name.endswith(".nodata"):
        yield from (SourceFinding(f"cut {cut['id']!r} has no recording", check="no_audio", shard=tar,
                                  member=s.get("id", cut["id"])) for s in supervisions)
        return
    if not supervisions:
        yield SourceFinding(f"cut {cut['id']!r} has no supervision (no text)", check="no_transcript", shard=tar,
                            member=name)
    for sup in supervisions:
        text = sup.get("text")
        utterance = _utterance(tar, sup.get("id", cut["id"]), text.strip() if isinstance(text, str) else None, name,
                               data, offset, compressed, source=cuts_path, line=number, fields=cut)
        utterance.update(start=float(sup.get("start", 0.0)), duration=sup.get("duration"),
                         channel=sup.get("channel"))
        yield utterance


def is_dataset(path: str) -> bool:
    """Whether ``path`` is a NeMo tarred dataset's manifest or a Lhotse Shar folder (what :func:`open_dataset`
    opens): how index, validate and balance tell them from shards."""
    return is_shar_folder(path) or is_nemo_manifest(path)


def open_dataset(path: str, *, tars=None, key_field: str | None = None):
    """The NeMo tarred dataset (a manifest) or Shar folder ``path`` names; a UsageError when it is neither."""
    if os.path.isdir(path):
        if not is_shar_folder(path):
            raise UsageError("not a Lhotse Shar folder (no cuts.NNNNNN.jsonl.gz + recording.NNNNNN.tar)", shard=path)
        return SharFolder(path)
    return NemoTarred(path, tars, key_field=key_field)


# --- index records ---------------------------------------------------------------------------------


def covers_whole(utterance: dict, seconds: float, rate: int) -> bool:
    """Whether an utterance is its whole audio member (no offset, or a part that is all of it within a sample)."""
    if utterance["duration"] is None:
        return True
    return utterance["start"] <= 0 and abs(float(utterance["duration"]) - seconds) < 1 / rate


def _unsafe_key(key: str) -> str | None:
    """Why ``key`` cannot name a tar member of a shard (WeNet's, NeMo's, Shar's), or None."""
    if not isinstance(key, str) or not key.strip():
        return "is empty"
    if key.startswith("/") or "\\" in key or any(part in ("", ".", "..") for part in key.split("/")):
        return "is not a relative name without '..' or empty parts"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return "holds a control character"
    return None


def index_record(utterance: dict, corpus: str) -> dict:
    """The index record of one utterance of a NeMo tarred dataset or Shar folder, its text inline (``text``;
    ``members`` holds only the audio member, at its offset in the decompressed tar). Its audio header is read
    as ``index`` reads every member's. Raises a located ShardkitError: audio the header refuses, a key no tar
    member can carry, a segment (``make --from`` cuts segments out; an index names whole members only)."""
    from shardkit.errors import AudioError
    from shardkit.io.audio import header_facts

    key, tar, name = utterance["key"], utterance["shard"], utterance["member"]
    why = _unsafe_key(key)
    if why is not None:
        raise SourceFinding(f"key {key!r} {why}: no shard can name a member by it", check="bad_key", shard=tar,
                            member=name)
    try:
        info = header_facts(utterance["data"], utterance["size"])
    except AudioError as err:
        raise err.located(shard=tar, member=name)
    if not covers_whole(utterance, info["duration"], info["sample_rate"]):
        raise SourceFinding(f"utterance {key!r} is a segment of its member ({utterance['start']:g} s + "
                            f"{float(utterance['duration']):g} s of {info['duration']:g} s): an index names whole "
                            "members; make --from cuts segments out", check="segment", shard=tar, member=name)
    text = utterance["text"]
    if not isinstance(text, str):
        raise SourceFinding(f"utterance {key!r} has no text", check="no_transcript", shard=tar, member=name)
    return {"shard": tar, "key": key, "corpus": corpus, "audio": name, "format": info["format"],
            "bytes": utterance["size"], "sample_rate": info["sample_rate"], "channels": info["channels"],
            "frames": info["frames"], "duration": round(info["duration"], 6), "text": text, "text_chars": len(text),
            "members": [[name, utterance["offset"], utterance["size"]]]}


def dataset_shards(dataset) -> list[str]:
    """The shard files a dataset reads (its tars) and its metadata (manifest, cuts files), for source stamps."""
    if isinstance(dataset, NemoTarred):
        return dataset.shards + [dataset.manifest]
    return dataset.shards + [c for c, _ in dataset.pairs]
