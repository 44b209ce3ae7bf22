"""Atomic files and resumable run manifests (a fsynced journal during the run, JSON at the end)."""

from __future__ import annotations

import json
import os
import tempfile

from .errors import UsageError

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write to a temporary name beside ``path``, fsync, rename, fsync the folder."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)  # mkstemp's 0600 would hide reports from co-workers
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def atomic_write_json(path: str, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))


def atomic_write_lines(path: str, lines) -> None:
    atomic_write_bytes(path, "".join(f"{line}\n" for line in lines).encode("utf-8"))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_out_dir(out_dir: str) -> str:
    """Create OUT_DIR if needed and prove it is writable; a UsageError says why not."""
    out_dir = os.path.abspath(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=out_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"output folder is not writable ({err.strerror or err})", shard=out_dir) from None
    return out_dir


class Journal:
    """Append-only JSON-lines record of finished tasks, fsynced per line, so a killed run resumes."""

    def __init__(self, path: str):
        self.path = path
        self._f = None

    def load(self) -> list[dict]:
        entries = []
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        entries.append(json.loads(line))
                    except json.JSONDecodeError:
                        break  # a line cut by the kill: everything before it is good
        except FileNotFoundError:
            pass
        return entries

    def append(self, entry: dict) -> None:
        if self._f is None:
            self._f = open(self.path, "a", encoding="utf-8")
        self._f.write(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self, *, remove: bool) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        if remove and os.path.exists(self.path):
            os.unlink(self.path)


def load_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
