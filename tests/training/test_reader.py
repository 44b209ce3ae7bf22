import io
import os
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import tar_bytes

from shardkit.errors import AudioError, CorruptStreamError, ShardkitError, TarFormatError, UnsafeMemberError, UsageError
from shardkit.io.audio import decode
from shardkit.io.synth import encode, speech_like
from shardkit.io.tar import TarWriter, iter_shard_members
from shardkit.training.reader import group_utterances, iter_members_fast, iter_samples, read_members, warn_and_skip


def _expected(paths):
    """(key, text, float32 samples) of every utterance, read with the foundation's strict reader."""
    out = []
    for path in paths:
        members = list(iter_shard_members(path))
        for (txt_name, txt), (_, audio) in zip(members[::2], members[1::2]):
            out.append((txt_name[:-4], txt.decode(), decode(audio)[0]))
    return out


@pytest.mark.parametrize("codec", ["none", "gz", "bz2", "xz", "zst"])
@pytest.mark.parametrize("audio_format", ["wav", "flac"])
def test_iter_samples_matches_the_strict_reader_for_every_codec(make_shards, codec, audio_format):
    paths = make_shards(codec, audio_format=audio_format)
    samples = list(iter_samples(paths))
    expected = _expected(paths)
    assert len(samples) == len(expected) == 14
    for sample, (key, text, audio) in zip(samples, expected):
        assert (sample["key"], sample["txt"], sample["sample_rate"]) == (key, text, 16000)
        assert sample["audio"].dtype == np.float32 and sample["audio"].shape == audio.shape
        assert np.array_equal(sample["audio"], audio)
        assert sample["shard"] in paths


@pytest.mark.parametrize("dtype", ["int16", "float64"])
def test_other_dtypes_match_soundfile(make_shards, dtype):
    import soundfile as sf

    paths = make_shards("zst")
    for sample, (_, data) in zip(iter_samples(paths, dtype=dtype, keep_bytes=True),
                                 [m for p in paths for m in iter_shard_members(p)][1::2]):
        ref, _ = sf.read(io.BytesIO(data), dtype=dtype, always_2d=True)
        assert sample["audio"].dtype == dtype and np.array_equal(sample["audio"], ref)
        assert sample["audio"].flags.writeable  # owns its memory: not a view of the member bytes


def test_decoders_agree_and_decode_false_keeps_bytes(make_shards):
    paths = make_shards("none", utts_per_shard=14)
    fast = list(iter_samples(paths))
    via_sf = list(iter_samples(paths, decoder="soundfile"))
    assert all(np.array_equal(a["audio"], b["audio"]) for a, b in zip(fast, via_sf))
    raw = list(iter_samples(paths, decode=False))
    assert [r["audio_format"] for r in raw] == ["wav"] * 14 and "audio" not in raw[0]
    assert bytes(raw[0]["audio_bytes"][:4]) == b"RIFF"


def test_torchaudio_decoder_matches(make_shards):
    pytest.importorskip("torchaudio")
    paths = make_shards("none", utts_per_shard=14)
    for a, b in zip(iter_samples(paths[:1]), iter_samples(paths[:1], decoder="torchaudio")):
        assert np.allclose(a["audio"], b["audio"], atol=1e-6)
    with pytest.raises(UsageError, match="float32 only"):
        iter_samples(paths, decoder="torchaudio", dtype="int16")


def test_bad_settings_are_usage_errors(make_shards):
    paths = make_shards("none")
    with pytest.raises(UsageError, match="unknown decoder 'ffmpeg'"):
        iter_samples(paths, decoder="ffmpeg")
    with pytest.raises(UsageError, match="unsupported dtype 'int8'"):
        iter_samples(paths, dtype="int8")


def test_data_list_path_is_read(make_shards):
    import os

    paths = make_shards("bz2")
    assert len(list(iter_samples(os.path.join(os.path.dirname(paths[0]), "data.list")))) == 14


def test_fast_member_parser_hands_unusual_members_to_the_strict_reader():
    wav = encode(speech_like(0.2, 16000, 1), 16000)
    long_key = "corpus/" + "speaker-with-a-very-long-name-" * 4 + "utt1"
    members = [("a/k-1.txt", b"one"), ("a/k-1.wav", wav), (long_key + ".txt", b"two"), (long_key + ".wav", wav),
               ("b/x.y-3.txt", b"three"), ("b/x.y-3.wav", wav)]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        assert list(iter_members_fast(io.BytesIO(tar_bytes(members, fmt)))) == members
    with pytest.raises(UnsafeMemberError, match="path traversal"):
        list(iter_members_fast(io.BytesIO(tar_bytes([("ok.txt", b"1"), ("../evil.wav", b"2")]))))
    skipped = []
    got = list(iter_members_fast(io.BytesIO(tar_bytes([("ok.txt", b"1"), ("../evil.wav", b"2"), ("z.txt", b"3")])),
                                 on_error=skipped.append))
    assert got == [("ok.txt", b"1"), ("z.txt", b"3")] and skipped[0].member == "../evil.wav"


def test_damaged_header_and_truncation_raise(tmp_path):
    blob = bytearray(tar_bytes([("a.txt", b"1"), ("a.wav", b"x" * 3000)]))
    blob[512 * 2 + 5] ^= 0x55  # the second header's name: its checksum no longer matches
    with pytest.raises(TarFormatError, match=r"damaged tar header #2 \(checksum mismatch"):
        list(iter_members_fast(io.BytesIO(bytes(blob)), shard="s.tar"))
    with pytest.raises(TarFormatError, match="truncated"):
        list(iter_members_fast(io.BytesIO(tar_bytes([("a.wav", b"x" * 5000)])[:2000])))


def _zst_shard(tmp_path, members, name="s.tar.zst"):
    import zstandard

    path = tmp_path / name
    path.write_bytes(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(tar_bytes(members)))
    return str(path)


def test_zstd_truncation_is_caught_even_at_a_member_boundary(tmp_path):
    import zstandard

    wav = encode(speech_like(0.5, 16000, 2), 16000)
    plain = tar_bytes([("k1.txt", b"a"), ("k1.wav", wav), ("k2.txt", b"b"), ("k2.wav", wav)])
    cut_at_boundary = plain[:plain.index(b"k2.txt") ]  # ends right after member k1.wav: no tar damage
    for blob in (plain[: len(plain) // 2], cut_at_boundary):
        data = zstandard.ZstdCompressor(level=3).compress(blob)
        for cut in (len(data) - 3, len(data) * 2 // 3):
            path = tmp_path / f"t{cut}.tar.zst"
            path.write_bytes(data[:cut])
            with pytest.raises((CorruptStreamError, TarFormatError)) as err:
                list(read_members(str(path)))
            assert str(path) in str(err.value)
    # a whole stream without end-of-archive blocks is fine (tarfile and GNU tar accept it too)
    whole = tmp_path / "noeof.tar.zst"
    whole.write_bytes(zstandard.ZstdCompressor(level=3).compress(cut_at_boundary))
    assert [n for n, _ in read_members(str(whole))] == ["k1.txt", "k1.wav"]


def test_zstd_corruption_is_a_located_error(tmp_path):
    wav = encode(speech_like(1.0, 16000, 3), 16000)
    path = _zst_shard(tmp_path, [("k.txt", b"t"), ("k.wav", wav)])
    blob = bytearray(open(path, "rb").read())
    blob[len(blob) // 2] ^= 0xFF
    open(path, "wb").write(bytes(blob))
    with pytest.raises(ShardkitError) as err:
        list(iter_samples([path]))
    assert str(err.value).startswith(path)


def test_grouping_errors_follow_the_policy():
    wav = encode(speech_like(0.2, 16000, 4), 16000)
    members = [("a.txt", b"A"), ("a.wav", wav), ("b.wav", wav), ("c.txt", b"C"), ("d.txt", b"\xff"), ("d.wav", wav),
               ("e.txt", b"E"), ("e.wav", wav), ("e.spk", b"S1")]
    with pytest.raises(ShardkitError, match="'b': utterance has no .txt transcript member"):
        list(group_utterances(members, shard="s.tar"))
    errors = []
    utts = list(group_utterances(members, shard="s.tar", on_error=errors.append))
    assert [u["key"] for u in utts] == ["a", "e"] and utts[1]["spk"] == b"S1"
    assert [str(e) for e in errors] == [
        "s.tar: member 'b': utterance has no .txt transcript member",
        "s.tar: member 'c': utterance has no audio member (.wav, .flac, ...)",
        "s.tar: member 'd.txt': transcript is not UTF-8 (invalid start byte at byte 0)"]


def test_undecodable_audio_is_located_and_skippable(tmp_path, caplog):
    path = tmp_path / "bad.tar"
    good = encode(speech_like(0.3, 16000, 5), 16000)
    with open(path, "wb") as f:
        w = TarWriter(f)
        for key, audio in (("x/1", good), ("x/2", b"RIFF\x00\x00\x00\x00WAVEjunkjunk"), ("x/3", good)):
            w.add(f"{key}.txt", b"t")
            w.add(f"{key}.wav", audio)
        w.close()
    with pytest.raises(AudioError) as err:
        list(iter_samples([str(path)]))
    assert str(err.value).startswith(f"{path}: member 'x/2.wav': ")
    assert [s["key"] for s in iter_samples([str(path)], on_error=warn_and_skip)] == ["x/1", "x/3"]
    assert "x/2.wav" in caplog.text


def test_missing_shard_is_reported_and_skipped_by_policy(make_shards, tmp_path):
    paths = make_shards("none")
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(ShardkitError, match="no such file"):
        list(iter_samples([missing] + paths))
    seen = []
    assert len(list(iter_samples([missing] + paths, on_error=seen.append))) == 14
    assert str(seen[0]) == f"{missing}: no such file"


def test_canonical_and_unusual_wav_headers_decode_alike():
    from shardkit.training.reader import decode_fast

    pcm = speech_like(0.5, 16000, 6, channels=2)
    wav = encode(pcm, 16000)
    # the same PCM with an extra LIST chunk before data: the fast header check declines, the walk decodes it
    extra = wav[:36] + b"LIST\x04\x00\x00\x00abcd" + wav[36:]
    extra = extra[:4] + (len(extra) - 8).to_bytes(4, "little") + extra[8:]
    for blob in (wav, extra):
        out, rate = decode_fast(blob)
        assert rate == 16000 and out.shape == (len(pcm), 2)
        assert np.array_equal(out, pcm.astype(np.float32) / 32768)
    assert np.array_equal(decode_fast(wav, "int16")[0], pcm)


def _mixed_audio_members(pcm24=True):
    """(name, bytes) of utterances whose audio takes every path of the decoder: canonical 16-bit PCM WAV (mono,
    stereo, an odd sample count), a WAV with an extra chunk before its data, 24-bit PCM and FLAC."""
    import soundfile as sf

    mono = encode(speech_like(0.7, 16000, 11), 16000)
    stereo_samples = np.stack([speech_like(0.4, 8000, 12), speech_like(0.4, 8000, 13)], axis=1)
    stereo = encode(stereo_samples, 8000)
    odd = encode(speech_like(0.3, 16000, 14)[:4801], 16000)
    listed = bytearray(mono)  # a LIST chunk between fmt and data: not the 44-byte canonical layout
    listed[36:36] = b"LIST\x04\x00\x00\x00INFO"
    listed[4:8] = (len(listed) - 8).to_bytes(4, "little")
    trailer = bytearray(odd + b"LIST\x04\x00\x00\x00INFO")  # a chunk after the data: bytes after the samples
    trailer[4:8] = (len(trailer) - 8).to_bytes(4, "little")
    buf = io.BytesIO()
    sf.write(buf, speech_like(0.5, 16000, 15), 16000, format="WAV", subtype="PCM_24")
    audio = [("mono", "wav", mono), ("stereo", "wav", stereo), ("odd", "wav", odd), ("listed", "wav", bytes(listed)),
             ("trailer", "wav", bytes(trailer)),
             ("pcm24", "wav", buf.getvalue()), ("flac", "flac", encode(speech_like(0.5, 16000, 16), 16000, "flac"))]
    if not pcm24:  # (int16 refuses 24-bit samples: no lossless conversion)
        del audio[5]
    members = []
    for key, ext, data in audio:
        members += [(f"{key}.txt", key.encode()), (f"{key}.{ext}", data)]
    return members


@pytest.mark.parametrize("dtype", ["float32", "int16", "float64"])
def test_wav_decoded_as_read_equals_the_decoder_on_the_bytes(tmp_path, monkeypatch, dtype):
    """iter_samples decodes canonical WAV members of a zstd shard as they are read (from one reused buffer);
    every sample equals decode_fast on the member's bytes, and every other member still takes the decoder."""
    from shardkit.training import zstd_source
    from shardkit.training.reader import decode_fast

    members = _mixed_audio_members(pcm24=dtype != "int16")
    path = _zst_shard(tmp_path, members)
    decoded_as_read = []
    real = zstd_source.ZstdMemberSource.read_decoded_member

    def spy(self, size, decode):
        decoded_as_read.append(size)
        return real(self, size, decode)

    monkeypatch.setattr(zstd_source.ZstdMemberSource, "read_decoded_member", spy)
    into_arrays = []
    real_into = zstd_source.ZstdMemberSource._read_into
    monkeypatch.setattr(zstd_source.ZstdMemberSource, "_read_into",
                        lambda self, *a: into_arrays.append(1) or real_into(self, *a))
    samples = list(iter_samples([path], dtype=dtype))
    # mono, stereo and odd take the fused loop (shardkit.training.fused), which reads "listed" (not canonical) as
    # bytes and hands it and the rest of the shard to the stages: they read every later .wav member with
    # read_decoded_member (the FLAC as bytes), int16's canonical one ("trailer") straight into its array
    assert len(into_arrays) == (1 if dtype == "int16" else 0)
    keys = [name.split(".")[0] for name, _ in members[::2]]
    assert len(decoded_as_read) == len(keys) - 5
    audio = dict(members)
    assert [s["key"] for s in samples] == keys
    for sample in samples:
        data = audio[f"{sample['key']}.{'flac' if sample['key'] == 'flac' else 'wav'}"]
        expected, rate = decode_fast(data, dtype, pool=None)
        assert sample["sample_rate"] == rate and sample["audio"].dtype == expected.dtype
        assert sample["audio"].shape == expected.shape and np.array_equal(sample["audio"], expected)
        assert sample["audio"].flags.writeable  # its own memory: the samples were all read before this check,
        # so an array over the reader's reused buffer would hold a later member's bytes by now
    # the same utterances through the bytes (keep_bytes reads them as before, nothing decoded as read)
    decoded_as_read.clear()
    kept = list(iter_samples([path], dtype=dtype, keep_bytes=True))
    assert not decoded_as_read
    assert all(np.array_equal(a["audio"], b["audio"]) for a, b in zip(samples, kept))
    assert [bytes(k["audio_bytes"]) for k in kept] == [audio[n] for n, _ in members[1::2]]


def test_a_wav_member_above_the_reused_buffer_gets_its_own(tmp_path, monkeypatch):
    from shardkit.training import zstd_source

    members = _mixed_audio_members()
    path = _zst_shard(tmp_path, members)
    reference = list(iter_samples([path]))
    monkeypatch.setattr(zstd_source, "SCRATCH_BYTES", 4096)  # below every WAV member here but the odd one's
    small = list(iter_samples([path]))
    assert [s["key"] for s in small] == [s["key"] for s in reference]
    assert all(np.array_equal(a["audio"], b["audio"]) for a, b in zip(small, reference))


def test_an_utterance_too_large_is_refused_when_decoded_as_read(tmp_path):
    from shardkit.errors import MemberTooLargeError

    members = _mixed_audio_members()[:4]  # mono (a 22 KB WAV), then stereo (13 KB)
    path = _zst_shard(tmp_path, members)
    limit = len(members[1][1]) + 2  # the mono WAV fits, not with its transcript; the stereo utterance does
    skipped = []
    got = list(iter_samples([path], max_member_bytes=limit, on_error=skipped.append))
    assert [s["key"] for s in got] == ["stereo"] and len(skipped) == 1
    assert isinstance(skipped[0], MemberTooLargeError) and skipped[0].member == "mono.wav"
    with pytest.raises(MemberTooLargeError):
        list(iter_samples([path], max_member_bytes=limit))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(min_value=0.02, max_value=0.999), dtype=st.sampled_from(["float32", "int16"]))
def test_a_truncated_zstd_shard_fails_after_every_whole_utterance_before_the_cut(tmp_path, cut, dtype):
    """Cut anywhere, a zstd shard yields a prefix of its utterances, each exact, then a located error (int16:
    through the samples decompressed straight into their arrays)."""
    import zstandard

    members = _mixed_audio_members(pcm24=False)
    whole = str(tmp_path / "whole.tar.zst")
    if not os.path.exists(whole):
        # frames of 4 KiB, as the seekable writer cuts them (by 1 MiB there): a cut lands inside or between frames
        data = b"".join(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(chunk)
                        for chunk in _chunks(tar_bytes(members), 4096))
        open(whole, "wb").write(data)
    reference = list(iter_samples([whole], dtype=dtype))
    blob = open(whole, "rb").read()
    path = str(tmp_path / f"cut{int(cut * 1e6)}.tar.zst")
    open(path, "wb").write(blob[:max(4, int(len(blob) * cut))])
    got = []
    with pytest.raises((CorruptStreamError, TarFormatError)) as err:
        for sample in iter_samples([path], dtype=dtype):
            got.append(sample)
    assert str(err.value).startswith(path)
    assert len(got) < len(reference)
    for sample, expected in zip(got, reference):
        assert sample["key"] == expected["key"] and np.array_equal(sample["audio"], expected["audio"])


def _chunks(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]
