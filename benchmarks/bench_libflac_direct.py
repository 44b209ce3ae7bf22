"""Is there a faster verified FLAC path than libsndfile's encode + decode here? (issue 17 part 2)

Encodes the same speech-like audio (``shardkit.io.synth``, 16 kHz mono int16) with:

* soundfile (libsndfile with the libFLAC it bundles, what shardkit uses), and decodes it back;
* libFLAC called directly through ctypes: the system's (``libFLAC.so.12``, Debian's libflac12) and
  the one pyFLAC bundles (when pyflac is installed), with its verify mode (an internal decoder
  checks every frame as it is encoded: the guarantee shardkit's separate decode gives) and its MD5
  signature on or off, at levels 0 (fixed predictors), 3 (the cheapest LPC level) and 5.

CPU seconds, best of ``--repeat`` (this process only). A direct libFLAC path would have to beat
libsndfile's encode + decode to be worth a binding of shardkit's own; issue 39 made that binding
(``shardkit.io.libflac``, verify mode on, MD5 on, soundfile's bytes), measured against the old path by
``benchmarks/bench_flac_verified.py``.

    flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_libflac_direct.py --minutes 10 --repeat 5
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import io
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RATE = 16000
_WRITE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_ubyte), ctypes.c_size_t,
                          ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json-out", default=None)
    return p.parse_args()


def load_libflacs() -> dict:
    """The libFLAC builds on this machine: the system's and pyFLAC's bundled one."""
    import glob

    found = {}
    candidates = [("system", ctypes.util.find_library("FLAC") or "libFLAC.so.12")]
    try:
        import pyflac

        bundled = glob.glob(os.path.join(os.path.dirname(pyflac.__file__), "libraries", "linux-x86_64", "libFLAC*.so"))
        candidates += [("pyflac-bundled", path) for path in bundled[:1]]
    except ImportError:
        pass
    for label, name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.FLAC__stream_encoder_new.restype = ctypes.c_void_p
        found[label] = lib
    if not found:
        raise SystemExit("no libFLAC here (apt-get install libflac12, or pip install pyflac)")
    return found


def libflac_encode(lib, samples: np.ndarray, *, verify: bool, md5: bool, level: int) -> bytes:
    chunks: list[bytes] = []

    @_WRITE
    def write(_encoder, buffer, size, _samples, _frame, _data):
        chunks.append(ctypes.string_at(buffer, size))
        return 0

    encoder = ctypes.c_void_p(lib.FLAC__stream_encoder_new())
    try:
        for call, value in (("set_verify", int(verify)), ("set_do_md5", int(md5)), ("set_compression_level", level),
                            ("set_channels", 1), ("set_bits_per_sample", 16), ("set_sample_rate", RATE)):
            getattr(lib, "FLAC__stream_encoder_" + call)(encoder, ctypes.c_uint(value))
        lib.FLAC__stream_encoder_set_total_samples_estimate(encoder, ctypes.c_uint64(len(samples)))
        if lib.FLAC__stream_encoder_init_stream(encoder, write, None, None, None, None) != 0:
            raise RuntimeError("libFLAC refused the stream settings")
        wide = samples.astype(np.int32)
        if not lib.FLAC__stream_encoder_process_interleaved(encoder, wide.ctypes.data_as(ctypes.c_void_p),
                                                            ctypes.c_uint(len(samples))):
            raise RuntimeError(f"libFLAC encoder state {lib.FLAC__stream_encoder_get_state(encoder)}")
        lib.FLAC__stream_encoder_finish(encoder)
    finally:
        lib.FLAC__stream_encoder_delete(encoder)
    return b"".join(chunks)


def best_cpu(fn, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        result = fn()
        best = min(best, time.process_time() - start)
    return best, result


def main(args) -> None:
    import soundfile as sf
    from common import emit_results, machine_info

    from shardkit.io.synth import speech_like

    pieces = [speech_like(10.0, RATE, seed=i) for i in range(int(args.minutes * 6))]
    samples = np.concatenate(pieces)
    if samples.dtype != np.int16:
        samples = np.clip(np.round(samples * 32767), -32768, 32767).astype(np.int16)
    samples = samples.reshape(-1)
    rows = {}

    def sf_encode():
        out = io.BytesIO()
        sf.write(out, samples, RATE, format="FLAC", subtype="PCM_16")
        return out.getvalue()

    seconds, encoded = best_cpu(sf_encode, args.repeat)
    rows["soundfile encode (level 5)"] = seconds
    seconds, decoded = best_cpu(lambda: sf.read(io.BytesIO(encoded), dtype="int16")[0], args.repeat)
    assert np.array_equal(decoded, samples)
    rows["soundfile decode"] = seconds
    rows["soundfile encode + decode (the verified limit)"] = rows["soundfile encode (level 5)"] + seconds
    sizes = {"soundfile encode (level 5)": len(encoded) / samples.nbytes}
    for label, lib in load_libflacs().items():
        for level in (0, 3, 5):
            for verify, md5 in ((False, True), (True, True), (True, False)):
                seconds, data = best_cpu(lambda: libflac_encode(lib, samples, verify=verify, md5=md5, level=level),
                                         args.repeat)
                assert np.array_equal(sf.read(io.BytesIO(data), dtype="int16")[0], samples)
                row = f"libFLAC {label} level {level}, verify {'on' if verify else 'off'}, md5 {'on' if md5 else 'off'}"
                rows[row], sizes[row] = seconds, len(data) / samples.nbytes
    audio_hours = len(samples) / RATE / 3600
    emit_results({"machine": machine_info(), "audio_hours": round(audio_hours, 4),
                  "cpu_s": {k: round(v, 4) for k, v in rows.items()},
                  "hours_per_cpu_s": {k: round(audio_hours / v, 3) for k, v in rows.items()},
                  "vs_verified_limit": {k: round(rows["soundfile encode + decode (the verified limit)"] / v, 3)
                                        for k, v in rows.items()},
                  "size_vs_pcm": {k: round(v, 4) for k, v in sizes.items()}}, args.json_out)


if __name__ == "__main__":
    main(parse_args())
