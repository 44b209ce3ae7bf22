"""The writing side of prep: every output shard open at once, filled as the plan places utterances.

Each output shard is written incrementally under its temporary name (``lifecycle.AtomicFile``), so
the work folder never holds more than the training shards themselves; at the end each is closed,
read back and verified, fsynced and renamed. A killed run leaves only temporary files, which the
next run removes before it starts again.
"""

from __future__ import annotations

import os
import queue
import re
import resource
import threading

from shardkit.errors import UsageError
from shardkit.io.layouts.nemo import CONFIG, MANIFEST, PARTS_DIR
from shardkit.io.layouts.shar import SHAR_DIR

OUTPUT_NAME = re.compile(r"shards_\d{9}\.tar(\.[a-z0-9]+)?")
LINES_SUFFIX = ".lines"  # a layout: the plain spool of a companion's lines, beside it, while its shard is open
LAYOUT_FOLDERS = (SHAR_DIR, PARTS_DIR)  # where a layout's files go below OUT_DIR, besides OUT_DIR itself
# the names of a layout's files, whose temporary files a killed run may leave
LAYOUT_NAME = re.compile(r"audio_\d+\.tar|recording\.\d{6,}\.tar|(cuts\.\d{6,}|manifest_\d+)\.jsonl\.gz"
                         r"(\.lines)?|" + re.escape(MANIFEST) + "|" + re.escape(CONFIG))
QUEUE_ITEMS = 256  # members waiting per writer thread
QUEUE_BYTES = 64 << 20  # member bytes waiting for all writer threads together (beyond the planner's pool)
_FINISH, _ABORT, _FLUSH = object(), object(), object()


def raise_open_file_limit(needed: int) -> None:
    """Every output shard is an open file: lift the soft limit to the hard one if it is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < needed:
            raise UsageError(f"{needed - 64} output shards need {needed} open files, the limit is {hard}: "
                             f"ask for fewer, longer shards (--shard-duration)")


class OutputShards:
    """The open output shards: ``add(shard, name, data, digest)``, then ``finish()`` (or ``abort()``).

    Each shard belongs to one writer thread (shard ``s`` to thread ``s % threads``), which takes its
    members from a queue in the order they were added: the bytes of a shard depend on that order
    alone, never on the thread count. Threads, not processes: the work (sha256 of every member read
    back and of every file written, compression, write and fsync) releases the GIL, and a thread
    takes the member bytes this process already holds, where a writer process would need one more
    copy of the corpus through a pipe. ``finish`` closes, verifies, fsyncs and renames the shards on
    the same threads, so the read-back at the end runs on every core instead of one.
    """

    def __init__(self, paths: list[str], codec: str, level: int | None, threads: int = 1,
                 resume: list[tuple[dict, object]] | None = None):
        """``resume``: per shard, a :meth:`checkpoint` entry and the sha256 of its prefix (``check_partials``):
        the temporary files of a killed run are continued from there (plain tar only)."""
        from shardkit.io.codecs import open_writer
        from shardkit.io.files import HashingFile
        from shardkit.io.tar import TarWriter

        raise_open_file_limit(len(paths) + 64)
        self.paths = paths
        self._files, self._hashing, self._outs, self._tars = [], [], [], []
        self.written: list[list[tuple[str, bytes]]] = [[] for _ in paths]
        self._threads: list[threading.Thread] = []
        self._queues: list[queue.Queue] = []
        self._error: BaseException | None = None
        self._entries: list[dict | None] = [None] * len(paths)
        self._queued = 0  # bytes added but not yet written
        self._room = threading.Condition()
        try:
            for s, path in enumerate(paths):
                saved, prefix = resume[s] if resume else (None, None)
                target = _open_target(path, saved)
                self._files.append(target)
                hashing = HashingFile(target.file)
                out = open_writer(hashing, codec, level)
                tar = TarWriter(out)
                if saved is not None:  # continue where the checkpoint was taken
                    hashing.sha256, hashing.size = prefix, saved["size"]
                    tar._offset, tar.members = saved["tar_offset"], len(saved["written"])
                    self.written[s] = [tuple(w) for w in saved["written"]]
                self._hashing.append(hashing)
                self._outs.append(out)
                self._tars.append(tar)
        except BaseException:
            self.abort()
            raise
        for t in range(max(1, min(threads, len(paths)))):
            # bounded: a writer that falls behind holds up the reader, never the memory
            self._queues.append(queue.Queue(maxsize=QUEUE_ITEMS))
            thread = threading.Thread(target=self._work, args=(t,), name=f"prep-writer-{t}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def add(self, shard: int, name: str, data: bytes, digest: bytes) -> None:
        """Queue one member for ``shard`` (``digest``: ``member_digest`` of ``data``, computed by the reader)."""
        self._enqueue(shard, (shard, name, data, digest), len(data))

    def _enqueue(self, shard: int, item: tuple, nbytes: int) -> None:
        """Queue ``item`` (``nbytes`` of member data) for the writer thread of ``shard``."""
        self._raise_error()
        with self._room:  # bounded in bytes, not only in members: a member may be many MB
            while self._queued > QUEUE_BYTES and self._error is None:
                self._room.wait(0.5)
            self._queued += nbytes
        self._queues[shard % len(self._queues)].put(item)

    def checkpoint(self) -> list[dict]:
        """Wait until every queued member is written and flushed to the kernel; then, per shard, what a rerun
        needs to continue it: its temporary file, size, sha256 of those bytes, tar offset, members written.
        (Flushed, not fsynced: a kill leaves the bytes in the page cache; after a crash, the rerun's prefix
        check finds a file that does not match and starts again.)"""
        self._barrier()
        return [{"tmp": self._files[s].tmp, "size": self._hashing[s].size,
                 "sha256": self._hashing[s].sha256.hexdigest(), "tar_offset": self._tars[s].offset,
                 "written": list(self.written[s])} for s in range(len(self.paths))]

    def _barrier(self) -> None:
        """Return when every writer thread has written and flushed what was queued; raise a writer's error."""
        done = [threading.Event() for _ in self._queues]
        for q, event in zip(self._queues, done):
            q.put((_FLUSH, event))
        for event in done:
            while not event.wait(0.5):
                self._raise_error()
        self._raise_error()

    def finish(self, verify: bool) -> list[dict]:
        """Close, verify (read back), fsync and rename every shard; one entry per shard, in shard order.
        Every member is written before the first shard is renamed: a failed write renames none."""
        self._barrier()
        for q in self._queues:
            q.put((_FINISH, verify))
        self._join()
        self._raise_error()
        return list(self._entries)

    def abort(self, keep_files: bool = False) -> None:
        """Stop the writer threads and remove every temporary file; ``keep_files``: close them instead, for a
        rerun to continue from the last resume point (the files named there)."""
        for q in self._queues:
            q.put((_ABORT,))
        self._join()
        for target in self._files:
            if not keep_files:
                target.discard()
            elif target.file is not None and not target.file.closed:
                try:
                    target.file.close()
                except OSError:  # a full disk: the rerun's prefix check finds the file short and starts again
                    pass

    # the writer threads
    def _work(self, t: int) -> None:
        q = self._queues[t]
        while True:
            item = q.get()
            if item[0] is _ABORT:
                return
            if self._error is not None:  # drain without writing, so that add() never blocks on a dead writer
                if self._drained(item):
                    return
                continue
            try:
                if item[0] is _FINISH:
                    self._close_all(t, item[1])
                    return
                if item[0] is _FLUSH:
                    self._flush(t, item[1])
                    continue
                self._write_item(item)
            except BaseException as err:  # handed to the main thread at its next add() or finish()
                self._error = self._error or err
                if item[0] is _FINISH:
                    return

    @staticmethod
    def _drained(item: tuple) -> bool:
        """After a writer's error, an item taken and not written: a flush is answered (nobody waits on it);
        whether it is the finish that ends the thread."""
        if item[0] is _FLUSH:
            item[1].set()
        return item[0] is _FINISH

    def _close_all(self, t: int, verify: bool) -> None:
        """Thread ``t``'s shards closed, verified, fsynced and renamed (:meth:`_close`), their entries kept."""
        for s in range(t, len(self.paths), len(self._queues)):
            self._entries[s] = self._close(s, verify)

    def _flush(self, t: int, done) -> None:
        """Thread ``t``'s shards flushed to the kernel, then ``done`` set."""
        from shardkit.io.files import output_error

        for s in range(t, len(self.paths), len(self._queues)):
            try:
                self._files[s].file.flush()  # plain tar only: a compressor's flush would change its bytes
            except OSError as err:  # a full disk: named, not a traceback from a thread
                raise output_error(err, self.paths[s]) from None
        done.set()

    def _write_item(self, item: tuple) -> None:
        """One queued item written (here a member: ``(shard, name, data, digest)``), its bytes released."""
        shard, name, data, digest = item
        try:
            self._write_member(shard, name, data, digest)
        finally:
            self._release(len(data))

    def _release(self, nbytes: int) -> None:
        with self._room:
            self._queued -= nbytes
            self._room.notify()

    def _write_member(self, shard: int, name: str, data: bytes, digest: bytes) -> None:
        try:
            self._tars[shard].add(name, data)
            self.written[shard].append((name, digest))
        except OSError as err:  # a full disk, a vanished folder: named, not a traceback from a thread
            from shardkit.io.files import output_error

            raise output_error(err, self.paths[shard]).located(member=name) from None

    def _close(self, s: int, verify: bool) -> dict:
        from shardkit.io.files import combine_digests
        from shardkit.run.lifecycle import verify_members

        from shardkit.io.files import output_error

        path = self.paths[s]
        try:
            tar_bytes = self._tars[s].close()
            self._outs[s].close()
        except OSError as err:  # the end-of-archive blocks or a compressor's last frame did not fit
            raise output_error(err, path) from None
        self._files[s].commit(verify_members(self.written[s], shard=path) if verify else None,
                              sync_while_verifying=True)
        hashing = self._hashing[s]
        return {"path": path, "size": hashing.size, "sha256": hashing.sha256.hexdigest(),
                "members": len(self.written[s]), "members_digest": combine_digests(self.written[s]),
                "tar_bytes": tar_bytes}

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error


def _open_target(path: str, saved: dict | None):
    """A new temporary file for ``path``, or the one a checkpoint names, cut back to the checkpoint's size."""
    from shardkit.io.files import AtomicFile

    target = AtomicFile(path, buffering=1 << 20)
    if saved is None:
        return target.__enter__()
    target.tmp = saved["tmp"]
    target.file = open(saved["tmp"], "r+b", buffering=1 << 20)
    target.file.truncate(saved["size"])
    target.file.seek(saved["size"])
    return target


def check_partials(saved: list[dict]) -> list | None:
    """Per shard, the sha256 object of the first ``size`` bytes of its temporary file, if every file is there
    and those bytes are what the checkpoint wrote; else None (the rerun starts again). A shard of a trainer's
    layout (its entry has ``lines``: the spooled metadata lines, see ``.layout``) gives the pair (tar's, lines')."""
    hashes = []
    for entry in saved:
        h = _prefix_hash(entry)
        if h is not None and "lines" in entry:
            lines = _prefix_hash(entry["lines"])
            h = None if lines is None else (h, lines)
        if h is None:
            return None
        hashes.append(h)
    return hashes


def _prefix_hash(entry: dict):
    """The sha256 object of the first ``entry["size"]`` bytes of ``entry["tmp"]`` if they hash to
    ``entry["sha256"]``, else None."""
    import hashlib

    h = hashlib.sha256()
    try:
        with open(entry["tmp"], "rb") as f:
            left = entry["size"]
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    return None
                h.update(chunk)
                left -= len(chunk)
    except OSError:
        return None
    return h if h.hexdigest() == entry["sha256"] else None


def output_leftovers(out_dir: str) -> list[str]:
    """The output names a killed run's temporary files stand for (``.shards_N.tar*.<token>.partial``, and those
    of a trainer's layout in OUT_DIR and its subfolders, LAYOUT_FOLDERS)."""
    from shardkit.io.files import PARTIAL_SUFFIX

    names = []
    for folder in [out_dir] + [os.path.join(out_dir, sub) for sub in LAYOUT_FOLDERS]:
        try:
            entries = list(os.scandir(folder))
        except OSError:  # no such subfolder
            continue
        for entry in entries:
            if entry.name.startswith(".") and entry.name.endswith(PARTIAL_SUFFIX):
                stem = entry.name[1:-len(PARTIAL_SUFFIX)].rpartition(".")[0]
                if OUTPUT_NAME.fullmatch(stem) or LAYOUT_NAME.fullmatch(stem):
                    names.append(os.path.join(folder, stem))
    return names
