"""The recipe's demo data: a mix of three synthetic corpora written as Kaldi data directories.

Like the mix that motivated shardkit (see docs/reference/wenet-format.md): short Mandarin-like utterances as WAV
files (AISHELL-like), long English-like utterances as FLAC files (LibriSpeech ships FLAC), and a
mixed third corpus of long WAV recordings cut into utterances by a ``segments`` file. Optional
faults (a 8 kHz utterance, a stereo one) give ``validate`` something to find.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from shardkit.io.synth import DEMO_CORPORA, CorpusSpec, corpus_utterances, encode, speech_like

SAMPLE_RATE = 16000
SEGMENT_GAP_SECONDS = 0.4
UTTERANCES_PER_RECORDING = 4


@dataclass(frozen=True)
class DemoCorpus:
    """One corpus of the demo: its synthetic speech spec, its share of the minutes, its file format and layout."""
    spec: CorpusSpec
    share: float  # of the demo's total minutes
    audio_format: str  # of the source files
    segmented: bool  # long recordings + segments instead of one file per utterance


DEMO_MIX = (
    DemoCorpus(DEMO_CORPORA[0], 0.40, "wav", False),
    DemoCorpus(DEMO_CORPORA[1], 0.35, "flac", False),
    DemoCorpus(DEMO_CORPORA[2], 0.25, "wav", True),
)


def demo_counts(minutes: float) -> dict[str, int]:
    """Utterances per corpus for about ``minutes`` of audio in all (pure); at least 2 each."""
    counts = {}
    for corpus in DEMO_MIX:
        mean = (corpus.spec.min_seconds + corpus.spec.max_seconds) / 2
        counts[corpus.spec.name] = max(2, round(minutes * 60 * corpus.share / mean))
    return counts


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _write_table(path: str, rows: list[tuple[str, str]]) -> None:
    # Kaldi tables are sorted by key (C locale)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{key} {value}\n" for key, value in sorted(rows, key=lambda r: r[0].encode("utf-8")))


def write_corpus(corpus: DemoCorpus, out_dir: str, *, utterances: int, seed: int = 0,
                 faults: bool = False) -> dict:
    """Write one corpus as a Kaldi data directory ``out_dir/<name>``; returns what it holds."""
    from shardkit.io.audio import decode

    spec = replace(corpus.spec, utterances=utterances)
    folder = os.path.join(os.path.abspath(out_dir), spec.name)
    os.makedirs(folder, exist_ok=True)
    wav_rows, text_rows, segment_rows = [], [], []
    seconds = 0.0
    utts = list(corpus_utterances(spec, seed=seed, sample_rate=SAMPLE_RATE, audio_format=corpus.audio_format))
    if not corpus.segmented:
        for i, (key, text, audio, length) in enumerate(utts):
            if faults and i == 0:  # a wrong sample rate, as when one corpus was recorded at 8 kHz
                audio = encode(speech_like(length, 8000, seed=seed + 1), 8000, corpus.audio_format)
            elif faults and i == 1:  # stereo, as when one corpus kept both channels
                audio = encode(speech_like(length, SAMPLE_RATE, seed=seed + 2, channels=2), SAMPLE_RATE,
                               corpus.audio_format)
            path = os.path.join(folder, "audio", f"{key}.{corpus.audio_format}")
            _write(path, audio)
            wav_rows.append((key, path))
            text_rows.append((key, text))
            seconds += length
    else:
        gap = np.zeros(int(SEGMENT_GAP_SECONDS * SAMPLE_RATE), np.int16)
        for first in range(0, len(utts), UTTERANCES_PER_RECORDING):
            recording = f"{spec.name}/R{first // UTTERANCES_PER_RECORDING:04d}"
            pieces, position = [gap], len(gap)
            for key, text, audio, _length in utts[first:first + UTTERANCES_PER_RECORDING]:
                pcm = decode(audio, "int16")[0][:, 0]
                segment_rows.append((key, f"{recording} {position / SAMPLE_RATE:.3f} "
                                          f"{(position + len(pcm)) / SAMPLE_RATE:.3f}"))
                text_rows.append((key, text))
                pieces += [pcm, gap]
                position += len(pcm) + len(gap)
                seconds += len(pcm) / SAMPLE_RATE
            path = os.path.join(folder, "audio", f"{recording}.{corpus.audio_format}")
            _write(path, encode(np.concatenate(pieces), SAMPLE_RATE, corpus.audio_format))
            wav_rows.append((recording, path))
    _write_table(os.path.join(folder, "wav.scp"), wav_rows)
    _write_table(os.path.join(folder, "text"), text_rows)
    if segment_rows:
        _write_table(os.path.join(folder, "segments"), segment_rows)
    return {"name": spec.name, "dir": folder, "utterances": len(utts), "seconds": round(seconds, 3),
            "audio_format": corpus.audio_format, "segments": bool(segment_rows), "faults": faults}


def write_demo(out_dir: str, *, minutes: float = 15.0, seed: int = 0, faults: bool = False) -> list[dict]:
    """Write the three-corpus demo mix under ``out_dir`` (one Kaldi data directory per corpus).

    With ``faults``, the first corpus gets one 8 kHz and one stereo utterance.
    """
    counts = demo_counts(minutes)
    return [write_corpus(c, out_dir, utterances=counts[c.spec.name], seed=seed, faults=faults and i == 0)
            for i, c in enumerate(DEMO_MIX)]


def run_demo(out_dir: str, *, minutes: float = 15.0, seed: int = 0, faults: bool = False) -> dict:
    """``shardkit demo``: claim ``out_dir`` (created, proved writable) and write the mix into it; the
    report (``command``, ``out_dir`` as given, ``corpora``: one ``write_corpus`` summary each)."""
    from shardkit.run.lifecycle import prepare_out_dir

    corpora = write_demo(prepare_out_dir(out_dir), minutes=minutes, seed=seed, faults=faults)
    return {"command": "demo", "out_dir": out_dir, "corpora": corpora}
