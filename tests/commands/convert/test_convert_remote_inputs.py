"""Proposed for the foundation owner: convert reads s3:// URLs and pipe: commands from a data.list."""

import os
import shlex

from click.testing import CliRunner

from shardkit.cli import main


def test_convert_reads_s3_urls_and_pipes_like_local_files(make_shards, s3_default, tmp_path):
    sources = make_shards("bz2", utts_per_shard=4)
    for src in sources:
        s3_default.put_file(src, f"corpus/in/{os.path.basename(src)}")
    remote = [f"s3://corpus/in/{os.path.basename(src)}" for src in sources[:-1]]
    remote.append(f"pipe:cat {shlex.quote(sources[-1])}")
    (tmp_path / "remote.list").write_text("".join(f"{line}\n" for line in remote))

    runner = CliRunner()
    assert runner.invoke(main, ["convert", *sources, "-o", str(tmp_path / "local"), "-j", "1", "-q"]).exit_code == 0
    result = runner.invoke(main, ["convert", str(tmp_path / "remote.list"), "-o", str(tmp_path / "remote"),
                                  "-j", "1", "-q", "--allow-pipes"])
    assert result.exit_code == 0, result.output
    local = sorted(os.listdir(tmp_path / "local"))
    assert sorted(os.listdir(tmp_path / "remote")) == local
    for name in local:
        if name.endswith(".tar.zst"):
            assert (tmp_path / "remote" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
