"""Fault points for the signal tests of tests/run/test_faults.py, imported by every Python process (main,
forkserver, pool workers) started with this folder first on PYTHONPATH. Nothing happens unless asked:

- ``SHARDKIT_TEST_STALL_COMMIT=N``: the N-th ``AtomicFile.commit`` of a process first creates
  ``$SHARDKIT_TEST_MARK.<pid>`` and then sleeps, its temporary file written and not yet renamed: the test
  signals the run at a known point, in the middle of a write.
- ``SHARDKIT_TEST_SIGINT_IN_SOUNDFILE=N``: the N-th write libsndfile makes through soundfile's virtual I/O
  (a cffi callback, where FLAC transcoding writes) sends SIGINT to this process: the raise happens inside
  the callback, which cffi swallows, as a Ctrl-C 3 s into `convert --audio flac` did.
- ``SHARDKIT_TEST_SIGINT_IN_LIBFLAC=N``: the N-th frame libFLAC hands to ``shardkit.io.libflac``'s write
  callback (a ctypes callback, which would print and drop the raise) sends SIGINT to this process.
"""

import os

_STALL_AT = int(os.environ.get("SHARDKIT_TEST_STALL_COMMIT") or 0)
_SIGINT_AT = int(os.environ.get("SHARDKIT_TEST_SIGINT_IN_SOUNDFILE") or 0)
_SIGINT_IN_LIBFLAC_AT = int(os.environ.get("SHARDKIT_TEST_SIGINT_IN_LIBFLAC") or 0)


def _stall_commits():
    import time

    from shardkit.io import files

    original = files.AtomicFile.commit
    seen = [0]

    def commit(self, *args, **kwargs):
        seen[0] += 1
        if seen[0] == _STALL_AT:
            with open(f"{os.environ['SHARDKIT_TEST_MARK']}.{os.getpid()}", "w") as mark:
                mark.write(self.tmp)
            time.sleep(120)
        return original(self, *args, **kwargs)

    files.AtomicFile.commit = commit


class _SignallingFile:
    def __init__(self, f, counter):
        self._f, self._counter = f, counter

    def write(self, data):
        self._counter[0] += 1
        if self._counter[0] == _SIGINT_AT:
            import signal

            os.kill(os.getpid(), signal.SIGINT)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _signal_in_soundfile():
    import soundfile

    original = soundfile.SoundFile._init_virtual_io
    counter = [0]

    def init_virtual_io(self, file):
        return original(self, _SignallingFile(file, counter) if hasattr(file, "write") else file)

    soundfile.SoundFile._init_virtual_io = init_virtual_io


def _signal_in_libflac():
    import signal

    from shardkit.io import libflac

    original = libflac._Sink.write
    frames = [0]

    def write(self, buffer, size, samples):
        frames[0] += bool(samples)
        if samples and frames[0] == _SIGINT_IN_LIBFLAC_AT:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, buffer, size, samples)

    libflac._Sink.write = write


if _STALL_AT:
    _stall_commits()
if _SIGINT_IN_LIBFLAC_AT:
    _signal_in_libflac()
if _SIGINT_AT:
    _signal_in_soundfile()
