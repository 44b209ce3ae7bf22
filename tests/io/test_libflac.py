"""FLAC through libFLAC's verify mode (shardkit.io.libflac): soundfile's very bytes, every sample proven, and
soundfile plus a second decode when no such libFLAC is found."""

import io

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit.errors import VerificationError
from shardkit.io import libflac, transcode
from shardkit.io.synth import speech_like
from shardkit.io.transcode import read_pcm, transcode_member


def wav(samples, rate, subtype="PCM_16"):
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


CASES = {
    "16bit-mono-16k": (speech_like(2.3, 16000, seed=1), 16000, "PCM_16"),
    "16bit-stereo-44k1": (speech_like(0.7, 44100, seed=2, channels=2), 44100, "PCM_16"),
    "24bit-mono-8k": (speech_like(0.77, 8000, seed=3).astype(np.int32) << 16, 8000, "PCM_24"),
    "24bit-stereo-48k": (speech_like(0.4, 48000, seed=4, channels=2).astype(np.int32) << 16, 48000, "PCM_24"),
    "8bit-mono-8k": (speech_like(0.3, 8000, seed=5), 8000, "PCM_U8"),
    "one-frame": (np.array([7], np.int16), 16000, "PCM_16"),
    "silence": (np.zeros(1600, np.int16), 16000, "PCM_16"),
    "full-scale": (np.array([32767, -32768] * 3000, np.int16), 16000, "PCM_16"),
}


@pytest.fixture
def direct():
    """libFLAC's direct path, or a skip naming why it is not here (pyFLAC, in the `flac` extra, brings it)."""
    libflac.encoder_library.cache_clear()
    if libflac.encoder_library(None) is None:
        pytest.skip("no libFLAC writing soundfile's bytes here (pip install shardkit[flac])")
    yield
    libflac.encoder_library.cache_clear()


@pytest.fixture
def soundfile_only(monkeypatch):
    """The fallback: no libFLAC found."""
    monkeypatch.setenv(libflac.LIBRARY_ENV, "none")
    libflac.encoder_library.cache_clear()
    yield
    monkeypatch.delenv(libflac.LIBRARY_ENV)
    libflac.encoder_library.cache_clear()


def _transcode_all(level):
    return {case: transcode_member("c/k.wav", wav(*CASES[case]), "flac", level) for case in CASES}


@pytest.mark.parametrize("level", [None, 0, 3, 8])
def test_direct_path_writes_soundfiles_bytes_and_the_same_report(direct, request, level):
    fast = _transcode_all(level)
    request.getfixturevalue("soundfile_only")
    assert libflac.encoder_library(level) is None
    slow = _transcode_all(level)
    for case in CASES:
        assert fast[case][2]["action"] == "transcoded", case
        assert fast[case] == slow[case], case
        samples, rate, subtype = CASES[case]
        decoded = read_pcm(fast[case][1])
        assert np.array_equal(decoded[0], read_pcm(wav(samples, rate, subtype))[0]) and decoded[1] == rate


def test_direct_path_proves_by_libflacs_verify_mode_and_does_not_decode_again(direct, monkeypatch):
    monkeypatch.setattr(transcode, "_same_samples", lambda *a: pytest.fail("decoded again"))
    _, flac, info = transcode_member("c/k.wav", wav(*CASES["16bit-stereo-44k1"]), "flac")
    assert info["action"] == "transcoded" and flac[:4] == b"fLaC"


def test_a_wrong_sample_handed_to_libflac_is_caught(direct, monkeypatch):
    real = libflac._widen

    def off_by_one(block, shift, out):
        real(block, shift, out)
        out[len(out) // 2] += 1
        return out

    monkeypatch.setattr(libflac, "_widen", off_by_one)
    with pytest.raises(VerificationError, match="samples handed to libFLAC differ"):
        transcode_member("c/k.wav", wav(*CASES["16bit-mono-16k"]), "flac")


def test_without_verify_soundfile_encodes_and_libflac_claims_no_proof(direct, monkeypatch):
    encoder = libflac.VerifiedEncoder(libflac.encoder_library(None), 16000, 1, 16, None, verify=False)
    assert not encoder.verifying
    encoder.close()
    monkeypatch.setattr(libflac, "VerifiedEncoder", lambda *a, **k: pytest.fail("libFLAC used without verify"))
    _, flac, info = transcode_member("c/k.wav", wav(*CASES["16bit-mono-16k"]), "flac", verify=False)
    assert info["action"] == "transcoded" and np.array_equal(read_pcm(flac)[0], read_pcm(wav(*CASES["16bit-mono-16k"]))[0])


def test_soundfile_path_catches_an_encoder_writing_a_wrong_sample(soundfile_only, monkeypatch):
    real = transcode._SoundfileEncoder.write

    def flips_a_sample(self, block):
        block = block.copy()
        block[len(block) // 2] ^= 1
        real(self, block)

    monkeypatch.setattr(transcode._SoundfileEncoder, "write", flips_a_sample)
    with pytest.raises(VerificationError, match="did not reproduce the samples"):
        transcode_member("c/k.wav", wav(*CASES["16bit-mono-16k"]), "flac")


def test_a_write_aimed_into_the_frames_fails_the_stream():
    sink = libflac._Sink()
    head, frame = (b"h" * 8), (b"\xff\xf8" + b"f" * 30)
    assert sink.write(head, len(head), 0) == 0 and sink.write(frame, len(frame), 4096) == 0
    sink.position = 4  # libFLAC's closing rewrite of STREAMINFO lands inside the metadata: fine
    assert sink.write(b"ok", 2, 0) == 0 and sink.value() == b"hhhhokhh" + frame
    sink.position = 7  # one that would reach into the first frame is refused
    assert sink.write(b"no", 2, 0) == libflac._WRITE_FATAL
    sink.position = 3  # and so is a frame anywhere but at the end
    assert sink.write(frame, len(frame), 4096) == libflac._WRITE_FATAL
    assert sink.value() == b"hhhhokhh" + frame


def test_streaminfo_that_states_other_facts_is_refused(direct):
    encoder = libflac.VerifiedEncoder(libflac.encoder_library(None), 16000, 1, 16, None)
    encoder.write(CASES["16bit-mono-16k"][0].reshape(-1, 1))
    encoder.frames += 1  # as if a block had been lost on the way
    with pytest.raises(VerificationError, match="states"):
        encoder.finish()


def test_a_libflac_writing_other_bytes_than_soundfile_is_not_used(monkeypatch):
    real_write = sf.write

    def another_level(file, data, rate, **kwargs):  # soundfile's bytes at another level: they differ
        real_write(file, data, rate, **{**kwargs, "compression_level": 1.0})

    libflac.encoder_library.cache_clear()
    monkeypatch.setattr(sf, "write", another_level)
    try:
        assert libflac.encoder_library(0) is None
    finally:
        libflac.encoder_library.cache_clear()


def test_an_exception_inside_the_write_callback_stops_the_encoder_instead_of_losing_a_frame(direct, monkeypatch):
    def interrupted(self, buffer, size, samples):
        if samples:
            raise KeyboardInterrupt  # what a Ctrl-C landing in the callback looks like
        return real(self, buffer, size, samples)

    real = libflac._Sink.write
    monkeypatch.setattr(libflac._Sink, "write", interrupted)
    encoder = libflac.VerifiedEncoder(libflac.encoder_library(None), 16000, 1, 16, None)
    with pytest.raises(RuntimeError, match="encoder stopped"):
        encoder.write(CASES["16bit-mono-16k"][0].reshape(-1, 1))
        encoder.finish()


@pytest.mark.parametrize("container", ["WAV", "WAVEX"])
def test_16bit_samples_read_from_the_data_chunk_are_libsndfiles(container):
    samples = speech_like(0.9, 22050, seed=9, channels=3)
    buf = io.BytesIO()
    sf.write(buf, samples, 22050, format=container, subtype="PCM_16")
    source = buf.getvalue()
    _, flac, info = transcode_member("c/k.wav", source, "flac")
    by_libsndfile, rate, _ = read_pcm(source)
    assert info["pcm_sha256"] == transcode.pcm_digest(by_libsndfile, rate)
    assert np.array_equal(read_pcm(flac)[0], by_libsndfile) and info["frames"] == len(samples)


_SUBTYPES = {8: "PCM_U8", 16: "PCM_16", 24: "PCM_24"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.integers(1, 9000), channels=st.integers(1, 3), bits=st.sampled_from([8, 16, 24]),
       rate=st.sampled_from([8000, 16000, 44100]), level=st.sampled_from([None, 0, 5, 8]), seed=st.integers(0, 99))
def test_any_signal_gives_soundfiles_bytes_and_decodes_to_the_source(direct, frames, channels, bits, rate, level,
                                                                     seed):
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.normal(0, 2 ** (bits - 6), (frames, channels)), axis=0)  # speech-like: correlated
    top = 2 ** (bits - 1)
    samples = np.clip(np.round(walk), -top, top - 1).astype(np.int32) << (32 - bits)
    source = wav(samples, rate, _SUBTYPES[bits])
    _, flac, info = transcode_member("c/k.wav", source, "flac", level)
    by_libsndfile = read_pcm(source)[0]
    assert info["action"] == "transcoded" and np.array_equal(read_pcm(flac)[0], by_libsndfile)
    reference = io.BytesIO()
    sf.write(reference, by_libsndfile, rate, format="FLAC", subtype={8: "PCM_S8"}.get(bits, _SUBTYPES[bits]),
             **({} if level is None else {"compression_level": level / 8}))
    assert flac == reference.getvalue()


def test_a_member_of_several_blocks_gives_soundfiles_bytes(direct):
    samples = speech_like(2.0, 16000, seed=11, channels=2)
    samples = np.concatenate([samples] * 9)  # 288 k frames: more than one of the WAV reader's blocks
    assert len(samples) > transcode._PcmWav.block_frames
    source = wav(samples, 16000)
    _, flac, info = transcode_member("c/k.wav", source, "flac")
    reference = io.BytesIO()
    sf.write(reference, samples, 16000, format="FLAC", subtype="PCM_16")
    assert flac == reference.getvalue() and info["frames"] == len(samples)
    assert info["pcm_sha256"] == transcode.pcm_digest(read_pcm(source)[0], 16000)
