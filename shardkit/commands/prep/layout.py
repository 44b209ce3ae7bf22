"""prep --layout nemo|shar: the balanced output in a trainer's own layout, written by prep's writer threads.

The same plan, the same utterances in the same order per shard as ``--layout wenet``; what each
utterance becomes (NeMo: its audio member renamed flat and a manifest line; Shar: its audio and its
``Recording`` JSON, and a cut line) is ``shardkit.io.layouts``' own rule, the one ``balance --layout``
writes by (:func:`shardkit.io.layouts.utterance_entries`). The durations are the audio headers' exact
frames / sample rate (``io.audio.header_facts``, as ``index`` records them for balance), read on the
writer thread of the shard.

Each output shard is a plain tar written by :class:`~shardkit.commands.prep.write.OutputShards`
(verified member by member at the end, as today) plus its companion file (NeMo's manifest part in
``OUT_DIR/.nemo_manifests``, Shar's ``cuts.NNNNNN.jsonl.gz``). The companion is gzip, whose
compressor state a resume point cannot save, so its lines are spooled plainly under a temporary
name beside it while the shard is open (truncated back at a resume like the tar), and gzipped,
read back and renamed after the tar at the end. NeMo's manifest and config fragment are joined
from the parts once every shard is written (``finish_layout``), as balance does.
"""

from __future__ import annotations

import hashlib
import os

from shardkit.commands.prep.write import (
    LAYOUT_FOLDERS,
    LINES_SUFFIX,
    OutputShards,
    _open_target,
    raise_open_file_limit,
)
from shardkit.errors import ShardkitError, UsageError, VerificationError
from shardkit.io.files import HashingFile, member_digest, output_error
from shardkit.io.layouts import check_layout, companion_paths, shard_paths, utterance_entries
from shardkit.io.layouts.nemo import CONFIG, MANIFEST

def check_layout_settings(layout: str, codec: str) -> None:
    """Refuse an unknown layout, and a codec with a trainer's layout (its reader takes plain tars only)."""
    check_layout(layout)
    if layout != "wenet" and codec != "none":
        raise UsageError(f"--codec {codec} with --layout {layout}: NeMo and Lhotse read plain tars, which "
                         f"--layout {layout} always writes; leave --codec and --level out")


def output_shard_paths(layout: str, out_dir: str, count: int) -> list[str]:
    """The tars of ``layout`` (``shardkit.io.layouts.shard_paths``), with the folders they and their companions
    go to made."""
    paths = shard_paths(layout, out_dir, count)
    for folder in {os.path.dirname(p) for path in paths[:1] for p in [path, *companion_paths(layout, path)]}:
        os.makedirs(folder, exist_ok=True)
    return paths


def utterance_record(key: str, members: list[tuple[str, bytes, bytes]], *, shard: str) -> dict:
    """What a layout needs of an utterance besides its members (the fields of an index record: its audio
    member, frames, sample rate, channels), from its audio header. validate's checks passed it, so it has
    one audio member whose header a decoder reads as it decodes."""
    from shardkit.errors import AudioError
    from shardkit.io.audio import header_facts
    from shardkit.io.tar import AUDIO_EXTENSIONS, split_key

    audio = [(name, data) for name, data, _ in members if split_key(name)[1] in AUDIO_EXTENSIONS]
    if len(audio) != 1:
        raise ShardkitError(f"{len(audio)} audio members (a layout carries one)", shard=shard, member=key)
    name, data = audio[0]
    try:
        facts = header_facts(data)
    except AudioError as err:
        raise err.located(shard=shard, member=name) from None
    return {"key": key, "audio": name, "frames": facts["frames"], "sample_rate": facts["sample_rate"],
            "channels": facts["channels"]}


class _SpooledLines:
    """A companion file's lines, plain, under a temporary name beside it (continued from a resume point when
    ``saved`` names one); :meth:`publish` gzips them into the companion."""

    def __init__(self, companion: str, saved: dict | None = None, prefix=None):
        self.companion = companion
        self.target = _open_target(companion + LINES_SUFFIX, saved)
        self.hashing = HashingFile(self.target.file)
        if saved is not None:
            self.hashing.sha256, self.hashing.size = prefix, saved["size"]

    def write(self, line: str) -> None:
        try:
            self.hashing.write((line + "\n").encode("utf-8"))
        except OSError as err:
            raise output_error(err, self.companion) from None

    def flush(self) -> None:
        try:
            self.target.file.flush()
        except OSError as err:
            raise output_error(err, self.companion) from None

    def state(self) -> dict:
        """What a resume point records of the spool (as ``OutputShards.checkpoint`` of a tar)."""
        return {"tmp": self.target.tmp, "size": self.hashing.size, "sha256": self.hashing.sha256.hexdigest()}

    def publish(self, verify: bool) -> str:
        """Gzip the spooled lines into the companion (``io.layouts.base.GzipLines``: the bytes balance writes for
        the same lines), read back unless ``verify`` is off, renamed; the spool removed. Returns the path."""
        from shardkit.io.layouts.base import GzipLines

        self.flush()
        self.target.file.close()
        gz = GzipLines(self.companion)
        try:
            gz.open()
            back = hashlib.sha256()
            with open(self.target.tmp, "rb") as f:
                for line in f:
                    back.update(line)
                    gz.write_line(line[:-1].decode("utf-8"))
            if back.digest() != self.hashing.sha256.digest():  # the spool changed on disk since it was written
                raise VerificationError("the spooled lines do not read back as written", shard=self.target.tmp)
            gz.commit(check=verify)
        except OSError as err:
            raise output_error(err, self.companion) from None
        finally:
            gz.discard()
        self.target.discard()
        return self.companion

    def close(self, keep: bool) -> None:
        """Close the spool: kept for a rerun to continue (``keep``), else removed."""
        if not keep:
            self.target.discard()
        elif self.target.file is not None and not self.target.file.closed:
            try:
                self.target.file.close()
            except OSError:  # a full disk: the rerun's prefix check finds the file short and starts again
                pass


class LayoutOutputShards(OutputShards):
    """:class:`OutputShards` for a trainer's layout: ``add_utterance(shard, key, members)`` instead of ``add``.

    ``resume``: per shard, a :meth:`checkpoint` entry (with ``lines``) and the pair of prefix hashes
    ``check_partials`` gives for it."""

    def __init__(self, paths: list[str], layout: str, threads: int = 1, resume: list[tuple[dict, object]] | None = None):
        self.layout = layout
        self._lines: list[_SpooledLines] = []
        raise_open_file_limit(2 * len(paths) + 64)  # the tar and its lines, per shard
        try:
            for s, path in enumerate(paths):
                saved, prefix = resume[s] if resume else (None, None)
                self._lines.append(_SpooledLines(companion_paths(layout, path)[0], saved and saved["lines"],
                                                 prefix and prefix[1]))
        except BaseException:
            for lines in self._lines:
                lines.close(keep=False)
            raise
        super().__init__(paths, "none", None, threads,
                         [(saved, prefix[0]) for saved, prefix in resume] if resume else None)

    def add_utterance(self, shard: int, key: str, members: list[tuple[str, bytes, bytes]]) -> None:
        """Queue one utterance for ``shard``: its members named for ``key``, each ``(name, data, digest)``."""
        self._enqueue(shard, (shard, key, members), sum(len(data) for _, data, _ in members))

    def _write_item(self, item: tuple) -> None:
        shard, key, members = item
        try:
            self._write_utterance(shard, key, members)
        finally:
            self._release(sum(len(data) for _, data, _ in members))

    def _write_utterance(self, shard: int, key: str, members: list[tuple[str, bytes, bytes]]) -> None:
        path = self.paths[shard]
        record = utterance_record(key, members, shard=path)
        tar_members, line = utterance_entries(self.layout, path, key, record, [(n, d) for n, d, _ in members])
        digests = {id(data): digest for _, data, digest in members}  # the reader's, of the very bytes copied
        for name, data in tar_members:
            self._write_member(shard, name, data, digests.get(id(data)) or member_digest(name, data))
        self._lines[shard].write(line)

    def _flush(self, t: int, done) -> None:
        for s in range(t, len(self.paths), len(self._queues)):
            self._lines[s].flush()
        super()._flush(t, done)

    def checkpoint(self) -> list[dict]:
        """``OutputShards.checkpoint``, each entry with its spooled lines' state (``lines``)."""
        entries = super().checkpoint()
        for entry, lines in zip(entries, self._lines):
            entry["lines"] = lines.state()
        return entries

    def _close(self, s: int, verify: bool) -> dict:
        """The tar closed, verified and renamed, then its companion; the entry names the companion."""
        entry = super()._close(s, verify)
        entry["companions"] = [self._lines[s].publish(verify)]
        return entry

    def abort(self, keep_files: bool = False) -> None:
        super().abort(keep_files)
        for lines in self._lines:
            lines.close(keep=keep_files)


def earlier_outputs(out_dir: str, doc: dict) -> list[str]:
    """The files an earlier finished prep run (its prep.json ``doc``) wrote in OUT_DIR and its layout folders:
    its shards, their companions, NeMo's manifest and config."""
    folders = {out_dir} | {os.path.join(out_dir, sub) for sub in LAYOUT_FOLDERS}
    files = [p for entry in doc.get("shards", []) for p in [entry.get("path", ""), *entry.get("companions", [])]]
    if (doc.get("summary") or {}).get("layout", {}).get("layout") == "nemo":
        files += [os.path.join(out_dir, MANIFEST), os.path.join(out_dir, CONFIG)]
    return [p for p in files if os.path.dirname(p) in folders]


def remove_empty_folders(out_dir: str) -> None:
    """The layout folders an earlier run made, once nothing is left in them."""
    for sub in LAYOUT_FOLDERS:
        try:
            os.rmdir(os.path.join(out_dir, sub))
        except OSError:  # absent, or not empty
            pass


def finished_layout(out_dir: str, doc: dict) -> bool:
    """Whether an earlier finished run's layout files besides its shards are all there (each shard's companions;
    NeMo's manifest and config are written again when one is missing, from the parts)."""
    from shardkit.io.layouts import finish_layout

    entries = doc.get("shards", [])
    if not all(os.path.exists(p) for entry in entries for p in entry.get("companions", [])):
        return False
    layout = (doc.get("summary") or {}).get("layout")
    if layout and layout.get("layout") == "nemo" and not all(os.path.exists(layout[k]) for k in ("manifest", "config")):
        finish_layout("nemo", out_dir, [entry["path"] for entry in entries], "prep")
    return True
