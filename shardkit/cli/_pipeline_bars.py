"""The progress of the pipelines (balance, prep): ``ProgressBars`` where a note ends the bar before it.

A pipeline's notes come between its stages ("loading...", "planning...", "closing and verifying N
shards..."): each is shown on a line of its own after the bar of the stage that ended, as these
commands always showed them. Balance also names, in its last line, the shards an "index CORPUS"
stage could not read (:attr:`PipelineBars.unreadable`); prep writes a line above its bar for a source
it could not read (``done_line``).
"""

from __future__ import annotations

import sys
from typing import Callable

from shardkit.cli._progress import ProgressBars
from shardkit.run.events import DONE, NOTE, STAGE, Event


class PipelineBars(ProgressBars):
    """``on_event`` for balance and prep: one bar per stage, a note after the bar it ends, the shards
    that could not be indexed kept in :attr:`unreadable`, and ``done_line(event)``'s line (if any) written
    above the bar."""

    def __init__(self, *, quiet: bool = False, done_line: Callable[[Event], str | None] | None = None):
        super().__init__(quiet=quiet)
        self.stage = ""
        self.unreadable: list[str] = []
        self.done_line = done_line

    def __call__(self, event: Event) -> None:
        if event.kind == STAGE:
            self.stage = event.stage
        elif event.kind == NOTE:
            self.close()
        elif event.kind == DONE and event.failed and self.stage.startswith("index "):
            self.unreadable.append(event.result["shard"])
        super().__call__(event)
        if event.kind == DONE and self.done_line is not None and self.bar is not None:
            line = self.done_line(event)
            if line:
                self.bar.write(line, file=sys.stderr)
