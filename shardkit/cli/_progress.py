"""The one progress renderer of the command line: library events (``shardkit.run.events``) as tqdm bars.

Each ``stage`` event closes the bar before it and opens one for the stage (a counter when its total
is unknown); ``done`` events advance it, show a MB/s rate when they carry bytes, and write a
failure above the bar; ``note`` events are lines on stderr. ``quiet``: no bar and no note (tqdm is
not even imported), but a failure is still printed, as a run's errors never go unsaid.
"""

from __future__ import annotations

import sys

from shardkit.run.events import DONE, NOTE, STAGE, Event


class ProgressBars:
    """``on_event`` for ``RunOptions``: one bar per stage on stderr. Use as a context manager, or call close()."""

    def __init__(self, *, quiet: bool = False, min_total: int = 1, show_notes: bool = True):
        self.quiet, self.min_total, self.show_notes = quiet, min_total, show_notes
        self.bar = None
        self.bytes = 0
        self.failures: list[str] = []

    def __call__(self, event: Event) -> None:
        if event.kind == STAGE:
            self._open(event)
        elif event.kind == DONE:
            self._advance(event)
        elif event.kind == NOTE and self.show_notes and not self.quiet:
            self._write(event.text)

    def _open(self, event: Event) -> None:
        self.close()
        if self.quiet:
            return
        from tqdm import tqdm

        disable = event.total is not None and event.total < self.min_total
        self.bytes = 0
        self.bar = tqdm(total=event.total, unit=event.unit, file=sys.stderr, dynamic_ncols=True, desc=event.stage,
                        disable=disable, unit_scale=event.total is None)

    def _advance(self, event: Event) -> None:
        error = event.failed
        if error:
            self.failures.append(error)
        if self.bar is None:
            if error:
                print(f"failed: {error}", file=sys.stderr)
            return
        self.bar.update(event.count)
        if event.nbytes:
            self.bytes += event.nbytes
            elapsed = self.bar.format_dict["elapsed"] or 1e-9
            self.bar.set_postfix_str(f"{self.bytes / elapsed / 1e6:.1f} MB/s", refresh=False)
        if error:
            self.bar.write(f"failed: {error}", file=sys.stderr)

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


class ShardProgress:
    """TRANSITIONAL: ``on_plan``/``on_result`` callbacks over :class:`ProgressBars`, for commands not yet
    reporting through ``RunOptions.on_event``. Removed once validate and make report events."""

    def __init__(self, desc: str, *, quiet: bool = False, byte_key: str | None = None, min_total: int = 1):
        self.desc, self.byte_key = desc, byte_key
        self.bars = ProgressBars(quiet=quiet, min_total=min_total)

    def on_plan(self, total: int) -> None:
        self.bars(Event(STAGE, stage=self.desc, total=total))

    def on_result(self, entry: dict) -> None:
        moved = entry.get(self.byte_key) or 0 if self.byte_key and entry.get("status") != "skipped" else 0
        self.bars(Event(DONE, stage=self.desc, result=entry, nbytes=moved))

    def close(self) -> None:
        self.bars.close()
