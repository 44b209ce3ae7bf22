"""WeNet data.list files: check every line, rewrite shard suffixes after a conversion, concatenate.

WeNet reads a data.list line by line, strips only the newline, and opens the rest as a path (or
a URL through ``wget``); a line it cannot open is logged and skipped. So the checks here look at
lines exactly as WeNet will: whitespace around a path, blank and comment lines, relative paths
(WeNet resolves them against the training's working directory; shardkit, like ``read_list``,
against the list's folder) and repeated shards are reported, not silently fixed.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.codecs import codec_of_path, detect_codec
from shardkit.io.inputs import SHARD_PATTERNS, shard_stem
from shardkit.io.tar import DEFAULT_MAX_MEMBER_BYTES, group_samples, iter_shard_members, open_regular
from shardkit.run.options import RunOptions

SHARD_SUFFIXES = tuple(pattern[1:] for pattern in SHARD_PATTERNS)  # ".tar", ".tar.gz", ...
# Python's tarfile reads these without help; zst needs the hook before 3.14 (see shardkit.training.zstd_hook).
TARFILE_NATIVE = frozenset({"none", "gz", "bz2", "xz"})


@dataclass(frozen=True)
class ListLine:
    """One line of a list file as WeNet sees it (newline removed, nothing else)."""

    list_path: str
    number: int  # 1-based
    text: str

    @property
    def is_entry(self) -> bool:
        """A line that names a shard (not blank, not a comment)."""
        stripped = self.text.strip()
        return bool(stripped) and not stripped.startswith("#")

    @property
    def is_url(self) -> bool:
        """Whether the line names a URL (``scheme://``) rather than a local path or ``pipe:``."""
        return "://" in self.text

    @property
    def location(self) -> str:
        """``LIST:LINE``, where messages point a person to."""
        return f"{self.list_path}:{self.number}"

    def resolved(self) -> str:
        """Absolute local path (relative lines against the list's folder), or the URL as written."""
        text = self.text.strip()
        if self.is_url or os.path.isabs(text):
            return text
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.list_path)), text))


def read_list_lines(list_path: str) -> list[ListLine]:
    """Every line of a list file, numbered; a missing or unreadable list is a UsageError."""
    try:
        with open(list_path, encoding="utf-8") as f:  # universal newlines, as WeNet's text-mode open
            return [ListLine(list_path, number, line.rstrip("\n")) for number, line in enumerate(f, 1)]
    except FileNotFoundError:
        raise UsageError("no such list file", shard=list_path) from None
    except IsADirectoryError:
        raise UsageError("is a folder, not a list file", shard=list_path) from None
    except UnicodeDecodeError as err:
        if _looks_like_shard(list_path):
            raise UsageError("is a shard, not a list file (list commands take data.list files; "
                             "`shardkit validate` reads shards)", shard=list_path) from None
        raise UsageError(f"cannot read list file ({err})", shard=list_path) from err
    except OSError as err:
        raise UsageError(f"cannot read list file ({err})", shard=list_path) from err


def _looks_like_shard(path: str) -> bool:
    from shardkit.io.codecs import detect_codec

    with open(path, "rb") as f:
        head = f.read(512)
    return detect_codec(head) != "none" or head[257:262] == b"ustar"


# ---------------------------------------------------------------------------------------- check


def check_shard(path: str, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES, threads: int = 1) -> dict:
    """Read one shard through: compression by magic, member and utterance counts, or the error."""
    result = {"compression": None, "members": 0, "utterances": 0, "bytes": None, "error": None}
    problems: list[ShardkitError] = []
    try:
        with os.fdopen(open_regular(path), "rb") as f:  # a FIFO or device fails here, never blocks
            result["bytes"] = os.fstat(f.fileno()).st_size
            result["compression"] = detect_codec(f.read(16))
        members = iter_shard_members(path, max_member_bytes=max_member_bytes, threads=threads,
                                     on_error=problems.append)

        def counted():
            for member in members:
                result["members"] += 1
                yield member

        for _ in group_samples(counted(), shard=path, max_bytes=max_member_bytes):
            result["utterances"] += 1
    except ShardkitError as err:  # first: some ShardkitErrors are also OSErrors (a missing shard, an input)
        result["error"] = str(err).removeprefix(f"{path}: ")
    except FileNotFoundError:
        result["error"] = "no such file"
    except IsADirectoryError:
        result["error"] = "is a folder, not a shard"
    except OSError as err:
        result["error"] = f"cannot read ({err.strerror or err})"
    if problems and result["error"] is None:
        first = str(problems[0]).removeprefix(f"{path}: ")
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        result["error"] = f"{first}{more}"
    return result


def _line_warnings(line: ListLine, first_seen: dict[str, ListLine]) -> list[str]:
    warnings = []
    if not line.is_entry:
        what = "blank line" if not line.text.strip() else "comment line"
        return [f"{what}: WeNet tries to open it as a shard and logs an error"]
    if not line.is_url and not os.path.isabs(line.text.strip()):
        warnings.append("relative path: WeNet opens it relative to the training's working directory")
    earlier = first_seen.get(line.resolved())
    if earlier is not None:
        warnings.append(f"same shard as line {earlier.number}: WeNet reads it twice per epoch")
    return warnings


def check_lists(
    list_paths: list[str],
    options: RunOptions | None = None,
    *,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
) -> "ListCheckReport":
    """Check every line of every list: exists, is a readable shard; counts and compression per line.

    Each entry: ``{"list", "line", "text", "path", "status": ok|bad|unchecked, "compression",
    "members", "utterances", "bytes", "error", "warnings"}``. URLs, blank and comment lines are
    ``unchecked`` (with a warning for the latter); unreadable shards and whitespace-padded paths
    are ``bad``. ``options``: ``jobs`` (local threads of checks) and ``on_event`` (one stage, "check",
    a ``done`` event per checked line); the other run options do not apply to a read-only check.
    """
    options = options or RunOptions()
    events = options.events
    entries, todo = _line_entries(list_paths)
    events.stage("check", len(todo))

    def finish(index: int, result: dict) -> None:
        entry = entries[index]
        entry.update(result)
        entry["status"] = "bad" if result["error"] else "ok"
        if result["compression"] and codec_of_path(entry["path"]) != result["compression"]:
            entry["warnings"].append(f"name says {codec_of_path(entry['path'])}, content is {result['compression']}")
        events.done(entry)

    cores = os.cpu_count() or 1
    jobs = max(1, min(options.jobs or cores, len(todo) or 1))
    threads = max(1, cores // jobs)
    if jobs == 1:
        for index in todo:
            finish(index, check_shard(entries[index]["path"], max_member_bytes, threads))
    else:
        from concurrent.futures import as_completed

        from shardkit.run.executor import local_pool

        with local_pool(jobs) as pool:
            futures = {pool.submit(check_shard, entries[i]["path"], max_member_bytes, threads): i for i in todo}
            for future in as_completed(futures):
                finish(futures[future], future.result())
    return ListCheckReport(entries)


def _line_entries(list_paths: list[str]) -> tuple[list[dict], list[int]]:
    """One entry per line of every list (``unchecked`` until read), and the indexes of the lines to read:
    local shard paths (URLs stay unchecked; a path padded with whitespace that names no file is ``bad``)."""
    entries: list[dict] = []
    todo: list[int] = []
    for list_path in list_paths:
        first_seen: dict[str, ListLine] = {}
        for line in read_list_lines(list_path):
            entry = {"list": list_path, "line": line.number, "text": line.text,
                     "path": line.resolved() if line.is_entry else None, "status": "unchecked",
                     "compression": None, "members": None, "utterances": None, "bytes": None, "error": None,
                     "warnings": _line_warnings(line, first_seen)}
            if line.is_entry:
                first_seen.setdefault(line.resolved(), line)
                if line.text != line.text.strip() and not os.path.exists(line.text):
                    entry["status"] = "bad"
                    entry["error"] = "whitespace around the path: WeNet opens the path with it, and no such file exists"
                elif not line.is_url:
                    todo.append(len(entries))
            entries.append(entry)
    return entries, todo


@dataclass
class ListCheckReport:
    """What ``list check`` found: one entry per line of every list (status, compression, counts, warnings)."""
    entries: list[dict]

    def summary(self) -> dict:
        """The ``--json`` document: lines ok, bad and unchecked, warnings, member/utterance/byte totals,
        the compressions seen and how many shards need the zstd hook, and every entry.
        """
        ok = [e for e in self.entries if e["status"] == "ok"]
        by_compression: dict[str, int] = {}
        for e in ok:
            by_compression[e["compression"]] = by_compression.get(e["compression"], 0) + 1
        return {
            "lists": sorted({e["list"] for e in self.entries}),
            "lines": len(self.entries),
            "ok": len(ok),
            "bad": sum(e["status"] == "bad" for e in self.entries),
            "unchecked": sum(e["status"] == "unchecked" for e in self.entries),
            "warnings": sum(len(e["warnings"]) for e in self.entries),
            **{total: sum(e[total] for e in ok) for total in ("members", "utterances", "bytes")},
            "compression": dict(sorted(by_compression.items())),
            "need_zstd_hook": by_compression.get("zst", 0),
            "entries": self.entries,
        }

    @property
    def exit_code(self) -> int:
        """1 when a line is bad, else 0 (the CLI's exit status)."""
        return 1 if any(e["status"] == "bad" for e in self.entries) else 0


# -------------------------------------------------------------------------------------- rewrite


def rewrite_entry(text: str, suffix: str, new_dir: str | None = None) -> str:
    """``/a/shards_000000001.tar.bz2`` -> ``/a/shards_000000001.tar.zst`` (or under NEW_DIR); pure."""
    if suffix not in SHARD_SUFFIXES:
        raise UsageError(f"--suffix must be one of {', '.join(SHARD_SUFFIXES)} (got {suffix!r})")
    folder, _, name = text.strip().rpartition("/")
    if not name.lower().endswith(SHARD_SUFFIXES):
        raise UsageError(f"{name!r} does not end with a shard suffix ({', '.join(SHARD_SUFFIXES)})")
    renamed = shard_stem(name) + suffix
    if new_dir is not None:
        return os.path.join(new_dir, renamed)
    return f"{folder}/{renamed}" if (folder or text.strip().startswith("/")) else renamed


def rewrite_list(list_path: str, out_path: str, *, suffix: str, new_dir: str | None = None,
                 check: bool = True) -> dict:
    """Write ``out_path``: ``list_path`` with each shard's suffix replaced (and folder, with ``new_dir``).

    Blank and comment lines are kept as they are. With ``check``, every new local path must exist
    and hold the compression its suffix names (a half-finished conversion is caught here);
    otherwise nothing is written and a ShardkitError lists the problems. URLs cannot be checked;
    the result counts them.
    """
    _refuse_overwriting_inputs(out_path, [list_path])
    new_dir = os.path.abspath(new_dir) if new_dir is not None else None
    lines = read_list_lines(list_path)
    moved = _moved_like_convert(lines, suffix, new_dir)
    out_lines = [_rewritten(line, suffix, new_dir, moved, list_path) if line.is_entry else line.text for line in lines]
    entries = [(line, new) for line, new in zip(lines, out_lines) if line.is_entry]
    if check:
        _refuse_unready(entries, list_path)
    from shardkit.io.files import atomic_write_lines

    atomic_write_lines(out_path, out_lines)
    return {"list": list_path, "out": os.path.abspath(out_path), "lines": len(lines),
            "entries": len(entries), "rewritten": sum(new != line.text for line, new in entries), "checked": check,
            "urls_not_checked": sum("://" in new for _, new in entries) if check else 0}


def _refuse_unready(entries: list[tuple[ListLine, str]], list_path: str) -> None:
    """A ShardkitError naming the rewritten local paths that are missing or hold another compression than
    their suffix says (URLs cannot be checked)."""
    problems = []
    for line, new in entries:
        problem = None if "://" in new else _suffix_problem(_local_target(new, line, list_path))
        if problem:
            problems.append(f"line {line.number}: {new}: {problem}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... ({len(problems) - 5} more)" if len(problems) > 5 else "")
        raise ShardkitError(f"{len(problems)} of {len(entries)} rewritten lines are not "
                            f"ready ({shown}); nothing written (use --no-check to write anyway)", shard=list_path)


def _rewritten(line: ListLine, suffix: str, new_dir: str | None, moved: dict[str, str], list_path: str) -> str:
    """``line``'s new path: where convert put the shard (``moved``), else its suffix replaced (under ``new_dir``)."""
    try:
        new = rewrite_entry(line.text, suffix, new_dir)
    except UsageError as err:
        raise UsageError(f"line {line.number}: {err.reason}", shard=list_path) from None
    return moved.get(line.resolved(), new)


def _local_target(new: str, line: ListLine, list_path: str) -> str:
    """The file a rewritten local line names (relative lines against the list's folder)."""
    return new if os.path.isabs(new) else ListLine(list_path, line.number, new).resolved()


def _moved_like_convert(lines: list[ListLine], suffix: str, new_dir: str | None) -> dict[str, str]:
    """Where convert put each listed shard in ``new_dir``: ``NEW_DIR/<stem><suffix>``, or, when
    shard names repeat (corpora joined in one list), below the folders it mirrors (one rule,
    ``inputs.plan_output_paths``). Empty without ``new_dir``."""
    from shardkit.io.inputs import plan_output_paths

    local = list(dict.fromkeys(l.resolved() for l in lines if l.is_entry and not l.is_url))
    if new_dir is None or not local:
        return {}
    try:
        return dict(zip(local, plan_output_paths(local, new_dir, suffix)))
    except UsageError:  # names that even the mirrored layout cannot tell apart: each line as it is
        return {}


def _suffix_problem(path: str) -> str | None:
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            found = detect_codec(f.read(16))
    except ShardkitError as err:
        return err.reason
    except OSError as err:
        return f"cannot read ({err.strerror or err})"
    expected = codec_of_path(path)
    return None if found == expected else f"content is {found}, the suffix says {expected}"


# --------------------------------------------------------------------------------------- concat


def concat_lists(list_paths: list[str], out_path: str, *, shuffle: bool = False, seed: int = 0,
                 allow_duplicates: bool = False) -> dict:
    """Write one list of every shard line of ``list_paths`` (in order, or shuffled with ``seed``).

    Relative lines become absolute (against their list's folder), so the result works from any
    folder; blank and comment lines are dropped. A shard named twice (in one list or two) is a
    UsageError naming both places, unless ``allow_duplicates`` (WeNet then reads it twice per epoch).
    """
    if not list_paths:
        raise UsageError("no list files given")
    _refuse_overwriting_inputs(out_path, list_paths)
    seen: dict[str, ListLine] = {}
    out_lines: list[str] = []
    per_list = []
    for list_path in list_paths:
        entries = [line for line in read_list_lines(list_path) if line.is_entry]
        for line in entries:
            path = line.resolved()
            earlier = seen.get(path)
            if earlier is not None and not allow_duplicates:
                raise UsageError(f"shard {path} is listed in {earlier.location} and in {line.location}; "
                                 "remove one, or pass --allow-duplicates to read it twice per epoch")
            seen.setdefault(path, line)
            out_lines.append(path)
        per_list.append({"list": list_path, "lines": len(entries)})
    if shuffle:
        random.Random(seed).shuffle(out_lines)
    from shardkit.io.files import atomic_write_lines

    atomic_write_lines(out_path, out_lines)
    return {"out": os.path.abspath(out_path), "lines": len(out_lines), "lists": per_list,
            "shuffled": shuffle, "seed": seed if shuffle else None}


def _refuse_overwriting_inputs(out_path: str, list_paths: list[str]) -> None:
    out = os.path.realpath(out_path)
    for list_path in list_paths:
        if os.path.realpath(list_path) == out:
            raise UsageError("the output would overwrite an input list; choose another -o", shard=list_path)
    if os.path.isdir(out_path):
        raise UsageError("-o names a folder; give a file name such as data.list", shard=out_path)
    from shardkit.run.lifecycle import claim_output_file

    claim_output_file(out_path, list_paths)  # a hard link to an input list is that list too
