"""Turning SHARDS arguments (files, folders, globs, data.list files) into one ordered shard list."""

from __future__ import annotations

import glob
import os
import posixpath

from .errors import UsageError

SHARD_PATTERNS = ("*.tar", "*.tar.gz", "*.tgz", "*.tar.bz2", "*.tbz2", "*.tar.xz", "*.txz",
                  "*.tar.zst", "*.tar.zstd", "*.tzst")
LIST_SUFFIXES = (".list", ".lst")
_GLOB_CHARS = set("*?[")
_STRIP_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.zstd", ".tgz", ".tbz2", ".txz",
                   ".tzst", ".tar")


def is_list_file(path: str) -> bool:
    return path.endswith(LIST_SUFFIXES)


def read_list(path: str) -> list[str]:
    """Shard paths named by a WeNet data.list; relative lines resolve against the list's folder."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except FileNotFoundError:
        raise UsageError("no such list file", shard=path) from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read list file ({err})", shard=path) from err
    base = os.path.dirname(os.path.abspath(path))
    return [line if "://" in line or line.startswith("pipe:") or os.path.isabs(line)
            else os.path.normpath(os.path.join(base, line))
            for line in lines if line and not line.startswith("#")]


def shards_in_dir(path: str) -> list[str]:
    found = {p for pattern in SHARD_PATTERNS for p in glob.glob(os.path.join(glob.escape(path), pattern))}
    return sorted(found)


def expand_shards(args: list[str] | tuple[str, ...]) -> list[str]:
    """Absolute shard paths in argument order; list and folder contents in their own order.

    A data.list line naming a missing file is kept (the command reports it as a failed shard);
    a command-line argument that names nothing is a usage error.
    """
    shards: list[str] = []
    for arg in args:
        if arg == "-":  # standard input, read as a stream
            shards.append(arg)
        elif os.path.isdir(arg):
            found = shards_in_dir(arg)
            if not found:
                raise UsageError(f"folder holds no shards (looked for {', '.join(SHARD_PATTERNS[:4])}, ...)", shard=arg)
            shards.extend(os.path.abspath(p) for p in found)
        elif is_list_file(arg):
            shards.extend(read_list(arg))
        elif os.path.exists(arg):
            shards.append(os.path.abspath(arg))
        elif "://" in arg or arg.startswith("pipe:"):  # read through shardkit.remote
            shards.append(arg)
        elif _GLOB_CHARS & set(arg):
            matches = sorted(glob.glob(arg))
            if not matches:
                raise UsageError("glob pattern matches no file", shard=arg)
            for match in matches:
                shards.extend(read_list(match) if is_list_file(match) else [os.path.abspath(match)])
        else:
            raise UsageError("no such file, folder or glob match", shard=arg)
    if not shards:
        raise UsageError("no shards given")
    return shards


def shard_stem(path: str) -> str:
    """``a/shards_000000001.tar.bz2`` -> ``shards_000000001``."""
    name = os.path.basename(path.rstrip("/"))
    lower = name.lower()
    for suffix in _STRIP_SUFFIXES:
        if lower.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    for suffix in (".gz", ".bz2", ".xz", ".zst", ".zstd"):
        if lower.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def plan_output_paths(shards: list[str], out_dir: str, suffix: str, *, keep_tree: bool = False) -> list[str]:
    """Output path per input shard: ``OUT_DIR/<stem><suffix>``; pure (no I/O).

    Two inputs that would land on the same output are a UsageError naming both, unless
    ``keep_tree`` mirrors the inputs' folders (relative to their common folder) under OUT_DIR.
    An OUT_DIR URL (``s3://bucket/prefix``) gives URLs under it, joined with ``/``.
    """
    if "://" in out_dir:  # a URL: no abspath, and '/' joins on every platform
        base = out_dir.rstrip("/")
        common = _common_folder(shards) if keep_tree else None
        outputs = []
        for s in shards:
            rel = posixpath.normpath(posixpath.relpath(posixpath.dirname(s), common)) if keep_tree else "."
            outputs.append(posixpath.join(base, shard_stem(s) + suffix) if rel == "."
                           else posixpath.join(base, rel, shard_stem(s) + suffix))
        return _refuse_collisions(shards, outputs)
    out_dir = os.path.abspath(out_dir)
    if keep_tree:
        common = _common_folder(shards)
        outputs = [os.path.join(out_dir, os.path.relpath(os.path.dirname(s), common), shard_stem(s) + suffix)
                   for s in shards]
        outputs = [os.path.normpath(p) for p in outputs]
    else:
        outputs = [os.path.join(out_dir, shard_stem(s) + suffix) for s in shards]
    return _refuse_collisions(shards, outputs)


def _common_folder(shards: list[str]) -> str:
    return os.path.commonpath([os.path.dirname(s) for s in shards]) if len(shards) > 1 else os.path.dirname(shards[0])


def _refuse_collisions(shards: list[str], outputs: list[str]) -> list[str]:
    seen: dict[str, str] = {}
    for shard, out in zip(shards, outputs):
        if out in seen:
            if seen[out] == shard:
                raise UsageError(f"shard given twice (both would write {out})", shard=shard)
            raise UsageError(f"{seen[out]} and {shard} would both write {out}; rename one or use --keep-tree")
        seen[out] = shard
    return outputs
