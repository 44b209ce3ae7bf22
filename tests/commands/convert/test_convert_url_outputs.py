"""convert -o s3://...: shards, data.list and convert.json published through a temporary key (moto on 127.0.0.1)."""

import json
import os

from support import run_cli

from shardkit.run.options import RunOptions
from shardkit.commands.convert import (
    ConvertSettings,
    partial_path,
    remote_journal_dir,
    run_convert,
)


def listing(fs, prefix):
    fs.invalidate_cache()
    return sorted(p.rpartition("/")[2] for p in fs.ls(prefix, detail=False))


def test_url_outputs_equal_local_ones_and_a_rerun_skips_them(make_shards, s3_default, tmp_path):
    sources = make_shards("bz2", utts_per_shard=5)
    local = run_convert(sources, str(tmp_path / "local"), ConvertSettings(), RunOptions(jobs=1))
    result = run_cli("convert", *sources, "-o", "s3://corpus/zst/", "-j", "1", "-q", "--json", "--codec", "zst")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["ok"], summary["data_list"]) == (3, "s3://corpus/zst/data.list")
    names = [f"shards_{i:09d}.tar.zst" for i in range(3)]
    assert listing(s3_default, "corpus/zst") == sorted(names + ["convert.json", "data.list"])  # no temporary key
    for name, entry in zip(names, local.shards):
        assert s3_default.cat(f"corpus/zst/{name}") == open(entry["output"]["path"], "rb").read()
    assert s3_default.cat("corpus/zst/data.list").decode().split() == [f"s3://corpus/zst/{n}" for n in names]
    manifest = json.loads(s3_default.cat("corpus/zst/convert.json"))
    assert [e["output"]["path"] for e in manifest["shards"]] == [f"s3://corpus/zst/{n}" for n in names]
    # a rerun finds every object whole (size from the store, sha256 read back) and skips it
    stale = "corpus/zst/.shards_000000001.tar.zst.0123abcd.partial"  # what a killed upload leaves
    s3_default.pipe(stale, b"half an upload")
    result = run_cli("convert", *sources, "-o", "s3://corpus/zst", "-j", "1", "-q", "--json", "--codec", "zst")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["skipped"] == 3
    assert listing(s3_default, "corpus/zst") == sorted(names + ["convert.json", "data.list"])
    # an object that changed is converted again
    s3_default.pipe("corpus/zst/shards_000000002.tar.zst", b"not what convert wrote")
    result = run_cli("convert", *sources, "-o", "s3://corpus/zst", "-j", "1", "-q", "--json", "--codec", "zst")
    assert (json.loads(result.stdout)["skipped"], json.loads(result.stdout)["ok"]) == (2, 1)
    assert s3_default.cat("corpus/zst/shards_000000002.tar.zst") == open(local.shards[2]["output"]["path"], "rb").read()


def test_a_failing_shard_leaves_no_object_under_its_name(make_shards, s3_default, tmp_path):
    sources = make_shards("gz", utts_per_shard=7)
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(open(sources[0], "rb").read()[:3000])  # the gzip stream ends early
    result = run_cli("convert", sources[0], broken, "-o", "s3://corpus/fail", "-j", "1", "-q", "--json",
                     "--codec", "zst")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["failures"][0]["shard"] == str(broken) and summary["ok"] == 1
    # the list lacks the failed shard, and its name says so
    assert listing(s3_default, "corpus/fail") == ["convert.json", "data.partial.list", "shards_000000000.tar.zst"]
    assert s3_default.cat("corpus/fail/data.partial.list").decode().split() == ["s3://corpus/fail/shards_000000000.tar.zst"]
    # nothing is left on this machine either: not the failed shard's local file, not the journal
    assert not os.path.exists(partial_path("s3://corpus/fail/broken.tar.zst"))
    assert not os.path.exists(remote_journal_dir("s3://corpus/fail"))


def test_split_slices_publish_their_own_reports(make_shards, s3_default):
    sources = make_shards("none", utts_per_shard=5)
    for i in (1, 2):
        result = run_cli("convert", *sources, "-o", "s3://corpus/sliced", "-j", "1", "-q", "--split", f"{i}/2",
                         "--codec", "zst")
        assert result.exit_code == 0, result.output
    assert listing(s3_default, "corpus/sliced") == sorted(
        [f"shards_{i:09d}.tar.zst" for i in range(3)]
        + [f"convert.slice-{i}-of-2.json" for i in (1, 2)] + [f"data.slice-{i}-of-2.list" for i in (1, 2)])
