"""balance re-balances datasets already in a trainer's layout: a NeMo tarred dataset (its manifest) or a Lhotse
Shar folder is a corpus source, indexed with its text inline; NeMo -> WeNet, NeMo -> Shar -> NeMo and Shar -> WeNet
keep every key, every transcript and every audio byte of the original WeNet shards."""

from __future__ import annotations

import gzip
import json
import os

from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands import balance
from shardkit.io.tar import group_samples, iter_shard_members
from support import corpus


def _balance(source: str, out, layout: str, *, world_size: int = 2, shards: int = 2):
    result = CliRunner().invoke(main, ["balance", "--corpus", f"mix={source}", "--world-size", str(world_size),
                                       "--num-workers", "1", "--num-shards", str(shards), "--layout", layout,
                                       "-o", str(out), "-q", "-j", "1"])
    assert result.exit_code == 0, result.output
    return str(out)


def _originals(*outs) -> dict:
    """Output key -> the key it repeats, through every balance run of the chain."""
    mapping: dict = {}
    for out in outs:
        step = {new: old for old, new in balance.read_repeats(out)}
        mapping = {new: mapping.get(old, old) for new, old in step.items()} | \
            {k: v for k, v in mapping.items() if k not in step}
    return mapping


def _wenet(out: str) -> dict:
    back = {}
    for shard in open(os.path.join(out, "data.list")).read().split():
        for sample in group_samples(iter_shard_members(shard), shard=shard):
            audio = next(e for e in sample if e in ("wav", "flac"))
            assert sample["__members__"] == [f"{sample['__key__']}.txt", f"{sample['__key__']}.{audio}"]
            back[sample["__key__"]] = (sample["txt"].decode("utf-8"), sample[audio])
    return back


def _nemo(out: str) -> dict:
    members = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("audio_") and name.endswith(".tar"):
            members.update(iter_shard_members(os.path.join(out, name)))
    back = {}
    with open(os.path.join(out, "tarred_audio_manifest.json"), encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            key = entry.get("key", os.path.splitext(entry["audio_filepath"])[0])
            back[key] = (entry["text"], members.pop(entry["audio_filepath"]))
    assert not members  # every member has its line
    return back


def _shar(folder: str) -> dict:
    back = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("cuts."):
            tar = dict(iter_shard_members(os.path.join(folder, name.replace("cuts.", "recording.").replace(
                ".jsonl.gz", ".tar"))))
            with gzip.open(os.path.join(folder, name), "rt", encoding="utf-8") as f:
                for line in f:
                    cut = json.loads(line)
                    (sup,) = cut["supervisions"]
                    audio = next(v for k, v in tar.items() if k.startswith(cut["id"] + ".") and not k.endswith(".json"))
                    back[sup["id"]] = (sup["text"], audio)
    return back


def _check(back: dict, outs, truth: dict) -> None:
    originals = _originals(*outs)
    assert {originals.get(k, k) for k in back} == set(truth)
    for key, value in back.items():
        assert value == truth[originals.get(key, key)], key


def test_nemo_to_wenet_keeps_every_key_text_and_audio_byte(make_shards, tmp_path):
    source = os.path.dirname(make_shards("bz2")[0])
    nemo = _balance(source, tmp_path / "nemo", "nemo")
    wenet = _balance(os.path.join(nemo, "tarred_audio_manifest.json"), tmp_path / "wenet", "wenet", shards=4)
    truth = {key: (text, audio) for key, text, audio, _ in corpus()}
    _check(_wenet(wenet), [nemo, wenet], truth)
    # the keys with '/' are back (the NeMo layout keeps them in the lines' key field)
    assert any("/" in key for key in _wenet(wenet))


def test_nemo_to_shar_to_nemo_keeps_every_key_text_and_audio_byte(make_shards, tmp_path):
    source = os.path.dirname(make_shards("zst", audio_format="flac")[0])
    nemo = _balance(source, tmp_path / "nemo", "nemo")
    shar = _balance(os.path.join(nemo, "tarred_audio_manifest.json"), tmp_path / "shar", "shar", shards=3)
    truth = {key: (text, audio) for key, text, audio, _ in corpus(audio_format="flac")}
    _check(_shar(os.path.join(shar, "shar")), [nemo, shar], truth)
    again = _balance(os.path.join(shar, "shar"), tmp_path / "again", "nemo")
    _check(_nemo(again), [nemo, shar, again], truth)


def test_shar_to_wenet_keeps_every_key_text_and_audio_byte(make_shards, tmp_path):
    source = os.path.dirname(make_shards("none")[0])
    shar = _balance(source, tmp_path / "shar", "shar", world_size=1)
    wenet = _balance(os.path.join(shar, "shar"), tmp_path / "wenet", "wenet", world_size=1, shards=3)
    truth = {key: (text, audio) for key, text, audio, _ in corpus()}
    _check(_wenet(wenet), [shar, wenet], truth)


def test_a_nemo_dataset_made_by_count_is_rebalanced_for_every_rank(tmp_path):
    """NeMo's converter's dataset (5 tars, scatter over 2 ranks drops one): balanced again into 2 equal shards,
    every manifest line once with its text and audio."""
    from support import nemo_by_count

    (tmp_path / "src").mkdir()
    manifest = nemo_by_count(tmp_path / "src", 5)
    out = _balance(str(manifest), tmp_path / "out", "nemo")
    back = _nemo(out)
    truth = {}
    for line in open(manifest, encoding="utf-8"):
        entry = json.loads(line)
        tar = tmp_path / "src" / f"audio_{entry['shard_id']}.tar"
        truth[os.path.splitext(entry["audio_filepath"])[0]] = (entry["text"],
                                                               dict(iter_shard_members(str(tar)))[entry["audio_filepath"]])
    _check(back, [out], truth)


def test_a_source_line_no_tar_holds_stops_balance_naming_it(tmp_path):
    from support import nemo_by_count

    (tmp_path / "src").mkdir()
    manifest = nemo_by_count(tmp_path / "src", 5, orphan=True)
    result = CliRunner().invoke(main, ["balance", "--corpus", f"mix={manifest}", "--world-size", "2",
                                       "--num-workers", "1", "-o", str(tmp_path / "out"), "-q", "-j", "1"])
    assert result.exit_code == 1
    assert "no tar holds member 'gone'" in result.output and str(manifest) in result.output
    assert not os.path.exists(tmp_path / "out" / "data.list")
