"""Output layouts of other trainers: the same balanced shards, written as NeMo or Lhotse Shar reads them.

``wenet`` (the default) is shardkit's own tar shards, written by each command as before; ``nemo``
(:mod:`.nemo`: ``audio_K.tar`` + one JSON-lines manifest) and ``shar`` (:mod:`.shar`: a folder of
``recording.NNNNNN.tar`` + ``cuts.NNNNNN.jsonl.gz``) are written here, one output shard at a time,
by a :class:`~shardkit.io.layouts.base.LayoutShard` that copies the audio members byte for byte (no
re-encoding) and writes the trainer's metadata beside them. The durations come from the index's
exact frame counts (frames / sample rate), so no audio is decoded.
"""

from __future__ import annotations

from shardkit.errors import UsageError

LAYOUTS = ("wenet", "nemo", "shar")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise UsageError(f"--layout must be one of {', '.join(LAYOUTS)} (got {layout!r})")


def _writer_module(layout: str):
    """The module that writes ``layout`` (``nemo`` or ``shar``): each has ``shard_paths``, ``companion_paths``
    and ``finish``."""
    from shardkit.io.layouts import nemo, shar

    return {"nemo": nemo, "shar": shar}[layout]


def shard_paths(layout: str, out_dir: str, count: int) -> list[str]:
    """The output shard (tar) paths of a non-WeNet layout, numbered by plan position."""
    return _writer_module(layout).shard_paths(out_dir, count)


def open_layout_shard(layout: str, dst: str):
    """The writer of the output shard of ``layout`` whose tar is ``dst`` (one of :func:`shard_paths`)."""
    from shardkit.io.layouts import nemo, shar

    return {"nemo": nemo.NemoShard, "shar": shar.SharShard}[layout](dst)


def companion_paths(layout: str, dst: str) -> list[str]:
    """The files written with the tar ``dst`` (a rerun rewrites a shard that lacks one of them)."""
    return _writer_module(layout).companion_paths(dst)


def utterance_entries(layout: str, dst: str, key: str, record: dict,
                      members: list[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], str]:
    """What one utterance becomes in the output shard ``dst`` of ``layout``: the tar members, in order, and
    the line of its companion file (what :func:`open_layout_shard`'s ``add`` writes, for a writer that keeps
    its own tar and companion, as prep's does)."""
    return _writer_module(layout).utterance_entries(dst, key, record, members)


def finish_layout(layout: str, out_dir: str, tar_paths: list[str], command: str = "balance") -> dict:
    """Once every shard is written: what the layout writes for the whole dataset (NeMo's manifest and config
    fragment, its first line naming ``command``); what was written, for the report."""
    return _writer_module(layout).finish(out_dir, tar_paths, command)
