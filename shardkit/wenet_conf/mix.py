"""``balance --wenet-conf``: WeNet's filter over balance's mix, before it is planned, and the simulated
batches of the balanced list.

Balance reads each index once: its ``load_columns`` collects the filter's columns
(:class:`~shardkit.wenet_conf.blocks.TrainerBlock`) in that read, and the filter takes them from
there, a corpus at a time; balance's keys stay in the index files, read back only when asked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from shardkit.errors import ShardkitError, UsageError
from shardkit.wenet_conf.filter import filter_reasons
from shardkit.wenet_conf.load import TrainerSpec
from shardkit.wenet_conf.simulation import Loader, plan_batches
from shardkit.wenet_conf.verdict import FilterResult, take_keys, tokenized_counts, verdict

if TYPE_CHECKING:
    from shardkit.run.events import Events
    from shardkit.wenet_conf.blocks import TrainerBlock


@dataclass
class MixFilter:
    """What ``balance --wenet-conf`` keeps of each corpus, for the plan of its output shards."""

    spec: TrainerSpec
    result: FilterResult
    samples: list[np.ndarray]  # per corpus, of its kept utterances (in the filtered mix's order)
    rates: list[np.ndarray]

    def report(self, plan, *, world_size: int, num_workers: int, seed: int, epochs: int) -> dict:
        """The ``BalanceReport`` fields of ``--wenet-conf``: ``wenet_conf``, ``warnings``, ``dropped_keys``."""
        batches = self.batches(plan, world_size=world_size, num_workers=num_workers, seed=seed, epochs=epochs)
        return {"wenet_conf": {**self.spec.header(), "filter": self.result.summary, "batches": batches},
                "warnings": self.spec.warnings, "dropped_keys": self.result.dropped_keys}

    def batches(self, plan, *, world_size: int, num_workers: int, seed: int, epochs: int) -> dict:
        """Simulated batches of the balanced list: output shard s holds plan positions s*U .. (s+1)*U-1."""
        # in the index's own dtypes (int32 / uint16 where they fit): feature_frames widens a chunk at a time
        samples = np.zeros(len(plan.utt), np.result_type(*self.samples) if self.samples else np.int64)
        rates = np.zeros(len(plan.utt), np.result_type(*self.rates) if self.rates else np.int64)
        for c in range(len(self.samples)):
            at = plan.corpus == c
            samples[at] = self.samples[c][plan.utt[at]]
            rates[at] = self.rates[c][plan.utt[at]]
        offsets = np.arange(plan.num_shards + 1, dtype=np.int64) * plan.utts_per_shard
        return plan_batches(offsets, samples, rates, np.asarray(plan.seconds, np.float64),
                            Loader(world_size, num_workers, seed, epochs), self.spec.conf)


def filter_mix(mix, spec: TrainerSpec, events: Events | None = None):
    """``(mix without the utterances WeNet's filter drops, MixFilter)``.

    ``mix`` is balance's ``MixColumns``, read with the filter's columns (``load_columns(...,
    trainer_columns=True)``: every corpus' ``trainer`` is a :class:`TrainerBlock`); the index is not
    read again. A record the filter cannot use (no frames, sample_rate or text_chars; no ``.txt``
    member when a tokenizer counts tokens) is the error, naming its file and line or row.
    ``events``: a ``done`` per shard whose transcripts a tokenizer reads.
    """
    blocks = _mix_blocks(mix, spec)
    # corpus by corpus (the filter is per utterance): no joined copy of the columns, a corpus' temporaries at a time
    reasons = np.concatenate([_corpus_reasons(mix.shards, corpus.shard, block, spec, events)
                              for corpus, block in zip(mix.corpora, blocks)])
    counts = [len(c.durations) for c in mix.corpora]
    corpus_ids = np.repeat(np.arange(len(counts), dtype=np.int8 if len(counts) < 128 else np.int32), counts)
    result = verdict(reasons, corpus_ids, mix.names, np.concatenate([c.durations for c in mix.corpora]),
                     _MixKeys([c.keys for c in mix.corpora]), spec)
    del reasons, corpus_ids
    corpora, samples, rates = _kept_corpora(mix, blocks, result.keep)
    return dataclasses.replace(mix, corpora=corpora), MixFilter(spec, result, samples, rates)


def _mix_blocks(mix, spec: TrainerSpec) -> list[TrainerBlock]:
    """Each corpus' filter columns; a corpus loaded without them is a bug, a row the filter cannot use the error."""
    blocks = []
    for name, corpus in zip(mix.names, mix.corpora):
        block = corpus.trainer
        if block is None or (spec.tokenizer is not None and block.txt is None):
            raise ValueError(f"corpus {name!r} was loaded without the trainer's columns")
        if block.problem is not None:
            raise ShardkitError(block.problem[0], shard=block.problem[1])
        blocks.append(block)
    return blocks


def _corpus_reasons(shards, shard: np.ndarray, block: TrainerBlock, spec: TrainerSpec,
                    events: Events | None) -> np.ndarray:
    """The filter's reason per utterance of one corpus (0: kept)."""
    tokens = block.text_chars if spec.tokenizer is None else \
        tokenized_counts(shards, shard, block.txt, spec.tokenizer, events)
    return filter_reasons(block.frames, block.rate, tokens, spec.conf.filter)


def _kept_corpora(mix, blocks: list[TrainerBlock], keep: np.ndarray) -> tuple[list, list, list]:
    """``(corpora, samples, rates)`` of what the filter keeps, per corpus; a corpus it empties is an error."""
    corpora, samples, rates = [], [], []
    start = 0
    for c, corpus in enumerate(mix.corpora):
        n = len(corpus.durations)
        kept = keep[start:start + n]
        start += n
        idx = np.flatnonzero(kept)
        if not len(idx):
            raise UsageError(f"corpus {mix.names[c]!r}: the trainer's filter_conf drops every utterance "
                             f"({len(kept)}); nothing is left to balance")
        corpora.append(dataclasses.replace(_kept(corpus, idx), trainer=None))
        samples.append(blocks[c].frames[idx])
        rates.append(blocks[c].rate[idx])
    return corpora, samples, rates


class _MixKeys:
    """The keys of several corpora as one sequence, read back from each corpus' keys (balance keeps no
    key strings: its ``IndexKeys`` reads the few asked for from the index files)."""

    def __init__(self, parts: list):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> str:
        return self.take(np.array([i]))[0]

    def take(self, positions: np.ndarray) -> list[str]:
        positions = np.asarray(positions, np.int64)
        out = np.empty(len(positions), object)
        part_of = np.searchsorted(self.starts, positions, side="right") - 1
        for k, part in enumerate(self.parts):
            mine = np.flatnonzero(part_of == k)
            if len(mine):
                out[mine] = take_keys(part, positions[mine] - self.starts[k])
        return list(out)


def _kept(corpus, idx: np.ndarray):
    """balance's corpus columns of the utterances ``idx`` only (every per-utterance column subset together)."""
    def pick(column):
        return None if column is None else column[idx]

    keys = corpus.keys.subset(idx) if hasattr(corpus.keys, "subset") else [corpus.keys[i] for i in idx]  # IndexKeys
    rows = None if corpus.segments is None else (idx if corpus.rows is None else corpus.rows[idx])
    if rows is not None and (not len(rows) or int(rows.max()) < 2**31):  # ascending: int32 where it fits (memory)
        rows = rows.astype(np.int32)
    return dataclasses.replace(corpus, durations=corpus.durations[idx], keys=keys, shard=corpus.shard[idx],
                               line_file=pick(corpus.line_file), line_offset=pick(corpus.line_offset),
                               key_hash=pick(corpus.key_hash), rows=rows)
