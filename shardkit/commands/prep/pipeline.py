"""prep's reading without a worker pool: every bz2 source decoded in parallel blocks on every core of this process.

``lbzip2 -dc`` spreads each file's blocks over every core from its first second. A pool of one process per
source (one decoder thread each) pays what lbzip2 does not: the processes' start-up, every accepted
member's bytes pickled through a pipe to this process, and a last source read on one core while the
others wait. When every source is a local bz2 file and the reading gets at most
:data:`BLOCK_DECODE_CORES` cores (``-j``), prep reads in this process instead:

* indexed_bzip2 decodes each source's blocks on all ``-j`` cores (its parallel mode; the C++ threads
  run outside the GIL), as lbzip2 does;
* a reader thread per source in flight runs :func:`.read.read_source` unchanged (validate's checks,
  the member digests), so the results are the pool's, byte for byte;
* :data:`READ_AHEAD` sources are in flight: the next one's blocks are decoded while the current one's
  last block ends, so no core waits between sources;
* results are handed back in list order, as the pool's ``ordered`` hand-back does, so the plan and
  every output byte are the same for any ``-j`` and either way of reading.

Other sources (plain, gz, zst, xz: one decoder thread per file, Python's tar parsing beside it), more
cores than one process's block decoder keeps busy, and Ray keep the pool.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Iterator, Sequence

from shardkit.commands.prep.read import SourceTask, Stopped, read_source

BLOCK_DECODE_CORES = 8  # cores whose bz2 blocks one process decodes while one thread per source parses and checks
READ_AHEAD = 2  # sources read at once: the next one starts while the current one's last blocks decode
_WAIT_S = 0.2  # how often the main thread looks up from a wait for a signal (Ctrl-C, SIGTERM)


def reads_in_process(paths: Sequence[str], executor: str, jobs: int | None) -> bool:
    """Whether prep reads ``paths`` in this process (see the module docstring): a local executor, ``jobs``
    (default: the usable cores) from 2 to :data:`BLOCK_DECODE_CORES`, and every source a local bz2 file (a
    missing one too: its finding is the same either way). ``jobs`` 1 reads inline already."""
    from shardkit.run.executor import usable_cores

    cores = jobs or usable_cores()
    if executor != "local" or not 1 < cores <= BLOCK_DECODE_CORES:
        return False
    return all(_bz2_or_missing(path) for path in paths)


def _bz2_or_missing(path: str) -> bool:
    from shardkit.io.codecs import detect_codec
    from shardkit.io.remote import is_local

    if not is_local(path):
        return False
    try:
        with open(path, "rb") as f:
            return detect_codec(f.read(16)) == "bz2"
    except FileNotFoundError:
        return True
    except OSError:  # a folder, no permission: the pool's reading reports it as it always has
        return False


def read_in_process(tasks: Sequence[SourceTask], cores: int) -> Iterator[tuple[int, dict]]:
    """``(index, read_source result)`` per task, in list order, read in this process on ``cores`` cores.

    A task that raises (a bug, never a data problem: ``read_source`` reports those) raises here, located at
    its source, as the pool's hand-back raises it. Closing the iterator (an error, Ctrl-C) stops the readers
    at their next utterance.
    """
    stop = threading.Event()
    running: collections.deque[_SourceReader] = collections.deque()
    started = 0
    try:
        for index in range(len(tasks)):
            while started < len(tasks) and len(running) < READ_AHEAD:
                task = dataclasses.replace(tasks[started], options=dataclasses.replace(tasks[started].options,
                                                                                      threads=cores))
                running.append(_SourceReader(task, stop))
                started += 1
                running[-1].start()
            yield index, running.popleft().result()
    finally:
        # the readers end before this returns, their sources closed (see _SourceReader)
        stop.set()
        for reader in running:
            reader.join()


class _SourceReader:
    """One source read by :func:`read_source` in a thread. Not a daemon: an indexed_bzip2 file still decoding
    when the interpreter finalizes aborts the process (SIGABRT, not 130/143), so the interpreter's exit waits
    for it; the run's ``stop`` ends it at its next utterance."""

    def __init__(self, task: SourceTask, stop: threading.Event):
        self.task, self.stop = task, stop
        self._done = threading.Event()
        self._result: dict | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"prep-reader-{task.path}")

    def start(self) -> None:
        """Start reading (after the caller holds this reader: a signal may end the run at any line)."""
        self._thread.start()

    def _run(self) -> None:
        import traceback

        try:
            self._result = read_source(self.task, stop=self.stop)
        except Stopped:
            pass  # the run is ending: nobody takes this result
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
            # the traceback's frames would keep the scan's open source (and its decoder threads) alive
            traceback.clear_frames(err.__traceback__)
            self._error = err
        finally:
            self._done.set()

    def join(self) -> None:
        """Wait for the thread to end (after ``stop``: at its next utterance, its source closed); one a signal
        kept from starting is left to the interpreter's exit, which waits for it."""
        try:
            self._thread.join()
        except RuntimeError:  # not started
            pass

    def result(self) -> dict:
        """The source's result once read; a signal received meanwhile raises here, in the main thread."""
        from shardkit.io import interrupts

        while not self._done.wait(_WAIT_S):
            interrupts.check()
        interrupts.check()
        if self._error is not None:
            located = _located(self._error, self.task.path)
            if located is not self._error:
                located.__cause__ = self._error
            raise located
        return self._result


def _located(err: BaseException, path: str) -> BaseException:
    """A reader's exception as the pool hands it back: a ShardkitError located at the source, anything else
    a TaskFailedError naming it."""
    from shardkit.errors import ShardkitError
    from shardkit.run.executor import TaskFailedError

    if isinstance(err, ShardkitError):
        return err.located(shard=path)
    if not isinstance(err, Exception):  # a KeyboardInterrupt and the like is the run's, not the source's
        return err
    return TaskFailedError(f"task raised {type(err).__name__}: {err}", shard=path)





def corpora_read_in_process(corpus_specs: Sequence[str], executor: str, jobs: int | None) -> bool:
    """:func:`reads_in_process` for the CLI's ``--corpus`` specs, before the run (whether to start the pool's
    forkserver early); a spec or source the run will refuse counts as no (the run says why)."""
    from shardkit.errors import ShardkitError
    from shardkit.io.inputs import expand_shards
    from shardkit.io.mix import parse_corpus_spec

    from shardkit.io.remote import is_local

    try:
        sources = [source for spec in corpus_specs for source in parse_corpus_spec(spec).sources]
        if not all(is_local(source) for source in sources):  # a remote list is fetched once, by the run
            return False
        paths = expand_shards(sources)
    except (ShardkitError, OSError):
        return False
    return bool(paths) and reads_in_process(paths, executor, jobs)
__all__ = ["BLOCK_DECODE_CORES", "READ_AHEAD", "corpora_read_in_process", "read_in_process", "reads_in_process"]
