"""Feature frames per utterance as the trainer computes them (pure): resample, speed perturb,
features and spec_trim.

Exact for fbank/mfcc (Kaldi framing, ``snip_edges``) and Whisper's log-mel (``n // hop``);
resampling gives ``ceil(n * new / old)`` samples (torchaudio); speed perturbation (sox ``speed``,
random per utterance) is drawn with numpy from the conf's speeds and gives ``round(n / speed)``
samples (sox can differ by a sample).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from shardkit.wenet_conf.conf import TrainerConf
from shardkit.wenet_conf.dtypes import compact


def _ms_samples(rate: int, ms: float) -> int:
    """torchaudio kaldi's ``int(sample_frequency * ms * 0.001)`` (the float product as Python does it)."""
    return int(float(rate) * ms * 0.001)


def feature_frames(samples, sample_rate, conf: TrainerConf, *, seed_seq: Sequence[int] = (0,),
                   dtype=np.int64, chunk: int = 1 << 20) -> np.ndarray:
    """Feature frames per utterance after resample, speed perturb, features and spec_trim (``dtype``,
    int64 unless asked; the simulation asks int32).

    The random parts (the speed of each utterance, spec_trim's length) are drawn with numpy's
    ``default_rng(seed_seq)``: one draw, as the trainer makes one per epoch. The draws are made for
    every utterance at once (a generator's bounded integers depend on how many are drawn per call),
    the arithmetic ``chunk`` utterances at a time, so that its int64 temporaries stay small.
    """
    samples, sample_rate = np.asarray(samples), np.asarray(sample_rate)
    total = len(samples)
    rng = np.random.default_rng(list(seed_seq))
    speed_idx = trim = None
    if conf.speed_perturb:
        speed_idx = compact(rng.integers(0, len(conf.speeds), total), np.uint8, np.uint16)
    if conf.spec_trim:
        trim = compact(rng.integers(1, conf.spec_trim_max_t + 1, total), np.uint8, np.uint16)
    out = np.empty(total, dtype)
    for a in range(0, total, chunk) if total else ():
        b = min(a + chunk, total)
        part = _frames_of(samples[a:b], sample_rate[a:b], conf, None if speed_idx is None else speed_idx[a:b],
                          None if trim is None else trim[a:b])
        if len(part) and int(part.max()) > np.iinfo(out.dtype).max:  # a compact dtype too small: widen
            out = out.astype(np.int64)
        out[a:b] = part
    return out


def _frames_of(samples, sample_rate, conf: TrainerConf, speed_idx, trim) -> np.ndarray:
    """:func:`feature_frames` of one chunk, given its random draws (int64)."""
    n = np.asarray(samples, np.int64)
    rate = np.asarray(sample_rate, np.int64)
    target = conf.resample_rate
    changed = rate != target
    if changed.any():  # torchaudio Resample: ceil(n * new / orig) with the rates reduced by their gcd
        g = np.gcd(rate, target)
        new, orig = target // g, rate // g
        n = np.where(changed, -(-(n * new) // orig), n)
    if speed_idx is not None:
        speeds = np.asarray(conf.speeds, np.float64)[speed_idx]
        if len(n) and int(n.max()) < (1 << 53):  # n / 1.0 is n exactly: no need to keep those apart
            n = np.rint(n / speeds).astype(np.int64)
        else:
            n = np.where(speeds != 1.0, np.rint(n / speeds).astype(np.int64), n)
    f = conf.features
    if f.feats_type == "log_mel_spectrogram":
        n = n + f.padding
        if f.pad_or_trim:
            n = np.full(len(n), f.max_duration * target, np.int64)
        frames = n // f.hop_length
    else:
        size = _ms_samples(target, f.frame_length)  # every sample is at the resample rate now
        shift = max(_ms_samples(target, f.frame_shift), 1)
        frames = np.where(n < size, 0, 1 + (n - size) // shift)
    if trim is not None:
        frames = np.where(trim < frames / 2, frames - trim, frames)
    return frames.astype(np.int64)

