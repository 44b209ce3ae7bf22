"""Same-corpus swaps between the most and least loaded shards: what closes the gap the deal leaves.

Balance's planner refines its dealt rows with :func:`refine`; prep's streaming planner
(``shardkit.planning.prep``) refines its final pool with the same function, the streamed part of each
shard standing as one fixed item of a corpus of its own.
"""

from __future__ import annotations

import numpy as np


def _best_swap(row_a, row_b, seconds, corpus_of, dev_a, dev_b):
    """Best same-corpus swap between two shards: (new worst deviation, index in a, index in b)."""
    best = None
    half = (dev_a - dev_b) / 2  # moving this many seconds from a to b evens them out
    ca, cb = corpus_of[row_a], corpus_of[row_b]
    for c in np.intersect1d(ca, cb):
        ia = np.flatnonzero(ca == c)
        ib = np.flatnonzero(cb == c)
        xa = seconds[row_a[ia]]
        yb_order = np.argsort(seconds[row_b[ib]], kind="stable")
        yb = seconds[row_b[ib]][yb_order]
        pos = np.searchsorted(yb, xa - half)
        for cand in (np.clip(pos, 0, len(yb) - 1), np.clip(pos - 1, 0, len(yb) - 1)):
            moved = xa - yb[cand]
            worst = np.maximum(np.abs(dev_a - moved), np.abs(dev_b + moved))
            k = int(np.argmin(worst))
            if best is None or worst[k] < best[0]:
                best = (float(worst[k]), int(ia[k]), int(ib[yb_order[cand[k]]]))
    return best


def shard_totals(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Each row's seconds, block by block (each row sums alike): seconds[rows] at once would be a 20 M-element
    temporary."""
    return np.concatenate([seconds[rows[a:a + 4096]].sum(axis=1) for a in range(0, rows.shape[0], 4096)])


def refine(rows, seconds, corpus_of, goal, partners=4, max_steps=None, totals=None) -> None:
    """Same-corpus swaps (in place on ``rows``) until every shard is within ``goal`` of the mean.

    Each step takes the shard furthest from the mean (``a``) and its best swap with one of the
    ``partners`` shards furthest on the other side; a shard with no swap that helps is left (stuck)
    until a swap changes it.
    """
    num_shards = rows.shape[0]
    totals = shard_totals(rows, seconds) if totals is None else totals
    mean = totals.mean()
    stuck = np.zeros(num_shards, bool)
    for _ in range(max_steps or 4 * num_shards + 100):
        dev = totals - mean
        score = np.abs(dev)
        score[stuck] = -1.0
        a = int(np.argmax(score))
        if score[a] <= goal:
            return
        best = _best_partner(rows, seconds, corpus_of, dev, a, partners)
        if best is None:
            stuck[a] = True
            continue
        _, i, j, b = best
        moved = seconds[rows[a, i]] - seconds[rows[b, j]]
        rows[a, i], rows[b, j] = rows[b, j], rows[a, i]
        totals[a] -= moved
        totals[b] += moved
        stuck[[a, b]] = False


def _best_partner(rows, seconds, corpus_of, dev: np.ndarray, a: int, partners: int):
    """The best swap of shard ``a`` with one of the ``partners`` shards furthest from the mean on the other
    side (a shard exactly at the mean counts as either): (new worst deviation, index in a, index in b, b),
    or None when no swap makes the worse of the two better."""
    candidates = np.argsort(dev if dev[a] > 0 else -dev, kind="stable")[:partners + 1]
    best = None
    for b in candidates:
        if b == a or np.sign(dev[b]) == np.sign(dev[a]) and dev[b] != 0:
            continue
        found = _best_swap(rows[a], rows[b], seconds, corpus_of, dev[a], dev[b])
        if found and found[0] < max(abs(dev[a]), abs(dev[b])) - 1e-9 and (best is None or found[0] < best[0]):
            best = (*found, int(b))
    return best
