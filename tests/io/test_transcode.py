import io
import json
import os
import struct

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.io.synth import speech_like, write_shards
from shardkit.io.tar import iter_shard_members
from shardkit.io.transcode import read_pcm, transcode_member


def wav(samples, rate, subtype="PCM_16"):
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def with_extra_chunks(data):
    """Insert LIST and fact chunks between fmt and data, as some recorders write them."""
    pos = data.index(b"data")
    extra = b"LIST" + struct.pack("<I", 14) + b"INFOISFT" + struct.pack("<I", 2) + b"sk" + b"fact" + struct.pack("<I", 4) + b"\x10\x00\x00\x00"
    body = data[12:pos] + extra + data[pos:]
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def signal(seconds, rate, channels=1, seed=0):
    return speech_like(seconds, rate, seed=seed, channels=channels)


CASES = {
    "16bit-mono-16k": (signal(1.0, 16000), 16000, "PCM_16"),
    "16bit-stereo-44k1": (signal(0.5, 44100, 2), 44100, "PCM_16"),
    "24bit-mono-8k": (signal(0.77, 8000).astype(np.int32) << 16, 8000, "PCM_24"),
    "8bit-mono-8k": (signal(0.3, 8000), 8000, "PCM_U8"),
    "odd-length": (signal(0.123457, 16000)[:1975], 16000, "PCM_16"),
    "silence": (np.zeros(1600, np.int16), 16000, "PCM_16"),
    "full-scale": (np.array([32767, -32768] * 800, np.int16), 16000, "PCM_16"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_wav_to_flac_to_wav_gives_the_original_samples(case):
    samples, rate, subtype = CASES[case]
    source = wav(samples, rate, subtype)
    name, flac, info = transcode_member("c/k-1.wav", source, "flac")
    assert name == "c/k-1.flac" and flac[:4] == b"fLaC" and info["action"] == "transcoded"
    name2, back, info2 = transcode_member(name, flac, "wav")
    assert name2 == "c/k-1.wav" and back[:4] == b"RIFF"
    a, ra, sa = read_pcm(source)
    b, rb, sb = read_pcm(back)
    assert ra == rb == rate and sa == sb == subtype and np.array_equal(a, b)
    assert info["pcm_sha256"] == info2["pcm_sha256"]
    assert sf.info(io.BytesIO(flac)).channels == (samples.shape[1] if samples.ndim == 2 else 1)


def test_extra_riff_chunks_are_read_and_samples_kept():
    samples = signal(0.5, 16000)
    source = with_extra_chunks(wav(samples, 16000))
    _, flac, info = transcode_member("k.wav", source, "flac")
    assert info["action"] == "transcoded"
    assert np.array_equal(read_pcm(flac)[0][:, 0], samples)


@pytest.mark.parametrize("member,data,reason", [
    ("f.wav", wav(np.random.default_rng(0).uniform(-1, 1, 800).astype(np.float32), 16000, "FLOAT"),
     "FLOAT WAV has no lossless FLAC form"),
    ("m.mp3", b"ID3\x03\x00\x00\x00\x00\x00\x00" + b"\xff\xfb" * 100, "lossy format (mp3): never re-encoded"),
    ("c.wav", b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk", "WAV has no fmt chunk"),
    ("g.wav", b"\x00garbage" * 50, "unknown or damaged audio bytes"),
    ("t.txt", b"text", None),
])
def test_members_without_a_lossless_form_are_kept_byte_for_byte(member, data, reason):
    name, out, info = transcode_member(member, data, "flac")
    assert (name, out) == (member, data)
    if reason is None:
        assert info is None
    else:
        assert info["action"] == "kept" and reason in info["reason"]


def test_convert_audio_flac_end_to_end_and_verify(make_shards, tmp_path):
    sources = make_shards("bz2")
    runner = CliRunner()
    out = tmp_path / "flac"
    result = runner.invoke(main, ["convert", *sources, "-o", str(out), "--codec", "none", "--audio", "flac", "--json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["audio"]["transcoded"] == 14 and report["audio"]["kept"] == 0
    outputs = [line.strip() for line in open(out / "data.list")]
    src_members = [m for p in sources for m in iter_shard_members(p)]
    out_members = [m for p in outputs for m in iter_shard_members(p)]
    assert [n.rsplit(".", 1)[0] for n, _ in out_members] == [n.rsplit(".", 1)[0] for n, _ in src_members]
    for (sn, sd), (on, od) in zip(src_members, out_members):
        if sn.endswith(".txt"):
            assert (sn, sd) == (on, od)
        else:
            assert on.endswith(".flac") and np.array_equal(read_pcm(sd)[0], read_pcm(od)[0])
    flac_bytes = sum(os.path.getsize(p) for p in outputs)
    assert flac_bytes < 0.9 * sum(os.path.getsize(p) for p in make_shards("none"))
    manifest = json.loads((out / "convert.json").read_text())
    assert manifest["libraries"]["libsndfile"] == sf.__libsndfile_version__
    assert all(len(i["pcm_sha256"]) == 64 for e in manifest["shards"] for i in e["transcoded"])
    # determinism, -j1 vs -j2
    runner.invoke(main, ["convert", *sources, "-o", str(tmp_path / "j2"), "--codec", "none", "--audio", "flac", "-j", "2", "-q"])
    assert [open(p, "rb").read() for p in outputs] == [
        open(str(p).replace(str(out), str(tmp_path / "j2")), "rb").read() for p in outputs]
    result = runner.invoke(main, ["verify", str(out), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"]
    # back to WAV: samples equal the original again
    result = runner.invoke(main, ["convert", str(out / "data.list"), "-o", str(tmp_path / "wav"), "--codec", "none",
                                  "--audio", "wav", "-q"])
    assert result.exit_code == 0
    back = [m for p in open(tmp_path / "wav" / "data.list").read().split() for m in iter_shard_members(p)]
    assert [n for n, _ in back] == [n for n, _ in src_members]
    for (name, sd), (_, bd) in zip(src_members, back):
        if name.endswith(".txt"):
            assert sd == bd
        else:
            assert np.array_equal(read_pcm(sd)[0], read_pcm(bd)[0])


def test_verify_catches_a_changed_sample(make_shards, tmp_path):
    sources = make_shards("none", utts_per_shard=20)
    out = tmp_path / "flac"
    CliRunner().invoke(main, ["convert", *sources, "-o", str(out), "--codec", "none", "--audio", "flac", "-q"])
    # rewrite the source with one sample changed in the first utterance, keeping names
    members = list(iter_shard_members(sources[0]))
    samples, rate = sf.read(io.BytesIO(members[1][1]), dtype="int16")
    samples[100] ^= 1
    members[1] = (members[1][0], wav(samples, rate))
    moved = tmp_path / "moved"
    write_shards([], str(moved), utts_per_shard=1)  # creates the folder
    from shardkit.io.tar import TarWriter

    with open(moved / os.path.basename(sources[0]), "wb") as f:
        w = TarWriter(f)
        for n, d in members:
            w.add(n, d)
        w.close()
    result = CliRunner().invoke(main, ["verify", str(out), "--against", str(moved), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert report["problems"][0]["key"] == members[1][0].rsplit(".", 1)[0]
    assert report["problems"][0]["reason"] == "decoded samples differ from the source's"


def test_mixed_shard_keeps_lossy_float_and_corrupt_members(tmp_path):
    from shardkit.io.tar import TarWriter

    good = wav(signal(0.4, 16000), 16000)
    members = [("a/1.txt", b"one"), ("a/1.wav", good),
               ("a/2.txt", b"two"), ("a/2.wav", wav(np.zeros(160, np.float32), 16000, "FLOAT")),
               ("a/3.txt", b"three"), ("a/3.mp3", b"ID3\x03" + bytes(60)),
               ("a/4.txt", b"four"), ("a/4.wav", good[: len(good) // 2])]
    src = tmp_path / "mixed.tar"
    with open(src, "wb") as f:
        w = TarWriter(f)
        for n, d in members:
            w.add(n, d)
        w.close()
    result = CliRunner().invoke(main, ["convert", str(src), "-o", str(tmp_path / "o"), "--codec", "none",
                                       "--audio", "flac", "--json"])
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["audio"]["transcoded"] == 1 and report["audio"]["kept"] == 3
    assert report["audio"]["undecodable_kept"] == [{"shard": str(src), "key": "a/4", "member": "a/4.wav",
                                                    "check": "truncated",
                                                    "reason": "truncated WAV (header promises more frames than present)"}]
    assert "kept undecodable: " in result.stderr and "key 'a/4'" in result.stderr
    out = dict(iter_shard_members(str(tmp_path / "o" / "mixed.tar")))
    assert set(out) == {"a/1.txt", "a/1.flac", "a/2.txt", "a/2.wav", "a/3.txt", "a/3.mp3", "a/4.txt", "a/4.wav"}
    assert out["a/2.wav"] == members[3][1] and out["a/3.mp3"] == members[5][1] and out["a/4.wav"] == members[7][1]


@pytest.mark.parametrize("level", [None, 0, 8])
def test_flac_bytes_are_the_same_for_one_and_several_jobs(make_shards, tmp_path, level):
    sources = make_shards("none", utts_per_shard=3)  # 5 plain shards: -j3 spreads them over processes
    outputs = {}
    for jobs in ("1", "3"):
        out = tmp_path / f"j{jobs}"
        args = ["convert", *sources, "-o", str(out), "--codec", "none", "--audio", "flac", "-j", jobs, "-q"]
        result = CliRunner().invoke(main, args + ([] if level is None else ["--flac-level", str(level)]))
        assert result.exit_code == 0, result.output
        outputs[jobs] = [open(p.strip(), "rb").read() for p in open(out / "data.list")]
    assert len(outputs["1"]) == 5 and outputs["1"] == outputs["3"]
    assert all(b".flac" in shard for shard in outputs["1"])
