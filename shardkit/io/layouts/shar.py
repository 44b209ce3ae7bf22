"""Lhotse Shar: a folder of ``recording.NNNNNN.tar`` + ``cuts.NNNNNN.jsonl.gz``, as ``CutSet.from_shar`` reads it.

Lhotse's reader (``lhotse.shar.readers``) pairs the members of a recording tar: the audio
``{cut_id}.{ext}`` (any format its audio backends decode, so the source bytes are copied as they
are, not re-encoded as lhotse's own ``AudioTarWriter`` would) followed by ``{cut_id}.json``, the
``Recording`` with a ``shar`` placeholder source that the reader fills with the audio bytes. The
``cuts`` file holds one ``MonoCut`` a line, in the same order, with one supervision (the
transcript). ``CutSet.from_shar(in_dir=...)`` treats every file of the folder as a field, so the
folder holds the Shar files only: reports and lists go beside it.
"""

from __future__ import annotations

import json
import os

from shardkit.io.layouts.base import GzipLines, LayoutShard, split_members

SHAR_DIR = "shar"


def shard_paths(out_dir: str, count: int) -> list[str]:
    return [os.path.join(out_dir, SHAR_DIR, f"recording.{s:06d}.tar") for s in range(count)]


def cuts_path(recording_tar: str) -> str:
    folder, name = os.path.split(recording_tar)
    return os.path.join(folder, "cuts." + name[len("recording."):-len(".tar")] + ".jsonl.gz")


def companion_paths(dst: str) -> list[str]:
    return [cuts_path(dst)]


def finish(out_dir: str, tar_paths: list[str], command: str = "balance") -> dict:
    """Shar needs nothing for the whole dataset: the folder and how a trainer opens it, for the report
    (``command`` is NeMo's: it names the writer in a config fragment, which Shar has none of)."""
    folder = os.path.join(os.path.abspath(out_dir), SHAR_DIR)
    return {"layout": "shar", "folder": folder, "shards": len(tar_paths),
            "reader": f"CutSet.from_shar(in_dir={folder!r}, split_for_dataloading=True)"}


def recording_manifest(key: str, record: dict) -> dict:
    """The ``Recording`` of an utterance, its source a Shar placeholder; duration exact (frames / rate)."""
    channels = list(range(int(record["channels"])))
    rate = int(record["sample_rate"])
    return {"id": key, "sources": [{"type": "shar", "channels": channels, "source": ""}], "sampling_rate": rate,
            "num_samples": int(record["frames"]), "duration": int(record["frames"]) / rate, "channel_ids": channels}


def cut_manifest(key: str, record: dict, text: str, extra: dict) -> dict:
    """A ``MonoCut`` (``MultiCut`` for several channels) over the whole recording, with its transcript."""
    recording = recording_manifest(key, record)
    channels = recording["channel_ids"]
    channel = channels[0] if len(channels) == 1 else channels
    supervision = {"id": key, "recording_id": key, "start": 0.0, "duration": recording["duration"],
                   "channel": channel, "text": text}
    cut = {"id": key, "start": 0.0, "duration": recording["duration"], "channel": channel,
           "supervisions": [supervision], "recording": recording,
           "type": "MonoCut" if len(channels) == 1 else "MultiCut"}
    if extra:
        cut["custom"] = extra
    return cut


class SharShard(LayoutShard):
    """One Shar shard: the recording tar (audio, then its ``Recording`` JSON) and the cuts file beside it."""

    def companions(self) -> list:
        self._cuts = GzipLines(cuts_path(self.dst))
        return [self._cuts]

    def add(self, key: str, record: dict, members: list[tuple[str, bytes]]) -> None:
        tar_members, line = utterance_entries(self.dst, key, record, members)
        for name, data in tar_members:
            self.add_member(name, data)
        self._cuts.write_line(line)


def utterance_entries(dst: str, key: str, record: dict,
                      members: list[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], str]:
    """What one utterance becomes in the recording tar ``dst``: its audio, then its ``Recording`` JSON; and its cut
    line."""
    audio_name = key + record["audio"][len(record["key"]):]
    texts = split_members(key, members, audio_name, shard=dst)
    recording = json.dumps(recording_manifest(key, record), ensure_ascii=False).encode() + b"\n"
    text = texts.pop("txt")
    return ([(audio_name, dict(members)[audio_name]), (f"{key}.json", recording)],
            json.dumps(cut_manifest(key, record, text, texts), ensure_ascii=False))
