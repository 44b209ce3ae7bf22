"""WebDataset reads shardkit's output: the real webdataset package, real audio, real shards.

Every utterance that WebDataset reads from what convert, balance and make write (plain, zstd,
FLAC members) must be the source's samples and text; the tarfile zstd hook must serve
WebDataset's ``r|*`` reader in-process; shardkit.training.wds's stage, handler and reader must give the
same samples as WebDataset's own, with located errors; and ``plan --reader webdataset`` must be
what WebDataset's own splitters do.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from support import corpus

from shardkit.cli import main
from shardkit.commands import balance
from shardkit.errors import AudioError, ShardkitError
from shardkit.io import zstd_tarfile as hook
from shardkit.io.synth import encode, speech_like
from shardkit.io.tar import TarWriter
from shardkit.planning.partition import plan_figures_webdataset, webdataset_lines_for
from shardkit.training import wds as skwds

wds = pytest.importorskip("webdataset")

# keys with '/' and '-', as WeNet's; no '.' in them (key_dot has its own tests below)
TRUTH = {key: (text, audio) for key, text, audio, _ in corpus()}


def source_samples(audio: bytes) -> np.ndarray:
    samples, _ = sf.read(io.BytesIO(audio), dtype="float32", always_2d=True)
    return samples


@pytest.fixture
def zstd_tarfile():
    """tarfile with the zstd hook patched in, as `shardkit wenet enable-zstd` arranges at start-up."""
    was_active = hook.is_patched(tarfile)
    hook.deactivate()
    if hook.needed():
        hook.patch(tarfile)
    yield tarfile
    hook.deactivate()
    if was_active:
        hook.activate()


def read_with(reader: str, urls: list[str]) -> list[dict]:
    """Samples as ``{key, url, txt, audio, rate}`` through one of the ways a WebDataset user reads."""
    if reader == "wds+stage":  # WebDataset's own tarfile reader, shardkit's decoding stage
        ds = wds.WebDataset(urls, shardshuffle=False).map(skwds.decode_audio())
    elif reader == "wds+handler":  # WebDataset's decoder with shardkit's handler
        ds = wds.WebDataset(urls, shardshuffle=False).decode(skwds.audio_handler())
    elif reader == "shardkit.training.wds.WebDataset":  # the drop-in: shardkit reads the tar
        ds = skwds.WebDataset(urls, shardshuffle=False).map(skwds.decode_audio())
    elif reader == "pipeline":  # a wds.DataPipeline with shardkit's reader stage
        ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker,
                              skwds.tarfile_to_samples(), wds.map(skwds.decode_audio()))
    else:
        raise AssertionError(reader)
    out = []
    for sample in ds:
        audio_field = next(f for f in ("wav", "flac") if f in sample)
        samples, rate = sample[audio_field]
        txt = sample["txt"]
        out.append({"key": sample["__key__"], "url": sample["__url__"], "field": audio_field,
                    "txt": txt if isinstance(txt, str) else txt.decode(), "audio": samples, "rate": rate})
    return out


def assert_source(samples: list[dict], urls: list[str], *, truth=TRUTH, rename=lambda key: key) -> None:
    assert [s["key"] for s in samples] and {s["url"] for s in samples} == set(urls)
    for s in samples:
        text, audio = truth[rename(s["key"])]
        assert s["txt"] == text
        assert s["rate"] == 16000
        expected = source_samples(audio)
        assert s["audio"].dtype == np.float32 and s["audio"].shape == expected.shape
        assert np.array_equal(s["audio"], expected), s["key"]


def convert(src_paths, out, *args):
    src_list = os.path.join(os.path.dirname(src_paths[0]), "data.list")
    result = CliRunner().invoke(main, ["convert", src_list, "-o", str(out), "-j", "1", "-q", *args])
    assert result.exit_code == 0, result.output
    return open(os.path.join(out, "data.list")).read().split()


READERS = ["wds+stage", "wds+handler", "shardkit.training.wds.WebDataset", "pipeline"]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("codec,audio", [("none", "keep"), ("zst", "keep"), ("none", "flac"), ("zst", "flac")])
def test_webdataset_reads_converted_shards_as_the_source(make_shards, tmp_path, zstd_tarfile, reader, codec, audio):
    urls = convert(make_shards("bz2"), tmp_path / "out", "--codec", codec, "--audio", audio)
    samples = read_with(reader, urls)
    assert sorted(s["key"] for s in samples) == sorted(TRUTH)
    assert {s["field"] for s in samples} == {"flac" if audio == "flac" else "wav"}
    assert_source(samples, urls)


def test_zst_shards_read_through_the_hook_without_a_subprocess(make_shards, zstd_tarfile, monkeypatch):
    urls = make_shards("zst")

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a subprocess was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    samples = read_with("wds+stage", urls)
    assert sorted(s["key"] for s in samples) == sorted(TRUTH)
    assert_source(samples, urls)


@pytest.mark.skipif(not hook.needed(), reason="Python 3.14+ tarfile reads zstd itself")
def test_without_the_hook_webdataset_cannot_open_zst(make_shards):
    was_active = hook.is_patched(tarfile)
    hook.deactivate()
    try:
        with pytest.raises(tarfile.ReadError):
            list(wds.WebDataset(make_shards("zst"), shardshuffle=False))
    finally:
        if was_active:
            hook.activate()


@pytest.mark.skipif(shutil.which("zstd") is None, reason="no zstd command")
def test_pipe_zstd_fallback_reads_the_same(make_shards):
    paths = make_shards("zst")
    urls = [f"pipe:zstd -dc < {p}" for p in paths]
    samples = read_with("wds+stage", urls)
    assert sorted(s["key"] for s in samples) == sorted(TRUTH)
    assert_source(samples, urls)


@pytest.mark.skipif(not hook.needed(), reason="Python 3.14+ tarfile reads zstd itself")
def test_webdataset_reads_zst_in_a_venv_with_the_hook_installed_by_the_cli(make_shards, tmp_path):
    from test_zstd_hook import make_venv, run_python

    paths = make_shards("zst")
    script = tmp_path / "read.py"
    script.write_text("import json, sys, subprocess\n"
                      "import webdataset as wds\n"
                      "subprocess.Popen = None  # no subprocess per shard\n"
                      "keys = [s['__key__'] for s in wds.WebDataset(sys.argv[1:], shardshuffle=False)]\n"
                      "print(json.dumps(keys))\n")
    python, _ = make_venv(tmp_path / "env")
    before = run_python(python, str(script), *paths)
    assert before.returncode == 1 and "ReadError" in before.stderr
    assert run_python(python, "-m", "shardkit", "wenet", "enable-zstd").returncode == 0
    after = run_python(python, str(script), *paths)
    assert after.returncode == 0, after.stderr
    assert sorted(json.loads(after.stdout)) == sorted(TRUTH)


def test_webdataset_reads_balanced_shards_as_the_source(make_shards, tmp_path, zstd_tarfile):
    src = make_shards("zst", name="mix")
    result = CliRunner().invoke(main, ["balance", "--corpus", f"mix={os.path.dirname(src[0])}", "-o",
                                       str(tmp_path / "bal"), "--world-size", "2", "--num-workers", "2",
                                       "--num-shards", "4", "-j", "1", "-q", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    urls = open(tmp_path / "bal" / "data.list").read().split()
    repeats = {new: old for old, new in balance.read_repeats(str(tmp_path / "bal"))}
    for reader in ("wds+stage", "shardkit.training.wds.WebDataset"):
        samples = read_with(reader, urls)
        assert len(samples) == report["num_shards"] * report["utterances_per_shard"]
        assert_source(samples, urls, rename=lambda key: repeats.get(key, key))
    # divisible for both readers: WebDataset's fixed split gives every (rank, worker) equal work
    plan = CliRunner().invoke(main, ["plan", str(tmp_path / "bal" / "data.list"), "--world-size", "2",
                                     "--num-workers", "2", "--reader", "webdataset", "--json", "-q", "-j", "1"])
    figures = json.loads(plan.stdout)
    assert figures["divides"] and figures["wenet"]["divides"]
    for f in (figures, figures["wenet"]):
        for epoch in f["epochs"]:
            assert len({w["utterances"] for w in epoch["workers"]}) == 1
            assert epoch["rank_spread"] == pytest.approx(1.0, abs=0.05)


def _kaldi_dir(root, utts):
    os.makedirs(root / "wav", exist_ok=True)
    with open(root / "wav.scp", "w") as scp, open(root / "text", "w") as text:
        for i, (key, words, seconds, fmt) in enumerate(utts):
            path = root / "wav" / f"{i}.{fmt}"
            path.write_bytes(encode(speech_like(seconds, 16000, seed=i), 16000, fmt))
            scp.write(f"{key} {path}\n")
            text.write(f"{key} {words}\n")


@pytest.mark.parametrize("codec,audio_format", [("none", "wav"), ("zst", "wav"), ("none", "flac")])
def test_webdataset_reads_make_output_as_the_source(tmp_path, zstd_tarfile, codec, audio_format):
    utts = [(f"spk{i % 2}-utt{i:03d}", f"words of utterance {i}", 0.3 + 0.1 * i, "wav") for i in range(6)]
    _kaldi_dir(tmp_path / "kaldi", utts)
    result = CliRunner().invoke(main, ["make", "--wav-scp", str(tmp_path / "kaldi" / "wav.scp"), "--text",
                                       str(tmp_path / "kaldi" / "text"), "-o", str(tmp_path / "out"), "-j", "1", "-q",
                                       "--codec", codec, "--audio-format", audio_format, "--utts-per-shard", "4"])
    assert result.exit_code == 0, result.output
    urls = open(tmp_path / "out" / "data.list").read().split()
    truth = {key: (words, encode(speech_like(seconds, 16000, seed=i), 16000, "wav"))
             for i, (key, words, seconds, _) in enumerate(utts)}
    for reader in ("wds+handler", "shardkit.training.wds.WebDataset"):
        samples = read_with(reader, urls)
        assert sorted(s["key"] for s in samples) == sorted(truth)
        assert_source(samples, urls, truth=truth)


# --- shardkit.training.wds itself ---------------------------------------------------------------------------


def test_reader_stage_gives_webdatasets_own_samples_including_dotted_keys(tmp_path):
    members = [("a/k-1.txt", b"one"), ("a/k-1.wav", encode(speech_like(0.2, 16000, seed=1), 16000, "wav")),
               ("b/k.2.txt", b"two"), ("b/k.2.wav", encode(speech_like(0.2, 16000, seed=2), 16000, "wav")),
               ("c/K3.TXT", b"three"), ("c/K3.json", b"{}"), ("d/noext", b"skipped by both")]
    path = tmp_path / "s.tar"
    with open(path, "wb") as f:
        writer = TarWriter(f)
        for name, data in members:
            writer.add(name, data)
        writer.close()
    theirs = list(wds.WebDataset([str(path)], shardshuffle=False))
    ours = list(skwds.WebDataset([str(path)], shardshuffle=False))
    stage = list(skwds.tarfile_to_samples()([{"url": str(path)}]))
    their_stage = list(wds.tarfile_to_samples()([{"url": str(path)}]))
    assert [s["__key__"] for s in theirs] == ["a/k-1", "b/k", "c/K3"]
    assert theirs == ours  # both add __local_path__; the stages do not
    assert their_stage == [{k: bytes(v) if isinstance(v, bytearray) else v for k, v in s.items()} for s in stage]
    assert [{k: v for k, v in s.items() if k != "__local_path__"} for s in theirs] == their_stage
    assert set(theirs[1]) == {"__key__", "__url__", "__local_path__", "2.txt", "2.wav"}
    decoded = skwds.decode_audio()(dict(theirs[1]))  # a dotted key's field "2.wav" still decodes
    assert decoded["2.txt"] == "two" and decoded["2.wav"][0].shape == (3200, 1)


def test_torch_output_matches_torchaudios_layout(make_shards):
    torch = pytest.importorskip("torch")
    paths = make_shards("none")
    for sample in wds.WebDataset(paths, shardshuffle=False).map(skwds.decode_audio(output="torch")):
        tensor, rate = sample["wav"]
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32 and rate == 16000
        expected = source_samples(TRUTH[sample["__key__"]][1]).T
        assert tensor.shape == expected.shape and np.array_equal(tensor.numpy(), expected)
    handler_out = next(iter(wds.WebDataset(paths, shardshuffle=False).decode(skwds.audio_handler(output="torch"))))
    assert handler_out["wav"][0].shape[0] == 1


def test_int16_and_float64_outputs(make_shards):
    paths = make_shards("none")
    sample = next(iter(wds.WebDataset(paths, shardshuffle=False).map(skwds.decode_audio(dtype="int16"))))
    pcm, _ = sf.read(io.BytesIO(TRUTH[sample["__key__"]][1]), dtype="int16", always_2d=True)
    assert sample["wav"][0].dtype == np.int16 and np.array_equal(sample["wav"][0], pcm)
    with pytest.raises(ShardkitError, match="unsupported output 'jax'"):
        skwds.decode_audio(output="jax")


def _bad_shard(tmp_path, audio: bytes, name="bad.tar"):
    path = tmp_path / name
    good = encode(speech_like(0.2, 16000, seed=0), 16000, "wav")
    with open(path, "wb") as f:
        writer = TarWriter(f)
        for key, data in (("spk/good", good), ("spk/broken", audio)):
            writer.add(f"{key}.txt", b"text")
            writer.add(f"{key}.wav", data)
        writer.close()
    return str(path)


def test_stage_errors_name_shard_and_key(tmp_path):
    url = _bad_shard(tmp_path, b"RIFF\x10\x00\x00\x00WAVEjunkjunk")
    ds = wds.WebDataset([url], shardshuffle=False).map(skwds.decode_audio())
    with pytest.raises(AudioError) as err:
        list(ds)
    assert err.value.shard == url and err.value.member == "spk/broken.wav"
    assert str(err.value).startswith(f"{url}: member 'spk/broken.wav': ")
    # WebDataset's error policy still applies: warn and go on with the next sample
    kept = list(wds.WebDataset([url], shardshuffle=False).map(skwds.decode_audio(), handler=wds.ignore_and_continue))
    assert [s["__key__"] for s in kept] == ["spk/good"]


def test_handler_errors_reach_the_caller_with_key_and_url(tmp_path):
    url = _bad_shard(tmp_path, b"fLaC not really")
    ds = wds.WebDataset([url], shardshuffle=False).decode(skwds.audio_handler())
    with pytest.raises(Exception) as err:
        list(ds)
    assert (err.value.key, err.value.url) == ("spk/broken", url)
    assert isinstance(err.value.__cause__, AudioError) and err.value.__cause__.member == "wav"


def test_non_utf8_transcript_is_located(tmp_path):
    path = tmp_path / "t.tar"
    with open(path, "wb") as f:
        writer = TarWriter(f)
        writer.add("k.txt", b"\xff\xfe")
        writer.add("k.wav", encode(speech_like(0.1, 16000, seed=0), 16000, "wav"))
        writer.close()
    with pytest.raises(ShardkitError, match=r"t\.tar: member 'k\.txt': transcript is not UTF-8"):
        list(wds.WebDataset([str(path)], shardshuffle=False).map(skwds.decode_audio()))


def test_reader_stage_errors_are_located_and_follow_the_handler(make_shards, tmp_path):
    good = make_shards("zst")
    truncated = tmp_path / "cut.tar.zst"
    truncated.write_bytes(open(good[0], "rb").read()[:-200])
    stage = skwds.tarfile_to_samples()
    with pytest.raises(ShardkitError) as err:
        list(stage([{"url": str(truncated)}]))
    assert err.value.shard == str(truncated)
    seen = []
    lenient = skwds.tarfile_to_samples(handler=lambda e: seen.append(e) or True)
    keys = [s["__key__"] for s in lenient([{"url": str(truncated)}, {"url": good[1]}])]
    assert len(seen) == 1 and isinstance(seen[0], ShardkitError)
    second = [s["__key__"] for s in stage([good[1]])]
    assert second and keys[-len(second):] == second  # the next shard was read whole


def test_stage_pickles_for_dataloader_workers():
    stage = pickle.loads(pickle.dumps(skwds.decode_audio(dtype="float64")))
    wav = encode(speech_like(0.1, 16000, seed=0), 16000, "wav")
    out = stage({"__key__": "k", "__url__": "u", "wav": wav})
    assert out["wav"][0].dtype == np.float64


# --- splitting: the real WebDataset splitters against the plan -----------------------------------


def _consumer_env(monkeypatch, rank, world_size, worker, num_workers):
    for name, value in (("RANK", rank), ("WORLD_SIZE", world_size), ("WORKER", worker),
                        ("NUM_WORKERS", num_workers)):
        monkeypatch.setenv(name, str(value))


@pytest.mark.parametrize("n,world_size,num_workers", [(12, 2, 3), (7, 2, 2), (5, 3, 1), (4, 1, 4), (3, 2, 2)])
def test_real_split_by_node_and_worker_is_the_plan(monkeypatch, n, world_size, num_workers):
    urls = [f"shard-{i:03d}.tar" for i in range(n)]
    seen = []
    for rank in range(world_size):
        for worker in range(num_workers):
            _consumer_env(monkeypatch, rank, world_size, worker, num_workers)
            got = [d["url"] for d in wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node,
                                                      wds.split_by_worker)]
            assert got == [urls[i] for i in webdataset_lines_for(rank, worker, n, world_size, num_workers)]
            seen += got
    assert sorted(seen) == urls  # every shard exactly once per epoch


def test_webdataset_with_shardshuffle_reads_each_shard_once_per_epoch_as_planned(make_shards, monkeypatch):
    paths = make_shards("none", utts_per_shard=2)  # 8 shards of 1-2 utterances
    utts = [len(list(wds.WebDataset([p], shardshuffle=False))) for p in paths]
    world_size, num_workers = 2, 2
    plan = plan_figures_webdataset(utts, [1.0] * len(paths), world_size=world_size, num_workers=num_workers, epochs=2)
    for epoch in range(2):
        urls = []
        for rank in range(world_size):
            for worker in range(num_workers):
                _consumer_env(monkeypatch, rank, world_size, worker, num_workers)
                ds = wds.WebDataset(paths, shardshuffle=5, seed=epoch, nodesplitter=wds.split_by_node,
                                    empty_check=False)
                samples = list(ds)
                mine = {s["__url__"] for s in samples}
                urls += sorted(mine)
                planned = next(w for w in plan["epochs"][epoch]["workers"] if (w["rank"], w["worker"]) == (rank, worker))
                assert (len(mine), len(samples)) == (planned["shards"], planned["utterances"])
                assert mine == {paths[i] for i in webdataset_lines_for(rank, worker, len(paths), world_size,
                                                                       num_workers)}
        assert sorted(urls) == sorted(paths)


def test_resampled_draws_from_the_whole_list_on_every_consumer(monkeypatch):
    urls = [f"s{i}.tar" for i in range(5)]
    for rank, worker in ((0, 0), (1, 1)):
        _consumer_env(monkeypatch, rank, 2, worker, 2)
        drawn = [d["url"] for d, _ in zip(wds.ResampledShards(urls, seed=rank), range(400))]
        assert set(drawn) == set(urls)  # no split: each worker draws from every shard
    plan = plan_figures_webdataset([1] * 5, [1.0] * 5, world_size=2, num_workers=2, resampled=True)
    assert plan["draws_per_worker"] == 2 and all(w["shards"] == 2 for w in plan["epochs"][0]["workers"])


def test_dataloader_workers_read_every_utterance_once(make_shards, monkeypatch):
    torch = pytest.importorskip("torch")
    paths = make_shards("none", utts_per_shard=2)
    monkeypatch.delenv("WORKER", raising=False)
    monkeypatch.delenv("NUM_WORKERS", raising=False)
    ds = skwds.WebDataset(paths, shardshuffle=False).map(skwds.decode_audio()).to_tuple("__key__", "wav")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    keys = [key for key, _ in loader]
    assert sorted(keys) == sorted(TRUTH)


def test_plan_cli_webdataset_shows_both_readers(make_shards):
    paths = make_shards("none")
    result = CliRunner().invoke(main, ["plan", *paths, "--world-size", "2", "--num-workers", "1", "--reader",
                                       "webdataset", "--epochs", "2", "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "WebDataset, nodesplitter=wds.split_by_node" in result.stderr
    assert "WebDataset, resampled=True" in result.stderr and "WeNet: the list shuffled" in result.stderr
    data = json.loads(CliRunner().invoke(main, ["plan", *paths, "--world-size", "2", "--num-workers", "1",
                                                "--reader", "webdataset", "--json", "-q", "-j", "1"]).stdout)
    assert data["reader"] == "webdataset" and data["resampled"]["mode"] == "resampled"
    assert data["wenet"]["reader"] == "wenet" and data["shards"] == 3
    assert [r["shards"] for r in data["epochs"][0]["ranks"]] == [2, 1] and not data["divides"]


# --- keys with dots --------------------------------------------------------------------------------


def test_validate_warns_about_dotted_keys_without_failing(tmp_path):
    path = tmp_path / "dots.tar"
    wav = encode(speech_like(0.2, 16000, seed=0), 16000, "wav")
    with open(path, "wb") as f:
        writer = TarWriter(f)
        for key in ("spk/plain-key", "spk/utt.v2", "v1.0/clean"):
            writer.add(f"{key}.txt", b"words")
            writer.add(f"{key}.wav", wav)
        writer.close()
    result = CliRunner().invoke(main, ["validate", str(path), "--json", "-j", "1"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["findings"] == [] and doc["totals"]["warnings"] == 1
    (warning,) = doc["warnings"]
    assert (warning["key"], warning["check"], warning["severity"]) == ("spk/utt.v2", "key_dot", "warning")
    assert "WebDataset reads its members as key 'spk/utt'" in warning["message"]
    assert "1 warnings (not findings" in result.stderr and "key 'spk/utt.v2'" in result.stderr
    assert [s["__key__"] for s in wds.WebDataset([str(path)], shardshuffle=False)] == \
        ["spk/plain-key", "spk/utt", "v1.0/clean"]


# --- bench's WebDataset rows -------------------------------------------------------------------------


def test_bench_measures_webdataset_loaders_next_to_shardkits_reader(tmp_path):
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", "-o", str(out), "--corpus-mb", "0.4", "--repeat", "1",
                                       "--min-seconds", "0", "-j", "1", "--formats", "none,zst:3", "--workers", "",
                                       "--reference", "", "--json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    corpus = report["corpus"]
    rows = {(r["format"], r["audio"]): r for r in report["webdataset"]}
    assert set(rows) == {("none", "wav"), ("zst:3", "wav"), ("none", "flac")}
    for (fmt, _), row in rows.items():
        expected = {"wds+soundfile", "wds+shardkit", "shardkit.training.wds.WebDataset", "shardkit reader"}
        assert expected <= set(row["loaders"])
        assert ("wds+soundfile pipe:zstd" in row["loaders"]) == (fmt == "zst:3" and shutil.which("zstd") is not None)
        for stat in row["loaders"].values():
            assert stat["counted"] == [corpus["utterances"], corpus["frames"]] and stat["hours_per_s"] > 0
        assert row["gains"]["stage_vs_soundfile"] > 0 and row["gains"]["dropin_vs_soundfile"] > 0
        assert set(row["gains"]["vs_shardkit_reader"]) == set(row["loaders"]) - {"shardkit reader"}
    assert "none/wav: " in report["recommendation"]["webdataset"]["summary"]
    md = (out / "bench.md").read_text()
    assert "WebDataset loaders, interleaved in one run" in md and "- WebDataset users: replace" in md
    assert json.loads((out / "bench.json").read_text())["webdataset"] == report["webdataset"]
    skipped = CliRunner().invoke(main, ["bench", "-o", str(tmp_path / "b2"), "--corpus-mb", "0.4", "--repeat", "1",
                                        "--min-seconds", "0", "-j", "1", "--formats", "none", "--audio", "wav",
                                        "--workers", "", "--reference", "", "--no-webdataset", "--json", "-q"])
    assert skipped.exit_code == 0 and json.loads(skipped.stdout)["webdataset"] == []


def test_plan_draws_without_webdataset_is_a_usage_error(make_shards):
    result = CliRunner().invoke(main, ["plan", *make_shards("none"), "--world-size", "2", "--num-workers", "1",
                                       "--draws", "3", "-q"])
    assert result.exit_code == 2 and "--draws needs --reader webdataset" in result.stderr
