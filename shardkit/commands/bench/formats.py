"""The format rows: per (format, audio) the size, writing it from a plain WAV tar, decompression alone,
read + group, read + decode per decoder, and the WeNet-style reference (``tarfile`` + torchaudio)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Callable

from shardkit.commands.bench.corpus import base_shards
from shardkit.commands.bench.settings import BenchSettings, say
from shardkit.commands.bench.timing import Counted, expect, expect_bytes, expect_members, rates, timed
from shardkit.io.codecs import iter_decompressed, open_writer, parse_codec_spec
from shardkit.io.tar import TarWriter
from shardkit.run.events import Events


def decompress_only(paths: list[str]) -> Counted:
    """Decompressed bytes of the shards, the fastest way the reader decompresses (count, bytes)."""
    from shardkit.io.codecs import detect_codec
    from shardkit.training.zstd_source import ZSTD_READ_SIZE

    total = 0
    scratch = bytearray(1 << 20)
    for path in paths:
        with open(path, "rb", buffering=1 << 20) as f:
            codec = detect_codec(f.peek(16)[:16])
            if codec == "zst":
                import zstandard

                reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=ZSTD_READ_SIZE,
                                                                    read_across_frames=True)
                while n := reader.readinto(scratch):
                    total += n
            elif codec == "none":
                while n := f.readinto(scratch):
                    total += n
            else:
                for chunk in iter_decompressed(f, shard=path, codec=codec):
                    total += len(chunk)
    return len(paths), total


def read_group(paths: list[str]) -> Counted:
    """Read and group every utterance of ``paths`` without decoding: ``(utterances, 0)`` for the read-only row."""
    from shardkit.training.reader import iter_samples

    return sum(1 for _ in iter_samples(paths, decode=False)), 0


def read_decode(paths: list[str], decoder: str) -> Counted:
    """Read and decode every utterance of ``paths`` with ``decoder``: ``(utterances, audio frames)``."""
    from shardkit.training.reader import iter_samples

    count = frames = 0
    for sample in iter_samples(paths, decoder=decoder):
        count += 1
        frames += len(sample["audio"])
    return count, frames


def wenet_reference(paths: list[str]) -> Counted:
    """How WeNet reads: tarfile ``r:*``, group by prefix, ``torchaudio.load(io.BytesIO(...))``."""
    import tarfile

    import torchaudio

    count = frames = 0
    for path in paths:
        with open(path, "rb") as stream, tarfile.open(fileobj=stream, mode="r:*") as tar:
            prev = None
            for info in tar:
                pos = info.name.rfind(".")
                prefix, postfix = info.name[:pos], info.name[pos + 1:]
                data = tar.extractfile(info).read()
                if postfix == "txt":
                    data.decode("utf8").strip()
                elif postfix in ("wav", "flac"):
                    waveform, _ = torchaudio.load(io.BytesIO(data))
                    frames += waveform.shape[1]
                if prefix != prev:
                    count += 1
                    prev = prefix
    return count, frames


def warm_up_torchaudio(work: str, audio: tuple[str, ...]) -> None:
    """Load torchaudio's decoder once per codec before timing (its first call loads FFmpeg)."""
    from shardkit.training.reader import decode_utterances, iter_utterances

    for a in audio:
        utt = next(iter_utterances(base_shards(work, a)[:1]))
        next(decode_utterances([utt], decoder="torchaudio"))


def write_sample(plain_wav_shard: str, limit_bytes: int) -> bytes:
    """The first utterances of a plain WAV shard, up to ``limit_bytes``, as one tar (the write input)."""
    from shardkit.io.tar import iter_shard_members

    buf = io.BytesIO()
    tar = TarWriter(buf)
    for name, data in iter_shard_members(plain_wav_shard):
        if buf.tell() >= limit_bytes and name.endswith(".txt"):
            break
        tar.add(name, data)
    tar.close()
    return buf.getvalue()


class _NullSink:
    def write(self, data) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def write_format(sample_tar: bytes, codec: str, level: int | None, audio: str) -> Counted:
    """Produce one format from a plain WAV tar in memory, as convert does (count of members, 0)."""
    from shardkit.io.tar import iter_tar_members
    from shardkit.io.transcode import transcode_member

    out = open_writer(_NullSink(), codec, level)
    tar = TarWriter(out)
    count = 0
    for name, data in iter_tar_members(io.BytesIO(sample_tar)):
        if audio == "flac":
            name, data, _ = transcode_member(name, data, "flac")
        tar.add(name, data)
        count += 1
    tar.close()
    out.close()
    return count, 0


@dataclass(frozen=True)
class FormatRows:
    """What every format row is measured against: the corpus totals (with the plain tars' bytes per audio
    codec, ``plain_tar_bytes``), the in-memory plain WAV tar each format is written from, the settings, and
    where progress goes."""

    corpus: dict
    sample_tar: bytes
    settings: BenchSettings
    events: Events

    def _timed(self, fn: Callable[[], Counted], check: Callable[[Counted], None]) -> dict:
        return timed(fn, repeat=self.settings.repeat, min_seconds=self.settings.min_seconds, check=check)

    def _rates(self, stat: dict, audio: str) -> dict:
        # MB/s of each row count its own plain tar (WAV or FLAC); h/s and utt/s compare across rows
        return rates(stat, tar_bytes=self.corpus["plain_tar_bytes"][audio], utterances=self.corpus["utterances"],
                     seconds=self.corpus["seconds"])

    def row(self, spec: str, audio: str, paths: list[str]) -> dict:
        """Every figure of one (format, audio), measured in this order: write, decompress, read + group,
        read + decode per decoder, the WeNet reference where asked for."""
        codec, level = parse_codec_spec(spec)
        label = f"{spec}/{audio}"
        size = sum(os.path.getsize(p) for p in paths)
        row: dict = {"format": spec, "codec": codec, "level": level, "audio": audio, "bytes": size,
                     "size_ratio": round(size / self.corpus["wav_tar_bytes"], 4)}
        row["write"] = self._write(label, codec, level, audio)
        say(self.events, f"{label}: decompress")
        row["decompress"] = self._rates(self._timed(lambda: decompress_only(paths),
                                                    expect_bytes(label, self.corpus["plain_tar_bytes"][audio])), audio)
        say(self.events, f"{label}: read + group")
        row["group"] = self._rates(self._timed(lambda: read_group(paths),
                                               expect(f"{label} read + group", self.corpus, frames=False)), audio)
        row["decode"] = {decoder: self._decode(label, audio, paths, decoder) for decoder in self.settings.decoders}
        row["reference"] = self._reference(label, audio, paths) if spec in self.settings.reference else None
        return row

    def _write(self, label: str, codec: str, level: int | None, audio: str) -> dict:
        say(self.events, f"{label}: write")
        sample_tar = self.sample_tar
        write = self._timed(lambda: write_format(sample_tar, codec, level, audio), expect_members(label))
        return {**write, "mb_per_s": round(len(sample_tar) / write["median_s"] / 1e6, 2),
                "input": "plain WAV tar", "input_bytes": len(sample_tar)}

    def _decode(self, label: str, audio: str, paths: list[str], decoder: str) -> dict:
        say(self.events, f"{label}: read + decode ({decoder})")
        return self._rates(self._timed(lambda: read_decode(paths, decoder),
                                       expect(f"{label} decode ({decoder})", self.corpus, frames=True)), audio)

    def _reference(self, label: str, audio: str, paths: list[str]) -> dict:
        say(self.events, f"{label}: WeNet reference (tarfile + torchaudio)")
        return self._rates(self._timed(lambda: wenet_reference(paths),
                                       expect(f"{label} WeNet reference", self.corpus, frames=True)), audio)


def measure_formats(layout: dict[tuple[str, str], list[str]], rows: FormatRows) -> list[dict]:
    """A row per (format, audio), audio codecs outermost, in the order of the settings."""
    return [rows.row(spec, audio, layout[(spec, audio)])
            for audio in rows.settings.audio for spec in rows.settings.formats]
