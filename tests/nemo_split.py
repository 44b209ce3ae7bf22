"""NeMo's dealing of tarred-audio shards, restated from its source for the layout tests (nemo-toolkit is not a
dependency: its ASR collection brings a second torch, lightning, hydra and transformers; with SHARDKIT_NEMO_PYTHON
set, tests/nemo_own_reader.py runs NeMo's own TarredAudioToCharDataset in its own environment as well).

Origin (Apache License 2.0, Copyright (c) 2020-2022 NVIDIA CORPORATION), github.com/NVIDIA/NeMo:
- ``nemo/collections/asr/data/audio_to_text.py``, ``expand_sharded_filepaths``: the tar paths are
  brace-expanded after ``(``, ``[``, ``<``, ``_OP_`` become ``{`` and ``)``, ``]``, ``>``, ``_CL_`` become
  ``}``; with ``world_size > 1`` and ``scatter``, rank r takes the slice
  ``[(N // world_size) * r, (N // world_size) * r + N // world_size)`` (the remainder is dropped, with only a
  logged warning); ``replicate`` gives every rank all N.
- ``nemo/utils/distributed.py``, ``webdataset_split_by_workers``: within a rank, worker w of K takes
  ``shards[w::K]`` (all of them with one worker).
- ``_TarredAudioToTextDataset.__init__``: the tars are read by a WebDataset pipeline, ``SimpleShardList``,
  the worker split above, ``shuffle(shuffle_n)``, ``tarfile_to_samples()``, ``rename(audio=VALID_FILE_FORMATS,
  key='__key__')``, ``to_tuple('audio', 'key')``; ``_filter`` and ``_build_sample`` then find the manifest
  line by the file id ``os.path.splitext(os.path.basename(key))[0]``, where ``key`` is WebDataset's
  ``__key__`` (the member name cut at the first dot of its basename).
The rules are restated here in the same steps, not copied; tests/commands/balance/test_balance_layouts.py
checks shardkit's NeMo output under them, independently of shardkit.planning's own statement of them.
"""

from __future__ import annotations

import os
import re

import braceexpand


def expand_sharded_filepaths(pattern: str, shard_strategy: str, world_size: int, global_rank: int) -> list[str]:
    if shard_strategy not in ("scatter", "replicate"):
        raise ValueError(shard_strategy)
    pattern = re.sub(r"\(|\[|<|_OP_", "{", pattern)
    pattern = re.sub(r"\)|\]|>|_CL_", "}", pattern)
    paths = list(braceexpand.braceexpand(pattern, escape=False))
    if world_size > 1 and shard_strategy == "scatter":
        per_rank = len(paths) // world_size
        paths = paths[per_rank * global_rank:per_rank * global_rank + per_rank]
    return paths


def split_by_workers(paths: list[str], worker: int, num_workers: int) -> list[str]:
    return paths[worker::num_workers] if num_workers > 1 else list(paths)


def file_id(member: str) -> str:
    return os.path.splitext(os.path.basename(member))[0]


VALID_FILE_FORMATS = "wav;mp3;flac;opus"  # NeMo adds soundfile's other formats; these tests write wav and flac


def tar_samples(tars: list[str]):
    """NeMo's WebDataset pipeline over one rank's tars (the worker split from torch's worker info; shuffle_n 0):
    ``(audio bytes, file id)`` per member, as ``_build_sample`` receives them."""
    import torch
    import webdataset as wds

    def split_workers(src):
        info = torch.utils.data.get_worker_info()
        yield from (split_by_workers(list(src), info.id, info.num_workers) if info is not None else src)

    pipeline = wds.DataPipeline(wds.SimpleShardList(urls=tars), split_workers, wds.tarfile_to_samples(),
                                wds.rename(audio=VALID_FILE_FORMATS, key="__key__"), wds.to_tuple("audio", "key"))
    for audio, key in pipeline:
        yield audio, file_id(key)
