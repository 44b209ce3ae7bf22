"""Hostile audio and text inside sound shards (issue 24): members whose tar structure is sound but whose
audio header or transcript lies, each between a good WAV and a good FLAC neighbour, next to a clean shard.

The crafted members are built here with ``struct`` (and soundfile for the real audio they mutate); every
command must finish its run, keep the good neighbours intact, name the hostile key under its own check, and
report only facts the bytes hold.
"""

from __future__ import annotations

import bz2
import io
import json
import os
import struct

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from support import run_cli, tar_bytes

from shardkit.cli import main
from shardkit.commands.index import index_shard
from shardkit.commands.validate import ValidateOptions, validate_shard
from shardkit.errors import ShardkitError
from shardkit.io.audio import HeaderBeyondHead, header_facts
from shardkit.io.synth import speech_like
from shardkit.io.tar import iter_shard_members

RATE = 16000
SIGNAL = speech_like(0.5, RATE, seed=4)  # 8000 frames
PCM_GUID = bytes.fromhex("0100000000001000800000aa00389b71")


def wav(*, tag=1, channels=1, rate=RATE, bits=16, align=None, frames=8000, chunks_before=b"", fmt_ext=b"",
        riff_size=None, data_size=None, second_fmt=None, second_data=None, samples=None) -> bytes:
    """A RIFF WAV written field by field: every field can lie."""
    width = (bits + 7) // 8
    align = channels * width if align is None else align
    if samples is not None:
        data = samples.astype("<i2").tobytes()
    else:
        data = (np.arange(frames * channels * width) % 251).astype("u1").tobytes()
    fmt = struct.pack("<HHIIHH", tag, channels, rate, (rate * align) % (1 << 32), align, bits) + fmt_ext
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if second_fmt is not None:
        body += b"fmt " + struct.pack("<I", len(second_fmt)) + second_fmt
    body += chunks_before + b"data" + struct.pack("<I", len(data) if data_size is None else data_size) + data
    if second_data is not None:
        body += b"data" + struct.pack("<I", len(second_data)) + second_data
    return b"RIFF" + struct.pack("<I", len(body) if riff_size is None else riff_size) + body


def chunk(name: bytes, size: int) -> bytes:
    return name + struct.pack("<I", size) + bytes(size + (size & 1))


def good_wav(seed=1) -> bytes:
    return wav(samples=speech_like(0.5, RATE, seed=seed))


def good_flac(seed=2, seconds=0.5, subtype="PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, RATE, seed=seed), RATE, format="FLAC", subtype=subtype)
    return buf.getvalue()


def streaminfo(data: bytes, **fields) -> bytes:
    """A FLAC with STREAMINFO fields replaced (min_block, max_block, rate, channels, bits, total, md5)."""
    d = bytearray(data)
    value = int.from_bytes(d[8:26], "big")
    layout = {"min_block": (128, 16), "max_block": (112, 16), "rate": (44, 20), "channels": (41, 3),
              "bits": (36, 5), "total": (0, 36)}
    for name, new in fields.items():
        if name == "md5":
            d[26:42] = new
            continue
        shift, width = layout[name]
        new = new - 1 if name in ("channels", "bits") else new
        value = value & ~(((1 << width) - 1) << shift) | (new << shift)
    d[8:26] = value.to_bytes(18, "big")
    return bytes(d)


def flac_with_blocks(data: bytes, blocks: list[tuple[int, int, bytes]]) -> bytes:
    """The FLAC with its metadata after STREAMINFO replaced by ``blocks`` ((type, declared length, body))."""
    pos, last = 4, False
    while not last:
        last = bool(data[pos] & 0x80)
        pos += 4 + int.from_bytes(data[pos + 1:pos + 4], "big")
    out = bytearray(data[:42])
    out[4] &= 0x7F
    for i, (kind, length, body) in enumerate(blocks):
        out += bytes([kind | (0x80 if i == len(blocks) - 1 else 0)]) + length.to_bytes(3, "big") + body
    return bytes(out) + (data[pos:] if all(len(b) == n for _, n, b in blocks) else b"")


def padded_flac(pad: int) -> bytes:
    data = good_flac(seed=5)
    return flac_with_blocks(data, [(1, pad, bytes(pad)), (1, pad, bytes(pad))])


# name -> (member bytes, extension, the check validate/index/make name it under)
HOSTILE = {
    "align4": (wav(align=4), "wav", "audio_header"),
    "align1": (wav(align=1), "wav", "audio_header"),
    "bits0": (wav(bits=0), "wav", "audio_format"),
    "rate4g": (wav(rate=4_000_000_000), "wav", "audio_header"),
    "ch65535": (wav(channels=65535, align=2, frames=4), "wav", "audio_channels"),
    "guid_random": (wav(tag=0xFFFE, fmt_ext=struct.pack("<HHI", 22, 16, 4) + bytes(range(16))), "wav",
                    "audio_format"),
    "guid_pcm_start": (wav(tag=0xFFFE, fmt_ext=struct.pack("<HHI", 22, 16, 4) + PCM_GUID[:2] + bytes(14)), "wav",
                       "audio_format"),
    "two_fmt": (wav(rate=8000, second_fmt=struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)), "wav",
                "audio_header"),
    "two_data": (wav(second_data=bytes(1000)), "wav", "audio_header"),
    "no_frames": (wav(frames=0), "wav", "empty_audio"),
    "flac_total_lie": (streaminfo(good_flac(), total=(1 << 36) - 1), "flac", "implausible_length"),
    "flac_total_short": (streaminfo(good_flac(), total=100), "flac", "implausible_length"),
    "flac_min_gt_max": (streaminfo(good_flac(), min_block=4096, max_block=1024), "flac", "flac_streaminfo"),
    "flac_channels": (streaminfo(good_flac(), channels=2), "flac", "flac_streaminfo"),
    "flac_rate": (streaminfo(good_flac(), rate=22050), "flac", "flac_streaminfo"),
    "flac_meta_past_end": (flac_with_blocks(good_flac(), [(4, 1 << 20, b"xx")]), "flac", "flac_metadata"),
    "flac_md5": (streaminfo(good_flac(), md5=bytes(range(1, 17))), "flac", "flac_md5"),
}

# what decoders agree on: valid, with these true frame counts
VALID = {
    "riff_size": (wav(riff_size=12345), "wav", 8000),
    "streamed": (wav(riff_size=0xFFFFFFFF, data_size=0xFFFFFFFF), "wav", 8000),
    "junk": (wav(chunks_before=chunk(b"JUNK", 70001) + chunk(b"LIST", 3)), "wav", 8000),
    "sub8bit": (wav(bits=4, frames=3000), "wav", 3000),
    "bits12": (wav(bits=12), "wav", 8000),
    "flac_total0": (streaminfo(good_flac(), total=0), "flac", 8000),
    "flac_padding": (padded_flac(40000), "flac", 8000),
}


def utterance(key: str, audio: bytes, ext: str, text: str = "a transcript") -> list[tuple[str, bytes]]:
    return [(f"{key}.txt", text.encode()), (f"{key}.{ext}", audio)]


def shard(path, hostile_key: str, audio: bytes, ext: str, codec: str) -> str:
    stem = hostile_key.split("/")[1]
    members = (utterance(f"good/w/{stem}", good_wav(), "wav") + utterance(hostile_key, audio, ext)
               + utterance(f"good/f/{stem}", good_flac(), "flac"))
    data = tar_bytes(members)
    path = f"{path}.bz2" if codec == "bz2" else str(path)
    with open(path, "wb") as f:
        f.write(bz2.compress(data) if codec == "bz2" else data)
    return path


def decoded(data: bytes) -> np.ndarray:
    from shardkit.io.audio import decode_soundfile

    return decode_soundfile(data, "int16")[0]  # also a FLAC whose STREAMINFO leaves the length unknown


@pytest.fixture(scope="module", params=["none", "bz2"])
def corpus(request, tmp_path_factory):
    """One shard per hostile and per valid kind, plus a clean shard; a data.list naming them all."""
    root = tmp_path_factory.mktemp(f"hostile-{request.param}")
    paths = {}
    for name, (audio, ext, _) in HOSTILE.items():
        paths[name] = shard(root / f"{name}.tar", f"bad/{name}", audio, ext, request.param)
    for name, (audio, ext, _) in VALID.items():
        paths[name] = shard(root / f"{name}.tar", f"ok/{name}", audio, ext, request.param)
    clean = tar_bytes(utterance("clean/1", good_wav(3), "wav") + utterance("clean/2", good_flac(4), "flac"))
    paths["clean"] = str(root / "clean.tar")
    with open(paths["clean"], "wb") as f:
        f.write(clean)
    with open(root / "data.list", "w") as f:
        f.write("".join(p + "\n" for p in paths.values()))
    return root, paths


def run_and_report(*args):
    """The command's result, and its --json report (None without --json)."""
    result = run_cli(*args)
    return result, json.loads(result.stdout) if "--json" in args else None


def test_validate_names_every_hostile_member_and_passes_the_rest(corpus):
    root, paths = corpus
    result, report = run_and_report("validate", root / "data.list", "--json", "-j", "1")
    assert result.exit_code == 1
    findings = report["findings"]
    for name, (_, ext, check) in HOSTILE.items():
        mine = [f for f in findings if f["shard"] == paths[name]]
        assert {(f["key"], f["check"]) for f in mine} == {(f"bad/{name}", check)}, (name, mine)
    flagged = {f["shard"] for f in findings}
    assert not flagged & {paths[n] for n in (*VALID, "clean")}, [f for f in findings if f["shard"] in
                                                                  {paths[n] for n in VALID}]


def test_index_fails_hostile_shards_naming_the_key_and_tells_true_facts(corpus, tmp_path):
    root, paths = corpus
    result, report = run_and_report("index", root / "data.list", "-o", tmp_path / "i.jsonl", "--json", "-j", "1")
    assert result.exit_code == 1
    failed = {f["shard"]: f["error"] for f in report["failures"]}
    for name in HOSTILE:
        if name == "flac_md5":  # a header reader does not decode: validate and convert find it
            assert paths[name] not in failed
            continue
        check = HOSTILE[name][2]
        assert f"bad/{name}" in failed[paths[name]] and f"{check}: " in failed[paths[name]], (name, failed[paths[name]])
    for name, (audio, ext, frames) in VALID.items():
        assert paths[name] not in failed, failed.get(paths[name])
        records = {r["key"]: r for r in index_shard(paths[name], "c")}
        assert records[f"ok/{name}"]["frames"] == frames == len(decoded(audio))
        assert records[f"good/w/{name}"]["frames"] == 8000 and records[f"good/f/{name}"]["frames"] == 8000


def test_convert_to_flac_never_aborts_keeps_problems_and_writes_exact_samples(corpus, tmp_path):
    root, paths = corpus
    result, report = run_and_report("convert", root / "data.list", "-o", tmp_path / "o", "--codec", "none", "--audio", "flac",
                         "--json", "-j", "1")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "o" / "convert.json").read_text())
    entries = {e["source"]["path"]: e for e in manifest["shards"]}
    assert set(entries) == set(paths.values()) and all(e["status"] == "ok" for e in entries.values())
    problems = {(p["key"], p["check"]) for p in report["audio"]["undecodable_kept"]}
    for name, (audio, ext, check) in HOSTILE.items():
        out = dict(iter_shard_members(entries[paths[name]]["output"]["path"]))
        if ext == "wav":  # kept byte for byte, named as a problem
            assert out[f"bad/{name}.wav"] == audio
            assert (f"bad/{name}", check) in problems, name
        assert decoded(out[f"good/w/{name}.flac"]).tolist() == decoded(good_wav()).tolist()  # exact neighbour
        assert out[f"good/f/{name}.flac"] == good_flac()
    for name, (audio, ext, frames) in VALID.items():
        out = dict(iter_shard_members(entries[paths[name]]["output"]["path"]))
        if ext == "wav":
            assert decoded(out[f"ok/{name}.flac"]).tolist() == decoded(audio).tolist()
            assert len(decoded(out[f"ok/{name}.flac"])) == frames


def test_convert_to_wav_checks_flac_headers_and_md5(corpus, tmp_path):
    root, paths = corpus
    result, report = run_and_report("convert", root / "data.list", "-o", tmp_path / "o", "--codec", "none", "--audio", "wav",
                         "--json", "-j", "1")
    assert result.exit_code == 0, result.output
    problems = {(p["key"], p["check"]) for p in report["audio"]["undecodable_kept"]}
    manifest = json.loads((tmp_path / "o" / "convert.json").read_text())
    entries = {e["source"]["path"]: e for e in manifest["shards"]}
    for name, (audio, ext, check) in HOSTILE.items():
        if ext == "flac":
            out = dict(iter_shard_members(entries[paths[name]]["output"]["path"]))
            assert out[f"bad/{name}.flac"] == audio and (f"bad/{name}", check) in problems, name
    for name in ("flac_total0", "flac_padding"):
        out = dict(iter_shard_members(entries[paths[name]]["output"]["path"]))
        assert decoded(out[f"ok/{name}.wav"]).tolist() == decoded(VALID[name][0]).tolist()


def test_a_task_error_is_a_finding_of_its_shard_naming_the_key(corpus, tmp_path, monkeypatch):
    """A failure nobody foresaw inside transcoding keeps the member, as a problem naming shard and key."""
    import shardkit.io.transcode as transcode

    def broken(*args, **kwargs):
        raise ValueError("buffer is smaller than requested size")

    monkeypatch.setattr(transcode, "transcode_member", broken)
    settings = type("S", (), {"audio": "flac", "flac_level": None, "verify": True, "max_decoded_seconds": 10.0})
    name, data, info = transcode.make_transform(settings)("s.tar", "k/1.wav", b"RIFF")
    assert data == b"RIFF" and info["problem"] and info["check"] == "transcode_error"
    assert "s.tar" in info["reason"] and "'k/1'" in info["reason"] and "ValueError" in info["reason"]


def test_balance_refuses_an_utterance_its_bytes_cannot_hold(tmp_path):
    line = {"shard": "/x/a.tar", "key": "liar", "corpus": "c", "audio": "liar.flac", "format": "flac",
            "bytes": 10_000, "sample_rate": 16000, "channels": 1, "frames": 10 ** 11, "duration": 10 ** 11 / 16000,
            "text_chars": 3, "members": [["liar.txt", 512, 3], ["liar.flac", 1536, 9997]]}
    honest = dict(line, key="ok", duration=2.0, frames=32000)
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(honest) + "\n" + json.dumps(line) + "\n")
    result, _ = run_and_report("balance", "--corpus", f"c={path}", "--num-shards", "1", "--world-size", "1",
                    "--num-workers", "1", "-o", tmp_path / "out", "--dry-run")
    assert result.exit_code != 0
    assert "'liar'" in result.output and "/x/a.tar" in result.output and "'c'" in result.output


def test_make_skips_hostile_members_under_their_check(corpus, tmp_path):
    root, paths = corpus
    shards = [paths[n] for n in ("align4", "flac_total_lie", "flac_meta_past_end", "bits0")] + [paths["junk"]]
    result = CliRunner().invoke(main, ["make", *shards, "-o", str(tmp_path / "m"), "--codec", "none"])
    manifest = json.loads((tmp_path / "m" / "make.json").read_text())
    findings = {f["key"]: f["check"] for f in manifest.get("findings", [])}
    for name in ("align4", "flac_total_lie", "flac_meta_past_end", "bits0"):
        assert findings.get(f"bad/{name}") == HOSTILE[name][2], (name, findings, result.output)
    packed = {}
    for s in manifest["shards"]:
        packed.update(dict(iter_shard_members(s["output"]["path"])))
    assert packed["ok/junk.wav"] == VALID["junk"][0]
    assert not any(k.startswith("bad/") for k in packed)


def test_validate_text_and_key_findings(tmp_path):
    members = (utterance("t/bom", good_wav(), "wav", "\ufeff\u200b ") + utterance("t/nul", good_wav(), "wav", "a\0b")
               + utterance("t/cr", good_wav(), "wav", "one\rtwo") + utterance("t/\x01k", good_wav(), "wav")
               + utterance("t/Case", good_wav(), "wav") + utterance("t/case", good_wav(), "wav")
               + utterance("t/" + "k" * 200, good_wav(), "wav"))
    path = tmp_path / "t.tar"
    path.write_bytes(tar_bytes(members))
    result = validate_shard(str(path), ValidateOptions())
    got = {(f["key"], f["check"]) for f in result["findings"]}
    assert got == {("t/bom", "empty_text"), ("t/nul", "text_control"), ("t/\x01k", "key_control")}


def test_kaldi_text_splits_on_newline_only(tmp_path):
    from shardkit.commands.make.kaldi import parse_text, read_table

    (tmp_path / "text").write_bytes(b"a one\rtwo\nb three\r\n")
    texts = parse_text(read_table(str(tmp_path / "text")))
    assert texts == {"a": "one\rtwo", "b": "three"}


def test_torchaudio_decode_errors_do_not_name_addresses():
    pytest.importorskip("torchaudio")
    from shardkit.errors import AudioError
    from shardkit.io.audio import decode_torchaudio

    with pytest.raises(AudioError) as caught:
        decode_torchaudio(b"RIFF" + bytes(60))
    assert " at 0x" not in str(caught.value)


def test_index_reads_a_header_past_the_head_streaming(tmp_path, monkeypatch):
    """A WAV whose data chunk follows a large JUNK chunk, a FLAC with large PADDING blocks: indexed."""
    import shardkit.commands.index as index

    monkeypatch.setattr(index, "STREAM_MEMBER_BYTES", 1 << 16)
    monkeypatch.setattr(index, "HEAD_BYTES", 1 << 14)
    junk = wav(chunks_before=chunk(b"JUNK", 200_000), samples=SIGNAL)
    padded = padded_flac(100_000)
    path = tmp_path / "big.tar"
    path.write_bytes(tar_bytes(utterance("j", junk, "wav") + utterance("p", padded, "flac")))
    records = {r["key"]: r for r in index_shard(str(path), "c")}
    assert records["j"]["frames"] == 8000 and records["p"]["frames"] == 8000
    with pytest.raises(HeaderBeyondHead):
        header_facts(junk[:1 << 14], len(junk))


def test_a_hostile_large_member_fails_its_shard_naming_it(tmp_path, monkeypatch):
    import shardkit.commands.index as index

    monkeypatch.setattr(index, "STREAM_MEMBER_BYTES", 1 << 12)
    monkeypatch.setattr(index, "HEAD_BYTES", 1 << 10)
    path = tmp_path / "big.tar"
    path.write_bytes(tar_bytes(utterance("liar", HOSTILE["flac_total_lie"][0], "flac")))
    with pytest.raises(ShardkitError) as caught:
        index_shard(str(path), "c")
    assert "liar.flac" in str(caught.value) and caught.value.check == "implausible_length"


def test_transcoding_a_float_wav_is_no_problem(tmp_path):
    from shardkit.io.transcode import transcode_member

    buf = io.BytesIO()
    sf.write(buf, SIGNAL.astype(np.float32) / 32768, RATE, format="WAV", subtype="FLOAT")
    _, data, info = transcode_member("k.wav", buf.getvalue(), "flac")
    assert data == buf.getvalue() and info["action"] == "kept" and not info.get("problem")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS is read from /proc")
def test_a_tiny_member_decoding_to_hours_stays_in_bounded_memory(tmp_path):
    """A 450 KB FLAC of five hours of silence: validate (streamed, limit raised) and convert --audio wav
    (refused above --max-decoded-seconds) each peak far below 300 MB, measured in a subprocess."""
    import subprocess
    import sys

    buf = io.BytesIO()
    block = np.zeros((1 << 20, 1), np.int16)
    with sf.SoundFile(buf, "w", 8000, 1, "PCM_16", format="FLAC") as f:
        for _ in range(8000 * 3600 * 5 // (1 << 20)):
            f.write(block)
    long_flac = buf.getvalue()
    assert len(long_flac) < 1 << 20
    path = tmp_path / "long.tar"
    path.write_bytes(tar_bytes(utterance("long", long_flac, "flac") + utterance("good/f", good_flac(), "flac")))
    # VmHWM, not getrusage's ru_maxrss: Linux carries the latter over from the forking (pytest) process
    script = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from shardkit.cli import main\n"
        "r = CliRunner().invoke(main, sys.argv[1:])\n"
        "peak = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM'))\n"
        "print(json.dumps({'rss_kb': peak, 'code': r.exit_code, 'out': r.stdout}))\n")
    runs = {
        "validate": ["validate", str(path), "--json", "--max-decoded-seconds", "20000", "-j", "1"],
        "convert": ["convert", str(path), "-o", str(tmp_path / "o"), "--codec", "none", "--audio", "wav",
                    "--json", "-j", "1"],
    }
    for name, args in runs.items():
        done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["rss_kb"] < 300 * 1024, (name, got["rss_kb"])
        report = json.loads(got["out"])
        if name == "validate":
            assert report["findings"] == [] and got["code"] == 0
        else:
            kept = report["audio"]["undecodable_kept"]
            assert [(p["key"], p["check"]) for p in kept] == [("long", "decoded_too_long")]


def test_an_unforeseen_error_in_a_check_is_the_utterances_finding(tmp_path, monkeypatch):
    import shardkit.commands.index as index
    import shardkit.commands.validate.shard as validate  # the shard scan calls check_audio

    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes(utterance("k/1", good_wav(), "wav")))

    def broken(*args, **kwargs):
        raise ValueError("buffer is smaller than requested size")

    monkeypatch.setattr(validate, "check_audio", broken)
    result = validate_shard(str(path), ValidateOptions())
    assert [(f["key"], f["check"]) for f in result["findings"]] == [("k/1", "check_error")]
    monkeypatch.setattr(index, "probe_member", broken)
    with pytest.raises(ShardkitError) as caught:
        index_shard(str(path), "c")
    assert "index_error" in str(caught.value) and "'k/1'" in str(caught.value) and str(path) in str(caught.value)
