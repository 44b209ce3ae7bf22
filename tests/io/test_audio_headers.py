"""Property tests of the header readers (issue 24): whatever a WAV's fmt/data fields or a FLAC's STREAMINFO
and metadata say, shardkit's header facts are either libsndfile's decode (frames, rate, channels) or a
finding (an AudioError, with its check name when the header is what is wrong)."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkit.errors import AudioError
from shardkit.io.audio import HEADER_CHECKS, AudioHeaderError, header_facts, open_soundfile, read_to_end
from shardkit.io.synth import speech_like

PCM_GUID = bytes.fromhex("0100000000001000800000aa00389b71")
FLOAT_GUID = bytes.fromhex("0300000000001000800000aa00389b71")
KNOWN_CHECKS = (*HEADER_CHECKS, "empty_audio", "audio")


def libsndfile_decode(data: bytes):
    """``(frames, rate, channels)`` as libsndfile decodes the member, or None when it refuses it."""
    try:
        with open_soundfile(io.BytesIO(data)) as f:
            return len(read_to_end(f, "int16")), f.samplerate, f.channels
    except Exception:
        return None


def agrees_or_finding(data: bytes) -> None:
    try:
        facts = header_facts(data)
    except AudioHeaderError as err:
        assert err.check in KNOWN_CHECKS
        return
    except AudioError:
        return  # a header that does not parse: validate's decode finding
    assert libsndfile_decode(data) == (facts["frames"], facts["sample_rate"], facts["channels"]), facts


@st.composite
def wavs(draw) -> bytes:
    tag = draw(st.sampled_from([1, 1, 1, 3, 0xFFFE, 6, 7, 2, 0x55, draw(st.integers(0, 0xFFFF))]))
    channels = draw(st.sampled_from([1, 1, 2, 0, 3, 1024, 1025, 65535]))
    rate = draw(st.sampled_from([16000, 8000, 1, 0, 192000, 1 << 31, 4_000_000_000]))
    bits = draw(st.sampled_from([16, 8, 24, 32, 0, 1, 4, 12, 20, 40, 64]))
    width = (bits + 7) // 8
    align = max(0, channels * width + draw(st.sampled_from([0, 0, 0, -1, 1, 2, -2]))) & 0xFFFF
    frames = draw(st.integers(0, 40))
    payload = bytes(draw(st.binary(min_size=0, max_size=4)) + bytes((frames * channels * width) % 5000))
    data_size = draw(st.sampled_from([len(payload), len(payload), 0xFFFFFFFF, 0, len(payload) + 7,
                                      max(0, len(payload) - 3)]))
    fmt = struct.pack("<HHIIHH", tag, channels, rate % (1 << 32), (rate * max(align, 1)) % (1 << 32), align, bits)
    if tag == 0xFFFE:
        guid = draw(st.sampled_from([PCM_GUID, FLOAT_GUID, PCM_GUID[:2] + bytes(14), bytes(range(16))]))
        fmt += struct.pack("<HHI", 22, bits, 4) + guid
    elif draw(st.booleans()):
        fmt += b"\0\0"  # cbSize
    body = b"WAVE"
    junk = draw(st.sampled_from([b"", b"JUNK" + struct.pack("<I", 3) + b"abc\0",
                                 b"LIST" + struct.pack("<I", 4) + b"INFO"]))
    body += junk + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if draw(st.integers(0, 9)) == 0:
        body += b"fmt " + struct.pack("<I", 16) + struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)
    body += b"data" + struct.pack("<I", data_size) + payload
    if draw(st.integers(0, 9)) == 0:
        body += b"data" + struct.pack("<I", 4) + bytes(4)
    riff = draw(st.sampled_from([len(body), len(body), 0xFFFFFFFF, 12345, 0]))
    return b"RIFF" + struct.pack("<I", riff) + body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wavs())
def test_wav_header_facts_are_the_decode_or_a_finding(data):
    agrees_or_finding(data)


def _flac(subtype="PCM_16", seconds=1.0, channels=1) -> bytes:
    samples = speech_like(seconds, 16000, seed=3, channels=channels)
    buf = io.BytesIO()
    sf.write(buf, samples, 16000, format="FLAC", subtype=subtype)
    return buf.getvalue()


FLACS = [_flac(), _flac(channels=2), _flac("PCM_24", 0.3)]
_LAYOUT = {"min_block": (128, 16), "max_block": (112, 16), "rate": (44, 20), "channels": (41, 3), "bits": (36, 5),
           "total": (0, 36)}


@st.composite
def flacs(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(FLACS)))
    value = int.from_bytes(data[8:26], "big")
    for name in draw(st.sets(st.sampled_from(sorted(_LAYOUT)), max_size=3)):
        shift, width = _LAYOUT[name]
        current = (value >> shift) & ((1 << width) - 1)
        new = draw(st.sampled_from([0, 1, current + 1, max(0, current - 1), (1 << width) - 1, current * 2,
                                    current // 2, draw(st.integers(0, (1 << width) - 1))])) & ((1 << width) - 1)
        value = value & ~(((1 << width) - 1) << shift) | (new << shift)
    data[8:26] = value.to_bytes(18, "big")
    if draw(st.integers(0, 4)) == 0:  # a metadata block whose declared length may run past the end
        length = draw(st.sampled_from([0, 10, 1 << 20, len(data) * 2]))
        block = bytes([1]) + length.to_bytes(3, "big") + bytes(min(length, 64))
        data[4] &= 0x7F
        data = data[:42] + bytes([block[0] | 0x80]) + block[1:] + (data[42:] if length <= 64 else b"")
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flacs())
def test_flac_header_facts_are_the_decode_or_a_finding(data):
    agrees_or_finding(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flacs(), st.floats(0.05, 0.999))
def test_a_cut_flac_is_a_finding_of_validate(data, where):
    """A FLAC cut inside its frames holds a header that cannot tell (only a decode does): validate decodes and
    finds it, whatever the header readers said."""
    from shardkit.commands.validate import ValidateOptions, check_audio

    cut = data[:max(42, int(len(data) * where))]
    problems, facts = check_audio("flac", cut, ValidateOptions())
    decoded = libsndfile_decode(cut)
    if not problems:
        assert decoded is not None and (facts["frames"], facts["sample_rate"], facts["channels"]) == decoded


@pytest.mark.parametrize("total", [0, 16000])
def test_an_honest_flac_agrees(total):
    data = bytearray(FLACS[0])
    value = int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1) | total
    data[18:26] = value.to_bytes(8, "big")
    facts = header_facts(bytes(data))
    assert (facts["frames"], facts["sample_rate"], facts["channels"]) == (16000, 16000, 1)
    assert np.array_equal(read_to_end(open_soundfile(io.BytesIO(bytes(data))), "int16").shape, (16000, 1))
