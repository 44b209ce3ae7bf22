"""What every writing command tells a person at the end, in one wording: the codec option they share,
the note on zstd output, and the last line after a failure (what was written, what was not, what to run next).

A command that fails a shard says so in its last line in the same words across convert, validate,
balance, make and index: ``COMMAND: N of M shards failed (where: LIST:LINE); written: ...; not
written: ...; next: fix or remove what failed, then rerun: shardkit ...``. The rerun is the command
line as it was run (finished shards are skipped), so it can be pasted.
"""

from __future__ import annotations

import os
import shlex

import click

from shardkit.io.codecs import CODEC_GRAMMAR

_invoked: list[str] = []  # the arguments after `shardkit`, as the group saw them (set by the group)


def remember_arguments(args: list[str]) -> None:
    _invoked[:] = list(args)


def rerun_command() -> str:
    """The command line that was run, quoted for a shell: ``shardkit convert miss/data.list -o conv``."""
    return shlex.join(["shardkit", *_invoked])


class CodecSpec(click.ParamType):
    """``--codec``: the one grammar of ``shardkit.io.codecs.parse_codec_spec`` (checked there, kept as
    typed here, so ``--level`` can still be combined by the command)."""

    name = "CODEC[:LEVEL]"

    def convert(self, value, param, ctx):
        from shardkit.errors import UsageError
        from shardkit.io.codecs import parse_codec_spec

        try:
            parse_codec_spec(value)
        except UsageError as err:
            self.fail(str(err), param, ctx)
        return value


def codec_option(default: str, what: str = "Output compression"):
    """``--codec`` with the shared grammar; the default says why it is what it is."""
    return click.option("--codec", type=CodecSpec(), default=default, show_default=True,
                        help=f"{what}: {CODEC_GRAMMAR}. none (plain .tar) is what every WeNet reads as installed; "
                             "zst shards need `shardkit wenet enable-zstd` in the trainer's Python < 3.14.")


def balanced_layout_options(command):
    """The options that fix a balanced output (ranks, workers, folder, shard size, codec), as balance and prep
    both take them, in one order and with one wording."""
    for option in reversed([
        click.option("--world-size", required=True, type=int, help="Number of ranks (GPUs)."),
        click.option("--num-workers", required=True, type=int, help="Loader workers per rank."),
        click.option("-o", "--out-dir", required=True, type=click.Path(file_okay=False), help="Output folder."),
        click.option("--shard-duration", type=float, default=None,
                     help="Target seconds of audio per shard [default: 3600]; the count is the nearest multiple of "
                          "world_size x num_workers."),
        click.option("--num-shards", type=int, default=None,
                     help="Shard count instead (rounded to a multiple of W x K)."),
        codec_option("none"),
        click.option("--level", type=int, default=None,
                     help="Compression level [default: the codec's, zst 3]; or --codec zst:19."),
    ]):
        command = option(command)
    return command


def zstd_note(codec: str) -> dict | None:
    """For zst output: whether this environment's tarfile (WeNet's reader) opens it, from ``wenet status``."""
    if codec != "zst":
        return None
    from shardkit.training.zstd_hook import zstd_status

    try:
        reads = bool(zstd_status()["reads_zstd"])
    except Exception:  # the note must not fail a run that wrote its shards
        reads = False
    text = ("zst shards: WeNet's tarfile in this Python reads them (`shardkit wenet status`)" if reads else
            "zst shards: WeNet's tarfile in this Python CANNOT read them (it skips them with a warning and trains "
            "on less); run `shardkit wenet enable-zstd` in the training environment, or write --codec none")
    return {"codec": "zst", "reads_zstd_here": reads, "text": text}


def list_lines(failed_paths: list[str], args: list[str]) -> list[str]:
    """``LIST:LINE`` of each failed shard in the data.list arguments that name it (as `list check` shows)."""
    from shardkit.io.inputs import is_list_file

    wanted = {os.path.abspath(p) if "://" not in p else p for p in failed_paths}
    found = []
    for arg in args:
        if is_list_file(arg) and os.path.isfile(arg):
            found.extend(f"{arg}:{number}" for number in _lines_naming(arg, wanted))
    return found


def _lines_naming(list_path: str, wanted: set[str]) -> list[int]:
    """The line numbers of ``list_path`` whose shard (relative paths against the list's folder) is in ``wanted``;
    none when the list cannot be read."""
    base = os.path.dirname(os.path.abspath(list_path))
    numbers = []
    try:
        with open(list_path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                path = line.strip()
                if path and "://" not in path and not path.startswith("pipe:"):
                    path = os.path.normpath(os.path.join(base, path))
                if path in wanted:
                    numbers.append(number)
    except (OSError, UnicodeDecodeError):
        return numbers
    return numbers


def shards(n: int) -> str:
    return f"{n} shard{'' if n == 1 else 's'}"


def failure_line(command: str, *, failed: list[str], total: int | None, written: str, not_written: str,
                 args: list[str] = (), next_step: str = "fix or remove what failed, then rerun",
                 headline: str | None = None, resumes: bool = True) -> str:
    """The last line of a run that failed shards: the same words for every command. ``total`` None: the
    run stopped before writing (``failed`` are the inputs it could not read)."""
    located, check = _where_listed(failed, args)
    what = headline or _what_failed(failed, total)
    skipped = " (finished shards are skipped)" if resumes and total is not None else ""
    return (f"{command}: {what}{located}; written: {written}; not written: {not_written}; next: {next_step} "
            f"`{rerun_command()}`{skipped}{check}")


def _where_listed(failed: list[str], args: list[str]) -> tuple[str, str]:
    """`` (LIST:LINE, ...)`` naming where the failed shards are listed, and the `list check` advice that goes
    with it (both empty when no list argument names them)."""
    where = list_lines(failed, list(args))
    if not where:
        return "", ""
    lists = [a for a in args if a.endswith((".list", ".lst")) and os.path.isfile(a)]
    located = f" ({', '.join(where[:3])}{', ...' if len(where) > 3 else ''})"
    check = f"; `shardkit list check {shlex.join(lists)}` names every bad line" if lists else ""
    return located, check


def _what_failed(failed: list[str], total: int | None) -> str:
    """``N of M shards failed``, or, for a run that stopped before writing, how many inputs it could not read."""
    if total is not None:
        return f"{len(failed)} of {total} shards failed"
    unread = f": {len(failed)} input{'s' if len(failed) > 1 else ''} could not be read" if failed else ""
    return f"stopped before writing{unread}"


def stopped(command: str, err: Exception, *, failed: list[str], args: list[str], as_json: bool) -> None:
    """A writing run that raised before writing a shard: the error, then the last line; exit 1."""
    import sys

    from shardkit.cli import emit_json

    line = failure_line(command, failed=failed, total=None,
                        written="nothing (an output folder this run made is removed)",
                        not_written="any shard, and no data.list", args=args)
    if as_json:
        emit_json({"command": command, "error": str(err), "exit_code": 1, "failed_inputs": failed,
                   "written": [], "next": line})
    click.echo(f"Error: {err}", err=True)
    click.echo(line, err=True)
    sys.exit(1)
