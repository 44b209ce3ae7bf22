"""NeMo's tarred audio datasets: ``audio_K.tar`` (K = shard_id, 0..N-1) + one JSON-lines manifest for all.

NeMo's ``TarredAudioToCharDataset``/``TarredAudioToBPEDataset`` (``nemo/collections/asr/data/
audio_to_text.py``) read the tars through WebDataset and find each member's manifest line by its
file id, ``os.path.splitext(os.path.basename(member))[0]``, after WebDataset has cut the member
name at the first dot of its basename into ``__key__`` and extension: so a member name is flat and
has one dot (a key's ``/`` and ``.`` become ``_``, and the key is kept in the line's ``key``
field), and file ids are unique across the dataset (checked when the manifest is assembled). ``audio_filepath`` is the member
name, ``duration`` the exact frames / sample rate, ``shard_id`` the tar's K, and the utterance's
other text members are kept as fields named by their extension.

Each shard's manifest lines are written with its tar, into ``OUT_DIR/.nemo_manifests`` (so a
rerun rewrites only the shards that are missing), and :func:`finish` joins them, in shard order,
into ``tarred_audio_manifest.json`` and writes the ready-to-paste config fragment beside them.
"""

from __future__ import annotations

import gzip
import json
import os

from shardkit.errors import ShardkitError
from shardkit.io.layouts.base import GzipLines, LayoutShard, require, split_members

MANIFEST = "tarred_audio_manifest.json"
CONFIG = "nemo_config.yaml"
PARTS_DIR = ".nemo_manifests"
DEFAULT_SHUFFLE_N = 2048  # NeMo's ASR recipes' shuffle_n


def shard_paths(out_dir: str, count: int) -> list[str]:
    return [os.path.join(out_dir, f"audio_{k}.tar") for k in range(count)]


def shard_id(tar_path: str) -> int:
    return int(os.path.basename(tar_path)[len("audio_"):-len(".tar")])


def part_path(tar_path: str) -> str:
    folder = os.path.dirname(tar_path)
    return os.path.join(folder, PARTS_DIR, f"manifest_{shard_id(tar_path)}.jsonl.gz")


def companion_paths(dst: str) -> list[str]:
    return [part_path(dst)]


def member_stem(key: str) -> str:
    """The member name's stem: NeMo looks members up by basename and WebDataset cuts names at their first dot."""
    return key.replace("/", "_").replace(".", "_")


class NemoShard(LayoutShard):
    """One ``audio_K.tar``: the audio members only; their manifest lines go to the shard's part file."""

    def companions(self) -> list:
        os.makedirs(os.path.dirname(part_path(self.dst)), exist_ok=True)
        self._lines = GzipLines(part_path(self.dst))
        return [self._lines]

    def add(self, key: str, record: dict, members: list[tuple[str, bytes]]) -> None:
        tar_members, line = utterance_entries(self.dst, key, record, members)
        for name, data in tar_members:
            self.add_member(name, data)
        self._lines.write_line(line)


def utterance_entries(dst: str, key: str, record: dict,
                      members: list[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], str]:
    """What one utterance becomes in the tar ``dst``: its audio member, renamed flat, and its manifest line."""
    audio_name = key + record["audio"][len(record["key"]):]
    texts = split_members(key, members, audio_name, shard=dst)
    member = member_stem(key) + audio_name[len(key):]
    require(not member.startswith(".") and member.count(".") == 1,
            "the member name would not be a flat file name with one extension", shard=dst, member=member)
    line = {"audio_filepath": member, "duration": int(record["frames"]) / int(record["sample_rate"]),
            "text": texts.pop("txt"), "shard_id": shard_id(dst)}
    line.update((k, v) for k, v in texts.items() if k not in line)
    if member_stem(key) != key:
        line["key"] = key
    return [(member, dict(members)[audio_name])], json.dumps(line, ensure_ascii=False)


def config_fragment(out_dir: str, num_shards: int, *, shuffle_n: int = DEFAULT_SHUFFLE_N,
                    command: str = "balance") -> str:
    """The ``train_ds`` keys that point NeMo at this dataset (YAML, to paste into a model config); ``command``:
    the shardkit command that wrote it, named in the fragment's first line."""
    out_dir = os.path.abspath(out_dir)
    tars = os.path.join(out_dir, "audio_{0.." + str(num_shards - 1) + "}.tar")
    return (f"# shardkit {command} --layout nemo: paste under model.train_ds\n"
            "train_ds:\n"
            "  is_tarred: true\n"
            f"  tarred_audio_filepaths: {json.dumps(tars)}\n"
            f"  manifest_filepath: {json.dumps(os.path.join(out_dir, MANIFEST))}\n"
            "  tarred_shard_strategy: scatter\n"
            f"  shuffle_n: {shuffle_n}\n")


def finish(out_dir: str, tar_paths: list[str], command: str = "balance") -> dict:
    """Join the shards' manifest parts into the one manifest (refusing a file id twice) and write the config
    fragment; ``{"manifest", "config", "config_fragment", "utterances"}``."""
    from shardkit.io.files import atomic_write_bytes, atomic_write_lines

    seen: dict[str, str] = {}

    def lines():
        for tar in tar_paths:
            with gzip.open(part_path(tar), "rt", encoding="utf-8") as f:
                for line in f:
                    member = json.loads(line)["audio_filepath"]
                    file_id = os.path.splitext(member)[0]
                    if file_id in seen:
                        raise ShardkitError(f"file id {file_id!r} twice (also in {seen[file_id]}): NeMo finds "
                                            "members by file id", shard=tar, member=member)
                    seen[file_id] = tar
                    yield line.rstrip("\n")

    manifest = os.path.join(out_dir, MANIFEST)
    atomic_write_lines(manifest, lines())
    fragment = config_fragment(out_dir, len(tar_paths), command=command)
    config = os.path.join(out_dir, CONFIG)
    atomic_write_bytes(config, fragment.encode("utf-8"))
    return {"layout": "nemo", "manifest": manifest, "config": config, "config_fragment": fragment,
            "utterances": len(seen)}
