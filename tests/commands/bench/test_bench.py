import hashlib
import json
import os

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.commands.bench import BenchCheckError, BenchSettings, generate_corpus, plan_corpus, timed
from shardkit.commands.bench.timing import expect as _expect
from shardkit.planning.bench import recommend, workers_needed

FORMATS = ["none", "gz", "bz2", "xz", "zst:1", "zst:3", "zst:19"]
TINY = ["--corpus-mb", "0.4", "--repeat", "1", "--min-seconds", "0", "-j", "2"]


def _run(args):
    result = CliRunner().invoke(main, ["bench", *args])
    return result, (json.loads(result.stdout) if result.exit_code == 0 and "--json" in args else None)


def test_default_formats_tiny_run_reports_every_figure(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    result, report = _run(["-o", str(out), *TINY, "--workers", "0,1", "--mp-context", "fork", "--json"])
    assert result.exit_code == 0, result.output
    corpus = report["corpus"]
    assert corpus["source"] == "generated" and corpus["utterances"] >= 2 and corpus["frames"] > 0
    rows = {(r["format"], r["audio"]): r for r in report["formats"]}
    assert set(rows) == {(f, a) for f in FORMATS for a in ("wav", "flac")}  # FLAC in plain tar included
    for (fmt, audio), row in rows.items():
        assert row["bytes"] > 0 and 0 < row["size_ratio"] <= 1.0 + 1e-9
        assert row["write"]["mb_per_s"] > 0 and row["decompress"]["mb_per_s"] > 0
        assert row["decompress"]["counted"][1] == corpus["plain_tar_bytes"][audio]
        assert row["group"]["utterances_per_s"] > 0 and row["group"]["counted"][0] == corpus["utterances"]
        for decoder in ("shardkit", "soundfile"):
            stat = row["decode"][decoder]
            assert stat["counted"] == [corpus["utterances"], corpus["frames"]]
            assert stat["hours_per_s"] > 0 and stat["x_realtime"] > 0 and stat["runs"] == 1
        assert (row["reference"] is not None) == (fmt == "bz2")
    assert rows[("bz2", "wav")]["reference"]["counted"] == [corpus["utterances"], corpus["frames"]]
    assert rows[("none", "flac")]["size_ratio"] < rows[("none", "wav")]["size_ratio"] == 1.0
    assert [(r["workers"], r["mp_context"], r["dtype"]) for r in report["loader"]] == [
        (0, "main", "int16"), (1, "fork", "int16"), (0, "main", "float32"), (1, "fork", "float32")]
    assert all(r["counted"] == [corpus["utterances"], corpus["frames"]] and r["startup_s"] >= 0
               and r["hours_per_cpu_s"] > 0 and r["per_cpu_vs_main"] > 0 for r in report["loader"])
    assert report["recommendation"]["batches"]["dtype"] in ("int16", "float32")
    rec = report["recommendation"]
    assert rec["format"] in FORMATS and rec["num_workers"] >= 1 and rec["prefetch"] >= 2
    assert report["machine"]["cores"] >= 1 and report["machine"]["libraries"]["numpy"]
    assert set(os.listdir(out)) == {"bench.json", "bench.md", "bench.png"}
    assert json.loads((out / "bench.json").read_text())["formats"] == report["formats"]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Recommendation" in (out / "bench.md").read_text()


def test_user_shards_are_sampled_and_repacked(make_shards, tmp_path):
    paths = make_shards("bz2")
    result, report = _run([*paths, "-o", str(tmp_path / "o"), *TINY, "--formats", "none,zst:3", "--audio", "wav",
                           "--workers", "", "--reference", "", "--json", "-q"])
    assert result.exit_code == 0, result.output
    assert report["corpus"]["source"] == "sampled" and report["corpus"]["utterances"] == 14
    assert report["corpus"]["sampled_from"] == len(paths) and report["loader"] == []
    assert [r["format"] for r in report["formats"]] == ["none", "zst:3"]
    assert result.stderr == ""


@pytest.mark.parametrize("args,message", [
    (["--formats", "none,lz4"],
     "Error: unknown codec 'lz4'; give none, zst[:LEVEL], bz2[:LEVEL], gz[:LEVEL] or xz[:LEVEL] (zstd = zst)"),
    (["--reference", "zst:3", "--formats", "zst:3"],
     "Error: the WeNet reference row needs a format tarfile reads (none, gz, bz2, xz), not zst"),
    (["--audio", "mp3"], "Error: unknown audio codec 'mp3'; choose from wav, flac"),
    (["--mp-context", "thread"],
     "Error: unknown multiprocessing context 'thread'; choose from fork, spawn, forkserver"),
    (["--workers", "1,x"], "Error: --workers takes integers separated by commas (got '1,x')"),
])
def test_bad_arguments_exit_2(tmp_path, args, message):
    result, _ = _run(["-o", str(tmp_path / "o"), *args])
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1] == message


def test_a_run_that_misses_utterances_fails_instead_of_reporting():
    corpus = {"utterances": 4, "frames": 100}
    with pytest.raises(BenchCheckError, match="zst:3/wav decode: read 3 of 4 utterances"):
        timed(lambda: (3, 100), repeat=1, min_seconds=0, check=_expect("zst:3/wav decode", corpus, frames=True))
    with pytest.raises(BenchCheckError, match="decoded 0 of 100 audio frames"):
        timed(lambda: (4, 0), repeat=2, min_seconds=0, check=_expect("x", corpus, frames=True))
    stat = timed(lambda: (4, 100), repeat=3, min_seconds=0, check=_expect("x", corpus, frames=True))
    assert stat["runs"] == 3 and stat["counted"] == [4, 100] and stat["min_s"] <= stat["median_s"] <= stat["max_s"]


def test_recommendation_picks_smallest_format_that_feeds_the_gpus():
    def row(fmt, audio, size, hps):
        return {"format": fmt, "audio": audio, "size_ratio": size, "decode": {"shardkit": {"hours_per_s": hps}}}

    formats = [row("none", "wav", 1.0, 20.0), row("zst:3", "wav", 0.8, 5.0), row("bz2", "wav", 0.7, 0.2),
               row("none", "flac", 0.65, 1.0)]
    def pick(rows, cores):
        rec = recommend(rows, [], cores=cores, gpus_per_node=8, target_hps=0.42, fbank_hps=0.25)
        return rec["format"], rec["audio"], rec["num_workers"]

    # workers per GPU = 0.42 * (1/decode + 1/0.25): FLAC 2.1, bz2 3.78, zst:3 1.76, plain WAV 1.70
    assert pick(formats, 64) == ("none", "flac", 3)  # 8 cores per GPU: all fit, FLAC is smallest
    assert pick(formats[:3], 64) == ("bz2", "wav", 4)
    assert pick(formats[:3], 24) == ("zst:3", "wav", 2)  # 3 cores per GPU: bz2 no longer fits
    assert pick(formats, 8) == ("none", "wav", 1)  # nothing fits 1 core: the fastest, capped at 1 worker
    assert workers_needed(0.42, 1.0, 0.25) == pytest.approx(2.1)


def test_generated_corpus_is_deterministic(tmp_path):
    specs = plan_corpus(64e6)
    assert len(specs) == 16 and specs == plan_corpus(64e6)
    settings = BenchSettings(corpus_mb=0.3, audio=("wav",))
    digests = []
    for run in ("a", "b"):
        work = tmp_path / run
        totals = generate_corpus(str(work), settings, jobs=1)
        names = sorted(os.listdir(work / "base-wav"))
        digests.append([hashlib.sha256((work / "base-wav" / n).read_bytes()).hexdigest() for n in names])
        assert totals["utterances"] >= 2
    assert digests[0] == digests[1]
