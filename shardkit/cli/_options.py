"""The click options several commands share, and the one value they become: ``RunOptions``.

``executor_options`` (--executor, --ray-address, --split), ``jobs_option``, ``json_option`` and
``io_options`` (--io-timeout, --io-retries, --allow-pipes) declare the options; ``run_options``
turns what a command received into ``shardkit.run.options.RunOptions``, which the library takes whole.
"""

from __future__ import annotations

import click

from shardkit.errors import UsageError


def one_blas_thread() -> None:
    """One OpenBLAS thread unless the user set a count, before numpy loads: OpenBLAS starts a thread per core
    when numpy is imported, ~0.07-0.08 CPU-s of a 2-core machine's start-up in this process and in each that
    inherits the setting (benchmarks/results/2026-11-28-flac.md, 2026-11-28-plan-scale.md). For commands that
    do no linear algebra (convert, balance)."""
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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


def run_options(*, jobs: int | None = None, executor: str = "local", ray_address: str | None = None,
                split: str | None = None, overwrite: bool = False, on_event=None):
    """The command line's run choices as one ``RunOptions`` (``--split`` parsed; remote-input settings
    are this process's, as ``io_options`` set them while the line was parsed)."""
    from shardkit.run.options import RunOptions
    from shardkit.run.split import parse_split

    return RunOptions(jobs=jobs, executor=executor, ray_address=ray_address,
                      split=parse_split(split) if split else None, overwrite=overwrite, on_event=on_event)


def layout_option(f):
    """--layout, as balance and prep take it (``shardkit.io.layouts``)."""
    return click.option("--layout", type=click.Choice(["wenet", "nemo", "shar"]), default="wenet", show_default=True,
                        help="The trainer's layout: WeNet tar shards; NeMo's tarred audio (audio_K.tar, one manifest, "
                             "a config fragment); Lhotse Shar (OUT_DIR/shar/recording.NNNNNN.tar + "
                             "cuts.NNNNNN.jsonl.gz). nemo and shar write plain tars: --codec and --level are refused "
                             "with them.")(f)


def layout_codec(layout: str, codec: str, level: int | None) -> tuple[str, int | None]:
    """--codec and --level as the library takes them (``io.codecs.parse_codec_spec``). A trainer's layout
    writes plain tars, the only ones NeMo's and Lhotse's readers open: a codec other than none, or a level,
    given with it is a UsageError (exit 2) rather than ignored."""
    from shardkit.io.codecs import parse_codec_spec

    if layout == "wenet":
        return parse_codec_spec(codec, level)
    given = " ".join(([f"--codec {codec}"] if parse_codec_spec(codec)[0] != "none" else [])
                     + ([f"--level {level}"] if level is not None else []))
    if given:
        raise UsageError(f"{given} with --layout {layout}: NeMo's and Lhotse's readers open plain tars only, which "
                         f"--layout {layout} always writes; leave --codec and --level out")
    return "none", None
