"""shardkit.training.wds's drop-ins behave as WebDataset does where that is safe (issue 36).

Each case is read twice, by the real webdataset package and by the drop-in, and the two must agree
(samples, or the exception type WebDataset's callers catch); where shardkit differs on purpose (pipe:
URLs, '..' member names) the named policy and its option are checked. WebDataset's own test suite,
run against the drop-ins, lives in tests/webdataset_suite.
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from shardkit.errors import (
    DuplicateMemberError,
    InputError,
    InputMissingError,
    NonRegularMemberError,
    ShardkitError,
    TarFormatError,
    UnsafeNameError,
    UsageError,
)
from shardkit.io.synth import encode, speech_like
from shardkit.training import wds as skwds

wds = pytest.importorskip("webdataset")

WAV = [encode(speech_like(0.3, 16000, seed=i), 16000, "wav") for i in range(4)]


def _tar(path, entries, mode="w"):
    """entries: (name, bytes) for files, (name, "dir") / (name, "symlink") for other member types."""
    with tarfile.open(path, mode) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif data == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def _utts(n):
    return [(f"u{i}.{ext}", data) for i in range(n) for ext, data in (("txt", f"text {i}".encode()), ("wav", WAV[i]))]


def _plain(samples):
    return [{k: bytes(v) if isinstance(v, bytearray) else v for k, v in s.items()} for s in samples]


def _stage(url, **kw):
    return _plain(skwds.tarfile_to_samples(**kw)([{"url": url}]))


def _theirs(url, **kw):
    return list(wds.tarfile_to_samples(**kw)([{"url": url}]))


def test_directories_and_symlinks_are_skipped_and_counted_as_webdataset_skips_them(tmp_path):
    path = _tar(tmp_path / "s.tar", [("d/", "dir")] + _utts(2)[:2] + [("link.wav", "symlink")] + _utts(2)[2:])
    stage = skwds.tarfile_to_samples()
    ours = _plain(stage([{"url": path}]))
    assert ours == _theirs(path)
    assert [s["__key__"] for s in ours] == ["u0", "u1"]
    assert stage.skipped_members == 2


def _cut_inside_last_wav(tmp_path, mode):
    """The 4-utterance shard cut in the middle of u3.wav's data (tar), or of the gzip stream's last part."""
    whole_path = _tar(tmp_path / "whole.tar", _utts(4), mode)
    whole = open(whole_path, "rb").read()
    if mode == "w":
        with tarfile.open(whole_path) as tar:
            at = tar.getmember("u3.wav").offset_data + len(WAV[3]) // 2
    else:  # the shortest gzip prefix whose decodable bytes end in the middle of u3.wav's data
        import zlib

        with tarfile.open(whole_path) as tar:
            middle = tar.getmember("u3.wav").offset_data + len(WAV[3]) // 2
        at = next(n for n in range(64, len(whole), 64)
                  if len(zlib.decompressobj(31).decompress(whole[:n])) >= middle)
    cut = tmp_path / ("cut.tar.gz" if mode == "w:gz" else "cut.tar")
    cut.write_bytes(whole[:at])
    return str(cut)


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_a_truncated_shard_gives_every_complete_sample_then_a_tarfile_read_error(tmp_path, mode):
    cut = _cut_inside_last_wav(tmp_path, mode)
    got = []
    with pytest.raises(tarfile.ReadError) as err:
        for sample in skwds.tarfile_to_samples()([{"url": cut}]):
            got.append(sample)
    assert isinstance(err.value, ShardkitError) and cut in str(err.value)
    # every sample handed on is whole, and none that WebDataset reads whole before the break is missing
    # (tarfile's stream buffer loses up to 10 KiB before a gzip break: shardkit may give more, never less)
    assert all(bytes(s["wav"]) == WAV[int(s["__key__"][1:])] and s["txt"] == f"text {s['__key__'][1:]}".encode()
               for s in got)
    theirs = [s for s in wds.WebDataset(cut, shardshuffle=False, handler=wds.ignore_and_stop)
              if bytes(s.get("wav", b"")) == WAV[int(s["__key__"][1:])]]
    assert [s["__key__"] for s in got][:len(theirs)] == [s["__key__"] for s in theirs]
    assert [s["__key__"] for s in got] == ["u0", "u1", "u2"]  # u3 is the broken one; nothing before it is lost
    with pytest.raises(tarfile.ReadError):
        list(wds.WebDataset(cut, shardshuffle=False))  # WebDataset raises the same type


def test_under_a_stopping_handler_the_complete_samples_before_the_break_arrive(tmp_path):
    cut = _cut_inside_last_wav(tmp_path, "w")
    ours = [s["__key__"] for s in skwds.WebDataset(cut, shardshuffle=False, handler=wds.ignore_and_stop)]
    theirs = [s["__key__"] for s in wds.WebDataset(cut, shardshuffle=False, handler=wds.ignore_and_stop)]
    assert ours == ["u0", "u1", "u2"]  # WebDataset also hands on u3 with its txt only
    assert theirs[:3] == ours


def test_a_duplicated_extension_under_a_continuing_handler_skips_that_member_only(tmp_path):
    entries = _utts(3)
    entries.insert(2, ("u0.txt", b"again"))  # u0 has txt twice: the second is dropped, as WebDataset drops it
    entries.insert(2, ("u0.wav", WAV[3]))
    path = _tar(tmp_path / "s.tar", entries)
    seen = []
    ours = _stage(path, handler=lambda err: seen.append(err) or True)
    assert ours == _theirs(path, handler=wds.ignore_and_continue)
    assert [s["__key__"] for s in ours] == ["u0", "u1", "u2"] and ours[0]["txt"] == b"text 0"
    assert len(seen) == 2 and all(isinstance(e, DuplicateMemberError) and isinstance(e, ValueError) for e in seen)
    assert "u0.txt" in str(seen[1]) and path in str(seen[1])
    with pytest.raises(ValueError):
        _stage(path)


def test_an_empty_tar_gives_no_sample(tmp_path):
    path = tmp_path / "empty.tar"
    path.write_bytes(b"\0" * 10240)
    assert _stage(str(path)) == _theirs(str(path)) == []


def test_a_missing_shard_is_a_file_not_found_error_naming_it(tmp_path):
    missing = str(tmp_path / "absent.tar")
    with pytest.raises(FileNotFoundError) as err:
        _stage(missing)
    assert isinstance(err.value, InputMissingError) and str(err.value) == f"{missing}: no such file"
    with pytest.raises(OSError):  # what code written against WebDataset catches
        list(skwds.WebDataset(missing, shardshuffle=False))
    assert _stage(missing, handler=wds.ignore_and_continue) == []


def test_select_and_rename_files_as_webdataset_applies_them(tmp_path):
    path = _tar(tmp_path / "s.tar", _utts(3))

    def rename(name):
        return name[:-4] + ".text" if name.endswith(".txt") else name

    def select(name):
        return not name.startswith("u1.")

    kw = {"rename_files": rename, "select_files": select}
    assert _stage(path, **kw) == _theirs(path, **kw)
    assert [sorted(s) for s in _stage(path, **kw)] == [["__key__", "__url__", "text", "wav"]] * 2
    ours = list(skwds.WebDataset(path, shardshuffle=False, **kw))
    assert ours == list(wds.WebDataset(path, shardshuffle=False, **kw))
    assert all(s["__local_path__"] == path for s in ours)  # WebDataset adds it; the stages do not


def test_pipe_urls_are_refused_by_default_and_run_when_allowed(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDKIT_ALLOW_PIPES", raising=False)
    path = _tar(tmp_path / "s.tar", _utts(2))
    url = f"pipe:cat {path}"
    with pytest.raises(OSError) as err:
        _stage(url)
    assert isinstance(err.value, InputError) and "SHARDKIT_ALLOW_PIPES" in str(err.value)
    expected = _theirs(url)
    assert _stage(url, allow_pipes=True) == expected
    assert _plain(skwds.WebDataset(url, shardshuffle=False, allow_pipes=True)) == \
        list(wds.WebDataset(url, shardshuffle=False))
    monkeypatch.setenv("SHARDKIT_ALLOW_PIPES", "1")
    assert _stage(url) == expected


def test_dot_dot_and_absolute_names_are_refused_or_read_as_names_by_policy(tmp_path):
    entries = _utts(1) + [("../evil.txt", b"x"), ("/abs.txt", b"y")] + _utts(2)[2:]
    path = _tar(tmp_path / "s.tar", entries)
    with pytest.raises(UnsafeNameError):
        _stage(path)
    seen = []
    skipped = _stage(path, handler=lambda err: seen.append(err) or True)
    assert [s["__key__"] for s in skipped] == ["u0", "u1"] and len(seen) == 2
    assert _stage(path, unsafe_names="read") == _theirs(path)  # WebDataset's reading: names, never paths
    with pytest.raises(UsageError):
        skwds.tarfile_to_samples(unsafe_names="extract")


def test_other_url_schemes_go_through_webdatasets_gopen(tmp_path, monkeypatch):
    import importlib

    gopen = importlib.import_module("webdataset.gopen")  # the module (webdataset.gopen is also its function)
    path = _tar(tmp_path / "s.tar", _utts(2))
    monkeypatch.setitem(gopen.gopen_schemes, "shardkittest",
                        lambda url, mode="rb", bufsize=8192, **kw: open(url.split(":", 1)[1], "rb"))
    url = f"shardkittest:{path}"
    assert _stage(url) == _theirs(url)
    assert [s["__key__"] for s in _stage(url)] == ["u0", "u1"]


def test_error_types_keep_shardkits_family_and_the_standard_bases():
    assert issubclass(TarFormatError, tarfile.ReadError) and issubclass(TarFormatError, ShardkitError)
    assert issubclass(InputMissingError, FileNotFoundError) and issubclass(InputError, OSError)
    assert issubclass(NonRegularMemberError, ShardkitError)
    err = InputMissingError("no such file", shard="a.tar")
    assert str(err) == "a.tar: no such file" and err.check == "missing_file"
