"""shardkit.training.fused: iter_samples' one loop for a zstd shard's common utterances reads exactly what the
stages read (members -> utterances -> decode, shardkit.training.reader): the same sample dicts (every field,
key order, dtype, shape, samples), the same ReadPosition at every yield, the same errors at the same point, and
from the first member outside the common case on, the stages themselves."""

import os
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import tar_bytes

from shardkit.errors import ShardkitError
from shardkit.io.synth import encode, speech_like
from shardkit.training import reader
from shardkit.training.reader import ReadPosition, decode_utterances, iter_samples, iter_utterances


def _stages(paths, dtype, **read):
    """The reference: the three stages, PCM WAV decoded as read (what iter_samples did before the fused loop)."""
    return decode_utterances(iter_utterances(paths, decode_wav=reader._WavDecoder(dtype), **read), dtype=dtype,
                             on_error=read.get("on_error"))


def _outcome(make_samples):
    """Everything a reader shows: per sample its fields (in order, arrays as dtype, shape, bytes) and the
    ReadPosition at that yield; the errors passed to the policy; the error raised, if any (type and message)."""
    position, reported = ReadPosition(), []
    seen, raised = [], None
    try:
        for sample in make_samples(position=position, on_error=reported.append):
            fields = [(k, (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v)
                      for k, v in sample.items()]
            seen.append((fields, position.index, position.end, position.utt_end, position.finished))
    except ShardkitError as err:
        raised = (type(err).__name__, str(err))
    return seen, [(type(e).__name__, str(e)) for e in reported], raised


def _both(paths, dtype, *, policy, **read):
    """(fused, stages) outcomes of the same read; ``policy``: collect errors (True) or raise them (False)."""
    def run(fn):
        def make(position, on_error):
            return fn(paths, dtype=dtype, position=position, on_error=on_error if policy else None, **read)
        return _outcome(make)

    return run(iter_samples), run(_stages)


def _zst(path, plain: bytes, frame: int = 4096) -> str:
    """``plain`` as a zstd shard of ``frame``-byte frames (a cut lands inside or between frames)."""
    import zstandard

    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    with open(path, "wb") as f:
        for i in range(0, len(plain), frame):
            f.write(compressor.compress(plain[i:i + frame]))
    return str(path)


def _utterances(n, start=0, seconds=0.3, channels=1):
    members = []
    for i in range(start, start + n):
        audio = speech_like(seconds, 16000, i)
        if channels == 2:
            audio = np.stack([audio, speech_like(seconds, 16000, i + 100)], axis=1)
        members += [(f"u{i:03d}.txt", f"words {i}".encode()), (f"u{i:03d}.wav", encode(audio, 16000))]
    return members


DTYPES = ["float32", "int16", "float64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_loop_reads_the_fixture_shards_as_the_stages(make_shards, dtype):
    paths = make_shards("zst", utts_per_shard=5)
    for policy in (False, True):
        fused, stages = _both(paths, dtype, policy=policy)
        assert fused == stages
        seen, reported, raised = fused
        assert len(seen) == 14 and not reported and raised is None
        assert [k for k, _ in seen[0][0]] == ["key", "shard", "txt", "audio_format", "audio", "sample_rate"]


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_a_resumed_read_is_the_stages_read_from_every_saved_offset(tmp_path, dtype):
    path = _zst(tmp_path / "s.tar.zst", tar_bytes(_utterances(6, channels=2) + _utterances(2, start=6)))
    seen = _both([path], dtype, policy=False)[1][0]
    assert len(seen) == 8
    for i, (_, _, _, utt_end, finished) in enumerate(seen[:-1]):
        assert not finished
        fused, stages = _both([path], dtype, policy=False, start=utt_end)
        assert fused == stages and len(fused[0]) == len(seen) - 1 - i  # the utterances after the i-th


def _listed_wav(i):
    """A PCM WAV with a LIST chunk before its data: not the canonical 44-byte layout (the stages decode it)."""
    wav = bytearray(encode(speech_like(0.2, 16000, i), 16000))
    wav[36:36] = b"LIST\x04\x00\x00\x00INFO"
    wav[4:8] = (len(wav) - 8).to_bytes(4, "little")
    return bytes(wav)


def _bad_riff():
    wav = bytearray(encode(speech_like(0.2, 16000, 7), 16000))
    wav[0:4] = b"RIFX"
    return bytes(wav)


# members that leave the common case in the middle of a shard (the fused loop hands over to the stages there)
ODD_MEMBERS = {
    "non-canonical wav": [("odd.txt", b"odd"), ("odd.wav", _listed_wav(1))],
    "undecodable wav": [("odd.txt", b"odd"), ("odd.wav", _bad_riff())],
    "flac": [("odd.txt", b"odd"), ("odd.flac", encode(speech_like(0.2, 16000, 3), 16000, "flac"))],
    "key repeated (a third member)": [("odd.txt", b"odd"), ("odd.wav", encode(speech_like(0.2, 16000, 4), 16000)),
                                      ("odd.txt", b"again")],
    "a member twice": [("odd.txt", b"odd"), ("odd.txt", b"odd"),
                       ("odd.wav", encode(speech_like(0.2, 16000, 5), 16000))],
    "no transcript": [("odd.wav", encode(speech_like(0.2, 16000, 6), 16000))],
    "transcript not UTF-8": [("odd.txt", b"\xff\xfe"), ("odd.wav", encode(speech_like(0.2, 16000, 8), 16000))],
    "another extension": [("odd.txt", b"odd"), ("odd.json", b"{}"),
                          ("odd.wav", encode(speech_like(0.2, 16000, 9), 16000))],
    "long name (GNU header)": [("d/" + "x" * 120 + ".txt", b"long"),
                               ("d/" + "x" * 120 + ".wav", encode(speech_like(0.2, 16000, 10), 16000))],
    "unsafe name": [("../odd.txt", b"odd"), ("../odd.wav", encode(speech_like(0.2, 16000, 11), 16000))],
    "wav first": [("odd.wav", encode(speech_like(0.2, 16000, 12), 16000)), ("odd.txt", b"odd")],
    "tiny wav": [("odd.txt", b"odd"), ("odd.wav", encode(speech_like(0.2, 16000, 13), 16000)[:44])],
    "transcript above 64 KiB": [("odd.txt", b"word " * 14000), ("odd.wav", encode(speech_like(0.2, 16000, 14), 16000))],
}


@pytest.mark.parametrize("case", sorted(ODD_MEMBERS))
@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_a_member_outside_the_common_case_in_the_middle_reads_as_the_stages(tmp_path, case, dtype):
    members = _utterances(3) + ODD_MEMBERS[case] + _utterances(3, start=3)
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = _zst(tmp_path / f"s{fmt}.tar.zst", tar_bytes(members, fmt))
        for policy in (False, True):
            fused, stages = _both([path], dtype, policy=policy)
            assert fused == stages, (case, fmt, policy)
            keys = [dict(fields)["key"] for fields, *_ in fused[0]]
            assert keys[:2] == ["u000", "u001"]  # before it, through the fused loop (u002 waits for the next member)
            if policy:  # after it, the stages read the rest of the shard
                assert keys[-3:] == ["u003", "u004", "u005"]


def test_the_end_and_a_missing_end_block_read_as_the_stages(tmp_path):
    plain = tar_bytes(_utterances(3))
    without_end = plain[:plain.index(bytes(1024), 512 * 3)]  # (the last member's padding holds no 1 KiB of zeros)
    for name, blob in (("whole", plain), ("no-end", without_end), ("only-end", bytes(10240))):
        path = _zst(tmp_path / f"{name}.tar.zst", blob)
        for policy in (False, True):
            fused, stages = _both([path], "int16", policy=policy)
            assert fused == stages, name


def _damaged(plain: bytes, at: int) -> bytes:
    blob = bytearray(plain)
    blob[at] ^= 0x5A
    return bytes(blob)


@pytest.mark.parametrize("where", ["name", "size", "checksum", "type", "mode"])
def test_a_damaged_header_in_the_middle_fails_as_in_the_stages(tmp_path, where):
    members = _utterances(4)
    plain = tar_bytes(members)
    third = sum(512 + len(d) + (-len(d) % 512) for _, d in members[:4])  # the header of u002.txt
    offset = {"name": 1, "size": 130, "checksum": 150, "type": 156, "mode": 103}[where]
    path = _zst(tmp_path / "s.tar.zst", _damaged(plain, third + offset))
    for dtype in ("float32", "int16"):
        for policy in (False, True):
            fused, stages = _both([path], dtype, policy=policy)
            assert fused == stages, (where, dtype, policy)


@pytest.mark.parametrize("where", [100, 20, 36, 40, 43])  # in a wav member's header: rate, fmt, data id, size
def test_a_bad_wav_header_in_the_middle_reads_as_the_stages(tmp_path, where):
    members = _utterances(4)
    wav = bytearray(members[3][1])
    wav[where] ^= 0xFF
    members[3] = (members[3][0], bytes(wav))
    path = _zst(tmp_path / "s.tar.zst", tar_bytes(members))
    for dtype in DTYPES:
        for policy in (False, True):
            assert _both([path], dtype, policy=policy)[0] == _both([path], dtype, policy=policy)[1]


def test_a_corrupt_zstd_block_inside_a_member_fails_as_in_the_stages(tmp_path):
    path = _zst(tmp_path / "s.tar.zst", tar_bytes(_utterances(4)))
    blob = bytearray(open(path, "rb").read())
    for at in (len(blob) // 3, len(blob) // 2, 2 * len(blob) // 3):
        damaged = tmp_path / f"d{at}.tar.zst"
        damaged.write_bytes(_damaged(bytes(blob), at))
        for dtype in ("float32", "int16"):
            fused, stages = _both([str(damaged)], dtype, policy=False)
            assert fused == stages and fused[2] is not None


def _cut_shard_members():
    return (_utterances(2, channels=2) + ODD_MEMBERS["non-canonical wav"] + _utterances(2, start=2)
            + [("u009.txt", b"last"), ("u009.wav", encode(speech_like(0.21, 16000, 9)[:3361], 16000))])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(min_value=0.0, max_value=1.0), dtype=st.sampled_from(["float32", "int16"]),
       policy=st.booleans())
def test_a_zstd_shard_cut_anywhere_fails_where_the_stages_fail(tmp_path, cut, dtype, policy):
    whole = tmp_path / "whole.tar.zst"
    if not whole.exists():
        _zst(whole, tar_bytes(_cut_shard_members()))
    blob = whole.read_bytes()
    path = tmp_path / f"cut{int(cut * 1e6)}.tar.zst"
    path.write_bytes(blob[:int(len(blob) * cut)])
    fused, stages = _both([str(path)], dtype, policy=policy)
    assert fused == stages
    if len(fused[0]) < len(_cut_shard_members()) // 2:  # utterances lost: never in silence
        assert fused[2] is not None or fused[1]  # a located error, raised or reported
        assert (fused[2] or fused[1][-1])[1].startswith(str(path))


def test_a_shard_list_with_every_kind_reads_as_the_stages(tmp_path, make_shards):
    """Plain and bz2 shards take the stages; zstd ones the fused loop; a missing one is reported by both."""
    zst = make_shards("zst", utts_per_shard=7)
    others = make_shards("bz2", utts_per_shard=7)[:1] + make_shards("none", utts_per_shard=7)[:1]
    paths = [zst[0], others[0], str(tmp_path / "missing.tar.zst"), others[1], zst[1]]
    fused, stages = _both(paths, "float32", policy=True)
    assert fused == stages and len(fused[1]) == 1
    assert os.path.basename(fused[1][0][1]).startswith("missing.tar.zst")
