"""The one progress renderer of the command line: library events (``shardkit.run.events``) as tqdm bars.

Each ``stage`` event closes the bar before it and opens one for the stage (a counter when its total
is unknown); ``done`` events advance it, show a MB/s rate when they carry bytes, and write a
failure above the bar; ``note`` events are lines on stderr. ``quiet``: no bar and no note (tqdm is
not even imported), but a failure is still printed, as a run's errors never go unsaid.

Three choices cover what the commands show beyond that: ``notes_end_bars`` (a pipeline's notes,
"planning...", come between its stages, each on a line of its own after the bar it ends: balance,
prep), ``running_total`` (a result field summed after the bar: index's "N utterances") and
``line_for`` (a line of the caller's written above the bar for a ``done`` event: prep's unreadable
source). Every failed ``done`` event is kept with its stage (:meth:`failed_results`).
"""

from __future__ import annotations

import sys
from typing import Callable

from shardkit.run.events import DONE, NOTE, STAGE, Event


class ProgressBars:
    """``on_event`` for ``RunOptions``: one bar per stage on stderr. Use as a context manager, or call close()."""

    def __init__(self, *, quiet: bool = False, min_total: int = 1, show_notes: bool = True,
                 notes_end_bars: bool = False, running_total: str | None = None,
                 line_for: Callable[[Event], str | None] | None = None, scale_counters: bool = False):
        self.quiet, self.min_total, self.show_notes = quiet, min_total, show_notes
        self.scale_counters = scale_counters  # a stage of unknown total counts in k/M (index's rows), else 1, 2, 3
        self.notes_end_bars, self.running_total, self.line_for = notes_end_bars, running_total, line_for
        self.bar = None
        self.stage = ""
        self.bytes = 0
        self.total = 0
        self._failed: list[tuple[str, Event]] = []

    def __call__(self, event: Event) -> None:
        if event.kind == STAGE:
            self.stage = event.stage
            self._open(event)
        elif event.kind == DONE:
            self._advance(event)
        elif event.kind == NOTE:
            if self.notes_end_bars:
                self.close()
            if self.show_notes and not self.quiet:
                self._write(event.text)

    @property
    def failures(self) -> list[str]:
        """The failure of every failed ``done`` event so far, in order."""
        return [event.failed for _, event in self._failed]

    def failed_results(self, stage_prefix: str = "") -> list:
        """The results of the failed ``done`` events of the stages whose name starts with ``stage_prefix``."""
        return [event.result for stage, event in self._failed if stage.startswith(stage_prefix)]

    def _open(self, event: Event) -> None:
        self.close()
        if self.quiet:
            return
        from tqdm import tqdm

        disable = event.total is not None and event.total < self.min_total
        self.bytes = 0
        self.bar = tqdm(total=event.total, unit=event.unit, file=sys.stderr, dynamic_ncols=True, desc=event.stage,
                        disable=disable, unit_scale=self.scale_counters and event.total is None)

    def _advance(self, event: Event) -> None:
        error = event.failed
        if error:
            self._failed.append((self.stage, event))
        if self.bar is None:
            if error:
                print(f"failed: {error}", file=sys.stderr)
            return
        self.bar.update(event.count)
        self._postfix(event)
        if error:
            self.bar.write(f"failed: {error}", file=sys.stderr)
        line = self.line_for(event) if self.line_for is not None else None
        if line:
            self.bar.write(line, file=sys.stderr)

    def _postfix(self, event: Event) -> None:
        if event.nbytes:
            self.bytes += event.nbytes
            elapsed = self.bar.format_dict["elapsed"] or 1e-9
            self.bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.1f} MB/s", refresh=False)
        elif self.running_total and isinstance(event.result, dict):
            self.total += event.result.get(self.running_total, 0)
            self.bar.set_postfix_str(f"{self.total} {self.running_total}", refresh=False)

    def _write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> ProgressBars:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
