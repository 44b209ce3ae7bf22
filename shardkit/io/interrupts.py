"""Ctrl-C (SIGINT) and SIGTERM as one event: :class:`Interrupted`, raised in the main thread.

Python's own SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread happens to run
Python code. Inside a C library's callback into Python (soundfile's virtual I/O, which FLAC
transcoding writes through) that exception is printed and dropped by cffi, and the run goes on to
its end as if nothing happened; SIGTERM, what schedulers (Slurm, Kubernetes) send, has no handler
at all, so the process dies where it stands and no ``finally`` runs.

``handling_signals()`` (the CLI's entry, every pool worker) installs one handler for both: it
records the signal and raises :class:`Interrupted` (a ``KeyboardInterrupt``, so every existing
``except KeyboardInterrupt`` and every ``with`` block that removes a temporary file treats both
alike). Since a raise can be swallowed, the record stays: :func:`check` raises it again at the next
checkpoint (each task of ``run_tasks``, each member transcoded, each block a writer writes), so a
signal is never lost. A signal that was ignored when the process started (``nohup``, a background
job of a non-interactive shell) stays ignored, as the shell asked.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

HANDLED = (signal.SIGINT, signal.SIGTERM)

_received: list[int] = []  # the signals received since handling began (a list: no global statement needed)


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop (SIGINT or SIGTERM): clean up, say so, exit ``128 + signal``."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def error(self) -> str:
        """The word of the JSON document: ``interrupted`` (Ctrl-C) or ``terminated`` (SIGTERM)."""
        return "terminated" if self.signum == signal.SIGTERM else "interrupted"


def as_interrupted(err: KeyboardInterrupt) -> Interrupted:
    """An interrupt as :class:`Interrupted`: a plain ``KeyboardInterrupt`` (Python's handler, before ours) is SIGINT,
    unless a SIGTERM was recorded."""
    if isinstance(err, Interrupted):
        return err
    return Interrupted(received() or signal.SIGINT)


_idle: list = []  # a pool worker's "am I between tasks?" (install's exit_when_idle)


def _handler(signum, frame) -> None:
    _received.append(signum)
    if _idle and _idle[0]():  # a pool worker waiting for a task has nothing to clean up: it ends quietly
        import os

        os._exit(128 + signum)
    if len(_received) == 1:  # a second signal while the first one's cleanup runs would cut that cleanup short
        raise Interrupted(signum)


def received() -> int | None:
    """The last signal received since handling began, or None."""
    return _received[-1] if _received else None


def check() -> None:
    """Raise :class:`Interrupted` if a signal was received (its first raise may have been swallowed by a C
    callback); a checkpoint for loops that make progress, never for cleanup code."""
    signum = received()
    if signum is not None:
        raise Interrupted(signum)


def _quiet_interrupts(unraisable) -> None:
    """``sys.unraisablehook`` while signals are handled: an :class:`Interrupted` a C callback swallowed is not
    printed as an "ignored" exception (a traceback from inside soundfile); :func:`check` raises it again where
    the run can stop cleanly. Anything else goes to the hook that was there before."""
    if not isinstance(unraisable.exc_value, Interrupted):
        _hooks[-1](unraisable)


_hooks: list = []  # the unraisable hooks install() replaced


def install(exit_when_idle=None) -> dict | None:
    """Route SIGINT and SIGTERM to :class:`Interrupted` in this process (main thread only; elsewhere nothing
    is installed and None is returned); returns the handlers it replaced, for :func:`restore`.

    ``exit_when_idle()`` (a pool worker's): True when no task runs; a signal then ends the process at once
    (a raise there would only print a traceback from the pool's own loop)."""
    import sys

    _idle[:] = [exit_when_idle] if exit_when_idle is not None else []
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {}
    for signum in HANDLED:
        current = signal.getsignal(signum)
        if current is signal.SIG_IGN:  # nohup, or a background job: the shell asked for it to be ignored
            continue
        previous[signum] = current
        signal.signal(signum, _handler)
    _hooks.append(sys.unraisablehook)
    sys.unraisablehook = _quiet_interrupts
    return previous


def restore(previous: dict | None) -> None:
    import sys

    if previous is None:
        return
    for signum, handler in previous.items():
        if handler is _record:  # the program's early recorder: the program is ending, Python's own come back
            handler = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    if _hooks:
        sys.unraisablehook = _hooks.pop()
    _received.clear()


def _record(signum, frame) -> None:
    _received.append(signum)


def record_early() -> None:
    """From the first line of the ``shardkit`` program until :func:`handling_signals` takes over: a signal is
    only recorded (the imports go on), and the CLI, once it can clean up and write its JSON document, stops
    with it (its first :func:`check`). Without this, a SIGTERM in the first tenth of a second ended the
    process with no word."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in HANDLED:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _record)


@contextmanager
def handling_signals():
    """SIGINT and SIGTERM raise :class:`Interrupted` inside the block; the earlier handlers come back after it.
    A signal :func:`record_early` recorded stays recorded: the block's first :func:`check` raises it."""
    previous = install()
    try:
        yield
    finally:
        restore(previous)
