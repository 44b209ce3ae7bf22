"""The ``shardkit`` command line: a thin shell over the library.

Each command lives in its own module of this package and defines ``command`` (a click command or
group); the group below discovers them, so adding a command touches no other file. Heavy imports
(numpy, torch) happen inside command bodies, so ``shardkit --help`` stays fast.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

from shardkit import __version__
from shardkit.errors import ShardkitError, UsageError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

EXIT_CODES_HELP = ("Exit codes: 0 ok, 1 data problems or failed shards, 2 usage errors, 3 the Ray cluster was lost "
                   "(rerun to resume). Ctrl-C: 130 (a rerun resumes).")
EXIT_INTERRUPTED = 130


class _Commands(click.Group):
    def _modules(self) -> list[str]:
        return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))

    def list_commands(self, ctx):
        return sorted(self._load(m).name for m in self._modules())

    def get_command(self, ctx, name):
        for module in self._modules():
            command = self._load(module)
            if command.name == name:
                return command
        return None

    @staticmethod
    def _load(module: str) -> click.Command:
        return importlib.import_module(f"{__name__}.{module}").command

    def invoke(self, ctx):
        global _json_emitted
        _json_emitted = False
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args  # click < 8.2
        args = [*protected, *ctx.args]  # before click consumes them
        from shardkit.cli._outcome import remember_arguments

        remember_arguments(args)  # for the "rerun" advice, pasted as it was run
        try:
            return super().invoke(ctx)
        except UsageError as err:
            self._fail(ctx, args, err, 2)
        except ShardkitError as err:
            self._fail(ctx, args, err, getattr(err, "exit_code", 1))  # ClusterError: 3
        except click.UsageError as err:  # click's own (a bad option value): --json still gets its document
            if "--json" in args and not _json_emitted:
                emit_json({"command": args[0] if args else None, "error": err.format_message(), "exit_code": 2})
            raise
        except KeyboardInterrupt:
            self._interrupted(ctx, args)

    @staticmethod
    def _interrupted(ctx, args):
        """Ctrl-C: exit 130 (128 + SIGINT, the shell's convention), one JSON document under --json. Outputs
        are written under temporary names and renamed when complete, so none is left half-made, and the
        journal of finished shards lets the same command resume."""
        from shardkit.cli._outcome import rerun_command

        if "tqdm" in sys.modules:  # a bar left open would redraw itself below the last line
            for bar in list(getattr(sys.modules["tqdm"].tqdm, "_instances", ())):
                bar.close()
        if "--json" in args and not _json_emitted:
            emit_json({"command": args[0] if args else None, "error": "interrupted", "exit_code": EXIT_INTERRUPTED})
        click.echo(f"\ninterrupted: finished shards are kept and no partial output is left; rerun "
                   f"`{rerun_command()}` to resume", err=True)
        ctx.exit(EXIT_INTERRUPTED)

    @staticmethod
    def _fail(ctx, args, err, code):
        if "--json" in args and not _json_emitted:  # --json promises one document on stdout, failures included
            emit_json({"command": args[0], "error": str(err), "exit_code": code})
        click.echo(f"Error: {err}", err=True)
        ray = sys.modules.get("ray")
        if code == 3 and ray is not None and ray.is_initialized():
            # a lost cluster: Ray's exit handlers would wait for it, then end the process with status 1
            import os

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        ctx.exit(code)


_json_emitted = False


@click.group(cls=_Commands, context_settings=CONTEXT_SETTINGS,
             epilog=f"{EXIT_CODES_HELP}\n\nExample: shardkit convert data/bz2/data.list -o data/zst")
@click.version_option(__version__, "-V", "--version", prog_name="shardkit")
def main():
    """Prepare WeNet-style tar shards of speech for distributed ASR training.

    Run `shardkit COMMAND --help` for each command's options and an example.
    """


def emit_json(obj) -> None:
    """The one machine-readable report of a --json run, on stdout."""
    import json

    from shardkit.errors import json_safe

    # a non-UTF-8 shard path or name is escaped (\xNN): the document is valid UTF-8 JSON, whatever the input holds
    from shardkit.run.executor import report_stdout

    global _json_emitted
    _json_emitted = True
    out = report_stdout()  # stdout, also while Ray has sent everything else there to stderr
    out.write(json.dumps(json_safe(obj), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    out.flush()


def jobs_option(f):
    return click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
                        help="Parallel processes, one shard per task [default: all cores].")(f)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON report on stdout and nothing else there.")(f)


def executor_options(split_help: str, executor_help: str = "local: processes on this machine; ray: one Ray task "
                     "per shard on a cluster (which must see the inputs and outputs at the same paths)."):
    """--executor, --ray-address and --split, shared by the commands that scale past one machine."""

    def decorate(f):
        f = click.option("--split", default=None, metavar="I/N", help=split_help)(f)
        f = click.option("--ray-address", default=None,
                         help="Ray cluster [default: auto: RAY_ADDRESS or a `ray start` cluster here, "
                              "else a local instance].")(f)
        return click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                            help=executor_help)(f)

    return decorate


def io_options(f=None, *, pipes: bool = True):
    """--io-timeout, --io-retries and --allow-pipes: how a command reads URL and ``pipe:`` inputs.

    They set ``shardkit.io.remote``'s settings as the command line is parsed (no parameter reaches
    the command), and the executor hands them to every worker process and Ray task. ``pipes=False``
    leaves --allow-pipes out, for a command that declares its own (make).
    """
    from shardkit.io.remote import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, DEFAULT_RETRIES

    def set_timeout(ctx, param, value):
        from shardkit.io.remote import configure_io, parse_io_timeout

        try:
            connect, read = parse_io_timeout(value)
        except UsageError as err:
            raise click.BadParameter(err.reason) from None
        configure_io(connect_timeout=connect, read_timeout=read)

    def set_retries(ctx, param, value):
        from shardkit.io.remote import configure_io

        configure_io(retries=value)

    def set_pipes(ctx, param, value):
        from shardkit.io.remote import configure_io

        configure_io(allow_pipes=value)

    def decorate(f):
        if pipes:
            f = click.option("--allow-pipes", is_flag=True, expose_value=False, callback=set_pipes,
                             help="Run the commands of `pipe:CMD` inputs (refused otherwise: a list can name any "
                                  "command); or set SHARDKIT_ALLOW_PIPES=1.")(f)
        f = click.option("--io-retries", type=click.IntRange(min=0), default=DEFAULT_RETRIES, show_default=True,
                         expose_value=False, callback=set_retries,
                         help="Further attempts at a URL after a transient failure (5xx, reset, short body, "
                              "stall), 0.5 s apart and doubling.")(f)
        return click.option("--io-timeout", default=f"{DEFAULT_CONNECT_TIMEOUT:g}:{DEFAULT_READ_TIMEOUT:g}",
                            show_default=True, metavar="[CONNECT:]READ", expose_value=False, callback=set_timeout,
                            help="Seconds to connect to a URL, and that a read of a URL or pipe: command may "
                                 "wait for data before the input fails as stalled.")(f)

    return decorate(f) if f is not None else decorate


class ShardProgress:
    """A tqdm bar on stderr, one tick per finished shard: ``on_plan``/``on_result`` for the library.

    ``byte_key`` names a result field of uncompressed bytes to show a MB/s rate (shards whose ``status``
    is "skipped", done by an earlier run, count no bytes: no rate for a rerun that did nothing); a result whose
    ``status`` is "failed" has its ``error`` written above the bar.
    """

    def __init__(self, desc: str, *, quiet: bool = False, byte_key: str | None = None, min_total: int = 1):
        self.desc, self.quiet, self.byte_key, self.min_total = desc, quiet, byte_key, min_total
        self.bar = None
        self.bytes = 0

    def on_plan(self, total: int) -> None:
        if self.quiet:  # no bar: tqdm is not even imported (~20 ms of a short run's start-up)
            return
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="shard", file=sys.stderr, dynamic_ncols=True, desc=self.desc,
                        disable=self.quiet or total < self.min_total)

    def on_result(self, entry: dict) -> None:
        if self.bar is None:
            if self.quiet and entry.get("status") == "failed" and entry.get("error"):
                print(f"failed: {entry['error']}", file=sys.stderr)  # as the disabled bar's write did
            return
        self.bar.update(1)
        if self.byte_key and entry.get("status") != "skipped":  # a skipped shard moved no bytes
            self.bytes += entry.get(self.byte_key) or 0
            elapsed = self.bar.format_dict["elapsed"] or 1e-9
            self.bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.1f} MB/s", refresh=False)
        if entry.get("status") == "failed" and entry.get("error"):
            self.bar.write(f"failed: {entry['error']}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
