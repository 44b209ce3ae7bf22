"""prep's sources in a trainer's layout: a NeMo tarred dataset (its manifest) or a Lhotse Shar folder.

* The parent expands such a source into its tars (:func:`expand_corpus`), each an ordinary source of the
  list (its size plans the shard count, its stamp and the manifest's or cuts files' decide a rerun).
* A worker reads one tar (:func:`read_dataset_tar`) through ``shardkit.io.layouts.sources``, the reader make,
  index, validate and balance share, and checks every line or supervision with validate's own checks of
  these inputs (``validate.layouts``: the audio decoded in full, the text, the declared duration, the key);
  an utterance without a finding comes back as ``KEY.txt`` (its text) + ``KEY.EXT`` (its audio member's
  bytes, unchanged), so prep's writers (WeNet, NeMo or Shar output) see ordinary utterances. A segment
  (a NeMo line with an offset, one of several supervisions of a Shar cut) is rejected: prep writes whole
  members; ``make --from`` cuts segments out.
* NeMo lines are matched to members as NeMo matches them: by the member's file id, in ANY tar (NeMo's
  ``shard_id`` is not needed). Each worker process loads the manifest once (:data:`_OPENED`) and takes the
  lines each tar's members name; the tar's result carries the file ids it took (``lines_read``), and once
  every tar is read the parent reports each line no tar held, and the manifest's own bad lines
  (:class:`DatasetLines`): findings and rejects lines, never a silent skip. A member no line names is
  rejected where it lies (shard, key = its file id, member, reason). A file id in two tars gives the
  utterance twice: the second is rejected by the cross-shard duplicate check.
"""

from __future__ import annotations

import os
import time
from typing import Sequence

from shardkit.errors import ShardkitError, UsageError

SEGMENT = "segment"
BAD_KEY = "bad_key"
TRANSCODE = "transcode"  # the check prep.read names a failed --audio transcode (read imports this module, not back)

_OPENED: dict[str, tuple[tuple, object]] = {}  # per worker process: dataset path -> (its stamp, the dataset)


def expand_corpus(args: Sequence[str]) -> list[tuple[str, str | None]]:
    """``(source path, its dataset or None)`` per source of one corpus, in argument order: a dataset's tars
    (dataset = the manifest's or folder's absolute path), everything else as ``expand_shards`` names it."""
    from shardkit.io.inputs import expand_shards
    from shardkit.io.layouts.sources import is_dataset

    out: list[tuple[str, str | None]] = []
    plain: list[str] = []
    for arg in args:
        if not is_dataset(arg):
            _refuse_manifest_without_tars(arg)
            plain.append(arg)
            continue
        if plain:
            out.extend((path, None) for path in expand_shards(plain))
            plain = []
        dataset = os.path.abspath(arg)
        out.extend((tar, dataset) for tar in _open(dataset).shards)
    if plain or not out:
        out.extend((path, None) for path in expand_shards(plain))
    return out


def _refuse_manifest_without_tars(arg: str) -> None:
    """A JSON-lines file that is not a NeMo tarred dataset's manifest (no ``shard_id``, no ``audio_0.tar`` beside
    it, a first line that is not a manifest line) is a UsageError saying why, never a list of shards that are not
    there (a shard list's lines are paths; an index file was refused before)."""
    from shardkit.io.layouts.sources import first_json_line

    if not os.path.isfile(arg):
        return
    with open(arg, "rb") as f:
        if not f.read(1 << 16).lstrip().startswith(b"{"):
            return
    first = first_json_line(arg)
    if not isinstance(first, dict) or "audio_filepath" not in first:
        why = "its first line is not a JSON object with audio_filepath"
    else:
        why = "no audio_0.tar beside it" if "shard_id" in first else "no shard_id on its first line"
    raise UsageError(f"a JSON-lines file prep cannot read as a NeMo tarred dataset ({why}): prep finds the tars as "
                     "audio_K.tar beside the manifest, K up to the largest shard_id of its lines, as NeMo's converter "
                     "writes them. A manifest of audio files is make's input (make --from nemo)",
                     shard=os.path.abspath(arg))


def metadata_files(datasets: Sequence[str]) -> list[str]:
    """The files besides the tars that decide what a dataset holds (NeMo's manifest, Shar's cuts files)."""
    from shardkit.io.layouts.sources import NemoTarred

    files: list[str] = []
    for path in sorted(set(datasets)):
        dataset = _open(path)
        files.extend([dataset.manifest] if isinstance(dataset, NemoTarred) else [c for c, _ in dataset.pairs])
    return files


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino


def _open(path: str):
    """The dataset at ``path``, loaded once per process while its manifest or folder is unchanged."""
    from shardkit.io.layouts.sources import open_dataset

    stamp = _stamp(path)
    cached = _OPENED.get(path)
    if cached is None or cached[0] != stamp:
        cached = _OPENED[path] = (stamp, open_dataset(path))
    return cached[1]


class _LinesOnce:
    """A view of a NeMo dataset's lines for one tar: ``pop`` gives a file id's lines once (as NeMo's reader
    takes them) without changing the loaded dataset, and records which file ids were taken."""

    def __init__(self, lines: dict):
        self._lines = lines
        self.taken: dict[str, None] = {}

    def pop(self, fid: str, default=None):
        if fid in self.taken or fid not in self._lines:
            return default
        self.taken[fid] = None
        return self._lines[fid]


def _tar_view(dataset):
    """What reads one tar: a NeMo dataset with its own view of the lines, or the Shar folder itself."""
    import copy

    from shardkit.io.layouts.sources import NemoTarred

    if not isinstance(dataset, NemoTarred):
        return dataset, None
    view = copy.copy(dataset)
    view.lines = _LinesOnce(dataset.lines)
    return view, view.lines


def read_dataset_tar(task) -> dict:
    """prep's ``read_source`` for one tar of a dataset (``task.dataset``): validate's result dict of the tar
    plus ``accepted`` (``[key, seconds, [(KEY.txt, text, digest), (KEY.EXT, audio, digest)]]`` per utterance
    without a finding), ``corpus`` and, for NeMo, ``lines_read`` (the file ids whose lines this tar held)."""
    from shardkit.commands.validate.layouts import _empty_result
    from shardkit.io.layouts.sources import SourceFinding

    started = time.perf_counter()
    result = _empty_result(task.path) | {"corpus": task.corpus, "dataset": task.dataset, "accepted": []}
    view, lines = _tar_view(_open(task.dataset))
    audio: dict = {}  # the member last decoded, shared by the lines that name it (validate.layouts' cache)
    seen: set[str] = set()
    for item in view.read_shard(task.path):
        if isinstance(item, SourceFinding):
            _reject_finding(result, task.path, item, nemo=lines is not None)
        else:
            _check(item, task, audio, seen, result)
    if lines is not None:
        result["lines_read"] = list(lines.taken)
    result["seconds"] = round(result["seconds"], 4)
    result["elapsed_s"] = round(time.perf_counter() - started, 4)
    return result


def _reject_finding(result: dict, tar: str, item, *, nemo: bool) -> None:
    """What the reader found (a member no line names, a damaged tar, a line without text...): a finding and a
    rejects line under the tar, with the key and member it names."""
    from shardkit.commands.validate.names import MISSING_FILE, finding

    key, member = _where(item, nemo)
    result["findings"].append(finding(tar, key, member, item.check, item.reason))
    if item.check != MISSING_FILE:  # prep.read's reject_lines lists a missing shard once, for every source
        result["rejected"].append([None, member, key, [item.check], [f"{item.check}: {item.reason}"]])


_NAMES_A_KEY = {"no_audio", "bad_line"}  # the reader's findings whose ``member`` is a line's or supervision's key


def _where(item, nemo: bool) -> tuple[str | None, str | None]:
    """``(key, member)`` of a reader's finding: a line's key where it names one (a NeMo line without text too),
    else the member and its file id as the key (a member no line names, a Shar cut without supervision)."""
    from shardkit.io.layouts.sources import file_id

    if item.check in _NAMES_A_KEY or (nemo and item.check == "no_transcript"):
        return item.member, None
    if item.check in ("no_line", "no_transcript") and item.member:
        return file_id(item.member), item.member
    return None, item.member


def _check(utterance: dict, task, audio: dict, seen: set[str], result: dict) -> None:
    """validate.layouts' checks of one line or supervision, then prep's own (a whole member, a key a member can
    carry, --audio's transcode); accepted as ``KEY.txt`` + ``KEY.EXT``, else rejected with every reason."""
    from shardkit.commands.validate.layouts import _check_utterance
    from shardkit.commands.validate.names import finding

    key, member, tar = utterance["key"], utterance["member"], utterance["shard"]
    before = len(result["findings"])
    _check_utterance(utterance, task.options, audio, seen, result)
    problems = [(f["check"], f["message"]) for f in result["findings"][before:]]
    checked = len(problems)  # validate's findings are in the result already; prep's own are added below
    problems.extend(_prep_problems(utterance, audio.get("facts")))
    members, seconds = None, 0.0
    if not problems:
        members, problem = _members(utterance, task)
        if problem is not None:
            problems.append(problem)
        seconds = audio["facts"]["seconds"]
    result["findings"].extend(finding(tar, key, member, check, message) for check, message in problems[checked:])
    if problems:
        result["rejected"].append([None, member, key, [c for c, _ in problems], [f"{c}: {m}" for c, m in problems]])
        return
    result["accepted"].append([key, seconds, members])


def _prep_problems(utterance: dict, facts: dict | None) -> list[tuple[str, str]]:
    """What prep cannot write as it is: a segment of a member, a key no tar member can carry."""
    from shardkit.io.layouts.sources import _unsafe_key, covers_whole

    problems = []
    why = _unsafe_key(utterance["key"])
    if why is not None:
        problems.append((BAD_KEY, f"key {utterance['key']!r} {why}: no shard can name a member by it"))
    if facts is not None and not covers_whole(utterance, facts["seconds"], facts["sample_rate"] or 1):
        problems.append((SEGMENT, f"a segment of its member ({utterance['start']:g} s + "
                                  f"{float(utterance['duration']):g} s of {facts['seconds']:g} s): prep writes whole "
                                  "members; make --from cuts segments out"))
    return problems


def _members(utterance: dict, task) -> tuple[list | None, tuple[str, str] | None]:
    """``KEY.txt`` and ``KEY.EXT`` with their digests (EXT: the audio member's, or --audio's after a verified
    transcode), or the transcode's problem."""
    from shardkit.io.files import member_digest

    key, name, data = utterance["key"], utterance["member"], utterance["data"]
    base = name.rsplit("/", 1)[-1]
    audio_name = f"{key}.{base.rsplit('.', 1)[1] if '.' in base.lstrip('.') else 'wav'}"
    if task.audio != "keep":
        from shardkit.io.transcode import transcode_member

        try:
            audio_name, data, _ = transcode_member(audio_name, data, task.audio, task.flac_level, True)
        except ShardkitError as err:
            return None, (TRANSCODE, err.reason)
    text = utterance["text"].encode("utf-8")
    return [(f"{key}.txt", text, member_digest(f"{key}.txt", text)),
            (audio_name, data, member_digest(audio_name, data))], None


class DatasetLines:
    """The parent's account of NeMo lines: the file ids some tar held (``take``, saved at resume points), and
    once every tar is read (``leftovers``) each line no tar held and each line the manifest could not give,
    as findings and rejects lines under the manifest."""

    def __init__(self, datasets: dict[str, str]):
        self.datasets = sorted(set(datasets.values()))
        self.read: dict[str, list[str]] = {}  # manifest -> file ids read

    def take(self, result: dict) -> None:
        """Note the file ids one tar's result read (and take them out of the result, which goes on to events)."""
        if "lines_read" in result:
            self.read.setdefault(result["dataset"], []).extend(result.pop("lines_read"))

    def state(self) -> dict:
        """What a resume point saves (plain data)."""
        return {"lines_read": self.read}

    def restore(self, state: dict) -> None:
        """Continue from a resume point's state (one saved before datasets: nothing read)."""
        self.read = state.get("lines_read", {})

    def leftovers(self) -> tuple[list[dict], list[dict]]:
        """``(findings, rejects lines)`` of the lines no tar held and the lines that are not usable."""
        from shardkit.commands.validate.names import finding
        from shardkit.io.layouts.sources import NemoTarred

        findings, rejects = [], []
        for path in self.datasets:
            dataset = _open(path)
            if not isinstance(dataset, NemoTarred):
                continue
            unread = [(f, f.member) for f in dataset.unread_lines(taken=set(self.read.get(path, ())))]
            for item, key in [(f, None) for f in dataset.findings] + unread:
                findings.append(finding(dataset.manifest, key, item.member if key is None else None, item.check,
                                        item.reason))
                rejects.append({"shard": dataset.manifest, "member": item.member if key is None else None, "key": key,
                                "checks": [item.check], "reasons": [f"{item.check}: {item.reason}"]})
        return findings, rejects


__all__ = ["DatasetLines", "expand_corpus", "metadata_files", "read_dataset_tar"]
