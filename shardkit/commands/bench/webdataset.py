"""The WebDataset rows: what a WebDataset user runs today, and what shardkit's stage gains them, next to
shardkit's reader, interleaved per (format, audio)."""

from __future__ import annotations

import io
import shutil

from shardkit.commands.bench.formats import read_decode
from shardkit.commands.bench.settings import BenchSettings, say
from shardkit.commands.bench.timing import expect, rates, timed_interleaved
from shardkit.errors import UsageError
from shardkit.io.codecs import parse_codec_spec
from shardkit.planning.bench import webdataset_gains
from shardkit.run.events import Events

WDS_LOADERS = {
    "wds+soundfile": "wds.WebDataset(urls).decode(soundfile handler)",
    "wds+soundfile pipe:zstd": "the same over pipe:zstd -dc < shard (zst only)",
    "wds+torchaudio": "wds.WebDataset(urls).decode(wds.torch_audio)",
    "wds+shardkit": "wds.WebDataset(urls).map(shardkit.training.wds.decode_audio())",
    "shardkit.training.wds.WebDataset": "shardkit.training.wds.WebDataset(urls).map(shardkit.training.wds.decode_audio())",
    "shardkit reader": "shardkit.iter_samples(urls)",
}


def soundfile_handler(key: str, data: bytes):
    """The audio handler a WebDataset user writes: soundfile from ``io.BytesIO``, float32."""
    if key.rsplit(".", 1)[-1] not in ("wav", "flac"):
        return None
    import soundfile as sf

    return sf.read(io.BytesIO(data), dtype="float32", always_2d=True)


def _pipeline(paths: list[str], loader: str):
    """The WebDataset pipeline named ``loader`` over the shards (UsageError for an unknown name)."""
    import webdataset as wds

    from shardkit.training import wds as skwds

    pipelines = {
        "wds+soundfile": lambda: wds.WebDataset(paths, shardshuffle=False).decode(soundfile_handler),
        "wds+soundfile pipe:zstd": lambda: wds.WebDataset([f"pipe:zstd -dc < {p}" for p in paths],
                                                          shardshuffle=False).decode(soundfile_handler),
        "wds+torchaudio": lambda: wds.WebDataset(paths, shardshuffle=False).decode(wds.torch_audio),
        "wds+shardkit": lambda: wds.WebDataset(paths, shardshuffle=False).map(skwds.decode_audio()),
        "shardkit.training.wds.WebDataset": lambda: skwds.WebDataset(paths, shardshuffle=False).map(
            skwds.decode_audio()),
    }
    if loader not in pipelines:
        raise UsageError(f"unknown WebDataset loader {loader!r}")
    return pipelines[loader]()


def webdataset_read(paths: list[str], loader: str) -> tuple[int, int]:
    """One pass of a WebDataset pipeline over the shards, decoding every utterance: (count, frames)."""
    if loader == "shardkit reader":
        return read_decode(paths, "shardkit")
    ds = _pipeline(paths, loader)
    axis = -1 if loader == "wds+torchaudio" else 0  # torchaudio: (channels, frames)
    count = frames = 0
    for sample in ds:
        audio = sample["wav"] if "wav" in sample else sample["flac"]
        count += 1
        frames += audio[0].shape[axis]
    return count, frames


def webdataset_formats(settings: BenchSettings) -> list[tuple[str, str]]:
    """The (format, audio) pairs the WebDataset rows cover: plain WAV, one zstd level, FLAC in plain tar."""
    zst = [f for f in settings.formats if parse_codec_spec(f)[0] == "zst"]
    zst_spec = settings.loader_format if settings.loader_format in zst else (zst[0] if zst else None)
    pairs = []
    for audio in settings.audio:
        for spec in settings.formats:
            if spec == "none" or (spec == zst_spec and audio == "wav"):
                pairs.append((spec, audio))
    return pairs


def _has_module(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _loader_names(spec: str, has_torchaudio: bool) -> list[str]:
    """The loaders measured on one format: torchaudio's where it is installed, ``pipe:zstd`` on zst
    shards where the ``zstd`` command exists."""
    is_zst = parse_codec_spec(spec)[0] == "zst"
    return [n for n in WDS_LOADERS if (n != "wds+torchaudio" or has_torchaudio)
            and (n != "wds+soundfile pipe:zstd" or (is_zst and shutil.which("zstd")))]


def measure_webdataset(layout: dict, corpus: dict, settings: BenchSettings, events: Events) -> list[dict]:
    """WebDataset pipelines next to shardkit's reader, interleaved, per (format, audio); [] without webdataset.

    zstd shards reach WebDataset's tarfile through the zstd hook (patched in this process for the
    run, as ``shardkit wenet enable-zstd`` arranges at start-up) and, where the ``zstd`` command
    exists, through ``pipe:zstd -dc``, the way WebDataset documents. MB/s count each audio codec's plain
    tar (``corpus["plain_tar_bytes"]``).
    """
    if not _has_module("webdataset"):
        say(events, "webdataset: skipped (not installed: pip install 'shardkit[wds]')")
        return []
    import tarfile

    from shardkit.io import zstd_tarfile as hook

    has_torchaudio = _has_module("torchaudio")
    patched = hook.needed() and hook.patch(tarfile)
    try:
        return [_webdataset_row(layout[(spec, audio)], spec, audio, _loader_names(spec, has_torchaudio),
                                corpus, settings, events)
                for spec, audio in webdataset_formats(settings)]
    finally:
        if patched:
            hook.unpatch(tarfile)


def _webdataset_row(paths: list[str], spec: str, audio: str, names: list[str], corpus: dict,
                    settings: BenchSettings, events: Events) -> dict:
    say(events, f"{spec}/{audio}: WebDataset loaders ({', '.join(names)})")
    check_one = {n: expect(f"{spec}/{audio} {n}", corpus, frames=True) for n in names}
    stats = timed_interleaved({n: (lambda n=n: webdataset_read(paths, n)) for n in names},
                              repeat=settings.repeat, min_seconds=settings.min_seconds,
                              check=lambda n, result: check_one[n](result))
    figures = {"tar_bytes": corpus["plain_tar_bytes"][audio], "utterances": corpus["utterances"],
               "seconds": corpus["seconds"]}
    loaders = {n: rates(stats[n], **figures) for n in names}
    return {"format": spec, "audio": audio, "loaders": loaders, "gains": webdataset_gains(loaders)}
