"""How many decompressor threads each task of a run may use: a pure function of the machine's numbers.

A bz2 or gz shard decompresses faster with threads, but tasks running side by side share the
cores: each gets ``cores // jobs`` (at least one). A Ray task asks the cluster for one CPU, so it
uses one thread: the scheduler, not this process, knows the node it lands on.

>>> decompressor_threads(16, 4, "local"), decompressor_threads(16, None, "local"), decompressor_threads(16, 4, "ray")
(4, 1, 1)
"""

from __future__ import annotations


def decompressor_threads(cores: int, jobs: int | None, executor: str) -> int:
    """Threads per task: 1 on Ray, else ``cores // jobs`` and at least 1 (``jobs`` None: one task per core)."""
    if executor == "ray":
        return 1
    return max(1, cores // (jobs or cores))
