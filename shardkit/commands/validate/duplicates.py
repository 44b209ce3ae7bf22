"""The cross-shard duplicate-key check, shared by a run, by merge-reports across slices and by prep."""

from __future__ import annotations

from shardkit.commands.validate.names import DUPLICATE_KEY, finding


class DuplicateKeys:
    """The cross-shard duplicate check: shards are fed in list order, and a key's first occurrence is kept."""

    def __init__(self):
        self.first: dict[str, str] = {}  # key -> the shard that holds its first occurrence

    def check(self, result: dict, keys: list[str]) -> list[str]:
        """Add a finding to ``result`` for each of its ``keys`` seen in an earlier shard; returns those keys."""
        repeated = []
        for key in keys:
            first = self.first.get(key)
            if first is None:
                self.first[key] = result["shard"]
            else:
                result["findings"].append(finding(result["shard"], key, None, DUPLICATE_KEY, f"key is also in {first}"))
                repeated.append(key)
        return repeated
