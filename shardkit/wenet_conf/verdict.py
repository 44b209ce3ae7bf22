"""The filter's verdict on index columns: label lengths (``text_chars``, or a tokenizer over transcripts
read back from the shards), WeNet's filter, the report of what it drops, and the dropped keys.

Token counts: with no tokenizer file (the conf names none and ``--tokenizer`` is not given),
one token per transcript character is assumed and the index's ``text_chars`` is used as is: no
shard is read. With a symbol table or a BPE model the transcripts are needed, and the index does
not hold them: they are read from the shards' ``.txt`` members at the offsets the index records
(:mod:`shardkit.wenet_conf.transcripts`), only then. Keeping transcripts out of the index keeps it
small and tokenizer-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from shardkit.wenet_conf.columns import UttColumns
from shardkit.wenet_conf.filter import filter_reasons, filter_summary
from shardkit.wenet_conf.load import TrainerSpec
from shardkit.wenet_conf.tokens import Tokenizer, count_tokens

if TYPE_CHECKING:
    from shardkit.run.events import Events


def token_counts(cols: UttColumns, spec: TrainerSpec, events: Events | None = None) -> np.ndarray:
    """Label length per utterance: the tokenizer's over transcripts read from the shards, or ``text_chars``."""
    if spec.tokenizer is None:
        return cols.text_chars
    return tokenized_counts(cols.shards, cols.shard, cols.txt, spec.tokenizer, events)


def tokenized_counts(shards: Sequence[str], shard: np.ndarray, txt: np.ndarray | None, tokenizer: Tokenizer,
                     events: Events | None = None) -> np.ndarray:
    """The tokenizer's label length of each utterance, its transcript read from ``shards[shard[i]]`` at
    ``txt[i]`` (``events``: a ``done`` per shard read)."""
    from shardkit.wenet_conf.transcripts import transcripts_by_shard

    ranges = [] if txt is None else txt.tolist()
    texts = transcripts_by_shard(shards, shard, ranges, events)
    return np.fromiter((count_tokens(t, tokenizer) for t in texts), np.int64, len(texts))


@dataclass
class FilterResult:
    """The filter's verdict on a set of utterances, and the report of what it drops."""

    keep: np.ndarray
    summary: dict
    dropped_keys: list[str] = field(default_factory=list)


def apply_filter(cols: UttColumns, spec: TrainerSpec, *, corpus_names: Sequence[str] | None = None,
                 events: Events | None = None) -> FilterResult:
    """WeNet's ``filter_conf`` over the columns (see :func:`shardkit.wenet_conf.filter.filter_reasons`);
    ``events``: a ``done`` per shard whose transcripts a tokenizer reads."""
    tokens = token_counts(cols, spec, events)
    reasons = filter_reasons(cols.samples, cols.rate, tokens, spec.conf.filter)
    names = list(corpus_names) if corpus_names is not None else cols.corpus_names
    return verdict(reasons, cols.corpus, names, cols.seconds, cols.keys, spec)


def verdict(reasons: np.ndarray, corpus: np.ndarray, names: Sequence[str], seconds: np.ndarray,
            keys: Sequence[str], spec: TrainerSpec) -> FilterResult:
    """The FilterResult of the filter's reasons (0: kept) per utterance."""
    summary = filter_summary(reasons, corpus, names, seconds, keys)
    summary["filter_conf"] = dataclasses.asdict(spec.conf.filter)
    dropped = np.flatnonzero(reasons != 0)
    # balance's keys are read back from the index: the dropped ones too, when they are written (not held:
    # 1.5 M dropped keys of a 20 M mix are ~120 MB of strings while the mix is planned)
    found = KeysAt(keys, dropped) if hasattr(keys, "take") else take_keys(keys, dropped)
    return FilterResult(reasons == 0, summary, found)


class KeysAt:
    """The keys at ``positions`` of a sequence that reads keys back (``take``), read a chunk at a time
    whenever iterated, in ``positions``' order."""

    CHUNK = 1 << 18

    def __init__(self, keys, positions: np.ndarray):
        self.keys, self.positions = keys, np.asarray(positions, np.int64)

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self):
        for start in range(0, len(self.positions), self.CHUNK):
            yield from self.keys.take(self.positions[start:start + self.CHUNK])

    def __getitem__(self, i: int) -> str:
        return self.keys.take(self.positions[[i]])[0]


def take_keys(keys: Sequence[str], positions: np.ndarray) -> list[str]:
    """The keys at ``positions``: read back in one go from a sequence that can (``take``), else one by one."""
    if hasattr(keys, "take"):
        return list(keys.take(np.asarray(positions, np.int64)))
    return [keys[i] for i in positions]
