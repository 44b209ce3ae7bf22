"""plan/balance --wenet-conf: the trainer's conf, its filter and its batching, checked against direct
per-utterance implementations of WeNet's own code (processor.filter, DynamicBatchWindow, SortDataPipe,
CharTokenizer/BpeTokenizer) on generated indexes and on real shards."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from support import SMALL_CORPORA, corpus

from shardkit.cli import main
from shardkit.io.synth import write_shards
from shardkit.planning.partition import lines_for, plan_figures
from shardkit.wenet_conf.batches import dynamic_batch_starts
from shardkit.wenet_conf.conf import BatchConf, ConfError, FilterConf, TrainerConf, trainer_conf
from shardkit.wenet_conf.filter import REASONS, filter_reasons
from shardkit.wenet_conf.frames import feature_frames
from shardkit.wenet_conf.simulation import Loader, simulate_epoch
from shardkit.wenet_conf.tokens import Tokenizer, count_tokens

pytest.importorskip("yaml")

# ---------------------------------------------------------------------------------------------
# Direct implementations of WeNet's code, one sample at a time (wenet/dataset/processor.py, datapipes.py)


def wenet_filter(samples, rate, label_len, max_length=10240, min_length=10, token_max_length=200,
                 token_min_length=1, min_output_input_ratio=0.0005, max_output_input_ratio=1):
    num_frames = samples / rate * 100
    if num_frames < min_length:
        return False
    if num_frames > max_length:
        return False
    if label_len is not None:
        if label_len < token_min_length:
            return False
        if label_len > token_max_length:
            return False
        if num_frames != 0:
            if label_len / num_frames < min_output_input_ratio:
                return False
            if label_len / num_frames > max_output_input_ratio:
                return False
    return True


def wenet_sort(samples, size):
    buf, out = [], []
    for s in samples:
        buf.append(s)
        if len(buf) >= size:
            buf.sort()
            out += buf
            buf = []
    buf.sort()
    return out + buf


def wenet_dynamic_batches(frames, max_frames):
    """DynamicBatchDataPipe with DynamicBatchWindow: the batch sizes."""
    batches, buf, longest = [], [], 0
    for f in frames:
        longest = max(longest, f)
        if longest * (len(buf) + 1) > max_frames:
            if buf:
                batches.append(len(buf))
            buf, longest = [f], f
        else:
            buf.append(f)
    if buf:
        batches.append(len(buf))
    return batches


def wenet_bucket_batches(frames, boundaries, sizes):
    buckets, out = {}, 0
    for f in frames:
        b = next((i for i, x in enumerate(list(boundaries) + [sys.maxsize]) if f < x), 0)
        buckets.setdefault(b, []).append(f)
        if len(buckets[b]) == sizes[b]:
            out += 1
            del buckets[b]
    return out + len(buckets)


def wenet_char_tokens(line, symbols, non_lang_syms=None, split_with_space=False):
    """CharTokenizer.tokenize(line) -> len(ids) (wenet/text/char_tokenizer.py)."""
    import re

    line = line.strip()
    if non_lang_syms is not None:
        parts = re.compile(r"(\[[^\[\]]+\]|<[^<>]+>|{[^{}]+})").split(line.upper())
        parts = [w.strip() for w in parts if len(w.strip()) > 0]
    else:
        parts = [line]
    tokens = []
    for part in parts:
        if part in (non_lang_syms or []):
            tokens.append(part)
        else:
            if split_with_space:
                part = part.split(" ")
            for ch in part:
                tokens.append("▁" if ch == " " else ch)
    return len([t for t in tokens if t in symbols or "<unk>" in symbols])


# ---------------------------------------------------------------------------------------------
# The conf


FULL_CONF = """
tokenizer: char
tokenizer_conf:
  symbol_table_path: {units}
  split_with_space: false
  bpe_path: null
  non_lang_syms_path: null
  is_multilingual: false
  num_languages: 1
  special_tokens: {{<blank>: 0, <unk>: 1, <sos>: 2, <eos>: 2}}
encoder: conformer
encoder_conf: {{output_size: 256}}
dataset: asr
dataset_conf:
  filter_conf: {{max_length: 40960, min_length: 0, token_max_length: 200, token_min_length: 1}}
  resample_conf: {{resample_rate: 16000}}
  speed_perturb: true
  fbank_conf: {{num_mel_bins: 80, frame_shift: 10, frame_length: 25, dither: 0.1}}
  spec_aug: true
  spec_aug_conf: {{num_t_mask: 2, num_f_mask: 2, max_t: 50, max_f: 10}}
  shuffle: true
  shuffle_conf: {{shuffle_size: 1500}}
  sort: true
  sort_conf: {{sort_size: 500}}
  batch_conf: {{batch_type: dynamic, max_frames_in_batch: 12000}}
"""


def test_conf_defaults_are_wenets():
    conf = trainer_conf({"dataset_conf": {}})
    assert conf.filter == FilterConf(10240, 10, 200, 1, 0.0005, 1)
    assert (conf.resample_rate, conf.speed_perturb, conf.shuffle_size, conf.sort_size) == (16000, False, 10000, 500)
    assert conf.batch == BatchConf("static", 16, 12000, (), ())
    assert (conf.features.feats_type, conf.features.frame_length, conf.features.frame_shift) == ("fbank", 25, 10)
    assert conf.tokenizer.tokenizer == "char" and conf.tokenizer.symbol_table_path is None
    assert conf.warnings == ()
    assert "no dataset_conf" in trainer_conf({}).warnings[0]


def test_full_recipe_conf_parses_without_warnings(tmp_path):
    import yaml

    conf = trainer_conf(yaml.safe_load(FULL_CONF.format(units="data/dict/lang_char.txt")))
    assert conf.warnings == ()
    assert conf.filter.max_length == 40960 and conf.filter.min_length == 0
    assert conf.batch.batch_type == "dynamic" and conf.batch.max_frames_in_batch == 12000
    assert (conf.shuffle_size, conf.sort_size, conf.speed_perturb) == (1500, 500, True)
    assert conf.tokenizer.symbol_table_path == "data/dict/lang_char.txt" and conf.tokenizer.bpe_path is None


def test_unknown_fields_are_named_in_warnings():
    conf = trainer_conf({"dataset_conf": {"mystery": 1, "filter_conf": {"max_lenght": 3},
                                          "batch_conf": {"batch_type": "static", "batch_size": 8, "pad": 1},
                                          "fbank_conf": {"frame_shift": 10, "snip": True}, "spec_trim": True},
                         "tokenizer": "whisper"})
    text = "\n".join(conf.warnings)
    for name in ("dataset_conf.mystery", "dataset_conf.filter_conf.max_lenght", "dataset_conf.batch_conf.pad",
                 "dataset_conf.fbank_conf.snip", "tokenizer 'whisper'"):
        assert name in text
    assert "spec_trim" not in text  # modelled


@pytest.mark.parametrize("doc,message", [
    ({"dataset_conf": {"batch_conf": {"batch_type": "huge"}}}, "batch_type 'huge'"),
    ({"dataset_conf": {"batch_conf": {"batch_type": "bucket", "bucket_boundaries": [100],
                                      "bucket_batch_sizes": [4]}}}, "one more entry"),
    ({"dataset_conf": {"filter_conf": {"max_length": "long"}}}, "filter_conf.max_length: expected float"),
    ({"dataset_conf": {"feats_type": "wav2vec"}}, "feats_type 'wav2vec'"),
    ([1, 2], "is a mapping"),
])
def test_bad_conf_values_are_refused(doc, message):
    with pytest.raises(ConfError, match=message.replace("(", r"\(")):
        trainer_conf(doc)


# ---------------------------------------------------------------------------------------------
# The filter, tokens and frames


def test_filter_matches_wenets_filter_per_utterance():
    rng = np.random.default_rng(3)
    n = 4000
    rate = rng.choice([8000, 16000, 22050, 44100], n)
    samples = (rng.uniform(0, 130, n) * rate).astype(np.int64)
    samples[:20] = 0
    tokens = rng.integers(0, 400, n)
    confs = [FilterConf(), FilterConf(12000, 0, 120, 3, 0.002, 0.2), FilterConf(3000, 50, 1e9, 0, 0, 1e9)]
    for conf in confs:
        reasons = filter_reasons(samples, rate, tokens, conf)
        expected = [wenet_filter(int(s), int(r), int(t), **conf.__dict__) for s, r, t in zip(samples, rate, tokens)]
        assert (reasons == 0).tolist() == expected
        assert 0 < (reasons == 0).sum() < n
    no_label = filter_reasons(samples, rate, None, FilterConf())
    assert (no_label == 0).tolist() == [wenet_filter(int(s), int(r), None) for s, r in zip(samples, rate)]


@pytest.mark.parametrize("text,non_lang,split", [
    ("你好 世界", None, False), (" hello world  ", None, False), ("hello world", None, True),
    ("[noise] 你好 <unk> okay {BRK}", ("[NOISE]", "{BRK}"), False), ("a b c", (), True), ("ÀB ç", None, False),
])
def test_char_tokens_match_wenets_char_tokenizer(text, non_lang, split):
    for symbols in ({"你", "好", "▁", "H", "E", "L", "O", "[NOISE]"}, {"你", "<unk>"}, set()):
        tok = Tokenizer(frozenset(symbols), non_lang, split)
        assert count_tokens(text, tok) == wenet_char_tokens(text, symbols, list(non_lang) if non_lang is not None
                                                            else None, split)


def test_bpe_tokens_are_sentencepiece_pieces_with_cjk_characters_alone(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    corpus_file = tmp_path / "text.txt"
    corpus_file.write_text("\n".join(["HELLO WORLD THE QUICK BROWN FOX", "JUMPS OVER THE LAZY DOG AGAIN"] * 50))
    spm.SentencePieceTrainer.train(input=str(corpus_file), model_prefix=str(tmp_path / "bpe"), vocab_size=40,
                                   model_type="bpe", minloglevel=2)
    model = spm.SentencePieceProcessor(model_file=str(tmp_path / "bpe.model"))
    tok = Tokenizer(None, None, False, model.encode_as_pieces)
    assert count_tokens("hello 你好 world", tok) == (len(model.encode_as_pieces("HELLO ")) + 2
                                                    + len(model.encode_as_pieces(" WORLD")))


def test_feature_frames_follow_kaldi_framing_and_resampling():
    samples = np.array([0, 399, 400, 559, 560, 16000, 48000, 22050])
    rate = np.array([16000, 16000, 16000, 16000, 16000, 16000, 48000, 22050])
    frames = feature_frames(samples, rate, TrainerConf())
    # 16 kHz: 400-sample window, 160 shift; 48 kHz and 22.05 kHz are resampled to 16 kHz first (ceil)
    assert frames.tolist() == [0, 0, 1, 1, 2, 98, 98, 98]


def test_feature_frames_match_torchaudio():
    torchaudio = pytest.importorskip("torchaudio")
    import torch
    from torchaudio.compliance import kaldi

    for n, rate in [(400, 16000), (16123, 16000), (8000, 8000), (44100, 44100), (22050, 22050)]:
        wav = torch.zeros(1, n)
        if rate != 16000:
            wav = torchaudio.transforms.Resample(rate, 16000)(wav)
        expected = kaldi.fbank(wav, num_mel_bins=80, sample_frequency=16000, energy_floor=0.0).shape[0]
        assert feature_frames(np.array([n]), np.array([rate]), TrainerConf()).tolist() == [expected]


# ---------------------------------------------------------------------------------------------
# Batches


def test_dynamic_batch_starts_match_wenets_window_sample_by_sample():
    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(0, 150))
        frames = rng.integers(0, 2500, n) if trial % 2 else rng.integers(1, 60, n)
        cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 4))))
        bounds = np.concatenate([[0], cuts, [n]])
        limit = int(rng.integers(1, 6000))
        for precompute in (True, False):  # lengths for every sample at once, or per step of the walk
            marks = dynamic_batch_starts(frames, bounds, limit, precompute=precompute)
            for c in range(len(bounds) - 1):
                seg = marks[bounds[c]:bounds[c + 1]]
                got = np.diff(np.append(np.flatnonzero(seg), len(seg))).tolist()
                assert got == wenet_dynamic_batches(frames[bounds[c]:bounds[c + 1]].tolist(), limit)


def _reference_worker_batches(shards, order_seed, world_size, num_workers, conf: TrainerConf):
    """Per (rank, worker): WeNet's chain on its samples, sample by sample (no shuffle buffer)."""
    out = np.zeros((world_size, num_workers), np.int64)
    for r in range(world_size):
        for w in range(num_workers):
            lines = lines_for(r, w, len(shards), world_size, num_workers, order_seed)
            frames = [f for line in lines for f in shards[line]]
            if conf.sort:
                frames = wenet_sort(frames, conf.sort_size)
            b = conf.batch
            if b.batch_type == "dynamic":
                out[r, w] = len(wenet_dynamic_batches(frames, b.max_frames_in_batch))
            elif b.batch_type == "static":
                out[r, w] = -(-len(frames) // b.batch_size)
            else:
                out[r, w] = wenet_bucket_batches(frames, b.bucket_boundaries, b.bucket_batch_sizes)
    return out


@pytest.mark.parametrize("batch", [BatchConf("dynamic", max_frames_in_batch=4000),
                                   BatchConf("dynamic", max_frames_in_batch=900),
                                   BatchConf("static", batch_size=7),
                                   BatchConf("bucket", bucket_boundaries=(300, 700), bucket_batch_sizes=(9, 5, 3))])
@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (2, 2), (3, 2)])
def test_simulated_steps_match_a_sample_by_sample_run(batch, world_size, num_workers):
    rng = np.random.default_rng(world_size * 10 + num_workers)
    shards = [rng.integers(30, 1500, int(rng.integers(0, 40))).tolist() for _ in range(23)]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in shards])])
    frames = np.array([f for s in shards for f in s], np.int64)
    conf = TrainerConf(batch=batch, shuffle=False, sort_size=17)
    for epoch in range(2):
        got = simulate_epoch(offsets, frames, frames / 100.0, Loader(world_size, num_workers, seed=4), conf,
                             epoch=epoch)
        expected = _reference_worker_batches(shards, (4, epoch), world_size, num_workers, conf)
        assert got.worker_batches.tolist() == expected.tolist()
        assert got.rank_steps.tolist() == expected.sum(axis=1).tolist()
        assert got.left_out_batches.tolist() == (expected.sum(axis=1) - expected.sum(axis=1).min()).tolist()
    # the shuffle buffer reorders samples but never changes static or bucket counts
    if batch.batch_type != "dynamic":
        shuffled = simulate_epoch(offsets, frames, frames / 100.0, Loader(world_size, num_workers, seed=4),
                                  TrainerConf(batch=batch, shuffle_size=10), epoch=0)
        assert shuffled.worker_batches.tolist() == _reference_worker_batches(
            shards, (4, 0), world_size, num_workers, conf).tolist()


def test_left_out_seconds_are_the_last_batches_in_the_loaders_round_robin():
    # one rank, two workers: worker 0 gets 3 static batches, worker 1 one; rank 1 gets 2 in all
    shards = [[100] * 6, [100] * 2, [100] * 2, [100] * 2]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in shards])])
    frames = np.full(12, 100, np.int64)
    seconds = np.arange(12, dtype=np.float64)
    conf = TrainerConf(batch=BatchConf("static", batch_size=2), shuffle=False, sort=False, list_shuffle=False)
    got = simulate_epoch(offsets, frames, seconds, Loader(2, 2, seed=0), conf, epoch=0)
    # lines: 0 -> (rank 0, worker 0), 1 -> (1, 0), 2 -> (0, 1), 3 -> (1, 1)
    assert got.worker_batches.tolist() == [[3, 1], [1, 1]]
    assert got.left_out_batches.tolist() == [2, 0]
    # rank 0 steps w0b0, w1b0, w0b1, w0b2: the last two are utterances 2..5 of shard 0
    assert got.left_out_seconds.tolist() == [2 + 3 + 4 + 5, 0]


# ---------------------------------------------------------------------------------------------
# The CLI on generated indexes and real shards


def _write_conf(path, dataset_conf, top=""):
    import yaml

    path.write_text(top + yaml.safe_dump({"dataset_conf": dataset_conf}))
    return str(path)


def _generated_index(tmp_path, n=3000, shards=40, seed=0):
    """An index of ``n`` utterances over ``shards`` listed (never read) shards, and its data.list."""
    rng = np.random.default_rng(seed)
    paths = [str(tmp_path / f"corpus{i % 2}" / f"shards_{i:09d}.tar") for i in range(shards)]
    records = []
    for u in range(n):
        rate = int(rng.choice([16000, 8000]))
        frames = int(rng.uniform(0.05, 25) * rate)
        shard = paths[int(rng.integers(shards))]
        records.append({"shard": shard, "key": f"utt{u:06d}", "corpus": f"c{u % 3}", "duration": frames / rate,
                        "frames": frames, "sample_rate": rate, "text_chars": int(rng.integers(0, 300)),
                        "members": [[f"utt{u:06d}.txt", 0, 1], [f"utt{u:06d}.wav", 512, 44 + 2 * frames]]})
    records.sort(key=lambda r: r["shard"])
    index = tmp_path / "index.jsonl"
    index.write_text("".join(json.dumps(r) + "\n" for r in records))
    listing = tmp_path / "data.list"
    listing.write_text("\n".join(paths) + "\n")
    return records, str(index), str(listing)


def _plan(*args):
    result = CliRunner().invoke(main, ["plan", *args, "--json", "-q"])
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


def test_plan_on_a_generated_index_drops_what_wenets_filter_drops(tmp_path):
    records, index, listing = _generated_index(tmp_path)
    filt = {"max_length": 2000, "min_length": 20, "token_max_length": 200, "token_min_length": 1,
            "max_output_input_ratio": 0.5}
    conf = _write_conf(tmp_path / "train.yaml", {"filter_conf": filt, "batch_conf": {"batch_type": "dynamic",
                                                                                     "max_frames_in_batch": 6000}})
    dropped = tmp_path / "dropped.txt"
    result, doc = _plan(listing, "--index", index, "--world-size", "2", "--num-workers", "2", "--epochs", "2",
                        "--wenet-conf", conf, "--dropped-keys", str(dropped))
    assert result.exit_code == 0, result.output
    kept = [r for r in records if wenet_filter(r["frames"], r["sample_rate"], r["text_chars"], **filt)]
    gone = [r["key"] for r in records if r not in kept]
    report = doc["wenet_conf"]
    assert report["filter"]["dropped_utterances"] == len(gone) > 0
    assert dropped.read_text().split() == gone
    assert doc["utterances"] == len(kept)
    assert doc["seconds"] == pytest.approx(sum(r["duration"] for r in kept), abs=0.01)
    for c in report["filter"]["corpora"]:
        mine = [r for r in records if r["corpus"] == c["corpus"]]
        assert c["dropped_utterances"] == sum(1 for r in mine if r["key"] in set(gone))
        assert set(c["example_keys"]) <= set(gone)
    assert "one token per transcript character" in report["tokens"]
    assert doc["warnings"] == []
    steps = report["batches"]["epochs"][0]
    assert sum(steps["steps_per_rank"]) == sum(map(sum, steps["batches_per_worker"])) > 0
    left = steps["equal_steps_left_out"]["batches"]
    assert left == [s - min(steps["steps_per_rank"]) for s in steps["steps_per_rank"]]


def test_plan_without_wenet_conf_is_unchanged(tmp_path):
    records, index, listing = _generated_index(tmp_path, n=500, shards=12)
    result, doc = _plan(listing, "--index", index, "--world-size", "3", "--num-workers", "2")
    assert result.exit_code == 0, result.output
    with open(listing) as f:
        paths = f.read().split()
    utts = np.array([sum(1 for r in records if r["shard"] == p) for p in paths])
    secs = np.array([sum(r["duration"] for r in records if r["shard"] == p) for p in paths])
    # the index is written as lines without completeness marks: it is used, and named as unchecked
    assert doc == {"command": "plan", **plan_figures(utts, secs, world_size=3, num_workers=2, epochs=3, seed=0),
                   "source_stamps": {}, "unchecked_indexes": [str(index)]}


@pytest.mark.parametrize("codec", ["zst", "none"])
def test_plan_and_balance_on_real_shards_with_a_units_file(tmp_path, codec):
    specs = SMALL_CORPORA
    write_shards(corpus(specs), str(tmp_path / "src"), utts_per_shard=4, codec=codec)
    texts = {key: text for key, text, _, _ in corpus(specs)}
    seconds = {key: s for key, _, _, s in corpus(specs)}
    units = tmp_path / "units.txt"
    chars = sorted({ch for t in texts.values() for ch in t if ch != " "})
    units.write_text("".join(f"{c} {i}\n" for i, c in enumerate(["<blank>", "<unk>", "▁"] + chars[:len(chars) // 2])))
    symbols = {line.split()[0] for line in units.read_text().splitlines()}
    conf = _write_conf(tmp_path / "train.yaml", {"filter_conf": {"token_max_length": 12, "min_length": 0},
                                                 "batch_conf": {"batch_type": "static", "batch_size": 2}})
    expected = sorted(k for k, t in texts.items() if wenet_char_tokens(t, symbols) > 12)
    assert expected and len(expected) < len(texts)

    result, doc = _plan(os.path.join(str(tmp_path / "src"), "data.list"), "--world-size", "2", "--num-workers", "1",
                        "--wenet-conf", conf, "--tokenizer", str(units), "-j", "1")
    assert result.exit_code == 0, result.output
    assert doc["wenet_conf"]["filter"]["dropped_utterances"] == len(expected)
    assert "CharTokenizer" in doc["wenet_conf"]["tokens"]

    out = tmp_path / "balanced"
    dropped = tmp_path / "dropped.txt"
    result = CliRunner().invoke(main, ["balance", "--corpus", f"mix={tmp_path / 'src'}", "--world-size", "2",
                                       "--num-workers", "1", "--num-shards", "2", "-o", str(out), "-j", "1", "--json",
                                       "--wenet-conf", conf, "--tokenizer", str(units), "--dropped-keys", str(dropped)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert sorted(dropped.read_text().split()) == expected
    assert summary["seconds"] == pytest.approx(sum(s for k, s in seconds.items() if k not in expected), abs=0.01)
    assert "filter_conf drops" in result.stderr
    from shardkit.io.tar import group_samples, iter_shard_members

    written = {s["__key__"] for p in (out / "data.list").read_text().split()
               for s in group_samples(iter_shard_members(p), shard=p)}
    assert written.isdisjoint(expected)
    assert json.loads((out / "balance.json").read_text())["wenet_conf"]["filter"]["dropped_utterances"] == len(expected)
    assert summary["wenet_conf"]["batches"]["epochs"][0]["steps_per_rank"] == [
        sum(w) for w in summary["wenet_conf"]["batches"]["epochs"][0]["batches_per_worker"]]


def test_balance_without_wenet_conf_has_no_new_fields(make_shards, tmp_path):
    paths = make_shards("none")
    result = CliRunner().invoke(main, ["balance", "--corpus", f"a={os.path.dirname(paths[0])}", "--world-size", "1",
                                       "--num-workers", "1", "--num-shards", "2", "-o", str(tmp_path / "o"),
                                       "--dry-run", "--json", "-q", "-j", "1"])
    assert result.exit_code == 0, result.output
    assert not {"wenet_conf", "warnings"} & set(json.loads(result.stdout))


def test_unknown_conf_fields_reach_stderr_and_json(tmp_path):
    _, index, listing = _generated_index(tmp_path, n=200, shards=6)
    conf = _write_conf(tmp_path / "train.yaml", {"mystery_conf": {"a": 1}})
    result = CliRunner().invoke(main, ["plan", listing, "--index", index, "--world-size", "2", "--num-workers", "1",
                                       "--wenet-conf", conf, "--json"])
    assert result.exit_code == 0, result.output
    assert any("dataset_conf.mystery_conf" in w for w in json.loads(result.stdout)["warnings"])
    assert "warning: dataset_conf.mystery_conf" in result.stderr


@pytest.mark.parametrize("case", ["bad_yaml", "missing_units", "no_conf_file", "tokenizer_alone", "no_sentencepiece"])
def test_clear_errors(tmp_path, case, monkeypatch):
    _, index, listing = _generated_index(tmp_path, n=50, shards=4)
    args = [listing, "--index", index, "--world-size", "1", "--num-workers", "1"]
    conf = tmp_path / "train.yaml"
    if case == "bad_yaml":
        conf.write_text("dataset_conf:\n  filter_conf: [1, 2\n")
        args += ["--wenet-conf", str(conf)]
        expected = f"{conf}: not valid YAML (line "
    elif case == "missing_units":
        conf.write_text("tokenizer: char\ntokenizer_conf:\n  symbol_table_path: data/dict/nowhere.txt\n")
        args += ["--wenet-conf", str(conf)]
        expected = "tokenizer_conf.symbol_table_path 'data/dict/nowhere.txt' of the conf is not a file"
    elif case == "no_conf_file":
        args += ["--wenet-conf", str(tmp_path / "absent.yaml")]
        expected = f"{tmp_path / 'absent.yaml'}: cannot read the WeNet conf (No such file or directory)"
    elif case == "tokenizer_alone":
        args += ["--tokenizer", str(conf)]
        expected = "--tokenizer and --dropped-keys need --wenet-conf"
    else:
        monkeypatch.setitem(sys.modules, "sentencepiece", None)
        model = tmp_path / "bpe.model"
        model.write_bytes(b"not a model")
        conf.write_text("dataset_conf: {}\n")
        args += ["--wenet-conf", str(conf), "--tokenizer", str(model)]
        expected = "needs sentencepiece: pip install sentencepiece"
    result = CliRunner().invoke(main, ["plan", *args, "-q"])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert "Traceback" not in result.output


def test_reasons_are_named():
    assert REASONS[0] == "kept" and len(REASONS) == 7


def test_conf_paths_resolve_beside_a_recipes_conf_folder(tmp_path, monkeypatch):
    from shardkit.wenet_conf.load import load_tokenizer, load_trainer_conf

    recipe = tmp_path / "recipe"
    (recipe / "conf").mkdir(parents=True)
    (recipe / "data" / "dict").mkdir(parents=True)
    (recipe / "data" / "dict" / "lang_char.txt").write_text("<blank> 0\n<unk> 1\n你 2\n")
    (recipe / "data" / "nls.txt").write_text("{NOISE}\n")
    conf_path = recipe / "conf" / "train.yaml"
    conf_path.write_text(FULL_CONF.format(units="data/dict/lang_char.txt").replace(
        "non_lang_syms_path: null", "non_lang_syms_path: data/nls.txt"))
    monkeypatch.chdir(tmp_path)
    conf = load_trainer_conf(str(conf_path))
    tok, note = load_tokenizer(conf.tokenizer, str(conf_path))
    assert tok.symbols == {"<blank>", "<unk>", "你"} and tok.non_lang_syms == ("{NOISE}",)
    assert "CharTokenizer" in note and "lang_char.txt" in note
    assert count_tokens("{noise} 你好", tok) == 3  # {NOISE}, 你, 好 -> <unk>


def test_balance_refuses_a_corpus_the_filter_empties(make_shards, tmp_path):
    paths = make_shards("none")
    conf = _write_conf(tmp_path / "train.yaml", {"filter_conf": {"max_length": 1}, "mystery": 1})
    result = CliRunner().invoke(main, ["balance", "--corpus", f"a={os.path.dirname(paths[0])}", "--world-size", "1",
                                       "--num-workers", "1", "-o", str(tmp_path / "o"), "--dry-run", "-q", "-j", "1",
                                       "--wenet-conf", conf])
    assert result.exit_code == 2, result.output
    assert "corpus 'a': the trainer's filter_conf drops every utterance" in result.stderr


def torch_shuffler(samples, buffer_size, rng):
    """torch's ShufflerIterDataPipe, sample by sample: once full, each new sample swaps with a random one."""
    buf, out = [], []
    for x in samples:
        if len(buf) == buffer_size:
            i = rng.randint(0, buffer_size - 1)
            out.append(buf[i])
            buf[i] = x
        else:
            buf.append(x)
    while buf:
        out.append(buf.pop(rng.randint(0, len(buf) - 1)))
    return out


def test_shuffle_buffer_model_gives_typical_dynamic_counts():
    """The modelled shuffle buffer against torch's own algorithm run sample by sample: per worker the
    dynamic batch counts agree within 3% (both are one random draw)."""
    import random

    rng = np.random.default_rng(11)
    # shards whose utterances come shortest first: without the shuffle buffer the sort buffer's chunks
    # would be narrow and the counts ~12% lower, so the buffer's model matters here
    shards = [sorted(np.clip(rng.gamma(2.0, 200, 300), 50, 3000).astype(int).tolist()) for _ in range(8)]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in shards])])
    frames = np.array([f for s in shards for f in s], np.int64)
    conf = TrainerConf(batch=BatchConf("dynamic", max_frames_in_batch=3000), shuffle_size=150, sort_size=50)
    got = simulate_epoch(offsets, frames, frames / 100.0, Loader(2, 2, seed=1), conf, epoch=0)
    for r in range(2):
        for w in range(2):
            lines = lines_for(r, w, len(shards), 2, 2, (1, 0))
            samples = torch_shuffler([f for line in lines for f in shards[line]], 150, random.Random(r * 2 + w))
            exact = len(wenet_dynamic_batches(wenet_sort(samples, 50), 3000))
            assert abs(got.worker_batches[r, w] - exact) <= 0.03 * exact, (got.worker_batches, exact)
