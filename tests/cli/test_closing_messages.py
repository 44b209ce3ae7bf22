"""What the commands tell a user: no rate for a rerun that did nothing, no pointer to a removed file."""

from __future__ import annotations

import json
import os


from support import run_cli


def test_a_convert_rerun_that_skips_every_shard_shows_no_rate(make_shards, tmp_path):
    shards = make_shards("bz2")
    listed = os.path.join(os.path.dirname(shards[0]), "data.list")
    first = run_cli("convert", listed, "-o", tmp_path / "zst", "-j", 1)
    assert first.exit_code == 0, first.output
    assert "MB/s" in first.stderr and "MB of tar in" in first.stderr
    again = run_cli("convert", listed, "-o", tmp_path / "zst", "-j", 1)
    assert again.exit_code == 0, again.output
    assert f"converted 0, skipped {len(shards)} (already done)" in again.stderr
    assert "MB/s" not in again.stderr and "MB of tar in" not in again.stderr


def test_balance_json_names_no_temporary_file_it_removed(make_shards, tmp_path):
    shards = make_shards("bz2", utts_per_shard=4)
    listed = os.path.join(os.path.dirname(shards[0]), "data.list")
    out = tmp_path / "balanced"
    result = run_cli("balance", "--corpus", f"mix={listed}", "--world-size", 2, "--num-workers", 1, "-o", out,
                    "-j", 1, "-q")
    assert result.exit_code == 0, result.output
    assert not (out / ".balance").exists()
    manifest = json.loads((out / "balance.json").read_text())
    source = manifest["sources"]["mix"]
    assert source["index_files"] == [] and "removed" in source["built_index"]

    def paths(node):
        if isinstance(node, dict):
            return [p for v in node.values() for p in paths(v)]
        if isinstance(node, list):
            return [p for v in node for p in paths(v)]
        return [node] if isinstance(node, str) and node.startswith(str(tmp_path)) else []

    assert all(os.path.exists(p) for p in paths(manifest)), [p for p in paths(manifest) if not os.path.exists(p)]
