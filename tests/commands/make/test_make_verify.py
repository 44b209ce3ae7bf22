"""make's read-back verification (lifecycle.verify_stream): a shard must read back, through the
checked tar reader, as the members written, with the tar stream's digest computed while writing."""

from __future__ import annotations

import hashlib
import os

import pytest

from shardkit.commands.convert import HashingFile
from shardkit.commands.make import MakeSettings, make_shard
from shardkit.errors import VerificationError
from shardkit.io.codecs import open_writer
from shardkit.io.synth import encode, speech_like
from shardkit.io.tar import TarWriter, iter_shard_members
from shardkit.run.lifecycle import verify_stream

RATE = 16000


def write_shard(path, members, codec="none"):
    """A shard as make writes it; returns (expected names and sizes, tar stream digest, size)."""
    with open(path, "wb") as f:
        hashing = HashingFile(f)
        out = open_writer(hashing, codec, None)
        stream = hashing if codec == "none" else HashingFile(out)
        tar = TarWriter(stream)
        for name, data in members:
            tar.add(name, data)
        tar.close()
        out.close()
    return [(n, len(d)) for n, d in members], stream.sha256.digest(), stream.size


MEMBERS = [("a/utt1.txt", b"HELLO WORLD"), ("a/utt1.wav", encode(speech_like(1.0, RATE, seed=1), RATE, "wav")),
           ("utt2.txt", b"SPEECH"), ("utt2.wav", encode(speech_like(0.5, RATE, seed=2), RATE, "wav"))]


@pytest.mark.parametrize("codec", ["none", "zst", "gz"])
def test_a_shard_as_written_verifies(tmp_path, codec):
    path = str(tmp_path / "s.tar")
    expected, digest, size = write_shard(path, MEMBERS, codec)
    verify_stream(expected, digest, size, shard="s")(path)
    assert [(n, len(d)) for n, d in iter_shard_members(path)] == expected


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


def test_a_changed_byte_inside_member_data_is_caught(tmp_path):
    # names and sizes still read back as written: only the stream digest can tell
    path = str(tmp_path / "s.tar")
    expected, digest, size = write_shard(path, MEMBERS)
    data = open(path, "rb").read()
    _flip(path, data.index(MEMBERS[1][1][1000:1016]) + 5)
    assert [(n, len(d)) for n, d in iter_shard_members(path)] == expected
    with pytest.raises(VerificationError, match="another sha256"):
        verify_stream(expected, digest, size, shard="s")(path)


def test_a_compressed_shard_that_decompresses_differently_is_caught(tmp_path):
    path = str(tmp_path / "s.tar.gz")
    expected, digest, size = write_shard(path, MEMBERS, "gz")
    other_path = str(tmp_path / "other.tar.gz")
    changed = [MEMBERS[0], (MEMBERS[1][0], MEMBERS[1][1][:-1] + bytes([MEMBERS[1][1][-1] ^ 0xFF])), *MEMBERS[2:]]
    write_shard(other_path, changed, "gz")
    with pytest.raises(VerificationError):
        verify_stream(expected, digest, size, shard="s")(other_path)


def test_other_names_sizes_or_a_truncated_shard_are_caught(tmp_path):
    path = str(tmp_path / "s.tar")
    expected, digest, size = write_shard(path, MEMBERS)
    renamed = [("a/utt9.txt", 11)] + expected[1:]
    with pytest.raises(VerificationError, match="does not read back") as err:
        verify_stream(renamed, digest, size, shard="s")(path)
    assert err.value.member == "a/utt9.txt"
    with pytest.raises(VerificationError):
        verify_stream(expected[:-1], digest, size, shard="s")(path)
    with open(path, "r+b") as f:
        f.truncate(size - 10240)
    with pytest.raises(Exception):
        verify_stream(expected, digest, size, shard="s")(path)


def test_make_shard_publishes_nothing_when_the_read_back_differs(tmp_path, monkeypatch):
    import shardkit.commands.make.shard as make

    wavs = []
    for i in range(3):
        p = tmp_path / f"u{i}.wav"
        p.write_bytes(encode(speech_like(1.0, RATE, seed=i), RATE, "wav"))
        wavs.append({"key": f"u{i}", "text": "HELLO", "source": {"path": str(p)}, "start": None, "end": None,
                     "seconds": 1.0})
    real = make.verify_stream

    def corrupting(expected, digest, size, *, shard):
        check = real(expected, digest, size, shard=shard)

        def verify(tmp):
            _flip(tmp, size // 2)  # what a bad disk or a racing writer would do
            check(tmp)
        return verify

    dst = str(tmp_path / "out.tar")
    good = make.make_shard(dst, wavs, MakeSettings(codec="none", level=None))
    assert good["status"] == "ok" and good["output"]["sha256"] == hashlib.sha256(open(dst, "rb").read()).hexdigest()
    os.unlink(dst)
    monkeypatch.setattr(make, "verify_stream", corrupting)
    bad = make_shard(dst, wavs, MakeSettings(codec="none", level=None))
    assert bad["status"] == "failed" and "does not read back as written" in bad["error"]
    # no shard, no temporary file (.index holds the index part of the good run's shard)
    assert sorted(n for n in os.listdir(tmp_path) if n != ".index") == [f"u{i}.wav" for i in range(3)]


def test_no_verify_skips_only_the_read_back(tmp_path, monkeypatch):
    """``make --no-verify`` publishes the same bytes, and hands no read-back to the commit."""
    from click.testing import CliRunner

    from shardkit.cli import main
    from shardkit.io.files import AtomicFile

    wav_scp, text = tmp_path / "wav.scp", tmp_path / "text"
    lines_wav, lines_text = [], []
    for i in range(4):
        p = tmp_path / f"u{i}.wav"
        p.write_bytes(encode(speech_like(0.7 + 0.1 * i, RATE, seed=i), RATE, "wav"))
        lines_wav.append(f"u{i} {p}")
        lines_text.append(f"u{i} HELLO {i}")
    wav_scp.write_text("\n".join(lines_wav) + "\n")
    text.write_text("\n".join(lines_text) + "\n")
    real_commit = AtomicFile.commit
    handed: list = []

    def commit(self, verify=None, **kwargs):
        if self.dst.endswith(".tar"):
            handed.append(verify)
        return real_commit(self, verify, **kwargs)

    monkeypatch.setattr(AtomicFile, "commit", commit)

    def run(out, *extra):
        handed.clear()
        result = CliRunner().invoke(main, ["make", "--wav-scp", str(wav_scp), "--text", str(text), "-o", str(out),
                                           "--codec", "none", "--utts-per-shard", "2", "-j", "1", "-q", *extra])
        assert result.exit_code == 0, result.output
        return {n: (out / n).read_bytes() for n in sorted(os.listdir(out)) if n.endswith(".tar")}, list(handed)

    verified, checks = run(tmp_path / "verified")
    assert len(verified) == 2 and len(checks) == 2 and all(callable(c) for c in checks)
    unverified, checks = run(tmp_path / "unverified", "--no-verify")
    assert unverified == verified and checks == [None, None]


from hypothesis import given  # noqa: E402
from hypothesis import settings as hsettings
from hypothesis import strategies as st


@hsettings(max_examples=300, deadline=None)
@given(name=st.text(st.characters(blacklist_categories=("Cs",)), max_size=120) | st.sampled_from(
           ["a" * 99, "a" * 100, "a" * 101, "é" * 50, "spk1/utt00001.wav"]),
       size=st.integers(0, 8 ** 11 - 1) | st.sampled_from([0, 511, 512, 8 ** 11, 2 ** 40]))
def test_tar_header_template_is_tarfiles_header_byte_for_byte(name, size):
    from shardkit.io.tar import _tarfile_header, tar_header

    assert tar_header(name, size) == _tarfile_header(name, size)


def test_sync_while_verifying_publishes_after_both_and_reports_a_failed_fsync(tmp_path, monkeypatch):
    import errno

    from shardkit.io.files import AtomicFile, OutputError

    seen = []
    dst = str(tmp_path / "out.bin")
    with AtomicFile(dst) as f:
        f.write(b"x" * 100000)
        f.commit(lambda tmp: seen.append(open(tmp, "rb").read() == b"x" * 100000), sync_while_verifying=True)
    assert seen == [True] and open(dst, "rb").read() == b"x" * 100000

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    dst2 = str(tmp_path / "out2.bin")
    with pytest.raises(OutputError, match="No space left"):
        with AtomicFile(dst2) as f:
            f.write(b"y" * 1000)
            f.commit(lambda tmp: None, sync_while_verifying=True)
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]  # nothing published, no temporary file left


def test_read_ahead_keeps_order_and_reads_only_small_sources_ahead(monkeypatch):
    """make reads the next utterance in a thread while this one is written, only when its source is at
    most READ_AHEAD_BYTES (so at most one large member is held), in order, errors in their place."""
    import threading

    import shardkit.commands.make.shard as make
    from shardkit.errors import AudioError

    sizes = [10, 20, make.READ_AHEAD_BYTES + 1, 30, 40]
    utterances = [{"key": f"u{i}", "source": {"path": f"/nowhere/u{i}.wav", "size": size}} for i, size in enumerate(sizes)]
    done: set[str] = set()  # utterances the caller has finished writing
    previous_done_when_read: dict[str, bool] = {}
    read = {u["key"]: threading.Event() for u in utterances}

    def audio(utt, settings):
        index = int(utt["key"][1:])
        previous_done_when_read[utt["key"]] = index == 0 or f"u{index - 1}" in done
        read[utt["key"]].set()
        if utt["key"] == "u3":
            raise AudioError("broken on purpose")
        return "wav", utt["key"].encode()

    monkeypatch.setattr(make, "utterance_audio", audio)
    seen = []
    for utt, got in make.read_ahead(utterances, make.MakeSettings()):
        index = int(utt["key"][1:])
        if index + 1 < len(sizes) and sizes[index + 1] <= make.READ_AHEAD_BYTES:
            assert read[f"u{index + 1}"].wait(5)  # the next one is read while this one is being written
        seen.append((utt["key"], got if isinstance(got, tuple) else type(got).__name__))
        done.add(utt["key"])
    assert seen == [("u0", ("wav", b"u0")), ("u1", ("wav", b"u1")), ("u2", ("wav", b"u2")), ("u3", "AudioError"),
                    ("u4", ("wav", b"u4"))]
    # u2 (large) is read only once u1 is done; the small ones are read while the one before is written
    assert previous_done_when_read == {"u0": True, "u1": False, "u2": True, "u3": False, "u4": False}
