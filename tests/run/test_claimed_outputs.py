"""One claimed-run helper (lifecycle.claimed_output_dir) for convert, make, validate --quarantine and
balance; outputs never land in an input's folder, however they are laid out; merge-reports takes
the run's folder lock; standard input as a convert source has a documented output name and is
converted again by a rerun."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner
from test_lifecycle import hold_lock

from shardkit.cli import main
from shardkit.errors import UsageError
from shardkit.io.inputs import plan_output_paths, stdin_stem
from shardkit.run.lifecycle import OutputLock, claim_output, claimed_output_dir, lock_name, remote_journal_dir
from support import REPO, folder_bytes, run_cli

ENV = {**os.environ, "PYTHONPATH": REPO}


def inodes(paths):
    return {p: (os.stat(p).st_ino, open(p, "rb").read()) for p in paths}


# ------------------------------------------------------------------------------ claimed_output_dir


def test_claimed_output_dir_claims_creates_locks_and_releases(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(b"x")
    out = tmp_path / "out" / "deeper"
    with claimed_output_dir(str(out), [str(src / "a.tar")], "convert", (2, 3)) as (out_dir, journal_dir):
        assert out_dir == journal_dir == str(out)
        assert os.listdir(out) == [lock_name("convert", (2, 3))]
        with pytest.raises(UsageError, match="another shardkit convert run \\(slice 2 of 3\\)"):
            OutputLock(out_dir, "convert", (2, 3)).acquire()
    assert os.listdir(out) == []
    # the body's exception passes through and the lock goes with it
    with pytest.raises(RuntimeError, match="body failed"):
        with claimed_output_dir(str(out), [], "make"):
            raise RuntimeError("body failed")
    assert os.listdir(out) == []
    with pytest.raises(UsageError, match="holds input"):
        with claimed_output_dir(str(src), [str(src / "a.tar")], "convert"):
            pass
    for pipe in ("-", "pipe:cat"):
        with pytest.raises(UsageError, match="cannot be a pipe: command; give a folder or a URL"):
            with claimed_output_dir(pipe, [], "convert"):
                pass
    with pytest.raises(UsageError, match="the quarantine folder must be a local folder"):
        with claimed_output_dir("s3://bucket/q", [], "validate", what="the quarantine folder", urls=False):
            pass
    assert not os.path.exists("s3:")


def test_claimed_output_dir_keeps_a_urls_journal_and_lock_in_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with claimed_output_dir("s3://bucket/prefix/", [], "make") as (out_dir, journal_dir):
        assert out_dir == "s3://bucket/prefix"
        assert journal_dir == remote_journal_dir("s3://bucket/prefix", "make")
        assert os.path.dirname(journal_dir) == str(tmp_path)
        assert os.listdir(journal_dir) == [".shardkit-make.lock"]
    assert not os.path.exists(journal_dir)
    # another slice's journal still in the folder: it stays
    with claimed_output_dir("s3://bucket/prefix", [], "make", (1, 2)) as (_, journal_dir):
        open(os.path.join(journal_dir, ".make.journal.slice-1-of-2.jsonl"), "w").close()
    assert os.listdir(journal_dir) == [".make.journal.slice-1-of-2.jsonl"]


def test_the_lifecycle_steps_live_in_lifecycle_only():
    """convert, make, validate and balance take the folder lock through claimed_output_dir alone."""
    commands = os.path.join(REPO, "shardkit", "commands")
    modules = [os.path.join(commands, "convert.py")]
    for package in ("validate", "make", "balance"):
        modules += [os.path.join(commands, package, name) for name in os.listdir(os.path.join(commands, package))
                    if name.endswith(".py")]
    for module in modules:
        with open(module, encoding="utf-8") as f:
            text = f.read()
        assert "OutputLock(" not in text and "prepare_out_dir(" not in text, module
        assert "def remote_journal_dir" not in text, module
    from shardkit.commands import convert
    from shardkit.run import lifecycle

    assert convert.remote_journal_dir is lifecycle.remote_journal_dir  # still importable where it was


# ------------------------------------------------------------------------ outputs in inputs' folders


@pytest.fixture
def two_corpora(make_shards, tmp_path):
    """/d/aishell and /d/libri, each with shards_000000000.tar.zst ... (names repeat across them)."""
    root = tmp_path / "d"
    root.mkdir()
    sources = []
    for name in ("aishell", "libri"):
        made = make_shards("zst", name=f"corpus-{name}")
        shutil.copytree(os.path.dirname(made[0]), root / name)
        sources += [str(root / name / os.path.basename(p)) for p in made]
    return root, sources


def test_mirrored_outputs_that_would_land_in_the_inputs_folders_are_refused(two_corpora):
    root, sources = two_corpora
    before = inodes(sources)
    # names repeat: outputs mirror aishell/ and libri/ below /d, which are the inputs' folders;
    # zst -> zst would replace every source by its re-packed copy
    for args in (["convert", *sources, "-o", root, "--codec", "zst"],
                 ["convert", *sources, "-o", root, "--keep-tree", "--codec", "zst"],
                 ["validate", *sources, "--quarantine", root, "--sample-rate", "16000"]):
        result = run_cli(*args, "-q")
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.count("\n") == 1, result.stderr
        what, suffix = ("the quarantine folder", ".tar") if "validate" in args else ("OUT_DIR", ".tar.zst")
        assert result.stderr == (f"Error: {root}: {what} would write {root}/aishell/shards_000000000{suffix} "
                                 f"into the folder of input {sources[0]} ({root}/aishell by real path), so "
                                 f"outputs could overwrite inputs; choose another folder\n")
    assert inodes(sources) == before
    assert sorted(os.listdir(root)) == ["aishell", "libri"]  # not even a lock file


def test_a_symlinked_sub_folder_of_the_output_is_seen_through(two_corpora, tmp_path):
    root, sources = two_corpora
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(root / "aishell", out / "aishell")  # the mirrored folder, by real path an input's
    with pytest.raises(UsageError, match="into the folder of input"):
        claim_output(str(out), sources, plan_output_paths(sources, str(out), ".tar.zst"))


def test_inputs_below_the_output_folder_stay_allowed_when_no_output_lands_beside_them(make_shards, tmp_path):
    """What validate's own 'sources below the quarantine folder' refusal used to forbid: flat
    outputs in a parent folder of the inputs touch no input and are allowed, as for convert."""
    made = make_shards("none", name="one-corpus")
    root = tmp_path / "d"
    shutil.copytree(os.path.dirname(made[0]), root / "corpus")
    sources = [str(root / "corpus" / os.path.basename(p)) for p in made]
    before = folder_bytes(root / "corpus")
    result = run_cli("validate", *sources, "--quarantine", root, "--sample-rate", "16000", "-q", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["quarantine"]["dir"] == str(root)
    result = run_cli("convert", *sources, "-o", root, "-q", "--codec", "zst")
    assert result.exit_code == 0, result.output
    assert sorted(n for n in os.listdir(root) if n.endswith(".tar.zst")) == [
        os.path.basename(s) + ".zst" for s in sources]
    assert folder_bytes(root / "corpus") == before


# -------------------------------------------------------------------------------- merge-reports lock


def test_merge_reports_refuses_while_an_unsliced_run_holds_the_folder(make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=4)
    out = tmp_path / "out"
    for i in (1, 2):
        assert run_cli("convert", *sources, "-o", out, "-q", "-j", "1", "--split", f"{i}/2").exit_code == 0
    holder = hold_lock(out, "convert")  # a convert without --split into the same folder
    before = folder_bytes(out)
    try:
        result = run_cli("merge-reports", out, "--command", "convert")
        assert result.exit_code == 2, result.output
        assert result.stderr == (f"Error: {out}: another shardkit convert run is writing this folder: pid "
                                 f"{holder.pid} on host {socket.gethostname()}, since "
                                 f"{result.stderr.split(', since ')[1].split(' holds')[0]} holds "
                                 f".shardkit-convert.lock; wait for it to finish or stop it, then run again\n")
        assert folder_bytes(out) == before  # nothing written
    finally:
        holder.kill()
        holder.wait()
    result = run_cli("merge-reports", out, "--command", "convert")
    assert result.exit_code == 0, result.output
    assert "took over a stale lock" in result.stderr
    assert not [n for n in os.listdir(out) if n.endswith(".lock")]
    assert json.loads(open(out / "convert.json").read())["command"] == "convert"
    # while the merge holds the folder, an un-sliced run refuses
    with OutputLock(str(out), "convert"):
        result = run_cli("convert", *sources, "-o", out, "-q", "-j", "1")
        assert result.exit_code == 2 and "another shardkit convert run is writing this folder" in result.stderr


def test_validate_merge_also_locks_the_quarantine_folder(make_shards, tmp_path):
    sources = make_shards("none", utts_per_shard=4)
    reports, quarantine = tmp_path / "v", tmp_path / "q"
    reports.mkdir()
    for i in (1, 2):
        result = run_cli("validate", *sources, "--sample-rate", "16000", "-q", "-j", "1", "--quarantine", quarantine,
                         "--report", reports / "check.json", "--split", f"{i}/2")
        assert result.exit_code == 0, result.output
    holder = hold_lock(quarantine, "validate")  # validate --quarantine without --split
    try:
        result = run_cli("merge-reports", reports, "--command", "check")
        assert result.exit_code == 2, result.output
        assert f"Error: {quarantine}: another shardkit validate run is writing this folder: pid {holder.pid} " \
               f"on host {socket.gethostname()}" in result.stderr
        assert not os.path.exists(reports / "check.json") and not os.path.exists(quarantine / "data.list")
    finally:
        holder.kill()
        holder.wait()
    result = run_cli("merge-reports", reports, "--command", "check")
    assert result.exit_code == 0, result.output
    assert os.path.exists(reports / "check.json") and os.path.exists(quarantine / "data.list")


# ------------------------------------------------------------------------------- standard input


def test_plan_output_paths_names_standard_input():
    shards = ["/d/a/s0.tar", "-", "/d/b/s0.tar"]
    assert plan_output_paths(shards, "/o", ".tar.zst") == ["/o/a/s0.tar.zst", "/o/stdin.tar.zst", "/o/b/s0.tar.zst"]
    assert plan_output_paths(["-"], "/o", ".tar", keep_tree=True) == ["/o/stdin.tar"]
    assert plan_output_paths(["-", "/d/a/x.tar"], "s3://b/p/", ".tar.zst", stdin_name="x0.tar.bz2",
                             keep_tree=True) == ["s3://b/p/x0.tar.zst", "s3://b/p/x.tar.zst"]
    assert stdin_stem(None) == "stdin" and stdin_stem("shards_000000007.tar.bz2") == "shards_000000007"
    for bad in ("", "a/b", "..", ".tar", "x\x00"):
        with pytest.raises(UsageError, match="--stdin-name takes one file name"):
            stdin_stem(bad)
    with pytest.raises(UsageError, match="would both write /o/stdin.tar; give standard input's output another "
                                         "name with --stdin-name"):
        plan_output_paths(["/d/stdin.tar.gz", "-"], "/o", ".tar", keep_tree=False)
    with pytest.raises(UsageError, match="would both write"):
        plan_output_paths(["/d/stdin.tar.gz", "-"], "/o", ".tar")


def convert_stdin(source, *args):
    with open(source, "rb") as f:
        return subprocess.run([sys.executable, "-m", "shardkit", "convert", "-", *map(str, args)], stdin=f,
                              capture_output=True, env=ENV, timeout=300)


def test_a_shard_piped_through_standard_input(make_shards, tmp_path):
    sources = make_shards("bz2", utts_per_shard=4)
    reference = tmp_path / "ref"
    assert run_cli("convert", *sources, "-o", reference, "-q", "-j", "1", "--codec", "zst").exit_code == 0
    expected = [(reference / (os.path.basename(s)[:-len(".tar.bz2")] + ".tar.zst")).read_bytes() for s in sources]
    out = tmp_path / "out"

    done = convert_stdin(sources[0], "--codec", "zst", "-o", out, "--json", "-q")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["ok"] == 1 and summary["this_run"] == {"done": 1, "skipped": 0, "failed": 0}
    assert (out / "stdin.tar.zst").read_bytes() == expected[0]
    assert (out / "data.list").read_text() == f"{out}/stdin.tar.zst\n"
    report = json.loads((out / "convert.json").read_text())
    assert report["shards"][0]["source"] == {"path": "-", "size": None, "mtime_ns": None}

    # a rerun cannot know the stream is the one it converted: another shard comes in, it is converted
    done = convert_stdin(sources[1], "--codec", "zst", "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["this_run"] == {"done": 1, "skipped": 0, "failed": 0}
    assert (out / "stdin.tar.zst").read_bytes() == expected[1]
    assert (f"note: {out}/stdin.tar.zst: standard input cannot be compared with the stream an earlier run "
            f"converted into it; converting it again\n") in done.stderr.decode()

    # --stdin-name: the source's own file name gives the output a file conversion gives it
    done = convert_stdin(sources[2], "--codec", "zst", "-o", out, "--stdin-name", os.path.basename(sources[2]), "-q")
    assert done.returncode == 0, done.stderr
    name = os.path.basename(sources[2])[:-len(".tar.bz2")] + ".tar.zst"
    assert (out / name).read_bytes() == expected[2]
    assert (out / "data.list").read_text() == f"{out}/{name}\n"

    # beside named shards, in a mirrored layout too: standard input's output stays on top
    result = convert_stdin(sources[0], sources[1], "-o", tmp_path / "mixed", "--keep-tree", "-q", "--codec", "none",
                           "--stdin-name", "piped")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "mixed")) == sorted(["convert.json", "data.list", "piped.tar",
                                                             os.path.basename(sources[1])[:-len(".bz2")],
                                                             ".index", "index.parquet"])  # the by-product index


def test_stdin_name_misuse_and_a_terminal_are_usage_errors(make_shards, tmp_path):
    sources = make_shards("none", utts_per_shard=4)
    result = run_cli("convert", sources[0], "-o", tmp_path / "out", "--stdin-name", "x")
    assert result.exit_code == 2
    assert "--stdin-name names the output of SOURCE - (standard input), and no SHARDS argument is -" in result.stderr
    result = CliRunner().invoke(main, ["convert", "-", "-o", str(tmp_path / "out"), "--stdin-name", "../x"],
                                input=b"")
    assert result.exit_code == 2 and "--stdin-name takes one file name, not '../x'" in result.stderr
    assert not os.path.exists(tmp_path / "out")
    import pty

    parent, child = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "shardkit", "convert", "-", "-o", str(tmp_path / "out")],
                              stdin=child, capture_output=True, text=True, env=ENV, timeout=120)
    finally:
        os.close(child)
        os.close(parent)
    assert done.returncode == 2
    assert done.stderr == ("Error: SOURCE - reads a shard from standard input, which is a terminal here; pipe one "
                           "in: curl -s URL | shardkit convert - -o OUT_DIR\n")
