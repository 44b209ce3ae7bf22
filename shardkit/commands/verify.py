"""verify: prove again, later, that a convert output holds what its sources held.

Byte-for-byte members must be equal; transcoded audio members must decode to exactly the
source's samples (and to the sample digest recorded in convert.json).
"""

from __future__ import annotations

import os
from itertools import zip_longest

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.files import load_json
from shardkit.io.inputs import expand_shards, shard_stem
from shardkit.io.tar import AUDIO_EXTENSIONS, iter_shard_members, split_key
from shardkit.io.transcode import pcm_digest, read_pcm


def verify_pair(source: str, output: str, recorded: dict[str, str] | None = None) -> dict:
    """Compare one output shard with its source; returns {shard, output, members, problems}."""
    problems: list[dict] = []
    members = 0
    recorded = recorded or {}

    def problem(key, member, reason):
        problems.append({"shard": output, "source": source, "key": key, "member": member, "reason": reason})

    try:
        src_iter = iter_shard_members(source)
        out_iter = iter_shard_members(output)
        for (src_name, src_data), (out_name, out_data) in _zip_strict(src_iter, out_iter, problem):
            members += 1
            src_key, src_ext = split_key(src_name)
            out_key, _ = split_key(out_name)
            if src_key != out_key:
                problem(out_key, out_name, f"member order differs (source has {src_name!r})")
                break
            if src_name == out_name and src_data == out_data:
                continue
            reason = _member_difference(src_ext, src_data, out_name, out_data, recorded)
            if reason is not None:
                problem(out_key, out_name, reason)
    except ShardkitError as err:
        problem(None, err.member, str(err))
    return {"shard": output, "source": source, "members": members, "problems": problems}


def _member_difference(src_ext: str, src_data: bytes, out_name: str, out_data: bytes,
                       recorded: dict[str, str]) -> str | None:
    """Why an output member that is not the source's bytes is wrong, or None: audio (transcoded) must decode
    to the source's samples and to the digest convert.json recorded for it; anything else must be byte-equal."""
    out_ext = split_key(out_name)[1]
    if not (src_ext.lower() in AUDIO_EXTENSIONS and out_ext.lower() in AUDIO_EXTENSIONS):
        return "member bytes differ from the source's"
    try:
        a, rate_a, _ = read_pcm(src_data)
        b, rate_b, _ = read_pcm(out_data)
    except ShardkitError as err:
        return err.reason
    digest = pcm_digest(b, rate_b)
    if rate_a != rate_b or pcm_digest(a, rate_a) != digest:
        return "decoded samples differ from the source's"
    if recorded.get(out_name, digest) != digest:
        return "decoded samples differ from the digest in convert.json"
    return None


def _zip_strict(a, b, problem):
    for x, y in zip_longest(a, b):
        if x is None or y is None:
            extra = y if x is None else x
            problem(split_key(extra[0])[0], extra[0], "member count differs between source and output")
            return
        yield x, y


def _match_moved_source(out_dir, output, recorded, by_stem, output_stems):
    """The --against shard that replaces ``recorded``: by stem, and where stems repeat (corpora that
    name their shards alike, whose outputs convert mirrored below OUT_DIR) by the output's folders."""
    stem = shard_stem(recorded)
    candidates = by_stem.get(stem, [])
    if not candidates:
        return None, "no source among --against with this shard's stem"
    if len(candidates) == 1 and output_stems.get(stem, 0) <= 1:
        return candidates[0], None
    rel_dir = os.path.relpath(os.path.dirname(os.path.abspath(output)), os.path.abspath(out_dir))
    parts = [] if rel_dir == os.curdir else rel_dir.split(os.sep)
    matching = [c for c in candidates
                if parts and os.path.dirname(os.path.abspath(c)).split(os.sep)[-len(parts):] == parts]
    if len(matching) == 1:
        return matching[0], None
    if len(matching) > 1:
        return None, (f"{len(matching)} sources among --against match this shard's name and folder {rel_dir!r} "
                      f"({', '.join(sorted(matching)[:3])})")
    return None, (f"this shard's name repeats; no source among --against lies in a folder ending in {rel_dir!r} "
                  f"(same name: {', '.join(sorted(candidates)[:3])})")


def run_verify(out_dir: str, against: list[str] | None = None) -> dict:
    """Verify every shard recorded in OUT_DIR/convert.json against its source.

    ``against`` (shards, folders, lists) replaces the recorded source paths, matched by stem,
    for sources that moved since the conversion.
    """
    manifest = load_json(os.path.join(out_dir, "convert.json"))
    if manifest is None:
        raise UsageError("no readable convert.json (run shardkit convert first)", shard=out_dir)
    entries = [entry for entry in manifest["shards"] if entry.get("output")]
    moved = _MovedSources(out_dir, against, entries) if against else None
    results = [_verify_entry(entry, moved) for entry in entries]
    problems = [p for r in results for p in r["problems"]]
    return {"command": "verify", "out_dir": os.path.abspath(out_dir), "shards": len(results),
            "members": sum(r["members"] for r in results), "problems": problems, "ok": not problems}


class _MovedSources:
    """The ``--against`` shards by stem, and how many recorded sources share each stem."""

    def __init__(self, out_dir: str, against: list[str], entries: list[dict]):
        self.out_dir = out_dir
        self.by_stem: dict[str, list[str]] = {}
        for path in expand_shards(against):
            self.by_stem.setdefault(shard_stem(path), []).append(path)
        self.output_stems: dict[str, int] = {}
        for entry in entries:
            stem = shard_stem(entry["source"]["path"])
            self.output_stems[stem] = self.output_stems.get(stem, 0) + 1

    def match(self, output: str, recorded: str) -> tuple[str | None, str | None]:
        return _match_moved_source(self.out_dir, output, recorded, self.by_stem, self.output_stems)


def _verify_entry(entry: dict, moved: _MovedSources | None) -> dict:
    """``verify_pair`` for one convert.json entry (its source replaced by a ``--against`` match, if given)."""
    output = entry["output"]["path"]
    source = entry["source"]["path"]
    if moved is not None:
        source, reason = moved.match(output, source)
        if source is None:
            return {"shard": output, "source": None, "members": 0, "problems": [
                {"shard": output, "source": None, "key": None, "member": None, "reason": reason}]}
    recorded = {i["member"].rsplit(".", 1)[0] + "." + i["to"]: i["pcm_sha256"]
                for i in entry.get("transcoded") or [] if i.get("action") == "transcoded"}
    return verify_pair(source, output, recorded)
