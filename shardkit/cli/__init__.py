"""The ``shardkit`` command line: a thin shell over the library.

Each command lives in its own module of this package and defines ``command`` (a click command or
group); the group below discovers them, so adding a command touches no other file. Heavy imports
(numpy, torch) happen inside command bodies, so ``shardkit --help`` stays fast.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

if os.path.basename(sys.argv[0]) == "shardkit":  # the installed program (python -m shardkit: __main__.py)
    from shardkit.io.interrupts import record_early

    record_early()  # before click's imports: a signal now is answered like one during the run

import click

from shardkit import __version__
from shardkit.errors import ShardkitError, UsageError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

EXIT_CODES_HELP = ("Exit codes: 0 ok, 1 data problems, failed shards or a full disk, 2 usage errors or an unusable "
                   "output path, 3 the Ray cluster was lost (rerun to resume). Ctrl-C: 130, SIGTERM: 143 (a rerun "
                   "resumes).")


class _Commands(click.Group):
    def _modules(self) -> list[str]:
        return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))

    def list_commands(self, ctx):
        return sorted(self._load(m).name for m in self._modules())

    def get_command(self, ctx, name):
        # the module named after the command first: the others' imports are start-up a run does not need
        for module in sorted(self._modules(), key=lambda m: m != name.replace("-", "_")):
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
        from shardkit.io.interrupts import handling_signals

        with handling_signals():  # SIGTERM (a scheduler's stop) takes Ctrl-C's path: clean up, one document, 143
            return self._invoke_reporting(ctx, args)

    def _invoke_reporting(self, ctx, args):
        from shardkit.io.interrupts import check

        try:
            check()  # a signal received while the program was still starting
            return super().invoke(ctx)
        except UsageError as err:
            self._fail(ctx, args, err, getattr(err, "exit_code", 2))  # OutputError on a full disk: 1
        except ShardkitError as err:
            self._fail(ctx, args, err, getattr(err, "exit_code", 1))  # ClusterError: 3
        except click.UsageError as err:  # click's own (a bad option value): --json still gets its document
            if "--json" in args and not _json_emitted:
                emit_json({"command": args[0] if args else None, "error": err.format_message(), "exit_code": 2})
            raise
        except KeyboardInterrupt as err:
            self._interrupted(ctx, args, err)

    @staticmethod
    def _interrupted(ctx, args, err: KeyboardInterrupt):
        """Ctrl-C or SIGTERM: exit 130 or 143 (128 + the signal, the shell's convention), one JSON document under
        --json. Outputs are written under temporary names and renamed when complete, so none is left half-made,
        and the journal of finished shards lets the same command resume."""
        from shardkit.cli._outcome import rerun_command
        from shardkit.io.interrupts import as_interrupted

        stop = as_interrupted(err)

        if "tqdm" in sys.modules:  # a bar left open would redraw itself below the last line
            for bar in list(getattr(sys.modules["tqdm"].tqdm, "_instances", ())):
                bar.close()
        if "--json" in args and not _json_emitted:
            emit_json({"command": args[0] if args else None, "error": stop.error, "exit_code": stop.exit_code})
        click.echo(f"\n{stop.error}: finished shards are kept and no partial output is left; rerun "
                   f"`{rerun_command()}` to resume", err=True)
        ctx.exit(stop.exit_code)

    @staticmethod
    def _fail(ctx, args, err, code):
        if "--json" in args and not _json_emitted:  # --json promises one document on stdout, failures included
            emit_json({"command": args[0], "error": str(err), "exit_code": code})
        click.echo(f"Error: {err}", err=True)
        ray = sys.modules.get("ray")
        if code == 3 and ray is not None and ray.is_initialized():
            # a lost cluster: Ray's exit handlers would wait for it, then end the process with status 1
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
