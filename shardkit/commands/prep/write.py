"""The writing side of prep: every output shard open at once, filled as the plan places utterances.

Each output shard is written incrementally under its temporary name (``lifecycle.AtomicFile``), so
the work folder never holds more than the training shards themselves; at the end each is closed,
read back and verified, fsynced and renamed. A killed run leaves only temporary files, which the
next run removes before it starts again.
"""

from __future__ import annotations

import os
import re
import resource

from shardkit.errors import UsageError

OUTPUT_NAME = re.compile(r"shards_\d{9}\.tar(\.[a-z0-9]+)?")


def raise_open_file_limit(needed: int) -> None:
    """Every output shard is an open file: lift the soft limit to the hard one if it is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < needed:
            raise UsageError(f"{needed - 64} output shards need {needed} open files, the limit is {hard}: "
                             f"ask for fewer, longer shards (--shard-duration)")


class OutputShards:
    """The open output shards: ``add(shard, name, data)``, then ``finish()`` (or ``abort()``)."""

    def __init__(self, paths: list[str], codec: str, level: int | None):
        from shardkit.io.codecs import open_writer
        from shardkit.io.files import HashingFile
        from shardkit.io.tar import TarWriter
        from shardkit.run.lifecycle import AtomicFile

        raise_open_file_limit(len(paths) + 64)
        self.paths = paths
        self._files, self._hashing, self._outs, self._tars = [], [], [], []
        self.written: list[list[tuple[str, bytes]]] = [[] for _ in paths]
        try:
            for path in paths:
                target = AtomicFile(path, buffering=1 << 20).__enter__()
                self._files.append(target)
                hashing = HashingFile(target.file)
                out = open_writer(hashing, codec, level)
                self._hashing.append(hashing)
                self._outs.append(out)
                self._tars.append(TarWriter(out))
        except BaseException:
            self.abort()
            raise

    def add(self, shard: int, name: str, data: bytes) -> None:
        from shardkit.io.files import member_digest

        self._tars[shard].add(name, data)
        self.written[shard].append((name, member_digest(name, data)))

    def finish(self, verify: bool) -> list[dict]:
        """Close, verify (read back), fsync and rename every shard; one entry per shard."""
        from shardkit.io.files import combine_digests
        from shardkit.run.lifecycle import verify_members

        entries = []
        for s, path in enumerate(self.paths):
            tar_bytes = self._tars[s].close()
            self._outs[s].close()
            self._files[s].commit(verify_members(self.written[s], shard=path) if verify else None,
                                  sync_while_verifying=True)
            hashing = self._hashing[s]
            entries.append({"path": path, "size": hashing.size, "sha256": hashing.sha256.hexdigest(),
                            "members": len(self.written[s]), "members_digest": combine_digests(self.written[s]),
                            "tar_bytes": tar_bytes})
        return entries

    def abort(self) -> None:
        for target in self._files:
            target.discard()


def output_leftovers(out_dir: str) -> list[str]:
    """The output names a killed run's temporary files stand for (``.shards_N.tar*.<token>.partial``)."""
    from shardkit.io.files import PARTIAL_SUFFIX

    names = []
    for entry in os.scandir(out_dir):
        if entry.name.startswith(".") and entry.name.endswith(PARTIAL_SUFFIX):
            stem = entry.name[1:-len(PARTIAL_SUFFIX)].rpartition(".")[0]
            if OUTPUT_NAME.fullmatch(stem):
                names.append(os.path.join(out_dir, stem))
    return names
