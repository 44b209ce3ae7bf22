"""One value for how a command runs, whatever it does: :class:`RunOptions`.

Every writing command (convert, validate, index, make, balance, prep, ...) takes it whole, so the
same seven choices are not threaded by hand through each signature:

- ``jobs``: local processes [None: all cores]; with Ray, the most tasks in flight;
- ``executor``/``ray_address``: where per-shard tasks run (``shardkit.run.executor``);
- ``split``: ``(I, N)``, only slice I of N of the work (job arrays; ``shardkit.run.split``);
- ``overwrite``: redo work an earlier run finished;
- ``io``: remote-input settings (deadlines, retries, ``pipe:`` permission) for this run's workers
  [None: this process's, as ``--io-timeout``/``--io-retries``/``--allow-pipes`` set them];
- ``on_event``: where progress goes, one :class:`~shardkit.run.events.Event` at a time
  [None: nowhere].

>>> options = RunOptions(jobs=2, split=(1, 3))
>>> options.replace(overwrite=True).overwrite
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from shardkit.errors import UsageError
from shardkit.run.events import Events, EventSink

if TYPE_CHECKING:
    from shardkit.io.remote import IOSettings


@dataclass(frozen=True)
class RunOptions:
    """How a command runs: jobs, executor, Ray address, slice, overwrite, remote I/O and progress."""

    jobs: int | None = None
    executor: str = "local"
    ray_address: str | None = None
    split: tuple[int, int] | None = None
    overwrite: bool = False
    io: IOSettings | None = None
    on_event: EventSink | None = None

    def __post_init__(self):
        from shardkit.run.executor import EXECUTORS

        if self.executor not in EXECUTORS:
            raise UsageError(f"unknown executor {self.executor!r}; choose one of {', '.join(EXECUTORS)}")
        if self.ray_address and self.executor != "ray":
            raise UsageError("--ray-address needs --executor ray")
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"jobs must be 1 or more, not {self.jobs}")

    @property
    def events(self) -> Events:
        """The reporter library code calls (``stage``/``done``/``note``), bound to ``on_event``."""
        return Events(self.on_event)

    def replace(self, **changes) -> RunOptions:
        """A copy with ``changes`` applied (the options are frozen, so a command never alters its caller's)."""
        return dataclasses.replace(self, **changes)

    def run_tasks(self, fn: Callable[[Any], Any], tasks: Iterable[Any], **kwargs) -> Iterator[tuple[int, Any]]:
        """``shardkit.run.executor.run_tasks`` with this value's jobs, executor, Ray address and I/O settings."""
        from shardkit.run.executor import run_tasks

        kwargs.setdefault("jobs", self.jobs)
        return run_tasks(fn, tasks, executor=self.executor, ray_address=self.ray_address, io_settings=self.io,
                         **kwargs)
