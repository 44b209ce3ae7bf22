"""make from sources whose audio entries are URLs: planning reads a WAV's or FLAC's head only.

The audio lives in fsspec's ``memory://`` filesystem (one store per process, so make runs with
``-j 1``); every byte read from it is counted per object, by phase (planning, writing).
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import re
import socket
import tarfile
import threading
import uuid
from collections import Counter

import fsspec
import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from shardkit.cli import main
from shardkit.commands.make import manifests as make_sources
from shardkit.commands.make.sources._probe import HEAD_BYTES, probe_audio, probe_head
from shardkit.io.remote import is_url
from shardkit.io.synth import encode, speech_like

RATE = 16000


class ByteCounter:
    """Bytes read from each memory:// object (whatever the reader: ranged cat_file, file reads)."""

    def __init__(self, monkeypatch):
        self.read = Counter()
        self.whole = Counter()  # reads that began at offset 0 and ran to the end of the object
        counter = self
        cat_file = MemoryFileSystem.cat_file

        def counting_cat_file(fs, path, start=None, end=None, **kwargs):
            data = cat_file(fs, path, start, end, **kwargs)
            name = fs._strip_protocol(path)
            counter.read[name] += len(data)
            counter.whole[name] += (start or 0) == 0 and len(data) == fs.size(path)
            return data

        def counting(method):
            def wrapper(f, *args):
                at = f.tell()
                out = method(f, *args)
                n = out if isinstance(out, int) else len(out)
                counter.read[f.path] += n
                counter.whole[f.path] += at == 0 and n == f.size
                return out
            return wrapper

        monkeypatch.setattr(MemoryFileSystem, "cat_file", counting_cat_file)
        for name in ("read", "read1", "readinto", "readinto1"):
            monkeypatch.setattr(MemoryFile, name, counting(getattr(io.BytesIO, name)))

    def snapshot(self) -> Counter:
        return Counter(self.read)


@pytest.fixture
def store():
    """A fresh folder of the process-wide memory:// store: ``put(name, bytes) -> url``."""
    fs = fsspec.filesystem("memory")
    root = f"/urlprobe-{uuid.uuid4().hex}"

    def put(name: str, data: bytes) -> str:
        fs.pipe_file(f"{root}/{name}", data)
        return f"memory://{root}/{name}"

    put.fs, put.root = fs, root
    yield put
    fs.rm(root, recursive=True)


def audio(seconds: float, seed: int, fmt: str = "wav") -> bytes:
    subtype = "VORBIS" if fmt == "ogg" else None
    return encode(speech_like(seconds, RATE, seed=seed), RATE, fmt, subtype=subtype)


def streamed_wav(data: bytes) -> bytes:
    """The same WAV with RIFF and data sizes 0xFFFFFFFF, as a writer that streams leaves them."""
    pos = data.index(b"data")
    return data[:4] + b"\xff\xff\xff\xff" + data[8:pos + 4] + b"\xff\xff\xff\xff" + data[pos + 8:]


def data_list(tmp_path, entries) -> str:
    path = tmp_path / "data.list"
    path.write_text("".join(json.dumps({"key": k, "wav": url, "txt": "HELLO"}) + "\n" for k, url in entries))
    return str(path)


def make(src, out, *extra):
    return CliRunner().invoke(main, ["make", "--from", "wenet-raw", src, "-o", str(out), "-j", "1", "-q",
                                     "--codec", "none", "--utts-per-shard", "1", *extra])


def shard_members(out) -> dict:
    members = {}
    with open(os.path.join(out, "data.list")) as f:
        for shard in f.read().split():
            with tarfile.open(shard) as tar:
                for m in tar:
                    members[m.name] = tar.extractfile(m).read()
    return members


def manifest(out) -> dict:
    with open(os.path.join(out, "make.json")) as f:
        return json.load(f)


def planning_counts(monkeypatch, counter: ByteCounter) -> dict:
    """Fills, once make has planned, with the bytes read per object during planning."""
    seen: dict = {}
    probe_files = make_sources.probe_files

    def probing(*args, **kwargs):
        result = probe_files(*args, **kwargs)
        seen.update(counter.snapshot())
        return result

    monkeypatch.setattr(make_sources, "probe_files", probing)
    return seen


def test_memory_urls_are_urls():
    assert is_url("memory://bucket/a.wav")


def test_wav_and_flac_urls_are_planned_from_their_heads_and_fetched_once(tmp_path, store, monkeypatch):
    corpus = {f"spk/w{i}": (audio(s, i), "wav") for i, s in enumerate([4.5, 5.5, 9.25])}
    corpus |= {f"spk/f{i}": (audio(s, 10 + i, "flac"), "flac") for i, s in enumerate([8.0, 12.5])}
    corpus["spk/tiny"] = (audio(0.5, 20), "wav")  # smaller than the head: its head is the whole object
    urls = {key: store(f"{key.replace('/', '_')}.{fmt}", data) for key, (data, fmt) in corpus.items()}
    assert all(len(data) > 2 * HEAD_BYTES for key, (data, _) in corpus.items() if key != "spk/tiny")
    counter = ByteCounter(monkeypatch)
    planned = planning_counts(monkeypatch, counter)

    result = make(data_list(tmp_path, urls.items()), tmp_path / "out")

    assert result.exit_code == 0, result.output
    members = shard_members(tmp_path / "out")
    assert members == {f"{key}.{part}": data for key, (source, fmt) in corpus.items()
                       for part, data in (("txt", b"HELLO"), (fmt, source))}
    doc = manifest(tmp_path / "out")
    seconds = {shard["keys"][0]: shard["seconds"] for shard in doc["shards"]}
    for key, (data, _) in corpus.items():
        info = sf.info(io.BytesIO(data))
        assert seconds[key] == pytest.approx(info.frames / info.samplerate, abs=1e-3)
    assert doc["summary"]["audio_seconds"] == pytest.approx(4.5 + 5.5 + 9.25 + 8.0 + 12.5 + 0.5, abs=1e-3)
    for key, (data, _) in corpus.items():
        name = f"{store.root}/{urls[key].rsplit('/', 1)[1]}"
        assert planned[name] <= min(len(data), HEAD_BYTES), key  # the head only
        assert counter.read[name] == len(data) + planned[name], key  # written from one whole read
        assert counter.whole[name] == 1 + (len(data) <= HEAD_BYTES), key  # a small one: its head is all of it


def test_a_truncated_wav_url_is_reported_with_its_key_as_a_local_one_is(tmp_path, store):
    whole = audio(6.0, 1)
    cut = whole[:len(whole) - 40000]
    url = store("cut.wav", cut)
    local = tmp_path / "cut.wav"
    local.write_bytes(cut)
    good = store("good.wav", audio(2.0, 2))

    for name, location in (("url", url), ("local", str(local))):
        result = make(data_list(tmp_path, [("spk/cut", location), ("spk/good", good)]), tmp_path / name)
        assert result.exit_code == 1, result.output
        found = manifest(tmp_path / name)["findings"]
        assert [(f["key"], f["check"]) for f in found] == [("spk/cut", "unreadable_audio")]
        assert found[0]["reason"] == (f"{location}: WAV header promises 96000 frames, the file holds "
                                      f"{(len(cut) - 44) // 2} (truncated)")
    assert probe_audio(url) == (f"{url}: WAV header promises 96000 frames, the file holds {(len(cut) - 44) // 2} "
                                "(truncated)")


def test_an_object_that_changes_size_after_planning_fails_its_entry_by_key(tmp_path, store, monkeypatch):
    before, after = audio(4.0, 3), audio(4.5, 3)
    url = store("moving.wav", before)
    steady = store("steady.flac", audio(3.0, 4, "flac"))
    probe_files = make_sources.probe_files

    def probe_then_replace(*args, **kwargs):
        result = probe_files(*args, **kwargs)
        store("moving.wav", after)
        return result

    monkeypatch.setattr(make_sources, "probe_files", probe_then_replace)
    result = make(data_list(tmp_path, [("spk/moving", url), ("spk/steady", steady)]), tmp_path / "out")

    assert result.exit_code == 1, result.output
    doc = manifest(tmp_path / "out")
    skipped = [u for shard in doc["shards"] for u in shard["skipped"]]
    assert skipped == [{"key": "spk/moving", "check": "unreadable_audio",
                        "reason": f"{url} changed since it was read for planning "
                                  f"({len(before)} bytes then, {len(after)} now)"}]
    assert set(shard_members(tmp_path / "out")) == {"spk/steady.txt", "spk/steady.flac"}


def test_other_formats_and_streamed_wavs_fall_back_to_the_whole_object(tmp_path, store, monkeypatch):
    ogg = audio(60.0, 5, "ogg")
    streamed = streamed_wav(audio(7.0, 6))
    assert len(ogg) > HEAD_BYTES and len(streamed) > HEAD_BYTES
    urls = {"spk/ogg": store("a.ogg", ogg), "spk/streamed": store("s.wav", streamed)}
    counter = ByteCounter(monkeypatch)
    planned = planning_counts(monkeypatch, counter)

    result = make(data_list(tmp_path, urls.items()), tmp_path / "out")

    assert result.exit_code == 0, result.output
    seconds = {shard["keys"][0]: shard["seconds"] for shard in manifest(tmp_path / "out")["shards"]}
    info = sf.info(io.BytesIO(ogg))
    assert seconds["spk/ogg"] == pytest.approx(info.frames / info.samplerate, abs=1e-3)
    assert seconds["spk/streamed"] == pytest.approx(7.0, abs=1e-3)
    assert shard_members(tmp_path / "out")["spk/ogg.ogg"] == ogg
    assert planned[f"{store.root}/a.ogg"] == len(ogg)  # the head did not tell: the rest read after it
    # a streamed WAV's frames follow from the object's size (what every decoder reads): its head is enough
    assert planned[f"{store.root}/s.wav"] < len(streamed)


def test_a_missing_url_is_reported(tmp_path, store):
    url = f"memory://{store.root}/absent.wav"
    assert probe_audio(url) == f"cannot read {url} (no such file or object)"
    result = make(data_list(tmp_path, [("spk/absent", url), ("spk/good", store("g.wav", audio(1.0, 7)))]),
                  tmp_path / "out")
    assert result.exit_code == 1
    assert [(f["key"], f["check"]) for f in manifest(tmp_path / "out")["findings"]] == [("spk/absent",
                                                                                        "unreadable_audio")]


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """GET with ``Range: bytes=A-[B]`` answered 206 (unless the server's ``ranges`` is off, as in
    Python's own handler); every body byte sent is counted per path in the server's ``served``."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        try:
            with open(self.translate_path(self.path), "rb") as f:
                data = f.read()
        except OSError:
            self.send_error(404)
            return
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if wanted and self.server.ranges:
            start = int(wanted[1])
            body = data[start:int(wanted[2]) + 1 if wanted[2] else len(data)]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.served[self.path] += len(body)


@pytest.fixture(params=[True, False], ids=["ranges", "no-ranges"])
def http_folder(request, tmp_path):
    pytest.importorskip("aiohttp")  # fsspec's HTTP driver
    folder = tmp_path / "www"
    folder.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = functools.partial(RangeHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.ranges, server.served = request.param, Counter()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{port}", server
    server.shutdown()
    server.server_close()


def test_http_urls_are_planned_from_ranged_reads_or_whole_where_the_server_ignores_ranges(tmp_path, http_folder,
                                                                                          monkeypatch):
    folder, base, server = http_folder
    corpus = {"spk/w": (audio(6.0, 1), "wav"), "spk/f": (audio(9.0, 2, "flac"), "flac"),
              "spk/o": (audio(60.0, 3, "ogg"), "ogg")}
    for key, (data, fmt) in corpus.items():
        (folder / f"{key[4:]}.{fmt}").write_bytes(data)
    planned: dict = {}
    probe_files = make_sources.probe_files

    def probing(*args, **kwargs):
        result = probe_files(*args, **kwargs)
        planned.update(server.served)
        return result

    monkeypatch.setattr(make_sources, "probe_files", probing)
    entries = [(key, f"{base}/{key[4:]}.{fmt}") for key, (_, fmt) in corpus.items()]

    result = make(data_list(tmp_path, entries), tmp_path / "out")

    assert result.exit_code == 0, result.output
    members = shard_members(tmp_path / "out")
    assert all(members[f"{key}.{fmt}"] == data for key, (data, fmt) in corpus.items())
    seconds = {shard["keys"][0]: shard["seconds"] for shard in manifest(tmp_path / "out")["shards"]}
    assert seconds["spk/w"] == 6.0 and seconds["spk/f"] == 9.0
    info = sf.info(io.BytesIO(corpus["spk/o"][0]))
    assert seconds["spk/o"] == pytest.approx(info.frames / info.samplerate, abs=1e-3)
    for key, (data, fmt) in corpus.items():
        path = f"/{key[4:]}.{fmt}"
        if not server.ranges or fmt == "ogg":
            assert planned[path] == len(data), key  # the whole object, once, at planning
        else:
            assert planned[path] == HEAD_BYTES, key
        assert server.served[path] == planned[path] + len(data), key  # and once whole when written


def test_probe_head_reads_flac_streaminfo_and_knows_when_it_does_not_tell():
    stereo = encode(speech_like(2.5, 22050, seed=8, channels=2), 22050, "flac")
    assert probe_head(stereo[:HEAD_BYTES], len(stereo), "x.flac") == (2.5, 22050, 2)
    unknown = bytearray(stereo)
    unknown[21] &= 0xF0  # total samples (36 bits at byte 21, low nibble, onwards) = 0: length unknown
    unknown[22:26] = b"\0\0\0\0"
    assert probe_head(bytes(unknown[:HEAD_BYTES]), len(unknown), "x.flac") is None
    ogg = audio(1.0, 9, "ogg")
    assert probe_head(ogg[:HEAD_BYTES], len(ogg), "x.ogg") is None
    wav = audio(3.0, 9)
    assert len(wav) > HEAD_BYTES
    assert probe_head(wav[:HEAD_BYTES], len(wav), "x.wav") == (3.0, RATE, 1)
    # data size not stated: the object's size tells, as every decoder reads a streamed WAV to its end
    assert probe_head(streamed_wav(wav)[:HEAD_BYTES], len(wav), "x.wav") == (3.0, RATE, 1)
    small = streamed_wav(audio(1.0, 9))  # a streamed WAV the head holds whole: its size tells
    assert probe_head(small, len(small), "x.wav") == (1.0, RATE, 1)


def test_local_flac_is_probed_from_streaminfo_as_soundfile_reads_it(tmp_path):
    path = tmp_path / "a.flac"
    path.write_bytes(audio(3.3, 11, "flac"))
    info = sf.info(str(path))
    seconds, rate, channels, size, mtime_ns = probe_audio(str(path))
    assert (seconds, rate, channels) == (info.frames / info.samplerate, info.samplerate, info.channels)
    assert (size, mtime_ns) == (os.path.getsize(path), os.stat(path).st_mtime_ns)
    assert np.isclose(seconds, 3.3)


def test_kaldi_wav_scp_takes_urls_with_segments(tmp_path, store):
    """A Kaldi wav.scp may name URLs, as every other source may: probed from the head, fetched when
    written, segments cut sample-exactly (a URL is not joined to the working folder as a path)."""
    long = speech_like(3.0, RATE, seed=11)
    url = store("rec.wav", encode(long, RATE, "wav"))
    (tmp_path / "wav.scp").write_text(f"rec {url}\n")
    (tmp_path / "segments").write_text("rec-a rec 0.5 1.25\nrec-b rec 2.0 -1\n")
    (tmp_path / "text").write_text("rec-a FIRST\nrec-b SECOND\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["make", "--wav-scp", str(tmp_path / "wav.scp"), "--text", str(tmp_path / "text"),
                                       "--segments", str(tmp_path / "segments"), "-o", str(out), "--codec", "none",
                                       "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    with tarfile.open(out / "shards_000000000.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    assert members["rec-a.txt"] == b"FIRST" and members["rec-b.txt"] == b"SECOND"
    got_a, rate = sf.read(io.BytesIO(members["rec-a.wav"]), dtype="int16")
    got_b, _ = sf.read(io.BytesIO(members["rec-b.wav"]), dtype="int16")
    assert rate == RATE
    assert np.array_equal(got_a, long[int(0.5 * RATE):int(1.25 * RATE)])
    assert np.array_equal(got_b, long[2 * RATE:])
    report = json.loads((out / "make.json").read_text())
    assert str(tmp_path / "memory:") not in json.dumps(report["inputs"])  # the URL was not taken for a local path


def _unknown_length_flac(samples: np.ndarray) -> bytes:
    """A FLAC whose STREAMINFO says 0 total samples (what an encoder writing to a pipe leaves)."""
    from shardkit.io.audio import flac_total_samples

    data = bytearray(encode(samples, RATE, "flac"))
    assert flac_total_samples(bytes(data)) == len(samples)
    data[21] &= 0xF0
    data[22:26] = bytes(4)
    assert flac_total_samples(bytes(data)) == 0
    return bytes(data)


def test_a_flac_of_unknown_length_is_planned_by_its_real_duration(tmp_path, store):
    """libsndfile says SF_COUNT_MAX frames for such a FLAC; planning counts them instead (file and URL),
    so the utterance is neither 10^14 s long nor dropped."""
    from shardkit.io.audio import probe

    first, second = speech_like(1.5, RATE, seed=21), speech_like(2.25, RATE, seed=22)
    local = tmp_path / "first.flac"
    local.write_bytes(_unknown_length_flac(first))
    url = store("second.flac", _unknown_length_flac(second))
    assert probe(_unknown_length_flac(first))["frames"] == len(first)
    (tmp_path / "data.list").write_text(json.dumps({"key": "first", "wav": str(local), "txt": "ONE"}) + "\n"
                                        + json.dumps({"key": "second", "wav": url, "txt": "TWO"}) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["make", "--from", "wenet-raw", str(tmp_path / "data.list"), "-o", str(out),
                                       "--codec", "none", "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "make.json").read_text())
    assert report["summary"]["utterances"] == 2
    assert abs(report["summary"]["audio_seconds"] - 3.75) < 1e-6
    with tarfile.open(out / "shards_000000000.tar") as tar:
        audio = {m.name: tar.extractfile(m).read() for m in tar if m.name.endswith(".flac")}
    from shardkit.io.audio import decode

    assert audio["second.flac"] == _unknown_length_flac(second)  # keep mode: the bytes as they were
    for name, samples in (("first.flac", first), ("second.flac", second)):  # and shardkit decodes them whole
        decoded, rate = decode(audio[name], "int16")
        assert rate == RATE and np.array_equal(decoded[:, 0], samples)


def test_a_flac_of_unknown_length_is_validated_cut_and_transcoded(tmp_path):
    """Beyond planning: validate does not call it truncated, make cuts segments out of it, convert
    --audio wav decodes it whole (libsndfile reports SF_COUNT_MAX frames for it)."""
    samples = speech_like(2.0, RATE, seed=31)
    recording = tmp_path / "rec.flac"
    recording.write_bytes(_unknown_length_flac(samples))
    (tmp_path / "wav.scp").write_text(f"rec {recording}\n")
    (tmp_path / "segments").write_text("rec-a rec 0.25 1.0\n")
    (tmp_path / "text").write_text("rec-a CUT\n")
    runner = CliRunner()
    cut = tmp_path / "cut"
    result = runner.invoke(main, ["make", "--wav-scp", str(tmp_path / "wav.scp"), "--text", str(tmp_path / "text"),
                                  "--segments", str(tmp_path / "segments"), "-o", str(cut), "--codec", "none",
                                  "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    with tarfile.open(cut / "shards_000000000.tar") as tar:
        got = sf.read(io.BytesIO(tar.extractfile("rec-a.wav").read()), dtype="int16")[0]
    assert np.array_equal(got, samples[int(0.25 * RATE):RATE])

    shard = tmp_path / "whole.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("rec.txt", b"WHOLE"), ("rec.flac", _unknown_length_flac(samples))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "data.list").write_text(f"{shard}\n")
    result = runner.invoke(main, ["validate", str(tmp_path / "data.list"), "--json", "-q"])
    report = json.loads(result.output)
    assert result.exit_code == 0 and report["findings"] == [], report["findings"]
    assert abs(report["totals"]["audio_seconds"] - 2.0) < 1e-9
    result = runner.invoke(main, ["convert", str(shard), "-o", str(tmp_path / "wav"), "--codec", "none",
                                  "--audio", "wav", "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    with tarfile.open(tmp_path / "wav" / "whole.tar") as tar:
        decoded = tar.extractfile("rec.wav").read()
    assert np.array_equal(sf.read(io.BytesIO(decoded), dtype="int16")[0], samples)  # every sample, verified


def test_a_local_header_is_read_from_its_first_page_unless_it_reaches_past_it(tmp_path):
    """Planning reads one page of a local WAV/FLAC (with the kernel's readahead off for it), and more
    only when the header reaches past it: a cold corpus is not read whole before it is packed."""
    import struct

    from shardkit.commands.make.sources import _probe

    samples = speech_like(3.0, RATE, seed=41)
    plain = tmp_path / "plain.wav"
    plain.write_bytes(encode(samples, RATE, "wav"))
    flac = tmp_path / "plain.flac"
    flac.write_bytes(encode(samples, RATE, "flac"))
    # a WAV with a 10 kB LIST chunk between fmt and data: its data chunk header lies past the first page
    wav = encode(samples, RATE, "wav")
    padding = b"LIST" + struct.pack("<I", 10_000) + bytes(10_000)
    data_at = wav.index(b"data")
    tagged_bytes = wav[:data_at] + padding + wav[data_at:]
    tagged_bytes = tagged_bytes[:4] + struct.pack("<I", len(tagged_bytes) - 8) + tagged_bytes[8:]
    tagged = tmp_path / "tagged.wav"
    tagged.write_bytes(tagged_bytes)

    reads: list[int] = []

    class Counting(io.FileIO):
        def read(self, n=-1):
            data = super().read(n)
            reads.append(len(data))
            return data

    for path, most in ((plain, _probe.FIRST_READ_BYTES), (flac, _probe.FIRST_READ_BYTES),
                       (tagged, _probe.HEAD_BYTES)):
        reads.clear()
        with Counting(str(path), "rb") as f:
            head, _ = _probe._probe_local_head(f, os.path.getsize(path), str(path))
        assert sum(reads) <= most and len(head) == sum(reads)
        seconds, rate, channels, size, _ = probe_audio(str(path))
        assert (rate, channels, size) == (RATE, 1, os.path.getsize(path))
        assert seconds == pytest.approx(3.0)
    assert sum(reads) > _probe.FIRST_READ_BYTES  # the tagged WAV needed its second read
