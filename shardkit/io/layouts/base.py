"""What every layout's output shard shares: a tar written atomically, plus the layout's companion files."""

from __future__ import annotations

import gzip
import hashlib
import os
from typing import Callable

from shardkit.errors import ShardkitError, VerificationError
from shardkit.io.files import AtomicFile, HashingFile, combine_digests, member_digest, remove_leftovers
from shardkit.io.tar import TarWriter


class LayoutShard:
    """One output shard of a trainer's layout: ``with Shard(dst) as s: s.add(...); s.commit(verify)``.

    Subclasses say which members an utterance becomes (:meth:`add`) and which metadata files go with
    the tar (:meth:`companions`, each a :class:`GzipLines` or a writer with the same methods). Every file is written
    under a temporary name and renamed only at :meth:`commit`, the tar first, then its companions: a
    shard killed between the two lacks a companion, which makes a rerun write it again.
    """

    def __init__(self, dst: str):
        self.dst = dst
        self.written: list[tuple[str, bytes]] = []
        self._target = AtomicFile(dst)
        self._tar: TarWriter | None = None
        self._hashing: HashingFile | None = None
        self._companions: list = []

    def companions(self) -> list:
        return []

    def add(self, key: str, record: dict, members: list[tuple[str, bytes]]) -> None:
        raise NotImplementedError

    def __enter__(self) -> "LayoutShard":
        os.makedirs(os.path.dirname(self.dst) or ".", exist_ok=True)
        self._companions = self.companions()
        remove_leftovers([self.dst] + [c.path for c in self._companions])  # a killed run's temporary files
        self._target.__enter__()
        self._hashing = HashingFile(self._target.file)
        self._tar = TarWriter(self._hashing)
        for companion in self._companions:
            companion.open()
        return self

    def add_member(self, name: str, data: bytes) -> None:
        self._tar.add(name, data)
        self.written.append((name, member_digest(name, data)))

    def commit(self, verify: Callable[[list], Callable[[str], None]] | None) -> dict:
        """Close the tar, read it back with ``verify(written)`` (unless None), rename it, then the companions;
        the entry fields of the shard (size, sha256, members, members_digest, tar_bytes)."""
        tar_bytes = self._tar.close()
        self._target.commit(verify(self.written) if verify is not None else None)
        for companion in self._companions:
            companion.commit(check=verify is not None)
        return {"size": self._hashing.size, "sha256": self._hashing.sha256.hexdigest(), "members": len(self.written),
                "members_digest": combine_digests(self.written), "tar_bytes": tar_bytes}

    def __exit__(self, *exc) -> bool:
        for companion in self._companions:
            companion.discard()
        if self._target.file is not None:
            self._target.__exit__(*exc)
        return False


class GzipLines:
    """A companion of JSON lines, gzip-compressed (deterministic: no name, mtime 0), read back before renaming."""

    def __init__(self, path: str):
        self.path = path
        self._target = AtomicFile(path)
        self._gzip: gzip.GzipFile | None = None
        self._digest = hashlib.sha256()

    def open(self) -> None:
        self._target.__enter__()
        self._gzip = gzip.GzipFile(filename="", mode="wb", fileobj=self._target.file, mtime=0)

    def write_line(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        self._gzip.write(data)
        self._digest.update(data)

    def commit(self, *, check: bool) -> None:
        self._gzip.close()
        self._target.commit(self._read_back if check else None)

    def _read_back(self, tmp: str) -> None:
        back = hashlib.sha256()
        try:
            with gzip.open(tmp, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    back.update(chunk)
        except (OSError, EOFError) as err:
            raise VerificationError(f"does not decompress ({err})", shard=self.path) from None
        if back.digest() != self._digest.digest():
            raise VerificationError("does not read back as written", shard=self.path)

    def discard(self) -> None:
        if self._target.file is not None:  # removes the temporary file unless it was committed
            self._target.__exit__(None, None, None)


def require(condition: bool, reason: str, *, shard: str, member: str | None = None) -> None:
    if not condition:
        raise ShardkitError(reason, shard=shard, member=member)


def split_members(key: str, members: list[tuple[str, bytes]], audio_name: str, *, shard: str) -> dict[str, str]:
    """The utterance's text members as ``{extension: text}`` (``txt`` the transcript); the audio is the one
    binary member a layout carries, any other member is refused rather than silently left out."""
    texts = {}
    for name, data in members:
        if name == audio_name:
            continue
        ext = name[len(key) + 1:]
        try:
            texts[ext] = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ShardkitError("a member other than the audio is not UTF-8 text (this layout keeps text fields "
                                "only)", shard=shard, member=name) from None
    require("txt" in texts, "no transcript (.txt member)", shard=shard, member=f"{key}.txt")
    return texts
