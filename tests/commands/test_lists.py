"""shardkit list check / rewrite / concat over real shards and data.list files."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from shardkit.run.options import RunOptions
from shardkit.commands.lists import check_lists, concat_lists, rewrite_entry
from shardkit.errors import UsageError
from support import run_cli

EXPECTED_COUNTS = [(10, 5), (10, 5), (8, 4)]  # (members, utterances) per shard at 5 utterances per shard


def list_of(paths):
    return os.path.join(os.path.dirname(paths[0]), "data.list")


def lines(path):
    with open(path) as f:
        return f.read().splitlines()


# --- check ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "gz", "bz2", "xz", "zst"])
def test_check_reports_counts_and_compression_per_line(make_shards, codec):
    paths = make_shards(codec)
    report = check_lists([list_of(paths)], RunOptions(jobs=1))
    summary = report.summary()
    assert report.exit_code == 0
    assert [(e["line"], e["status"], e["compression"], e["members"], e["utterances"], e["path"])
            for e in summary["entries"]] == [(i + 1, "ok", codec, m, u, p)
                                             for i, (p, (m, u)) in enumerate(zip(paths, EXPECTED_COUNTS))]
    assert (summary["ok"], summary["bad"], summary["utterances"], summary["members"]) == (3, 0, 14, 28)
    assert summary["compression"] == {codec: 3}
    assert summary["need_zstd_hook"] == (3 if codec == "zst" else 0)
    assert all(e["warnings"] == [] for e in summary["entries"])


def test_check_cli_prints_a_row_per_line_and_a_summary(make_shards):
    paths = make_shards("zst")
    listed = list_of(paths)
    result = run_cli("list", "check", listed, "-j", 1)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["LIST:LINE\tstatus    comp members   utts  path\tproblems"] + [
        f"{listed}:{i + 1}\tok        zst  {m:>7} {u:>6}  {p}" for i, (p, (m, u)) in enumerate(zip(paths, EXPECTED_COUNTS))]
    assert "3 ok, 0 bad, 0 unchecked of 3 lines; 14 utterances in 28 members" in result.stderr
    assert "note: 3 zst shards: on Python < 3.14 WeNet reads them only with the hook" in result.stderr
    as_json = run_cli("list", "check", listed, "-j", 1, "--json")
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout)["compression"] == {"zst": 3}


def test_check_finds_every_bad_line_and_names_it(make_shards, tmp_path):
    good = make_shards("bz2")
    folder = tmp_path / "lists"
    folder.mkdir()
    truncated = folder / "truncated.tar.bz2"
    truncated.write_bytes(open(good[1], "rb").read()[:2000])
    empty = folder / "empty.tar"  # what WeNet's make_shard_list.py writes with torchaudio 2.9+
    empty.write_bytes(b"")
    not_tar = folder / "notes.tar.zst"
    not_tar.write_bytes(b"this is not a shard\n" * 100)
    shutil.copy(good[2], folder / "relative.tar.bz2")
    listed = folder / "data.list"
    listed.write_text("\n".join([
        good[0],                       # 1 ok
        str(folder / "missing.tar"),   # 2 missing
        str(truncated),                # 3 truncated
        str(empty),                    # 4 empty
        "",                            # 5 blank
        "# a comment",                 # 6 comment
        f"{good[0]} ",                 # 7 whitespace
        "relative.tar.bz2",            # 8 relative, exists beside the list
        good[0],                       # 9 repeated
        str(not_tar),                  # 10 not a tar, wrong name
        "http://example.com/s.tar",    # 11 URL
    ]) + "\n")
    summary = check_lists([str(listed)], RunOptions(jobs=1)).summary()
    rows = {e["line"]: (e["status"], e["error"], e["warnings"]) for e in summary["entries"]}
    assert rows == {
        1: ("ok", None, []),
        2: ("bad", "no such file", []),
        3: ("bad", "bz2 stream is truncated or corrupt (EOFError: Compressed file ended before the "
                   "end-of-stream marker was reached)", []),
        4: ("bad", "empty stream: not a tar archive", []),
        5: ("unchecked", None, ["blank line: WeNet tries to open it as a shard and logs an error"]),
        6: ("unchecked", None, ["comment line: WeNet tries to open it as a shard and logs an error"]),
        7: ("bad", "whitespace around the path: WeNet opens the path with it, and no such file exists",
            ["same shard as line 1: WeNet reads it twice per epoch"]),
        8: ("ok", None, ["relative path: WeNet opens it relative to the training's working directory"]),
        9: ("ok", None, ["same shard as line 1: WeNet reads it twice per epoch"]),
        10: ("bad", "not a tar archive (no valid tar header at the start)", ["name says zst, content is none"]),
        11: ("unchecked", None, []),
    }
    assert summary["entries"][7]["path"] == str(folder / "relative.tar.bz2")
    assert (summary["ok"], summary["bad"], summary["unchecked"]) == (3, 5, 3)

    result = run_cli("list", "check", listed, "-j", 2)  # through the process pool as well
    assert result.exit_code == 1
    assert f"{listed}:2\tbad       -          -      -  {folder / 'missing.tar'}\tno such file" in result.stdout
    assert "3 ok, 5 bad, 3 unchecked of 11 lines" in result.stderr


def test_check_reports_a_name_that_disagrees_with_the_content(make_shards, tmp_path):
    source = make_shards("zst")[0]
    misnamed = tmp_path / "shard.tar.gz"
    shutil.copy(source, misnamed)
    (tmp_path / "data.list").write_text(f"{misnamed}\n")
    entry = check_lists([str(tmp_path / "data.list")], RunOptions(jobs=1)).entries[0]
    assert (entry["status"], entry["compression"], entry["warnings"]) == ("ok", "zst", ["name says gz, content is zst"])


def test_check_missing_list_is_a_usage_error(tmp_path):
    result = run_cli("list", "check", tmp_path / "nope.list")
    assert (result.exit_code, result.stderr) == (2, f"Error: {tmp_path / 'nope.list'}: no such list file\n")


# --- rewrite -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, suffix, new_dir, expected", [
    ("/a/shards_000000001.tar.bz2", ".tar.zst", None, "/a/shards_000000001.tar.zst"),
    ("/a/shards_000000001.tar.bz2", ".tar.zst", "/b", "/b/shards_000000001.tar.zst"),
    ("rel/x.tgz", ".tar", None, "rel/x.tar"),
    ("x.tar", ".tar.zst", None, "x.tar.zst"),
    ("/x.tar.zst", ".tar", None, "/x.tar"),
    ("http://h/p/x.tar.gz", ".tar.zst", None, "http://h/p/x.tar.zst"),
    ("/a/corpus.v2.tar.xz", ".tar.gz", None, "/a/corpus.v2.tar.gz"),
])
def test_rewrite_entry(text, suffix, new_dir, expected):
    assert rewrite_entry(text, suffix, new_dir) == expected


@pytest.mark.parametrize("text, suffix, message", [
    ("/a/x.tar", ".zst", "--suffix must be one of .tar, .tar.gz,"),
    ("/a/x.wav", ".tar", "'x.wav' does not end with a shard suffix"),
])
def test_rewrite_entry_refuses(text, suffix, message):
    with pytest.raises(UsageError, match=message):
        rewrite_entry(text, suffix)


def test_rewrite_after_a_conversion_with_dir(make_shards, tmp_path):
    bz2 = make_shards("bz2")
    zst = make_shards("zst")
    out = tmp_path / "train.list"
    result = run_cli("list", "rewrite", list_of(bz2), "--suffix", ".tar.zst", "--dir", os.path.dirname(zst[0]),
                    "-o", out)
    assert result.exit_code == 0, result.output
    assert result.stderr == f"wrote {out}: 3 shard lines, 3 rewritten\n"
    assert lines(out) == zst
    assert sorted(os.listdir(tmp_path)) == ["train.list"]  # no temporary file left behind


def test_rewrite_in_place_keeps_blank_and_comment_lines(make_shards, tmp_path):
    bz2 = make_shards("bz2")
    folder = os.path.dirname(bz2[0])
    for path in bz2:  # the converted shards sit beside the originals
        os.replace(make_zst_copy(path), path[: -len(".bz2")] + ".zst")
    listed = tmp_path / "in.list"
    listed.write_text(f"# corpus A\n{bz2[0]}\n\n{bz2[1]}\n")
    out = tmp_path / "out.list"
    result = run_cli("list", "rewrite", listed, "--suffix", ".tar.zst", "-o", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rewritten"] == 2
    assert lines(out) == ["# corpus A", f"{folder}/shards_000000000.tar.zst", "", f"{folder}/shards_000000001.tar.zst"]


def make_zst_copy(bz2_path):
    """A real zst shard holding the bz2 shard's tar (what `shardkit convert` would produce)."""
    import bz2

    import zstandard

    target = bz2_path + ".tmp.zst"
    with open(bz2_path, "rb") as f, open(target, "wb") as out:
        out.write(zstandard.ZstdCompressor().compress(bz2.decompress(f.read())))
    return target


def test_rewrite_check_refuses_missing_or_mismatched_outputs(make_shards, tmp_path):
    bz2 = make_shards("bz2")
    decoy = tmp_path / "new"
    decoy.mkdir()
    shutil.copy(bz2[0], decoy / "shards_000000000.tar.zst")  # bz2 content under a zst name
    out = tmp_path / "out.list"
    result = run_cli("list", "rewrite", list_of(bz2), "--suffix", ".tar.zst", "--dir", decoy, "-o", out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {list_of(bz2)}: 3 of 3 rewritten lines are not ready ("
        f"line 1: {decoy}/shards_000000000.tar.zst: content is bz2, the suffix says zst; "
        f"line 2: {decoy}/shards_000000001.tar.zst: no such file; "
        f"line 3: {decoy}/shards_000000002.tar.zst: no such file); nothing written (use --no-check to write anyway)\n")
    assert not out.exists()
    unchecked = run_cli("list", "rewrite", list_of(bz2), "--suffix", ".tar.zst", "--dir", decoy, "-o", out, "--no-check")
    assert unchecked.exit_code == 0
    assert unchecked.stderr == f"wrote {out}: 3 shard lines, 3 rewritten (not checked)\n"
    assert len(lines(out)) == 3


def test_rewrite_usage_errors(make_shards, tmp_path):
    listed = list_of(make_shards("bz2"))
    same = run_cli("list", "rewrite", listed, "--suffix", ".tar", "-o", listed, "--no-check")
    assert (same.exit_code, same.stderr) == (
        2, f"Error: {listed}: the output would overwrite an input list; choose another -o\n")
    bad = tmp_path / "bad.list"
    bad.write_text("/a/x.tar\n/a/y.wav\n")
    result = run_cli("list", "rewrite", bad, "--suffix", ".tar.zst", "-o", tmp_path / "o.list", "--no-check")
    assert (result.exit_code, result.stderr) == (
        2, f"Error: {bad}: line 2: 'y.wav' does not end with a shard suffix "
           "(.tar, .tar.gz, .tgz, .tar.bz2, .tbz2, .tar.xz, .txz, .tar.zst, .tar.zstd, .tzst)\n")


# --- concat --------------------------------------------------------------------------------------


def corpus_lists(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "data.list").write_text("/data/a/s0.tar\n/data/a/s1.tar\n\n# old\n")
    (b / "data.list").write_text("s0.tar.zst\n/data/b/s1.tar.zst\n")
    return str(a / "data.list"), str(b / "data.list")


def test_concat_keeps_order_and_makes_relative_lines_absolute(tmp_path):
    a, b = corpus_lists(tmp_path)
    out = tmp_path / "train.list"
    result = run_cli("list", "concat", a, b, "-o", out)
    assert result.exit_code == 0, result.output
    assert lines(out) == ["/data/a/s0.tar", "/data/a/s1.tar", str(tmp_path / "b" / "s0.tar.zst"), "/data/b/s1.tar.zst"]
    assert result.stderr == f"wrote {out}: 4 shard lines ({a} 2, {b} 2)\n"


def test_concat_shuffle_is_a_seeded_permutation(tmp_path):
    a, b = corpus_lists(tmp_path)
    first = concat_lists([a, b], str(tmp_path / "x.list"), shuffle=True, seed=7)
    shuffled = lines(tmp_path / "x.list")
    concat_lists([a, b], str(tmp_path / "y.list"), shuffle=True, seed=7)
    concat_lists([a, b], str(tmp_path / "z.list"))
    assert shuffled == lines(tmp_path / "y.list")
    assert sorted(shuffled) == sorted(lines(tmp_path / "z.list")) and shuffled != lines(tmp_path / "z.list")
    assert (first["shuffled"], first["seed"], first["lines"]) == (True, 7, 4)


def test_concat_refuses_a_shard_in_two_lists_naming_both(tmp_path):
    a, _ = corpus_lists(tmp_path)
    c = tmp_path / "c.list"
    c.write_text("/data/c/s0.tar\n/data/a/s1.tar\n")
    out = tmp_path / "train.list"
    result = run_cli("list", "concat", a, c, "-o", out)
    assert (result.exit_code, result.stderr) == (
        2, f"Error: shard /data/a/s1.tar is listed in {a}:2 and in {c}:2; remove one, or pass --allow-duplicates "
           "to read it twice per epoch\n")
    assert not out.exists()
    allowed = run_cli("list", "concat", a, c, "-o", out, "--allow-duplicates")
    assert allowed.exit_code == 0
    assert lines(out) == ["/data/a/s0.tar", "/data/a/s1.tar", "/data/c/s0.tar", "/data/a/s1.tar"]


def test_concat_refuses_to_overwrite_an_input(tmp_path):
    a, b = corpus_lists(tmp_path)
    before = open(b).read()
    result = run_cli("list", "concat", a, b, "-o", b)
    assert (result.exit_code, result.stderr) == (
        2, f"Error: {b}: the output would overwrite an input list; choose another -o\n")
    assert open(b).read() == before
