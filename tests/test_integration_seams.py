"""Seams between features merged from separate branches: each test reproduces a bug found on the
integrated build (the recipe as a newcomer runs it, commands chained the way the README chains them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from support import REPO



def test_recipe_does_not_take_a_python3_that_only_sees_the_checkout(tmp_path):
    # From the repository root `python3 -c "import shardkit"` imports the checkout itself (the current
    # folder is on sys.path), even where python3 lacks shardkit's dependencies. The recipe must then
    # set up its own venv, not run shardkit on that python3 and die in a traceback (soundfile, click).
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "scripts", "run.sh"), repo / "scripts" / "run.sh")
    os.symlink(os.path.join(REPO, "shardkit"), repo / "shardkit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"  # a python3 without site-packages; `-m venv` stops the set-up there
    python3.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m venv" ] && {{ echo FAKE-VENV >&2; exit 3; }}\n'
                       f'exec {sys.executable} -S "$@"\n')
    python3.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(["bash", "scripts/run.sh", "--workdir", str(tmp_path / "w"), "--stop_stage", "0"],
                            cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert "run.sh: setting up" in result.stderr, result.stderr
    assert "FAKE-VENV" in result.stderr and "Traceback" not in result.stderr
    assert result.returncode != 0


def _cli(*args):
    from click.testing import CliRunner

    from shardkit.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def test_validate_job_array_as_the_readme_runs_it(tmp_path, make_shards):
    # README "Large corpora": `validate data.list --report /shared/v/validate.json --quarantine /shared/q
    # --split I/3`, then `merge-reports /shared/v --command validate`, with nothing creating /shared/v
    # first; the joined list's shards repeat file names across folders (quarantine mirrors them).
    from shardkit.io.synth import CorpusSpec

    a = make_shards("none", name="a", specs=(CorpusSpec("a", 6, 0.4, 1.0, "zh"),), utts_per_shard=3)
    b = make_shards("none", name="b", specs=(CorpusSpec("b", 6, 0.4, 1.0, "en"),), utts_per_shard=3, seed=1)
    assert os.path.basename(a[0]) == os.path.basename(b[0])
    joined = tmp_path / "train.list"
    joined.write_text("".join(p + "\n" for p in a + b))
    # one bad utterance in b's first shard: its transcript (the first member) emptied
    import io
    import tarfile

    with tarfile.open(b[0]) as t:
        members = [(m, t.extractfile(m).read()) for m in t.getmembers()]
    assert members[0][0].name.endswith(".txt")
    members[0][0].size = 0
    with tarfile.open(b[0], "w", format=tarfile.GNU_FORMAT) as t:
        for i, (m, data) in enumerate(members):
            t.addfile(m, io.BytesIO(b"" if i == 0 else data))
    report = tmp_path / "v" / "validate.json"
    for i in (1, 2, 3):
        result = _cli("validate", joined, "--report", report, "--quarantine", tmp_path / "q", "--split", f"{i}/3",
                      "-j", "1", "--quiet")
        assert result.exit_code in (0, 1), result.output
    merged = _cli("merge-reports", tmp_path / "v", "--command", "validate")
    assert merged.exit_code == 1, merged.output  # findings
    doc = json.loads(report.read_text())
    assert doc["totals"]["findings"] == 1 and doc["totals"]["shards"] == len(a) + len(b)
    listed = (tmp_path / "q" / "data.list").read_text().split()
    assert len(listed) == len(a) + len(b)
    cleaned = [p for p in listed if p.startswith(str(tmp_path / "q"))]
    assert cleaned == [str(tmp_path / "q" / os.path.basename(os.path.dirname(b[0])) / os.path.basename(b[0]))]
    assert set(listed) - set(cleaned) == set(a + b[1:])


def test_json_is_one_document_on_stdout_when_a_command_fails(tmp_path, make_shards):
    # `balance --json` over a corpus whose shards cannot be read used to print the error on stderr and
    # nothing on stdout, so `shardkit ... --json | jq` saw no document at all.
    good = make_shards("none", name="good")[0]
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar archive " * 64)
    listing = tmp_path / "data.list"
    listing.write_text(f"{good}\n{bad}\n")
    env = {**os.environ, "PYTHONPATH": REPO}
    for args, code in [(["balance", "--corpus", f"a={listing}", "--world-size", "1", "--num-workers", "1",
                         "-o", str(tmp_path / "bal")], 1),
                       (["list", "check", str(tmp_path / "missing.list")], 2)]:
        result = subprocess.run([sys.executable, "-m", "shardkit", *args, "--json"], env=env, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == code, result.stderr
        doc = json.loads(result.stdout)  # exactly one document, nothing else
        assert doc["exit_code"] == code and doc["command"] == args[0]
        assert doc["error"] and doc["error"] in result.stderr
    assert str(bad) in json.loads(subprocess.run(
        [sys.executable, "-m", "shardkit", "balance", "--corpus", f"a={listing}", "--world-size", "1",
         "--num-workers", "1", "-o", str(tmp_path / "bal"), "--json"], env=env, capture_output=True, text=True,
        timeout=120).stdout)["error"]


def test_make_job_array_merge_exits_1_when_utterances_were_skipped(tmp_path):
    # A single `make` run that skips an utterance (here: its audio file is missing) exits 1; the merge
    # of a `--split` job array over the same tables must say the same, not exit 0.
    import numpy as np
    import soundfile as sf

    data = tmp_path / "kaldi"
    data.mkdir()
    scp, text = [], []
    for i in range(4):
        key = f"spk/u{i}"
        path = data / f"u{i}.wav"
        if i != 2:  # u2's audio is missing
            t = np.arange(16000) / 16000
            sf.write(path, (0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t)).astype(np.float32), 16000, subtype="PCM_16")
        scp.append(f"{key} {path}\n")
        text.append(f"{key} word {i}\n")
    (data / "wav.scp").write_text("".join(scp))
    (data / "text").write_text("".join(text))
    single = _cli("make", data, "-o", tmp_path / "one", "--utts-per-shard", "1", "-q")
    assert single.exit_code == 1, single.output
    for i in (1, 2):
        sliced = _cli("make", data, "-o", tmp_path / "arr", "--utts-per-shard", "1", "--split", f"{i}/2", "-q")
        assert sliced.exit_code in (0, 1), sliced.output
    merged = _cli("merge-reports", tmp_path / "arr", "--command", "make", "--json")
    assert merged.exit_code == 1, merged.output
    doc = json.loads(merged.stdout)
    assert doc["skipped_utterances"] == 1 and doc["statuses"] == {"ok": 3}
    report = json.loads((tmp_path / "arr" / "make.json").read_text())
    assert [f["key"] for f in report["findings"]] == ["spk/u2"]
    assert len((tmp_path / "arr" / "data.list").read_text().split()) == 3


def test_verify_against_moved_sources_whose_names_repeat(tmp_path, make_shards):
    # convert mirrors corpora that name their shards alike (a/shards_000000000.tar, b/shards_000000000.tar)
    # below OUT_DIR; verify --against matched moved sources by stem alone, so b's output was compared with
    # a's source ("member order differs") and the right pair never checked.
    from shardkit.io.synth import CorpusSpec

    a = make_shards("bz2", name="a", specs=(CorpusSpec("a", 4, 0.4, 1.0, "zh"),), utts_per_shard=2)
    b = make_shards("bz2", name="b", specs=(CorpusSpec("b", 4, 0.4, 1.0, "en"),), utts_per_shard=2, seed=1)
    joined = tmp_path / "train.list"
    joined.write_text("".join(p + "\n" for p in a + b))
    out = tmp_path / "flac"
    assert _cli("convert", joined, "-o", out, "--codec", "none", "--audio", "flac", "-j", "1", "-q").exit_code == 0
    moved = tmp_path / "moved"
    for src in (a, b):
        shutil.copytree(os.path.dirname(src[0]), moved / os.path.basename(os.path.dirname(src[0])))
    folder_a, folder_b = (str(moved / os.path.basename(os.path.dirname(s[0]))) for s in (a, b))
    both = _cli("verify", out, "--against", folder_a, "--against", folder_b, "--json")
    assert both.exit_code == 0, both.output
    assert json.loads(both.stdout)["shards"] == len(a) + len(b)
    # only a's sources given: b's outputs are not compared with a's namesakes, they are named as unmatched
    only_a = _cli("verify", out, "--against", folder_a, "--json")
    assert only_a.exit_code == 1
    problems = json.loads(only_a.stdout)["problems"]
    assert len(problems) == len(b)
    assert all("no source among --against lies in a folder ending in" in p["reason"] for p in problems)
    assert not any("differs" in p["reason"] for p in problems)
    text = _cli("verify", out, "--against", folder_a)
    assert "key None" not in text.output and ": this shard's name repeats; no source among --against" in text.output


def test_loader_check_names_a_bad_shard_in_one_line_from_torch_workers(tmp_path, make_shards):
    # torch re-raises a worker's ShardkitError as "Caught ... in DataLoader worker process 0. Original
    # Traceback (most recent call last): ..."; loader-check printed that whole traceback as its error.
    import pytest

    pytest.importorskip("torch")
    good = make_shards("none", name="good")
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar archive " * 64)
    listing = tmp_path / "data.list"
    listing.write_text("".join(p + "\n" for p in [*good, str(bad)]))
    result = subprocess.run([sys.executable, "-m", "shardkit", "loader-check", str(listing), "--world-size", "1",
                             "--num-workers", "1", "--engine", "torch"], env={**os.environ, "PYTHONPATH": REPO},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "Caught" not in result.stderr, result.stderr
    assert f"Error: {bad}: not a tar archive" in result.stderr


def test_a_mirrored_convert_output_folder_points_to_its_list(tmp_path, make_shards):
    # convert mirrors corpora with repeated shard names below OUT_DIR, so OUT_DIR itself holds no shard;
    # giving that folder to the next command (as the README does with folders) must say where the list is.
    from shardkit.io.synth import CorpusSpec

    a = make_shards("none", name="a", specs=(CorpusSpec("a", 2, 0.4, 1.0, "zh"),), utts_per_shard=2)
    b = make_shards("none", name="b", specs=(CorpusSpec("b", 2, 0.4, 1.0, "en"),), utts_per_shard=2, seed=1)
    joined = tmp_path / "train.list"
    joined.write_text("".join(p + "\n" for p in a + b))
    out = tmp_path / "zst"
    assert _cli("convert", joined, "-o", out, "-j", "1", "-q").exit_code == 0
    result = _cli("validate", out, "-q")
    assert result.exit_code == 2
    assert "folder holds no shards" in result.output and f"pass its list, {out / 'data.list'}" in result.output
    assert _cli("validate", out / "data.list", "-q").exit_code == 0


def test_list_commands_given_a_shard_say_so(make_shards):
    # `shardkit list check shard.tar` failed with "cannot read list file ('utf-8' codec can't decode ...)"
    for codec in ("none", "zst"):
        shard = make_shards(codec, name=f"s-{codec}")[0]
        for args in (["list", "check", shard], ["list", "concat", shard, "-o", shard + ".list"]):
            result = _cli(*args)
            assert result.exit_code == 2
            assert f"{shard}: is a shard, not a list file" in result.output, result.output


def test_wds_webdataset_without_webdataset_names_the_extra(monkeypatch):
    # the core install (what scripts/run.sh sets up) has no webdataset: a bare ModuleNotFoundError before
    import shardkit.training.wds
    from shardkit.errors import UsageError

    # import webdataset (and any submodule an earlier test imported) -> ImportError, as when not installed
    for name in [m for m in sys.modules if m == "webdataset" or m.startswith("webdataset.")] + ["webdataset"]:
        monkeypatch.setitem(sys.modules, name, None)
    import pytest

    with pytest.raises(UsageError, match=r"pip install 'shardkit\[wds\]'"):
        shardkit.training.wds.WebDataset(["x.tar"])


def test_index_refuses_to_write_over_its_input_list(tmp_path, make_shards):
    # `index data.list -o data.list` replaced the list with the index (exit 0): the claim saw only the
    # shards the list names, not the list itself.
    paths = make_shards("none", name="idx")
    listing = tmp_path / "data.list"
    listing.write_text("".join(p + "\n" for p in paths))
    before = listing.read_bytes()
    os.link(listing, tmp_path / "hard.list")
    for out in (listing, tmp_path / "hard.list"):
        result = _cli("index", listing, "-o", out, "-q")
        assert result.exit_code == 2, result.output
        assert "destroy the input" in result.output or "is input" in result.output, result.output
    assert listing.read_bytes() == before
    assert _cli("index", listing, "-o", tmp_path / "index.jsonl", "-q").exit_code == 0


def test_list_rewrite_dir_finds_convert_mirrored_outputs(tmp_path, make_shards):
    # convert mirrors corpora whose shard names repeat (OUT/a/shards_000000000.tar.zst, OUT/b/...);
    # `list rewrite --dir OUT` put every line at OUT/<name> and refused the list (no such file).
    from shardkit.io.synth import CorpusSpec

    a = make_shards("bz2", name="a", specs=(CorpusSpec("a", 4, 0.4, 1.0, "zh"),), utts_per_shard=2)
    b = make_shards("bz2", name="b", specs=(CorpusSpec("b", 2, 0.4, 1.0, "en"),), utts_per_shard=2, seed=1)
    joined = tmp_path / "train.list"
    joined.write_text("".join(p + "\n" for p in a + b))
    out = tmp_path / "zst"
    assert _cli("convert", joined, "-o", out, "-j", "1", "-q", "--codec", "zst").exit_code == 0
    result = _cli("list", "rewrite", joined, "--suffix", ".tar.zst", "--dir", out, "-o", tmp_path / "zst.list")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "zst.list").read_text() == (out / "data.list").read_text()
    # names that do not repeat keep the flat layout convert gives them
    flat = _cli("list", "rewrite", os.path.join(os.path.dirname(a[0]), "data.list"), "--suffix", ".tar",
                "--dir", tmp_path / "plain", "--no-check", "-o", tmp_path / "plain.list")
    assert flat.exit_code == 0, flat.output
    assert (tmp_path / "plain.list").read_text().split() == \
        [str(tmp_path / "plain" / os.path.basename(p).replace(".tar.bz2", ".tar")) for p in a]
