"""One output per input shard: the layout rule (inputs.plan_output_paths) and the commands that use it,
on multi-corpus lists whose shards share file names (every WeNet corpus names them shards_000000000.tar)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands.validate import plan_quarantine
from shardkit.errors import UsageError
from shardkit.io.inputs import plan_output_paths, read_list, shard_stem
from shardkit.io.synth import CorpusSpec
from shardkit.io.tar import group_samples, iter_shard_members

CORPORA = ["/d/aishell/shards_000000000.tar.bz2", "/d/aishell/shards_000000001.tar.bz2",
           "/d/libri/train/shards_000000000.tar.bz2"]


def test_distinct_names_stay_flat():
    assert plan_output_paths(CORPORA[:2], "/o", ".tar.zst") == ["/o/shards_000000000.tar.zst",
                                                                 "/o/shards_000000001.tar.zst"]


def test_repeated_names_mirror_every_output_below_the_common_parent():
    assert plan_output_paths(CORPORA, "/o", ".tar") == ["/o/aishell/shards_000000000.tar",
                                                        "/o/aishell/shards_000000001.tar",
                                                        "/o/libri/train/shards_000000000.tar"]


def test_keep_tree_forces_the_mirror_and_flat_refuses_collisions():
    assert plan_output_paths(CORPORA[:2], "/o", ".tar", keep_tree=True) == ["/o/shards_000000000.tar",
                                                                            "/o/shards_000000001.tar"]
    assert plan_output_paths(["/d/a/x.tar", "/d/b/y.tar"], "/o", ".tar", keep_tree=True) == ["/o/a/x.tar",
                                                                                             "/o/b/y.tar"]
    with pytest.raises(UsageError) as err:
        plan_output_paths(CORPORA, "/o", ".tar", keep_tree=False)
    assert str(err.value) == ("/d/aishell/shards_000000000.tar.bz2 and /d/libri/train/shards_000000000.tar.bz2 "
                              "would both write /o/shards_000000000.tar; drop --flat to mirror their folders")


def test_a_shard_given_twice_is_refused_in_every_layout():
    for keep_tree in (None, True, False):
        with pytest.raises(UsageError, match="shard given twice"):
            plan_output_paths([CORPORA[0], CORPORA[0]], "/o", ".tar", keep_tree=keep_tree)


def test_url_outputs_mirror_with_slashes():
    assert plan_output_paths(CORPORA, "s3://b/p/", ".tar") == ["s3://b/p/aishell/shards_000000000.tar",
                                                               "s3://b/p/aishell/shards_000000001.tar",
                                                               "s3://b/p/libri/train/shards_000000000.tar"]


def test_quarantine_stems_follow_the_same_rule():
    assert plan_quarantine(CORPORA, "/q") == ["aishell/shards_000000000", "aishell/shards_000000001",
                                              "libri/train/shards_000000000"]
    assert plan_quarantine(CORPORA[:2], "/q") == ["shards_000000000", "shards_000000001"]


@pytest.fixture
def two_corpora(tmp_path, make_shards):
    """Two corpora whose shards have the same file names, joined in one data.list."""
    a = make_shards("bz2", utts_per_shard=7, name="corpus-a")
    b = make_shards("none", utts_per_shard=3, name="corpus-b", specs=(CorpusSpec("other", 6, 0.4, 1.0, "zh"),))
    assert [os.path.basename(p) for p in a][:1] == ["shards_000000000.tar.bz2"]
    joined = tmp_path / "joined.list"
    joined.write_text("\n".join(a + b) + "\n")
    return a, b, joined


def keys(data_list):
    return [s["__key__"] for shard in read_list(str(data_list)) for s in group_samples(iter_shard_members(shard))]


def test_convert_mirrors_folders_when_names_repeat(two_corpora, tmp_path):
    a, b, joined = two_corpora
    out = tmp_path / "zst"
    result = CliRunner().invoke(main, ["convert", str(joined), "-o", str(out), "-q", "--json", "-j", "1", "--codec", "zst"])
    assert result.exit_code == 0, result.output
    outputs = read_list(str(out / "data.list"))
    parent = os.path.commonpath([os.path.dirname(p) for p in a + b])
    assert outputs == [str(out / os.path.relpath(os.path.dirname(p), parent) / (shard_stem(p) + ".tar.zst"))
                       for p in a + b]
    assert len({os.path.basename(p) for p in outputs}) < len(outputs)  # names repeat, paths do not
    assert keys(out / "data.list") == keys(joined)
    flat = CliRunner().invoke(main, ["convert", str(joined), "-o", str(tmp_path / "flat"), "-q", "--flat"])
    assert flat.exit_code == 2 and "drop --flat to mirror their folders" in flat.stderr


def test_validate_quarantine_mirrors_folders_when_names_repeat(two_corpora, tmp_path):
    a, b, joined = two_corpora
    bad = tmp_path / "bad"
    shutil.copytree(os.path.dirname(b[0]), bad)  # one more corpus, same names, all keys duplicates of b's
    with open(joined, "a") as f:
        f.write(f"{bad}/shards_000000000.tar\n")
    q = tmp_path / "q"
    result = CliRunner().invoke(main, ["validate", str(joined), "--quarantine", str(q), "-q", "--json", "-j", "1"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert {f["check"] for f in report["findings"]} == {"duplicate_key"}
    assert report["quarantine"]["keep_tree"] is None
    # the shard with findings went to a folder named after its source folder, not to q/shards_000000000.tar
    assert not (q / "shards_000000000.tar").exists()
    parent = os.path.commonpath([os.path.dirname(p) for p in a + b + [str(bad / "x")]])
    assert (q / os.path.relpath(bad, parent) / "shards_000000000.rejects.tar").exists()
    listed = read_list(str(q / "data.list"))
    assert listed == a + b  # the duplicate-only shard kept nothing
    assert len(keys(q / "data.list")) == len(set(keys(q / "data.list")))


def test_a_glob_over_several_corpora_lists_reads_every_list(two_corpora, tmp_path):
    from shardkit.io.inputs import expand_shards

    a, b, _ = two_corpora
    folder = os.path.basename(os.path.dirname(a[0]))  # corpus-aN, beside corpus-bN
    pattern = os.path.join(os.path.dirname(os.path.dirname(a[0])), folder.replace("-a", "-?"), "data.list")
    assert expand_shards([pattern]) == a + b
