"""The zstd bridge for WeNet: tarfile patched in-process, and installed the documented way in a venv."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import textwrap

import pytest
import zstandard

import shardkit
from shardkit.io import zstd_tarfile as hook
from shardkit.io.tar import iter_shard_members
from shardkit.training import zstd_hook
from support import run_cli

pytestmark = pytest.mark.skipif(not hook.needed(), reason="Python 3.14+ tarfile reads zstd itself")

READ_MODES = ["r:*", "r|*", "r:zst", "r|zst"]


@pytest.fixture
def unpatched():
    was_active = hook.is_patched(tarfile)
    hook.deactivate()
    yield tarfile
    if was_active:
        hook.activate()


def read_with_tarfile(fileobj, mode):
    """Every member as (name, size, mtime, mode, type, bytes), read as WeNet does (iterate, extractfile)."""
    out = []
    with tarfile.open(fileobj=fileobj, mode=mode) as archive:
        for info in archive:
            with archive.extractfile(info) as f:
                out.append((info.name, info.size, info.mtime, info.mode, info.type, f.read()))
    return out


def tar_blob(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("mode", READ_MODES)
def test_patched_tarfile_reads_shardkit_zst_shards_in_every_mode(make_shards, patched, mode):
    zst = make_shards("zst")
    plain = make_shards("none")
    for zst_path, plain_path in zip(zst, plain):
        expected = list(iter_shard_members(plain_path))
        with open(zst_path, "rb") as f:
            got = read_with_tarfile(f, mode)
        assert [(name, data) for name, *_, data in got] == expected


def test_without_the_patch_zst_is_refused_as_wenet_sees_it(make_shards, unpatched):
    with open(make_shards("zst")[0], "rb") as f, pytest.raises(tarfile.ReadError, match="could not be opened"):
        tarfile.open(fileobj=f, mode="r:*")


@pytest.mark.parametrize("codec", ["none", "gz", "bz2", "xz"])
@pytest.mark.parametrize("mode", ["r:*", "r|*"])
def test_other_compressions_read_identically_with_and_without_the_patch(make_shards, codec, mode):
    path = make_shards(codec, utts_per_shard=7)[0]
    was_active = hook.is_patched(tarfile)
    hook.deactivate()
    try:
        with open(path, "rb") as f:
            before = read_with_tarfile(f, mode)
        hook.patch(tarfile)
        with open(path, "rb") as f:
            after = read_with_tarfile(f, mode)
        with pytest.raises(tarfile.ReadError):
            tarfile.open(fileobj=io.BytesIO(b"not a tar at all" * 64), mode=mode)
    finally:
        hook.deactivate()
        if was_active:
            hook.activate()
    assert after == before and len(before) == 14


def test_patch_is_idempotent_and_unpatch_restores_tarfile_exactly(unpatched):
    methods = dict(tarfile.TarFile.OPEN_METH)
    stream_init = tarfile._Stream.__init__
    assert hook.patch(tarfile) is True
    assert hook.patch(tarfile) is False  # second import / activation changes nothing
    assert tarfile.TarFile.OPEN_METH == {**methods, "zst": "zstopen"}
    assert list(tarfile.TarFile.OPEN_METH) == [*methods, "zst"]  # tried after xz, before plain tar
    assert hook.unpatch(tarfile) is True
    assert hook.unpatch(tarfile) is False
    assert tarfile.TarFile.OPEN_METH == methods
    assert tarfile._Stream.__init__ is stream_init
    assert not hasattr(tarfile.TarFile, "zstopen")


def test_random_access_backward_reads_are_correct_as_over_bz2(patched):
    members = [(f"spk/utt-{i:03d}.wav", os.urandom(700) + bytes(3000 + i)) for i in range(40)]
    blob = tar_blob(members)
    for compressed in (zstandard.ZstdCompressor().compress(blob), __import__("bz2").compress(blob)):
        with tarfile.open(fileobj=io.BytesIO(compressed), mode="r:*") as archive:
            infos = archive.getmembers()
            backwards = [(i.name, archive.extractfile(i).read()) for i in reversed(infos)]
            again = archive.extractfile(infos[3]).read()  # far back after the end
        assert backwards == members[::-1]
        assert again == members[3][1]


def test_concatenated_zstd_frames_read_as_one_stream_in_both_modes(patched):
    members = [(f"k{i}.txt", f"text {i}".encode()) for i in range(30)]
    blob = tar_blob(members)
    cut = len(blob) // 3
    frames = zstandard.ZstdCompressor().compress(blob[:cut]) + zstandard.ZstdCompressor().compress(blob[cut:])
    for mode in ("r:*", "r|*"):
        assert [(n, d) for n, *_, d in read_with_tarfile(io.BytesIO(frames), mode)] == members


def test_truncated_zst_raises_as_truncated_bz2_does_never_a_short_read(patched):
    # Which error depends on where the cut falls against the codec's blocks: EOFError once data was
    # delivered (r:), ReadError (r|, or nothing decodable yet); bz2 behaves the same way.
    members = [(f"k{i}.wav", os.urandom(300) + bytes(30000)) for i in range(60)]
    blob = tar_blob(members)
    for compress in (zstandard.ZstdCompressor().compress, __import__("bz2").compress):
        data = compress(blob)
        for mode, expected in (("r:*", (EOFError, tarfile.ReadError)), ("r|*", tarfile.ReadError)):
            for cut in (0.1, 0.5, 0.9, 0.999):
                with pytest.raises(expected):
                    read_with_tarfile(io.BytesIO(data[: int(len(data) * cut)]), mode)


def test_zst_write_modes_round_trip(patched, tmp_path):
    members = [("a/1.txt", b"hello"), ("a/1.wav", os.urandom(999))]
    for mode in ("w:zst", "w|zst"):
        path = tmp_path / f"out-{mode[1]}.tar.zst"
        with tarfile.open(path, mode) as archive:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        assert path.read_bytes()[:4] == hook.ZSTD_MAGIC
        assert list(iter_shard_members(str(path))) == members


def test_missing_backports_zstd_is_a_compression_error_naming_it(patched, monkeypatch, make_shards):
    monkeypatch.setitem(sys.modules, "backports.zstd", None)
    with open(make_shards("zst")[0], "rb") as f:
        with pytest.raises(tarfile.CompressionError, match="backports.zstd is not installed"):
            tarfile.open(fileobj=f, mode="r:zst")
        f.seek(0)
        with pytest.raises(tarfile.ReadError, match="method zst: CompressionError"):
            tarfile.open(fileobj=f, mode="r:*")


def test_activation_is_lazy_idempotent_and_survives_reload(tmp_path):
    code = textwrap.dedent("""
        import importlib, sys
        import shardkit.io.zstd_tarfile as hook
        hook.activate(); hook.activate()
        assert "tarfile" not in sys.modules and "backports.zstd" not in sys.modules
        assert sum(getattr(f, "_shardkit_zstd", False) for f in sys.meta_path) == 1
        import tarfile
        assert tarfile.TarFile.OPEN_METH["zst"] == "zstopen" and "backports.zstd" not in sys.modules
        assert tarfile.__loader__.get_source("tarfile")  # the real loader still answers
        tarfile = importlib.reload(tarfile)
        assert hook.is_patched(tarfile)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"


# --- installed the documented way ----------------------------------------------------------------

WENET_READER = r'''
"""WeNet's read path: data.list lines -> open -> tarfile.open(fileobj, "r:*") -> group -> torchaudio."""
import hashlib, io, json, sys, tarfile

AUDIO_FORMAT_SETS = {"flac", "mp3", "m4a", "ogg", "opus", "wav", "wma"}


def tar_file_and_group(list_path):
    with open(list_path) as lines:
        for line in lines:
            url = line.strip("\n")
            stream = open(url, "rb")
            try:
                with tarfile.open(fileobj=stream, mode="r:*") as archive:
                    prev_prefix, example = None, {}
                    for tarinfo in archive:
                        name = tarinfo.name
                        pos = name.rfind(".")
                        assert pos > 0
                        prefix, postfix = name[:pos], name[pos + 1:]
                        if prev_prefix is not None and prefix != prev_prefix:
                            example["key"] = prev_prefix
                            yield example
                            example = {}
                        with archive.extractfile(tarinfo) as file_obj:
                            if postfix == "txt":
                                example["txt"] = file_obj.read().decode("utf8").strip()
                            elif postfix in AUDIO_FORMAT_SETS:
                                example["wav"] = file_obj.read()
                            else:
                                example[postfix] = file_obj.read()
                        prev_prefix = prefix
                    if prev_prefix is not None:
                        example["key"] = prev_prefix
                        yield example
            except Exception as ex:  # WeNet's ignore_error: log and go on with the next shard
                print(f"In tar_file_and_group: {ex!r} when processing {url}", file=sys.stderr)
            finally:
                stream.close()


report = {}
for list_path in sys.argv[1:]:
    utts = []
    for sample in tar_file_and_group(list_path):
        import torchaudio  # only when there is audio to decode, as in WeNet's decode_wav

        waveform, sample_rate = torchaudio.load(io.BytesIO(sample["wav"]))
        utts.append([sample["key"], sample["txt"], sample_rate, list(waveform.shape),
                     hashlib.sha256(waveform.numpy().tobytes()).hexdigest()])
    report[list_path] = utts
print(json.dumps(report))
'''


def make_venv(root, *, link_shardkit=True):
    """A throwaway venv; its site-packages sees shardkit (from source) and this venv's packages.

    Path lines only: this venv's own .pth files (a hook the developer enabled there) are not run.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    python = os.path.join(str(root), "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if link_shardkit:
        repo_root = os.path.dirname(os.path.dirname(os.path.abspath(shardkit.__file__)))
        with open(os.path.join(purelib, "_link_test_packages.pth"), "w") as f:
            f.write(f"{repo_root}\n{sysconfig.get_paths()['purelib']}\n")
    return python, purelib


def run_python(python, *args, stdin=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", hook.DISABLE_ENV)}
    return subprocess.run([python, *args], capture_output=True, text=True, timeout=300, env=env)


def test_wenet_reads_zst_shards_in_a_venv_with_the_hook_installed_by_the_cli(make_shards, tmp_path):
    pytest.importorskip("torchaudio")
    lists = {}
    for codec in ("zst", "none"):
        for audio in ("wav", "flac"):
            paths = make_shards(codec, audio_format=audio, utts_per_shard=4)
            lists[codec, audio] = os.path.join(os.path.dirname(paths[0]), "data.list")
    reader = tmp_path / "wenet_reader.py"
    reader.write_text(WENET_READER)
    python, purelib = make_venv(tmp_path / "env")

    before = run_python(python, str(reader), lists["zst", "wav"])
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout) == {lists["zst", "wav"]: []}  # every zst shard skipped, as in WeNet today
    assert before.stderr.count("could not be opened successfully") == 4

    enabled = run_python(python, "-m", "shardkit", "wenet", "enable-zstd")
    pth = os.path.join(purelib, zstd_hook.PTH_NAME)
    assert enabled.returncode == 0, enabled.stderr
    assert enabled.stderr.startswith(f"wrote {pth} (backports.zstd ")
    assert f"reads .tar.zst at every start of {python}" in enabled.stderr
    with open(pth) as f:
        assert f.read() == zstd_hook.PTH_TEXT

    after = run_python(python, str(reader), *lists.values())
    assert after.returncode == 0, after.stderr
    assert after.stderr == ""
    got = json.loads(after.stdout)
    for audio in ("wav", "flac"):
        zst, plain = got[lists["zst", audio]], got[lists["none", audio]]
        assert len(plain) == 14 and zst == plain
    assert [u[0] for u in got[lists["zst", "wav"]]] == [u[0] for u in got[lists["zst", "flac"]]]

    status = run_python(python, "-m", "shardkit", "wenet", "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["reads_zstd"] is True

    disabled = run_python(python, "-m", "shardkit", "wenet", "disable-zstd")
    assert disabled.returncode == 0 and disabled.stderr == f"removed {pth}\n"
    assert not os.path.exists(pth)
    again = run_python(python, str(reader), lists["zst", "wav"])
    assert json.loads(again.stdout) == {lists["zst", "wav"]: []}
    status = run_python(python, "-m", "shardkit", "wenet", "status")
    assert status.returncode == 1 and "hook not active" in status.stderr


def test_leftover_hook_without_shardkit_is_silent_at_startup(tmp_path):
    python, purelib = make_venv(tmp_path / "bare", link_shardkit=False)
    with open(os.path.join(purelib, zstd_hook.PTH_NAME), "w") as f:
        f.write(zstd_hook.PTH_TEXT)
    done = run_python(python, "-c", "import tarfile; print('zst' in tarfile.TarFile.OPEN_METH)")
    assert (done.returncode, done.stdout, done.stderr) == (0, "False\n", "")


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_enable_status_disable_with_target(tmp_path):
    pth = tmp_path / zstd_hook.PTH_NAME
    first = run_cli("wenet", "enable-zstd", "--target", tmp_path)
    assert first.exit_code == 0, first.output
    assert first.stderr.splitlines()[0].startswith(f"wrote {pth} (backports.zstd ")
    assert pth.read_text() == zstd_hook.PTH_TEXT
    second = run_cli("wenet", "enable-zstd", "--target", tmp_path, "--json")
    assert second.exit_code == 0
    report = json.loads(second.stdout)
    assert (report["action"], report["pth"], report["probe"]["reads_zstd"]) == ("unchanged", str(pth), True)
    assert report["probe"]["target_is_site_dir"] is False  # a plain folder: read through site.addsitedir

    status = run_cli("wenet", "status", "--target", tmp_path, "--json")
    assert status.exit_code == 0
    assert {k: json.loads(status.stdout)[k] for k in ("installed", "current", "reads_zstd")} == {
        "installed": True, "current": True, "reads_zstd": True}

    removed = run_cli("wenet", "disable-zstd", "--target", tmp_path)
    assert (removed.exit_code, removed.stderr) == (0, f"removed {pth}\n")
    absent = run_cli("wenet", "disable-zstd", "--target", tmp_path)
    assert (absent.exit_code, absent.stderr) == (0, f"no hook installed ({pth})\n")
    status = run_cli("wenet", "status", "--target", tmp_path)
    assert status.exit_code == 1
    assert f"hook:            {pth}: not installed" in status.stderr
    assert "reads .tar.zst:  no (this tarfile has no zstd support (hook not active))" in status.stderr


def test_cli_refuses_a_foreign_pth_and_a_missing_target(tmp_path):
    (tmp_path / zstd_hook.PTH_NAME).write_text("import something_else\n")
    refused = run_cli("wenet", "disable-zstd", "--target", tmp_path)
    assert refused.exit_code == 2
    assert refused.stderr == (f"Error: {tmp_path / zstd_hook.PTH_NAME}: {zstd_hook.PTH_NAME} was not written by shardkit "
                              f"(it does not import shardkit.io.zstd_tarfile); left in place\n")
    assert (tmp_path / zstd_hook.PTH_NAME).exists()
    missing = run_cli("wenet", "enable-zstd", "--target", tmp_path / "nope")
    assert missing.exit_code == 2
    assert missing.stderr == (f"Error: {tmp_path / 'nope'}: target folder does not exist "
                              "(give a site-packages folder)\n")


def test_cli_enable_without_backports_zstd_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(zstd_hook, "backports_zstd_version", lambda: None)
    result = run_cli("wenet", "enable-zstd", "--target", tmp_path)
    assert result.exit_code == 1
    assert result.stderr == (f"Error: backports.zstd is not installed for {sys.executable}; the hook reads zstd "
                             "through it. Run: pip install backports.zstd\n")
    assert not (tmp_path / zstd_hook.PTH_NAME).exists()


def test_cli_on_python_314_does_nothing_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(zstd_hook, "native_zstd", lambda: True)
    monkeypatch.setattr(zstd_hook, "python_version", lambda: "3.14.0")
    result = run_cli("wenet", "enable-zstd", "--target", tmp_path)
    assert (result.exit_code, result.stderr) == (
        0, "Python 3.14.0 reads .tar.zst natively (tarfile mode r:*); nothing to install.\n")
    assert os.listdir(tmp_path) == []
