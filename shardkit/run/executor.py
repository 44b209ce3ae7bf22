"""Where per-shard tasks run: in this process, in a local process pool, or on a Ray cluster.

``run_tasks(fn, tasks, executor=...)`` is the one loop every command uses for its per-shard work;
``fn(task)`` is a module-level function of one picklable argument (convert's ``_task((src, dst,
settings))``, validate's ``_validate_task((path, options))``). Results come back as
``(index, result)``, in completion order or, with ``ordered=True``, in task order; either way the
command assembles the same report and manifest, so every executor writes the same bytes.

- ``local``: ``jobs == 1`` runs inline; otherwise a forkserver process pool. A worker process that
  dies (killed, out of memory) breaks the whole pool; a new pool reruns the tasks that were in it,
  one at a time, so that the one that dies again is known, and retries it up to ``retries`` times.
  Workers die with the main process: each sets ``PR_SET_PDEATHSIG`` (its parent is the
  forkserver, which sets it too) and watches the main process's pid, so a ``kill -9`` of a run
  leaves no worker writing and no forkserver or resource tracker behind.
- ``ray``: one Ray task per item, ``max_retries=retries`` (Ray re-runs a task whose worker or node
  died; a task that raises is not retried). Connects to ``ray_address`` (default ``auto``: the
  cluster named by ``RAY_ADDRESS`` or started with ``ray start`` on this node), or starts a local
  instance on this machine's cores when none is running and no address was given.

Both bound the tasks submitted but not yet handed back (``max_in_flight``), so a million-shard list
never sits in a scheduler queue or in memory at once. Data problems are results (convert returns
``status: failed``); a task that raises is re-raised here as the same ``ShardkitError`` located at
the task's shard, or as ``TaskFailedError`` naming the shard and the exception, unless the command
passes ``on_error``, which turns it into that shard's result (convert, validate, index: any error
inside a task is a finding, never the run's end). Every worker gets this process's input settings
(``shardkit.io.remote``: deadlines, retries, pipe permission). While Ray runs, stdout carries
only the command's report (``quiet_stdout``); losing the cluster raises ``ClusterError`` (exit 3).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from shardkit.errors import ClusterError, ShardkitError, UsageError
from shardkit.io import interrupts
from shardkit.io.files import pid_alive

EXECUTORS = ("local", "ray")
RAY_INSTALL_HINT = "pip install 'shardkit[ray]'"


class TaskFailedError(ShardkitError):
    """A task raised instead of returning a result, or its worker died more often than retried."""

    check = "task"


def task_name(task: Any, index: int) -> str:
    """What an error calls a task: its first string field (the shard path), else its position."""
    fields = task if isinstance(task, (tuple, list)) else (task,)
    for value in fields:
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
    return f"task {index}"


def _located(err: BaseException, task: Any, index: int) -> ShardkitError:
    name = task_name(task, index)
    if isinstance(err, ShardkitError):
        return err.located(shard=name)
    return TaskFailedError(f"task raised {type(err).__name__}: {err}", shard=name)


class _Raised:
    """A task's exception, carried to the point where its result would have been handed back."""

    def __init__(self, error: BaseException):
        self.error = error


def _failed(err: BaseException, task: Any, index: int) -> _Raised:
    located = _located(err, task, index)
    if located is not err:
        located.__cause__ = err
    return _Raised(located)


class _Prepared:
    """A task list whose items are prepared when they are fetched (see ``run_tasks``' ``prepare``)."""

    def __init__(self, items: list, prepare: Callable[[Any], Any]):
        self._items = items
        self._prepare = prepare

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int):
        return self._prepare(self._items[index])

    def __iter__(self):
        return (self._prepare(item) for item in self._items)


class _Window:
    """Tasks submitted but not yet handed to the caller; submission waits while it is full."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.outstanding = 0

    @property
    def open(self) -> bool:
        return self.outstanding < self.limit


@dataclass(frozen=True)
class TaskPolicy:
    """How one batch of tasks is fed, retried, handed back and failed, whatever executor runs it.

    ``max_in_flight``: tasks submitted but not yet handed back [default: 2 x jobs locally; with Ray,
    ``jobs`` or twice the cluster's CPUs]. ``retries``: reruns of a task whose worker died. ``ordered``:
    results in task order (else completion order). ``on_result(index, result)``: called for each result
    just before it is yielded. ``initializer(*initargs)``: once in each worker process before its first
    task (inline: once, here). ``prepare(task)``: turns a task into ``fn``'s argument just before it is
    submitted, here, so only the tasks in flight are held in full (make builds a shard's utterance list
    this way). ``on_error(task, error)``: the error policy, see :func:`run_tasks`.
    """

    max_in_flight: int | None = None
    retries: int = 3
    ordered: bool = False
    on_result: Callable[[int, Any], None] | None = None
    initializer: Callable[..., None] | None = None
    initargs: tuple = ()
    prepare: Callable[[Any], Any] | None = None
    on_error: Callable[[Any, ShardkitError], Any] | None = None


def run_tasks(fn: Callable[[Any], Any], tasks: Iterable[Any], *, jobs: int | None = None,
              executor: str = "local", ray_address: str | None = None, io_settings=None,
              policy: TaskPolicy | None = None, **policy_fields) -> Iterator[tuple[int, Any]]:
    """Run ``fn(task)`` for every task; an iterator of ``(index, result)``. See the module docstring.

    ``jobs``: local processes [default: all cores]; with Ray, the most tasks running at once
    [default: twice the cluster's CPUs in flight]. ``policy`` (:class:`TaskPolicy`), or its fields as
    keywords (``ordered=True``, ``retries=1``, ``on_error=...``; given both, the keywords win): how the
    tasks are fed, retried and handed back. Arguments are checked, and Ray is connected, when this is
    called; tasks run as the iterator is consumed.

    ``on_error(task, error)``: the error policy. Given, a task that raised anything (an fsspec,
    aiohttp or botocore error, a subprocess failure) or whose worker died more often than retried
    becomes the result ``on_error`` returns for it (the command's finding for that shard), and the
    other tasks run on; without it, that error is raised here. Losing the Ray cluster is never a
    task's error: it raises ``ClusterError``. ``io_settings``: the remote-input settings every worker
    gets (``shardkit.io.remote.IOSettings``) [default: this process's].
    """
    policy = dataclasses.replace(policy or TaskPolicy(), **policy_fields)
    items = list(tasks)
    tasks = items if policy.prepare is None else _Prepared(items, policy.prepare)
    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if policy.retries < 0:
        raise UsageError("retries must be 0 or more")
    # every worker reads inputs with this process's deadlines and pipe permission (shardkit.io.remote)
    from shardkit.io.remote import settings_for_workers

    workers_io = settings_for_workers() if io_settings is None else io_settings
    setup = (os.getpid(), workers_io, policy.initializer, policy.initargs)  # _worker_setup's arguments
    if executor == "ray":
        completions, window = _ray_completions(fn, tasks, jobs, ray_address, policy, setup)
    else:
        completions, window = _local_completions(fn, tasks, jobs, policy, setup)
    on_error = policy.on_error
    handler = None if on_error is None else (lambda index, error: on_error(items[index], error))
    return _hand_back(completions, window, len(tasks), policy.ordered, policy.on_result, handler)


def _ray_completions(fn, tasks, jobs: int | None, ray_address: str | None, policy: TaskPolicy,
                     setup: tuple) -> tuple[Iterator, _Window]:
    """One Ray task per item, ``setup`` (``_worker_setup``'s arguments) run first in each worker."""
    quiet_stdout()
    ray = connect_ray(ray_address)
    cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
    window = _Window(policy.max_in_flight or jobs or 2 * cpus)
    return _iter_ray(ray, fn, tasks, window, policy.retries, _worker_setup, setup), window


def _local_completions(fn, tasks, jobs: int | None, policy: TaskPolicy, setup: tuple) -> tuple[Iterator, _Window]:
    """Inline for one job, else a process pool; ``setup`` (``_worker_setup``'s arguments) run first in each worker."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks) or 1))
    if jobs == 1:
        window = _Window(1)
        return _iter_inline(fn, tasks, window, _worker_setup, setup), window
    window = _Window(policy.max_in_flight or 2 * jobs)
    return _iter_pool(fn, tasks, jobs, window, policy.retries, _worker_setup, setup), window


def _worker_setup(parent_pid: int, io_settings, initializer, initargs) -> None:
    """First thing in every worker (and inline): the parent's input settings (another process only: inline,
    this process keeps its own), then the command's initializer."""
    if os.getpid() != parent_pid:
        from shardkit.io.remote import configure_io

        configure_io(io_settings)
    if initializer is not None:
        initializer(*initargs)


def _hand_back(completions, window: _Window, total: int, ordered: bool, on_result,
               policy=None) -> Iterator[tuple[int, Any]]:
    # In ordered mode, results that finish early wait here; the window counts them, so at most
    # ``limit`` results are ever held, and the lowest unreturned index is always still in flight.
    held: dict[int, Any] = {}
    next_index = 0
    with closing(completions):  # an early stop shuts the pool down or cancels the Ray tasks
        for index, result in completions:
            interrupts.check()  # a signal whose first raise a C callback swallowed stops the run here
            if ordered:
                held[index] = result
                ready = []
                while next_index in held:
                    ready.append((next_index, held.pop(next_index)))
                    next_index += 1
            else:
                ready = [(index, result)]
            for done_index, done in ready:
                window.outstanding -= 1
                if isinstance(done, _Raised):
                    if policy is None or isinstance(done.error, ClusterError):
                        raise done.error
                    done = policy(done_index, done.error)
                if on_result:
                    on_result(done_index, done)
                yield done_index, done
    assert not held and (not ordered or next_index == total), "ordered hand-back lost a result"


def _iter_inline(fn, tasks, window: _Window, initializer, initargs):
    if initializer is not None:
        initializer(*initargs)
    for index, task in enumerate(tasks):
        interrupts.check()
        window.outstanding += 1
        try:
            result = fn(task)
        except Exception as err:
            result = _failed(err, task, index)
        yield index, result


def _iter_pool(fn, tasks, jobs: int, window: _Window, retries: int, initializer, initargs):
    from concurrent.futures import FIRST_COMPLETED, wait

    run = _PoolRun(fn, tasks, jobs, retries, initializer, initargs)
    try:
        while run.next_index < len(tasks) or run.pending or run.suspects:
            run.submit(window)
            done, _ = wait(run.pending, return_when=FIRST_COMPLETED)
            broken = yield from run.collect(done)
            if broken:
                yield from run.recover()
    except KeyboardInterrupt:
        stop_workers(run.pool)  # a signal to this process only (a scheduler's SIGTERM) must not wait for every task
        raise
    finally:
        run.pool.shutdown(wait=True, cancel_futures=True)


STOP_WORKERS_SECONDS = 10.0


def stop_workers(pool, grace: float = STOP_WORKERS_SECONDS) -> None:
    """SIGTERM every worker of ``pool``, which stops its task the way the main process stops (its ``with``
    blocks remove their temporary files) and exits; SIGKILL for one still running after ``grace`` seconds."""
    import signal

    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        try:
            os.kill(process.pid, signal.SIGTERM)
        except (ProcessLookupError, TypeError):
            pass
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1.0)


class _PoolRun:
    """The state of one local process pool run, and how it survives a worker's death.

    When a worker dies the whole pool breaks and every task in it is lost, with no telling which
    one killed it. The lost tasks become suspects and run again one at a time in a new pool: a
    death then has one culprit, which is charged an attempt and runs alone again, up to ``retries``.
    """

    def __init__(self, fn, tasks, jobs: int, retries: int, initializer, initargs):
        self.fn, self.tasks, self.jobs, self.retries = fn, tasks, jobs, retries
        self.initializer, self.initargs = initializer, initargs
        self.pool = self._new_pool()
        self.pending: dict = {}  # future -> task index
        self.suspects: list[int] = []
        self.alone: int | None = None  # the suspect running by itself
        self.attempts: dict[int, int] = {}
        self.next_index = 0

    def _new_pool(self):
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(max_workers=self.jobs, mp_context=forkserver_context(),
                                   initializer=_pool_worker_init,
                                   initargs=(os.getpid(), self.initializer, self.initargs))

    def submit(self, window: _Window) -> None:
        """The next suspect alone, or new tasks while the window has room."""
        if self.suspects and not self.pending:
            self.alone = self.suspects.pop(0)
            self.pending[self.pool.submit(_in_worker, self.fn, self.tasks[self.alone])] = self.alone
        while self.alone is None and self.next_index < len(self.tasks) and window.open:
            self.pending[self.pool.submit(_in_worker, self.fn, self.tasks[self.next_index])] = self.next_index
            window.outstanding += 1
            self.next_index += 1

    def collect(self, done):
        """Yield ``(index, result)`` of each finished future in task order; returns whether the pool broke."""
        from concurrent.futures.process import BrokenProcessPool

        broken = False
        for future in sorted(done, key=self.pending.__getitem__):
            index = self.pending[future]
            try:
                result = future.result()
            except BrokenProcessPool:
                broken = True
                continue
            except Exception as err:
                result = _failed(err, self.tasks[index], index)
            del self.pending[future]
            if index == self.alone:
                self.alone = None
            yield index, result
        return broken

    def recover(self):
        """After a worker died: charge the task that ran alone (yielding its failure once it is out of
        retries), or make every lost task a suspect; then a new pool."""
        alone = self.alone
        if alone is not None:
            self.attempts[alone] = self.attempts.get(alone, 0) + 1
            if self.attempts[alone] > self.retries:
                times = "once" if self.retries == 0 else f"each of the {self.retries + 1} times it ran"
                yield alone, _Raised(TaskFailedError(f"its worker process died (killed, out of memory or "
                                                     f"crashed) {times}", shard=task_name(self.tasks[alone], alone)))
            else:
                self.suspects.insert(0, alone)
            self.alone = None
        else:
            self.suspects.extend(sorted(self.pending.values()))
        self.pending.clear()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = self._new_pool()


# --- workers that die with their parent --------------------------------------------------------

_PR_SET_PDEATHSIG = 1
WATCHDOG_SECONDS = 0.5


def die_with_parent(signal_number: int | None = None) -> bool:
    """Ask the kernel to kill this process when its parent dies (Linux ``PR_SET_PDEATHSIG``).

    Returns False where there is no such call (not Linux); the caller's watchdog still works.
    """
    import signal

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal_number or signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(pid: int, interval: float = WATCHDOG_SECONDS) -> None:
    """A daemon thread that kills this process (and any child it started in its process group
    is left to PR_SET_PDEATHSIG) as soon as process ``pid`` is gone."""
    import signal
    import threading

    def watch():
        while True:
            time.sleep(interval)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGKILL)
            except PermissionError:  # pid reused by another user's process: ours is gone
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="shardkit-parent-watchdog", daemon=True).start()


def _pool_worker_init(main_pid: int, initializer, initargs) -> None:
    """First thing in every pool worker: die with the forkserver (PDEATHSIG) and with the main
    process (watchdog: the worker's parent is the forkserver, not the main process), and stop on
    SIGINT/SIGTERM as the main process does (``_in_worker`` then ends the worker)."""
    die_with_parent()
    if os.getppid() == 1 or not pid_alive(main_pid):
        os._exit(1)
    watch_parent(main_pid)
    interrupts.install(exit_when_idle=lambda: not _running)
    if initializer is not None:
        initializer(*initargs)


_running: list = []  # the task this pool worker runs now (empty between tasks)


def _in_worker(fn, task):
    """``fn(task)`` in a pool worker; a worker that was signalled exits once the task's ``with`` blocks have
    removed its temporary files (the main process stops too: no worker is left waiting for tasks)."""
    _running.append(task)
    try:
        return fn(task)
    finally:
        _running.clear()
        if interrupts.received() is not None:
            os._exit(128 + interrupts.received())


def forkserver_context():
    """The forkserver multiprocessing context, whose server process dies with this one.

    The server imports ``shardkit.run.deathsig`` first, which sets its PR_SET_PDEATHSIG: a kill -9
    of the main process then ends the forkserver, and with it (PDEATHSIG again) every worker, and
    the resource tracker, whose last writers they were. A rerun right after finds no one writing.
    """
    return _set_forkserver_preload([])


_DEATHSIG_MODULE = "shardkit.run.deathsig"


def _set_forkserver_preload(modules: list[str]):
    """The forkserver context, its preload list set to: ``shardkit.run.deathsig`` first when this is the
    main thread, then what was asked before, then ``modules``. (Takes effect when the server starts.)"""
    import multiprocessing
    import threading

    context = multiprocessing.get_context("forkserver")
    try:
        from multiprocessing import forkserver

        current = list(getattr(forkserver._forkserver, "_preload_modules", []) or [])
    except (ImportError, AttributeError):
        current = []
    # PR_SET_PDEATHSIG follows the parent *thread*: a server started from a thread that ends
    # would die with it, so only a server started from the main thread asks for it
    first = [_DEATHSIG_MODULE] if threading.current_thread() is threading.main_thread() else []
    wanted = list(dict.fromkeys(first + [m for m in current + modules if m != _DEATHSIG_MODULE]))
    if wanted != current:
        context.set_forkserver_preload(wanted)
    return context


def preload_in_forkserver(modules: list[str]) -> None:
    """Have the forkserver import ``modules`` once when it starts (after ``shardkit.run.deathsig``), so
    that every pool worker forked from it starts with them instead of importing them itself: one
    import of numpy, soundfile and a command's task module for the run, not one per worker. No
    effect once the server is running (it is one per process, started by the first pool)."""
    _set_forkserver_preload(modules)


def start_forkserver(modules: list[str]) -> None:
    """Start the forkserver now, importing ``modules`` (see :func:`preload_in_forkserver`), so that its
    start-up runs while this process is still importing and checking its arguments."""
    from multiprocessing import forkserver

    preload_in_forkserver(modules)
    forkserver.ensure_running()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a job scheduler or taskset set it), else
    every core the machine has (platforms without affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def local_pool(jobs: int):
    """A forkserver ``ProcessPoolExecutor`` whose workers die with this process (for the few
    commands that drive a pool themselves rather than through ``run_tasks``)."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=jobs, mp_context=forkserver_context(), initializer=_pool_worker_init,
                               initargs=(os.getpid(), None, ()))


# --- Ray ---------------------------------------------------------------------------------------

_WORKER_INIT_TOKEN: str | None = None


def _ray_call(fn, task, init):
    """The body of every Ray task: run the initializer once per worker process, then ``fn(task)``."""
    global _WORKER_INIT_TOKEN
    if init is not None:
        token, boxed = init
        if _WORKER_INIT_TOKEN != token:
            import ray

            initializer, initargs = ray.get(boxed[0])
            initializer(*initargs)
            _WORKER_INIT_TOKEN = token
    return fn(task)


def connect_ray(address: str | None = None):
    """Connect this process to Ray (once) and return the ``ray`` module.

    ``address`` None tries ``auto`` (``RAY_ADDRESS`` or a ``ray start`` cluster on this node) and
    starts a local instance on all cores when none is running; an explicit address must answer.
    A process that already called ``ray.init`` keeps its connection.
    """
    try:
        import ray
    except ImportError:
        raise UsageError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL_HINT}") from None
    if ray.is_initialized():
        return ray
    import logging

    quiet_stdout()  # before Ray starts any process: they inherit this process's stdout

    options = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    if address:
        _check_reachable(address)
    try:
        ray.init(address=address or "auto", **options)
    except ConnectionError as err:
        if address:
            raise UsageError(f"cannot reach the Ray cluster at --ray-address {address} ({err})") from None
        ray.init(address="local", num_cpus=os.cpu_count() or 1, **options)
    return ray


def _check_reachable(address: str) -> None:
    """Refuse a ``host:port`` nobody listens on now: ray.init would retry it for minutes."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto", "local" and the like: Ray resolves those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as err:
        raise UsageError(f"cannot reach the Ray cluster at --ray-address {address} "
                         f"({err.strerror or err})") from None


def _iter_ray(ray, fn, tasks, window: _Window, retries: int, initializer, initargs):
    remote = ray.remote(_ray_call).options(max_retries=retries, retry_exceptions=False, num_cpus=1)
    # the boxed reference reaches each worker unresolved, so it fetches the initargs only once
    init = (uuid.uuid4().hex, [ray.put((initializer, initargs))]) if initializer is not None else None
    pending: dict = {}  # ObjectRef -> task index
    next_index = 0
    watch = _ClusterWatch(ray)
    try:
        while next_index < len(tasks) or pending:
            while next_index < len(tasks) and window.open:
                pending[remote.remote(fn, tasks[next_index], init)] = next_index
                window.outstanding += 1
                next_index += 1
            for ref in _wait_one(ray, pending, watch):
                index = pending.pop(ref)
                yield index, _ray_result(ray, ref, tasks[index], index, retries, watch)
    finally:
        if not watch.lost:  # a lost cluster cannot be asked to cancel anything
            for ref in pending:
                ray.cancel(ref)


def _ray_result(ray, ref, task, index: int, retries: int, watch: _ClusterWatch):
    """A finished Ray task's result, or its error as a ``_Raised``; a lost cluster raises ``ClusterError``."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        # err.cause is the task's own exception; err itself carries the remote traceback
        result = _failed(getattr(err, "cause", None) or err, task, index)
        result.error.__cause__ = err
        return result
    except ray.exceptions.RaySystemError as err:
        watch.lost = True
        raise ClusterError(f"lost the Ray cluster ({_first_line(err)}); rerun to resume") from err
    except ray.exceptions.RayError as err:
        # the worker or node died on every attempt, an object was lost, out of memory
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        error = TaskFailedError(f"Ray could not finish the task in {retries + 1} attempts "
                                f"({type(err).__name__}: {first_line})", shard=task_name(task, index))
        error.__cause__ = err
        return _Raised(error)


CLUSTER_LOST_SECONDS = 20.0  # below Ray's own 60 s wait for its GCS, after which Ray ends the process itself
_WAIT_SECONDS = 2.0


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class _ClusterWatch:
    """Whether the cluster's head (its GCS) still answers, checked while no task finishes.

    When the head or the connection to it is lost, Ray waits 60 s and then ends this process from its
    C++ core with exit status 1, with no Python exception: shardkit must notice first, so that the
    run ends as a ``ClusterError`` (exit code 3, a JSON error document, the output folder's lock
    released, its temporary files removed) and a rerun resumes."""

    def __init__(self, ray):
        self.lost = False
        self._since: float | None = None
        self._address = None
        try:
            host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
            self._address = (host, int(port))
        except Exception:  # an older Ray, or a client connection: only Ray's own errors tell then
            pass

    def check(self) -> None:
        if self._address is None:
            return
        import socket

        try:
            socket.create_connection(self._address, timeout=_WAIT_SECONDS).close()
            self._since = None
            return
        except OSError as err:
            reason = err.strerror or str(err)
        now = time.monotonic()
        self._since = self._since or now
        if now - self._since >= CLUSTER_LOST_SECONDS:
            self.lost = True
            raise ClusterError(f"lost the Ray cluster: its head at {self._address[0]}:{self._address[1]} has not "
                               f"answered for {now - self._since:.0f} s ({reason}); rerun to resume")


def _wait_one(ray, pending: dict, watch: _ClusterWatch) -> list:
    """Refs of finished tasks (at least one), watching the cluster while none finishes."""
    while True:
        try:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=_WAIT_SECONDS)
        except ray.exceptions.RaySystemError as err:
            watch.lost = True
            raise ClusterError(f"lost the Ray cluster ({_first_line(err)}); rerun to resume") from err
        if done:
            return done
        watch.check()


# --- stdout while Ray runs ------------------------------------------------------------------------

_REPORT_STREAM = None


def quiet_stdout() -> None:
    """Send everything but shardkit's report to stderr while Ray runs.

    Ray prints its own lines (task retries, worker deaths, ``(raylet)`` messages) from Python and from
    the processes it starts: ``--json`` must still put exactly one document on stdout. File
    descriptor 1 and ``sys.stdout`` become stderr; the report goes through :func:`report_stdout`.
    """
    global _REPORT_STREAM
    if _REPORT_STREAM is not None and sys.stdout is sys.stderr:
        return
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd == 1:
        _REPORT_STREAM = os.fdopen(os.dup(1), "w", encoding="utf-8")
        sys.stderr.flush()
        os.dup2(2, 1)
    else:  # already captured (a test runner): the report goes where stdout went
        _REPORT_STREAM = sys.stdout
    sys.stdout = sys.stderr


def report_stdout():
    """Where a command's report goes: stdout, or where it went before Ray took it (:func:`quiet_stdout`)."""
    return _REPORT_STREAM if _REPORT_STREAM is not None and sys.stdout is sys.stderr else sys.stdout
