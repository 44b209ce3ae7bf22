"""Is there a faster verified FLAC path than libsndfile's encode + decode here? (issue 17 part 2)

Encodes the same speech-like audio (``shardkit.synth``, 16 kHz mono int16) with:

* soundfile (libsndfile with the libFLAC it bundles, what shardkit uses), and decodes it back;
* the system's libFLAC called directly through ctypes (``libFLAC.so.12``, Debian's libflac12),
  with its verify mode (an internal decoder checks every frame as it is encoded: the guarantee
  shardkit's separate decode gives) and its MD5 signature on or off, at levels 0 and 5.

CPU seconds, best of ``--repeat`` (this process only). A direct libFLAC path would have to beat
libsndfile's encode + decode to be worth a binding of shardkit's own.

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


def load_libflac():
    name = ctypes.util.find_library("FLAC") or "libFLAC.so.12"
    try:
        lib = ctypes.CDLL(name)
    except OSError as err:
        raise SystemExit(f"no system libFLAC ({err}); apt-get install libflac12") from None
    lib.FLAC__stream_encoder_new.restype = ctypes.c_void_p
    return lib


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
    from shardkit.synth import speech_like

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
    lib = load_libflac()
    for level in (0, 5):
        for verify in (False, True):
            for md5 in (False, True):
                seconds, data = best_cpu(lambda: libflac_encode(lib, samples, verify=verify, md5=md5, level=level),
                                         args.repeat)
                assert np.array_equal(sf.read(io.BytesIO(data), dtype="int16")[0], samples)
                rows[f"libFLAC direct level {level}, verify {'on' if verify else 'off'}, "
                     f"md5 {'on' if md5 else 'off'}"] = seconds
    audio_hours = len(samples) / RATE / 3600
    emit_results({"machine": machine_info(), "audio_hours": round(audio_hours, 4),
                  "cpu_s": {k: round(v, 4) for k, v in rows.items()},
                  "hours_per_cpu_s": {k: round(audio_hours / v, 3) for k, v in rows.items()}}, args.json_out)


if __name__ == "__main__":
    main(parse_args())
