"""A mix of corpora as balance and prep take it, and what both need to know about its files.

``--corpus NAME=SOURCES[:WEIGHT]`` becomes a :class:`CorpusSource` (:func:`parse_corpus_spec`,
:func:`check_corpora`); :func:`source_stamps` says whether a source is unchanged since an index or
an output shard was built from it; :func:`output_paths` names the balanced shards either command
writes (numbered by plan position, so that every slice of a job array agrees). The two pipelines
share this module so that neither imports the other.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

from shardkit.errors import UsageError


@dataclass(frozen=True)
class CorpusSource:
    """One ``--corpus NAME=SOURCE[,SOURCE...][:WEIGHT]``: the corpus name, its sources and its weight in the mix."""
    name: str
    sources: tuple[str, ...]
    weight: float = 1.0


def parse_corpus_spec(text: str) -> CorpusSource:
    """``NAME=SOURCE[,SOURCE...][:WEIGHT]`` -> CorpusSource. Raises UsageError."""
    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq or not name or not rest:
        raise UsageError(f"--corpus {text!r}: expected NAME=SOURCES[:WEIGHT]")
    rest, weight, typed = _weight_suffix(text, rest)
    if not math.isfinite(weight) or weight <= 0:
        raise UsageError(f"corpus {name!r}: weight must be a number > 0 (got {typed})")
    sources = tuple(s for s in rest.split(",") if s)
    if not sources:
        raise UsageError(f"--corpus {name!r}: no sources given")
    return CorpusSource(name, sources, weight)


def _weight_suffix(text: str, rest: str) -> tuple[str, float, str]:
    """``(sources, weight, the weight as typed)`` of ``SOURCES[:WEIGHT]``: a last ``:`` part without a ``/`` or
    ``,`` is the weight (``data/x:0.5``), otherwise there is none (weight 1)."""
    head, colon, tail = rest.rpartition(":")
    if not colon or "/" in tail or "," in tail:
        return rest, 1.0, tail
    try:
        return head, float(tail), tail
    except ValueError:
        raise UsageError(f"--corpus {text!r}: weight {tail!r} is not a number") from None


def check_corpora(corpora: Sequence[CorpusSource]) -> None:
    """At least one corpus, each name once, each weight a number > 0 (UsageError otherwise)."""
    if not corpora:
        raise UsageError("no --corpus given")
    seen = set()
    for c in corpora:
        if c.name in seen:
            raise UsageError(f"corpus {c.name!r} is given twice")
        seen.add(c.name)
        if not (math.isfinite(c.weight) and c.weight > 0):
            raise UsageError(f"corpus {c.name!r}: weight must be a number > 0 (got {c.weight})")


def source_stamps(paths: Sequence[str]) -> list[list]:
    """``[path, size, mtime_ns]`` per path (None, None if gone): what decides that an index or an
    output shard built from these sources is still current."""
    stamps = []
    for p in paths:
        try:
            st = os.stat(p)
            stamps.append([p, st.st_size, st.st_mtime_ns])
        except OSError:
            stamps.append([p, None, None])
    return stamps


def output_paths(out_dir: str, count: int, codec: str) -> list[str]:
    """Every output shard's path, numbered by plan position, so that all slices of an array agree."""
    from shardkit.io.codecs import CODECS

    return [os.path.join(out_dir, f"shards_{s:09d}.tar{CODECS[codec].suffix}") for s in range(count)]
