"""libFLAC's stream encoder in verify mode, through ctypes: FLAC members proven sample by sample as they are made.

libFLAC's verify mode runs its own decoder over every frame as the encoder writes it and compares the
decoded samples with the ones handed in (``FLAC__stream_encoder_set_verify``); a mismatch stops the
encoder. That is the proof a second decode of the finished member gives, without a second parse of
the bytes, a second pass through libsndfile or a conversion of the decoded samples (issue 39 measured
the difference). The samples handed in are compared with the source's block by block, and the frames
kept are exactly the bytes the verify decoder read.

soundfile (libsndfile) has its own libFLAC built in but does not export it, so this module loads a
libFLAC of the same version beside it (pyFLAC's bundled one, or the system's) and uses it only when a
probe (8, 16 and 24 bits, one and two channels) encodes to exactly soundfile's bytes at the level asked
for: the members written are the ones soundfile would write. Without such a library, transcoding falls back to soundfile plus a decode.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib.util
import io
import itertools
import os

import numpy as np

from shardkit.errors import VerificationError

LIBRARY_ENV = "SHARDKIT_LIBFLAC"  # a libFLAC to try first; "none" turns the direct path off
_VERIFY_STATES = {3: "the verify decoder failed", 4: "a decoded sample differs from the one encoded"}
_WRITE_FATAL = 1  # FLAC__STREAM_ENCODER_WRITE_STATUS_FATAL_ERROR
_WRITE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32,
                          ctypes.c_uint32, ctypes.c_void_p)
_SEEK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p)
_TELL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p)
_DEFAULT_LEVEL = 5  # libsndfile's when no level is asked for


def _candidates():
    """libFLAC builds to try, in order: $SHARDKIT_LIBFLAC, pyFLAC's bundled one, the system's (looked up only
    when the others do not serve: ctypes.util runs ldconfig for it)."""
    if os.environ.get(LIBRARY_ENV):
        yield os.environ[LIBRARY_ENV]
    spec = importlib.util.find_spec("pyflac")  # finds the package without importing it (no cffi modules loaded)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        yield from sorted(glob.glob(os.path.join(folder, "libraries", "*", "libFLAC*.so*")))
    system = ctypes.util.find_library("FLAC")
    if system:
        yield system


@functools.cache
def _load(path: str):
    """The library at ``path`` with the signatures used here, or None when it does not load."""
    try:  # another machine's build (pyFLAC ships several) or a library without these symbols: not used
        lib = ctypes.CDLL(path)
        lib.FLAC__stream_encoder_new.restype = ctypes.c_void_p
        lib.FLAC__stream_encoder_init_stream.argtypes = [ctypes.c_void_p, _WRITE, _SEEK, _TELL, ctypes.c_void_p,
                                                         ctypes.c_void_p]
        lib.FLAC__stream_encoder_process_interleaved.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32]
        for name in ("delete", "finish", "get_state", "get_verify"):
            getattr(lib, "FLAC__stream_encoder_" + name).argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return lib


def _probe_signal(frames: int, channels: int, bits: int) -> np.ndarray:
    """A deterministic signal with speech's shape (tones under noise) that exercises LPC, stereo decorrelation
    and every sample width."""
    t = np.arange(frames)[:, None] / 16000
    tones = np.sin(2 * np.pi * 190 * t * (1 + np.arange(channels))) + 0.3 * np.sin(2 * np.pi * 2300 * t)
    # noise from a 64-bit LCG over the sample index: deterministic like a seeded generator, without importing
    # numpy.random (and ssl, which it pulls in) into every run that transcodes
    index = np.arange(frames * channels, dtype=np.uint64) + np.uint64(frames + channels + bits)
    bits24 = (index * np.uint64(6364136223846793005) + np.uint64(1442695040888963407)) >> np.uint64(40)
    noise = (bits24.astype(np.float64) / (1 << 24) - 0.5).reshape(frames, channels) * 0.17
    return np.round((tones * 0.4 + noise) * (2 ** (bits - 1) - 1)).astype(np.int32)


def _same_as_soundfile(lib, level: int | None) -> bool:
    """Whether ``lib`` encodes probes of every width, one and two channels, at ``level``, to soundfile's bytes."""
    import soundfile as sf

    kwargs = {} if level is None else {"compression_level": level / 8}
    for channels, bits, subtype in ((1, 16, "PCM_16"), (2, 16, "PCM_16"), (1, 24, "PCM_24"), (2, 8, "PCM_S8")):
        wide = _probe_signal(4700, channels, bits)
        samples = (wide << (16 - bits)).astype(np.int16) if bits <= 16 else wide << 8  # as soundfile reads them
        buf = io.BytesIO()
        sf.write(buf, samples, 16000, format="FLAC", subtype=subtype, **kwargs)
        encoder = VerifiedEncoder(lib, 16000, channels, bits, level, verify=False)
        encoder.write(samples)
        if encoder.finish() != buf.getvalue():
            return False
    return True


@functools.cache
def encoder_library(level: int | None):
    """The first libFLAC that writes exactly soundfile's bytes at ``level`` (None: the default), or None (then
    soundfile encodes, and a decode verifies). Probed once per process and level."""
    if os.environ.get(LIBRARY_ENV, "").lower() == "none":
        return None
    for lib in filter(None, map(_load, _candidates())):
        try:
            if _same_as_soundfile(lib, level):
                return lib
        except Exception:  # noqa: BLE001 - a library that cannot encode the probe is simply not used
            continue
    return None


class _Sink:
    """The encoder's output: the metadata blocks, which libFLAC rewrites at the end (STREAMINFO's MD5, length and
    frame sizes), then frames, only ever appended. A write that would land anywhere else fails the encoder."""

    def __init__(self):
        self.head = bytearray()
        self.frames: list[bytes] = []
        self.frame_bytes = 0
        self.position = 0

    def write(self, buffer, size: int, samples: int) -> int:
        end = len(self.head) + self.frame_bytes
        data = ctypes.string_at(buffer, size)
        if samples:  # a frame: it goes at the end, and only there
            if self.position != end:
                return _WRITE_FATAL
            self.frames.append(data)
            self.frame_bytes += size
        elif self.position == end and not self.frames:
            self.head += data
        elif self.position + size <= len(self.head):  # the closing rewrite of STREAMINFO
            self.head[self.position:self.position + size] = data
        else:
            return _WRITE_FATAL
        self.position += size
        return 0

    def value(self) -> bytes:
        """The stream's bytes: the metadata as last rewritten, then every frame."""
        return bytes(self.head) + b"".join(self.frames)


# the callbacks are made once (a ctypes callback per encoder costs more than the encoder's setup); each encoder
# passes its key as libFLAC's client data, which finds its sink
_SINKS: dict[int, _Sink] = {}
_KEYS = itertools.count(1)


@_WRITE
def _write(_encoder, buffer, size, samples, _frame, key):
    try:
        return _SINKS[key].write(buffer, size, samples)
    except BaseException:  # noqa: BLE001 - ctypes would print and drop it (a Ctrl-C: io.interrupts raises it
        return _WRITE_FATAL  # again after the member); the encoder must stop rather than lose a frame


@_SEEK
def _seek(_encoder, offset, key):
    _SINKS[key].position = offset
    return 0


@_TELL
def _tell(_encoder, offset, key):
    offset[0] = _SINKS[key].position
    return 0


class VerifiedEncoder:
    """One FLAC stream: ``write`` blocks of samples (frames x channels, integer), then ``finish`` for the bytes.

    With ``verify`` (libFLAC's verify mode), every frame is decoded as it is made and compared with the
    samples handed in, and each block handed in is compared with the caller's; ``finish`` raises
    VerificationError on any difference.
    """

    def __init__(self, lib, sample_rate: int, channels: int, bits: int, level: int | None, verify: bool = True):
        self.lib, self.sample_rate, self.bits, self.channels = lib, sample_rate, bits, channels
        self.handle = ctypes.c_void_p(lib.FLAC__stream_encoder_new())
        if not self.handle:
            raise MemoryError("libFLAC could not allocate an encoder")
        self.sink = _Sink()
        self.key = next(_KEYS)
        _SINKS[self.key] = self.sink
        settings = (("set_verify", int(verify)), ("set_do_md5", 1), ("set_channels", channels),
                    ("set_bits_per_sample", bits), ("set_sample_rate", sample_rate),
                    ("set_compression_level", _DEFAULT_LEVEL if level is None else level))
        if not all(getattr(lib, "FLAC__stream_encoder_" + call)(self.handle, ctypes.c_uint(value))
                   for call, value in settings):
            self.close()
            raise ValueError(f"libFLAC refused {channels} channels, {bits} bits, {sample_rate} Hz, level {level}")
        if lib.FLAC__stream_encoder_init_stream(self.handle, _write, _seek, _tell, None, self.key) != 0:
            state = lib.FLAC__stream_encoder_get_state(self.handle)
            self.close()
            raise ValueError(f"libFLAC refused the stream (encoder state {state})")
        # read back: a proof counts only if libFLAC really runs its verify decoder
        self.verifying = bool(lib.FLAC__stream_encoder_get_verify(self.handle))
        self._wide = np.empty((0, channels), np.int32)
        self.frames = 0

    def write(self, block: np.ndarray) -> None:
        """Encode ``block`` (frames x channels) of samples as soundfile reads them: left-justified in int16 (8 and
        16 bits) or int32 (24 bits)."""
        shift = block.dtype.itemsize * 8 - self.bits
        if len(self._wide) < len(block):
            self._wide = np.empty((len(block), self.channels), np.int32)
        wide = _widen(block, shift, self._wide[:len(block)])
        ok = self.lib.FLAC__stream_encoder_process_interleaved(self.handle, wide.ctypes.data, len(block))
        # what libFLAC was given (and verified its frames against) must be the caller's samples
        if ok and not np.array_equal(np.left_shift(wide, shift) if shift else wide, block):
            self.close()
            raise VerificationError("the samples handed to libFLAC differ from the source's")
        if not ok:
            self._fail()
        self.frames += len(block)

    def finish(self) -> bytes:
        """The FLAC bytes, after libFLAC verified the last frame and rewrote STREAMINFO; checks that STREAMINFO
        states this stream's rate, channels, width and the frames written, with the frames directly after it."""
        if not self.lib.FLAC__stream_encoder_finish(self.handle):
            self._fail()
        self.close()
        data = self.sink.value()
        _check_streaminfo(data, (self.sample_rate, self.channels, self.bits, self.frames), len(self.sink.head))
        return data

    def _fail(self):
        state = self.lib.FLAC__stream_encoder_get_state(self.handle)
        self.close()
        if state in _VERIFY_STATES:
            raise VerificationError(f"libFLAC's verify mode: {_VERIFY_STATES[state]}")
        raise RuntimeError(f"libFLAC's encoder stopped (state {state})")

    def close(self) -> None:
        """Free libFLAC's encoder (again: a no-op)."""
        if self.handle:
            self.lib.FLAC__stream_encoder_delete(self.handle)
            self.handle = ctypes.c_void_p()
            _SINKS.pop(self.key, None)

    def __del__(self):
        if getattr(self, "handle", None):  # one its owner never closed (closed ones, at exit too: nothing to do)
            self.close()


def _widen(block: np.ndarray, shift: int, out: np.ndarray) -> np.ndarray:
    """``block``'s samples right-justified into ``out`` (int32, libFLAC's input)."""
    return np.right_shift(block, shift, out=out, casting="unsafe")


def _check_streaminfo(data: bytes, expected: tuple, head_size: int) -> None:
    """VerificationError unless ``data`` starts with a STREAMINFO stating ``expected`` (rate, channels, bits,
    frames) and the first frame's sync code follows the metadata (``head_size`` bytes)."""
    info = int.from_bytes(data[18:26], "big") if len(data) >= 42 and data[:4] == b"fLaC" else None
    stated = None if info is None else (info >> 44, ((info >> 41) & 7) + 1, ((info >> 36) & 31) + 1,
                                        info & ((1 << 36) - 1))
    if stated != expected or (expected[3] and data[head_size:head_size + 1] != b"\xff"):
        raise VerificationError(f"libFLAC's stream states {stated} (rate, channels, bits, frames), not {expected}")
