"""Speech-like audio and demo corpora, generated deterministically (tests, bench, the recipe).

Real corpora can't ship with the project; these signals stand in for them: voiced harmonics on a
moving pitch, syllable-rate amplitude envelopes, pauses and a noise floor, so that codecs see
something close to speech (not silence, not white noise).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import soundfile as sf

_CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 400)]
_WORDS = ("the of and to in that it was he for on are with as his they be at one have this from or had by "
          "word but what some we can out other were all there when up use your how said an each she which do "
          "their time if will way about many then them write would like so these her long make thing see him "
          "two has look more day could go come did number sound no most people my over know water than call").split()


@dataclass(frozen=True)
class CorpusSpec:
    """A synthetic corpus: how many utterances, their duration range, and the text style."""

    name: str
    utterances: int
    min_seconds: float
    max_seconds: float
    language: str = "en"  # "zh" for Mandarin-like text, "en" for English-like, "mix" for both


DEMO_CORPORA = (
    CorpusSpec("aishell", 0, 2.0, 6.0, "zh"),
    CorpusSpec("librispeech", 0, 8.0, 20.0, "en"),
    CorpusSpec("accented", 0, 1.0, 15.0, "mix"),
)


def speech_like(seconds: float, sample_rate: int = 16000, seed: int = 0, channels: int = 1) -> np.ndarray:
    """Speech-like int16 samples, shape (frames,) for mono, (frames, channels) otherwise."""
    rng = np.random.default_rng(seed)
    n = max(1, int(round(seconds * sample_rate)))
    t = np.arange(n) / sample_rate
    f0 = rng.uniform(90, 230) * (1 + 0.12 * np.sin(2 * np.pi * rng.uniform(0.5, 2.0) * t + rng.uniform(0, 6.3)))
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = np.zeros(n)
    for k in range(1, 9):
        voiced += (0.6 ** k) * np.sin(k * phase + rng.uniform(0, 6.3))
    syllable_rate = rng.uniform(3.0, 5.5)
    envelope = np.clip(np.sin(2 * np.pi * syllable_rate * t + rng.uniform(0, 6.3)), 0, None) ** 1.5
    pauses = rng.random(int(seconds * 2) + 1) < 0.2  # ~20% of half-second slots are silent
    envelope *= ~pauses[np.minimum((t * 2).astype(int), len(pauses) - 1)]
    signal = 0.35 * voiced * envelope + 0.01 * rng.standard_normal(n)
    pcm = np.clip(signal * 32767 * rng.uniform(0.5, 0.9), -32768, 32767).astype(np.int16)
    if channels > 1:
        pcm = np.stack([np.roll(pcm, 7 * c) for c in range(channels)], axis=1)
    return pcm


def encode(samples: np.ndarray, sample_rate: int, audio_format: str = "wav", subtype: str | None = None) -> bytes:
    """Audio file bytes (WAV or FLAC) written with soundfile."""
    buf = io.BytesIO()
    sf.write(buf, samples, sample_rate, format=audio_format.upper(),
             subtype=subtype or ("PCM_16" if samples.dtype == np.int16 else None))
    return buf.getvalue()


def transcript(rng: np.random.Generator, seconds: float, language: str) -> str:
    """A made-up transcript for ``seconds`` of speech in ``language`` ("zh", "en", or "mix": one of the
    two, drawn), its length in proportion to the duration; deterministic for a seeded ``rng``.
    """
    if language == "mix":
        language = "zh" if rng.random() < 0.5 else "en"
    if language == "zh":
        return "".join(rng.choice(_CJK, size=max(1, int(seconds * 4))))
    return " ".join(rng.choice(_WORDS, size=max(1, int(seconds * 2.5)))).upper()


def corpus_utterances(spec: CorpusSpec, *, seed: int = 0, sample_rate: int = 16000, audio_format: str = "wav"):
    """Yield ``(key, text, audio_bytes, seconds)`` for a synthetic corpus, deterministically.

    Keys contain '/' and '-' like real WeNet keys (``aishell/S0001-U000003``).
    """
    rng = np.random.default_rng([seed, sum(map(ord, spec.name))])
    for i in range(spec.utterances):
        seconds = float(np.round(rng.uniform(spec.min_seconds, spec.max_seconds), 3))
        key = f"{spec.name}/S{i // 50:04d}-U{i:06d}"
        text = transcript(rng, seconds, spec.language)
        pcm = speech_like(seconds, sample_rate, seed=int(rng.integers(1 << 31)))
        yield key, text, encode(pcm, sample_rate, audio_format), seconds


def write_shards(utterances, out_dir: str, *, utts_per_shard: int, codec: str = "none", level: int | None = None,
                 prefix: str = "shards_", audio_format: str = "wav") -> list[str]:
    """Pack ``(key, text, audio, seconds)`` tuples into WeNet-style shards; returns their paths.

    Writes ``<key>.txt`` then ``<key>.<audio_format>`` per utterance and ``out_dir/data.list``.
    """
    from shardkit.io.codecs import CODECS, open_writer
    from shardkit.io.tar import TarWriter

    os.makedirs(out_dir, exist_ok=True)
    paths: list[str] = []
    writer = raw = out = None

    def finish():
        writer.close()
        out.close()
        raw.close()

    for i, (key, text, audio, _seconds) in enumerate(utterances):
        if i % utts_per_shard == 0:
            if writer is not None:
                finish()
            path = os.path.join(os.path.abspath(out_dir), f"{prefix}{len(paths):09d}.tar{CODECS[codec].suffix}")
            paths.append(path)
            raw = open(path, "wb")
            out = open_writer(raw, codec, level)
            writer = TarWriter(out)
        writer.add(f"{key}.txt", text.encode("utf-8"))
        writer.add(f"{key}.{audio_format}", audio)
    if writer is not None:
        finish()
    with open(os.path.join(out_dir, "data.list"), "w") as f:
        f.writelines(p + "\n" for p in paths)
    return paths
