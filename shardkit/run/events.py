"""The one progress protocol: what a command says while it runs, as plain values.

A command reports through ``RunOptions.on_event`` (``shardkit.run.options``): a callable that takes
one :class:`Event`. Three kinds cover every command:

- ``stage``: a phase begins (``name``, ``total`` units or None when unknown, ``unit``); e.g. convert's
  one stage "convert", balance's "index aishell" then "decompress" then "write";
- ``done``: ``count`` units of the current stage finished; ``result`` is the unit's report entry (a
  dict with ``status``/``error`` for a shard), ``error`` a failure to show, ``nbytes`` bytes moved
  (for a rate);
- ``note``: a line for a person (``text``), e.g. "planning..." or "resuming a killed run".

The library never renders anything: the CLI turns events into one tqdm bar per stage
(``shardkit.cli._progress.ProgressBars``); a library caller passes its own callable, or nothing.

>>> seen = []
>>> events = Events(seen.append)
>>> events.stage("convert", total=2)
>>> events.done(result={"status": "ok"})
>>> [e.kind for e in seen]
['stage', 'done']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

STAGE, DONE, NOTE = "stage", "done", "note"


@dataclass(frozen=True)
class Event:
    """One thing a running command reports; see the module docstring for the kinds."""

    kind: str
    stage: str = ""
    total: int | None = None
    unit: str = "shard"
    count: int = 1
    nbytes: int = 0
    error: str | None = None
    result: Any = None
    text: str = ""

    @property
    def failed(self) -> str | None:
        """The failure to show for a ``done`` event: its ``error``, or its result's when that failed."""
        if self.error:
            return self.error
        if isinstance(self.result, dict) and self.result.get("status") == "failed":
            return self.result.get("error")
        return None


EventSink = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The default sink: a library call reports to nobody."""


class Events:
    """What library code calls to report: ``events.stage(...)``, ``events.done(...)``, ``events.note(...)``.

    It remembers the current stage, so ``done`` events carry its name without each caller passing it.
    """

    __slots__ = ("sink", "current")

    def __init__(self, sink: EventSink | None = None):
        self.sink = sink or ignore
        self.current = ""

    def stage(self, name: str, total: int | None = None, unit: str = "shard") -> None:
        """Start a phase named ``name`` with ``total`` units of ``unit`` (None: unknown); later events belong to it."""
        self.current = name
        self.sink(Event(STAGE, stage=name, total=total, unit=unit))

    def done(self, result: Any = None, *, error: str | None = None, count: int = 1, nbytes: int = 0) -> None:
        """One or more units (``count``, ``nbytes``) of the current stage finished: its ``result``, or the
        ``error`` that failed it.
        """
        self.sink(Event(DONE, stage=self.current, count=count, nbytes=nbytes, error=error, result=result))

    def note(self, text: str) -> None:
        """A line for a person (a renderer prints it above the progress bars)."""
        self.sink(Event(NOTE, stage=self.current, text=text))
