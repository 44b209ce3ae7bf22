"""Turning SHARDS arguments (files, folders, globs, data.list files) into one ordered shard list."""

from __future__ import annotations

import glob
import os
import posixpath

from shardkit.errors import UsageError
from shardkit.io.remote import STDIN  # the SHARDS argument that reads one shard from standard input

SHARD_PATTERNS = ("*.tar", "*.tar.gz", "*.tgz", "*.tar.bz2", "*.tbz2", "*.tar.xz", "*.txz",
                  "*.tar.zst", "*.tar.zstd", "*.tzst")
LIST_SUFFIXES = (".list", ".lst")
_GLOB_CHARS = set("*?[")
_STRIP_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.zstd", ".tgz", ".tbz2", ".txz",
                   ".tzst", ".tar")


def is_list_file(path: str) -> bool:
    """Whether ``path`` names a shard list by its suffix (``.list``, ``.lst``), not a shard."""
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
    """The shards directly inside folder ``path`` (every tar suffix shardkit reads), sorted by name."""
    found = {p for pattern in SHARD_PATTERNS for p in glob.glob(os.path.join(glob.escape(path), pattern))}
    return sorted(found)


def expand_shards(args: list[str] | tuple[str, ...]) -> list[str]:
    """Absolute shard paths in argument order; list and folder contents in their own order.

    A data.list line naming a missing file is kept (the command reports it as a failed shard);
    a command-line argument that names nothing is a usage error.
    """
    shards: list[str] = []
    for arg in args:
        shards.extend(_shards_of(arg))
    if not shards:
        raise UsageError("no shards given")
    return shards


def _shards_of(arg: str) -> list[str]:
    """What one argument names: standard input, a folder's shards, a list's lines or a file, else
    (nothing there) a URL or ``pipe:`` command, or a glob's matches."""
    if arg == STDIN:  # standard input, read as a stream
        return [arg]
    if os.path.isdir(arg):
        return [os.path.abspath(p) for p in _folder_shards(arg)]
    if os.path.exists(arg):
        return read_list(arg) if is_list_file(arg) else [os.path.abspath(arg)]
    return _not_a_file(arg)


def _not_a_file(arg: str) -> list[str]:
    """An argument that names no existing file: a list (its error), a URL or ``pipe:`` command (read
    through ``shardkit.io.remote``), or a glob pattern."""
    globbed = bool(_GLOB_CHARS & set(arg))
    if is_list_file(arg) and not globbed:
        return read_list(arg)
    if "://" in arg or arg.startswith("pipe:"):
        return [arg]
    if not globbed:
        raise UsageError("no such file, folder or glob match", shard=arg)
    matches = sorted(glob.glob(arg))
    if not matches:
        raise UsageError("glob pattern matches no file", shard=arg)
    return [path for match in matches
            for path in (read_list(match) if is_list_file(match) else [os.path.abspath(match)])]


def _folder_shards(folder: str) -> list[str]:
    found = shards_in_dir(folder)
    if not found:
        hint = ""  # convert's output mirrored below its folder (repeated shard names) holds its list on top
        if os.path.isfile(os.path.join(folder, "data.list")):
            hint = f"; pass its list, {os.path.join(folder, 'data.list')}"
        raise UsageError(f"folder holds no shards (looked for {', '.join(SHARD_PATTERNS[:4])}, ...){hint}",
                         shard=folder)
    return found


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


STDIN_STEM = "stdin"


def stdin_stem(name: str | None) -> str:
    """The output stem of SOURCE ``-``: ``stdin``, or ``--stdin-name NAME`` without a shard suffix
    (``shards_000000001.tar.bz2`` -> ``shards_000000001``). A NAME that is not one plain, visible
    file name (empty, starting with ``.``, holding a ``/`` or a NUL) is a UsageError."""
    if name is None:
        return STDIN_STEM
    stem = shard_stem(name)
    if not stem or stem.startswith(".") or "/" in name or os.sep in name or "\x00" in name:
        raise UsageError(f"--stdin-name takes one file name, not {name!r} (it names the output of SOURCE -, "
                         f"inside the output folder)")
    return stem


def plan_output_paths(shards: list[str], out_dir: str, suffix: str, *, keep_tree: bool | None = None,
                      stdin_name: str | None = None) -> list[str]:
    """Output path per input shard (pure: no I/O); one rule for every command that writes one
    output per input shard (convert, validate --quarantine).

    Standard input (SOURCE ``-``) has no name of its own: its output is
    ``OUT_DIR/stdin<suffix>``, or ``OUT_DIR/<stdin_name's stem><suffix>`` (see :func:`stdin_stem`),
    always directly in OUT_DIR, whatever the layout of the other shards.

    ``keep_tree=None`` (the default) decides from the names: when every input has its own file
    name the outputs are ``OUT_DIR/<stem><suffix>``; when two inputs share one (every WeNet corpus
    names its shards ``shards_000000000.tar``, ...), *all* outputs mirror the inputs' folders
    below their common parent folder: ``OUT_DIR/<folder relative to it>/<stem><suffix>``.
    ``keep_tree=True`` (``--keep-tree``) always mirrors; ``keep_tree=False`` (``--flat``) never
    does, and two inputs landing on one output are then a UsageError naming both. A shard given
    twice is always a UsageError. An OUT_DIR URL (``s3://bucket/prefix``) gives URLs under it,
    joined with ``/``.
    """
    stem = stdin_stem(stdin_name)
    if keep_tree is None:
        flat = _outputs(shards, out_dir, suffix, stem, tree=False)
        if len(set(flat)) == len(flat):
            return flat
        _refuse_repeated_shards(shards)
        return _refuse_collisions(shards, _outputs(shards, out_dir, suffix, stem, tree=True), keep_tree)
    return _refuse_collisions(shards, _outputs(shards, out_dir, suffix, stem, tree=keep_tree), keep_tree)


def _outputs(shards: list[str], out_dir: str, suffix: str, stdin: str, *, tree: bool) -> list[str]:
    # standard input and pipe: commands lie in no folder: they are not mirrored
    named = [s for s in shards if s != STDIN and not s.startswith("pipe:")]
    tree = tree and bool(named)
    if "://" in out_dir:  # a URL: no abspath, and '/' joins on every platform
        return _url_outputs(shards, named, out_dir, suffix, stdin, tree)
    out_dir = os.path.abspath(out_dir)
    if tree:
        return _mirrored_outputs(shards, named, out_dir, suffix, stdin)
    return [os.path.join(out_dir, (stdin if s == STDIN else shard_stem(s)) + suffix) for s in shards]


def _mirrored_outputs(shards: list[str], named: list[str], out_dir: str, suffix: str, stdin: str) -> list[str]:
    """Local outputs below ``out_dir`` in the folders of ``named`` relative to their common folder."""
    common = _common_folder(named)
    mirrored = set(named)
    return [os.path.join(out_dir, stdin + suffix) if s == STDIN else
            os.path.join(out_dir, shard_stem(s) + suffix) if s not in mirrored else
            os.path.normpath(os.path.join(out_dir, os.path.relpath(os.path.dirname(s), common),
                                          shard_stem(s) + suffix)) for s in shards]


def _url_outputs(shards: list[str], named: list[str], out_dir: str, suffix: str, stdin: str,
                 tree: bool) -> list[str]:
    """``_outputs`` under an OUT_DIR URL: joined with ``/``, mirrored folders relative to the inputs' common one."""
    base = out_dir.rstrip("/")
    common = _common_folder(named) if tree else None
    mirrored = set(named)
    outputs = []
    for s in shards:
        rel = posixpath.normpath(posixpath.relpath(posixpath.dirname(s), common)) if tree and s in mirrored else "."
        name = (stdin if s == STDIN else shard_stem(s)) + suffix
        outputs.append(posixpath.join(base, name) if rel == "." else posixpath.join(base, rel, name))
    return outputs


def _common_folder(shards: list[str]) -> str:
    return os.path.commonpath([os.path.dirname(s) for s in shards]) if len(shards) > 1 else os.path.dirname(shards[0])


def _refuse_repeated_shards(shards: list[str]) -> None:
    seen: set[str] = set()
    for shard in shards:
        if shard in seen:
            raise UsageError("shard given twice (both would write the same output)", shard=shard)
        seen.add(shard)


def _refuse_collisions(shards: list[str], outputs: list[str], keep_tree: bool | None) -> list[str]:
    seen: dict[str, str] = {}
    for shard, out in zip(shards, outputs):
        if out in seen:
            if seen[out] == shard:
                raise UsageError(f"shard given twice (both would write {out})", shard=shard)
            hint = "; drop --flat to mirror their folders" if keep_tree is False else ""
            if STDIN in (seen[out], shard):
                hint = "; give standard input's output another name with --stdin-name"
            raise UsageError(f"{seen[out]} and {shard} would both write {out}{hint}")
        seen[out] = shard
    return outputs
