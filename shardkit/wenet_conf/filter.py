"""WeNet's ``processor.filter`` over arrays (pure): which utterances the trainer drops, and why.

Exact: frames = samples / sample_rate * 100 before resampling, token counts as the tokenizer gives
them (:mod:`shardkit.wenet_conf.tokens`), the same comparisons in float64, in WeNet's order (the
first check an utterance fails is its reason).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from shardkit.wenet_conf.conf import FilterConf

REASONS = ("kept", "min_length", "max_length", "token_min_length", "token_max_length", "min_output_input_ratio",
           "max_output_input_ratio")


def filter_reasons(samples, sample_rate, tokens, conf: FilterConf) -> np.ndarray:
    """Per utterance the index in :data:`REASONS` of the first check of ``processor.filter`` it fails (0: kept).

    ``samples``/``sample_rate``: the decoded audio's frames and rate (before resampling);
    ``tokens``: label lengths, or None for samples without a label (then only frames are checked).
    """
    samples = np.asarray(samples, np.float64)
    rate = np.asarray(sample_rate, np.float64)
    num_frames = samples / rate * 100
    reason = np.zeros(len(samples), np.int8)

    def mark(code, failed):
        reason[(reason == 0) & failed] = code

    mark(1, num_frames < conf.min_length)
    mark(2, num_frames > conf.max_length)
    if tokens is not None:
        t = np.asarray(tokens, np.float64)
        mark(3, t < conf.token_min_length)
        mark(4, t > conf.token_max_length)
        nonzero = num_frames != 0
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = t / num_frames
        mark(5, nonzero & (ratio < conf.min_output_input_ratio))
        mark(6, nonzero & (ratio > conf.max_output_input_ratio))
    return reason



def filter_summary(reasons: np.ndarray, corpus: np.ndarray, names: Sequence[str], seconds: np.ndarray,
                   keys: Sequence[str], *, examples: int = 5) -> dict:
    """What the filter drops, JSON-ready: totals, and per corpus utterances, seconds, their share of
    the corpus, the count per reason and the first ``examples`` dropped keys."""
    dropped = reasons != 0
    per_corpus = []
    for c, name in enumerate(names):
        mine = corpus == c
        gone = mine & dropped
        total_s = float(seconds[mine].sum())
        gone_s = float(seconds[gone].sum())
        counts = np.bincount(reasons[gone], minlength=len(REASONS))
        per_corpus.append({
            "corpus": name, "utterances": int(mine.sum()), "seconds": round(total_s, 3),
            "dropped_utterances": int(gone.sum()), "dropped_seconds": round(gone_s, 3),
            "dropped_share": round(gone_s / total_s, 6) if total_s > 0 else 0.0,
            "reasons": {REASONS[r]: int(counts[r]) for r in range(1, len(REASONS)) if counts[r]},
            "example_keys": [keys[i] for i in np.flatnonzero(gone)[:examples]]})
    total_s = float(seconds.sum())
    gone_s = float(seconds[dropped].sum())
    return {"utterances": len(reasons), "dropped_utterances": int(dropped.sum()),
            "dropped_seconds": round(gone_s, 3), "dropped_share": round(gone_s / total_s, 6) if total_s > 0 else 0.0,
            "corpora": per_corpus}
