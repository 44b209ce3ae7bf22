"""The first hour of a new user (issue 28): each trap seen, as a CLI test of exit code, last line and --json.

1 safe default output, 2 validate names a mixed corpus, 3 nothing looks finished after a failure,
4 pasteable "rerun with" lines, 5 one codec grammar, 6 --json and exit 130 at the edges,
7 shardkit on the PATH, 8 advice for the machine that is there, 9 progress and the recipe's rerun
skip, 10 the test command checks the machine first.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.io.synth import encode, speech_like, write_shards
from support import REPO

ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def utterance(key: str, seconds: float = 0.6, rate: int = 16000, channels: int = 1, fmt: str = "wav", seed: int = 0):
    return key, f"text of {key}", encode(speech_like(seconds, rate, seed=seed, channels=channels), rate, fmt), seconds


@pytest.fixture
def mixed_corpus(tmp_path):
    """18 mono 16 kHz WAV utterances, one 8 kHz and one stereo: the demo's planted faults."""
    utts = [utterance(f"spk/u{i:02d}", seed=i) for i in range(18)]
    utts += [utterance("spk/u18", rate=8000, seed=18), utterance("spk/u19", channels=2, seed=19)]
    write_shards(utts, str(tmp_path / "mixed"), utts_per_shard=5)
    return tmp_path / "mixed" / "data.list"


@pytest.fixture
def list_with_a_missing_shard(make_shards, tmp_path):
    """A data.list whose 3rd line names no file, between shards that exist (the issue's `miss/data.list`)."""
    shards = make_shards("bz2")
    folder = tmp_path / "miss"
    folder.mkdir()
    lines = [shards[0], shards[1], str(tmp_path / "gone" / "shards_000000009.tar.bz2"), *shards[2:]]
    (folder / "data.list").write_text("\n".join(lines) + "\n")
    return folder / "data.list", shards


# --- 1. safe defaults ---------------------------------------------------------------------------


def test_convert_and_balance_write_plain_tar_by_default_which_tarfile_reads(make_shards, tmp_path):
    shards = make_shards("bz2")
    result = cli("convert", *shards, "-o", tmp_path / "conv", "--json", "-q")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert "zstd" not in summary  # nothing to warn about
    outputs = (tmp_path / "conv" / "data.list").read_text().split()
    assert outputs and all(p.endswith(".tar") for p in outputs)
    for path in outputs:  # WeNet's own call reads them with no hook
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:*") as tar:
            assert tar.next() is not None

    result = cli("balance", "--corpus", f"a={tmp_path / 'conv' / 'data.list'}", "--world-size", "1",
                 "--num-workers", "1", "--num-shards", "2", "-o", tmp_path / "bal", "--json", "-q")
    assert result.exit_code == 0, result.output
    assert all(p.endswith(".tar") for p in (tmp_path / "bal" / "data.list").read_text().split())
    assert "zstd" not in json.loads(result.stdout)


def test_zst_output_says_whether_this_pythons_tarfile_reads_it(make_shards, tmp_path):
    from shardkit import zstd_status

    shards = make_shards("none")
    result = cli("convert", *shards, "-o", tmp_path / "z", "--codec", "zstd", "--json")
    assert result.exit_code == 0, result.output
    note = json.loads(result.stdout)["zstd"]
    assert note["reads_zstd_here"] == zstd_status()["reads_zstd"]  # what `shardkit wenet status` says
    assert last_line(result.stderr) == f"note: {note['text']}"
    if not note["reads_zstd_here"]:
        assert "shardkit wenet enable-zstd" in note["text"]
    assert all(p.endswith(".tar.zst") for p in (tmp_path / "z" / "data.list").read_text().split())


# --- 2. validate tells a person what is mixed -----------------------------------------------------


def test_validate_warns_of_a_mixed_corpus_and_strict_makes_it_a_finding(mixed_corpus):
    result = cli("validate", mixed_corpus)
    assert result.exit_code == 0, result.output  # a warning: WeNet trains on it
    assert "warning: mixed audio" in result.stderr
    assert "  2 sample rates: 16000 Hz 19, 8000 Hz 1" in result.stderr.splitlines()
    assert "  2 channel counts: 1 ch 19, 2 ch 1" in result.stderr.splitlines()
    report = json.loads(cli("validate", mixed_corpus, "--json", "-q").stdout)
    assert report["totals"]["mix"]["sample_rate"] == {"16000": 19, "8000": 1}
    assert report["totals"]["mixed"] == ["2 sample rates: 16000 Hz 19, 8000 Hz 1", "2 channel counts: 1 ch 19, 2 ch 1"]

    strict = cli("validate", mixed_corpus, "--strict", "--json")
    assert strict.exit_code == 1
    doc = json.loads(strict.stdout)
    assert [f["check"] for f in doc["findings"]] == ["mixed_audio", "mixed_audio"]
    assert last_line(strict.stderr).startswith("validate: 2 findings in 0 of 4 shards and the corpus's audio mix "
                                               "(--strict); written: no report")
    # the rate and channels the recipe passes name the two utterances themselves
    named = json.loads(cli("validate", mixed_corpus, "--sample-rate", "16000", "--channels", "1", "--json").stdout)
    assert sorted(f["key"] for f in named["findings"]) == ["spk/u18", "spk/u19"]


# --- 3. nothing looks finished when it is not ------------------------------------------------------


def test_convert_with_a_failed_shard_writes_a_partial_list_and_says_what_next(list_with_a_missing_shard, tmp_path,
                                                                              monkeypatch):
    data_list, shards = list_with_a_missing_shard
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "conv"
    (out).mkdir()
    (out / "data.list").write_text("/stale/list/of/an/earlier/run.tar\n")
    result = cli("convert", "miss/data.list", "-o", "conv", "--json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["data_list"] == str(out / "data.partial.list")
    assert not (out / "data.list").exists()  # the stale list would look finished
    assert len((out / "data.partial.list").read_text().split()) == len(shards)
    assert last_line(result.stderr) == (
        f"convert: 1 of {len(shards) + 1} shards failed (miss/data.list:3); written: {len(shards)} shards, "
        f"{out / 'data.partial.list'} (the list without the failed shards), {out / 'convert.json'}; not written: "
        f"1 shard, and no data.list; next: fix or remove what failed, then rerun `shardkit convert miss/data.list "
        f"-o conv --json` (finished shards are skipped); `shardkit list check miss/data.list` names every bad line")
    # fixed: the rerun converts the rest, writes data.list, and the partial list goes
    (tmp_path / "miss" / "data.list").write_text("\n".join(shards) + "\n")
    again = cli("convert", "miss/data.list", "-o", "conv", "--json", "-q")
    assert again.exit_code == 0 and json.loads(again.stdout)["skipped"] == len(shards)
    assert (out / "data.list").exists() and not (out / "data.partial.list").exists()


def test_balance_and_index_that_stop_leave_no_folder_and_say_so(list_with_a_missing_shard, tmp_path, monkeypatch):
    data_list, _ = list_with_a_missing_shard
    monkeypatch.chdir(tmp_path)
    result = cli("balance", "--corpus", "a=miss/data.list", "--world-size", "1", "--num-workers", "1", "-o", "bal",
                 "--json")
    assert result.exit_code == 1
    assert not (tmp_path / "bal").exists()  # no empty folder, no bal/.balance
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 1 and doc["failed_inputs"] == [str(tmp_path / "gone" / "shards_000000009.tar.bz2")]
    assert last_line(result.stderr) == doc["next"] == (
        "balance: stopped before writing: 1 input could not be read (miss/data.list:3); written: nothing (an output "
        "folder this run made is removed); not written: any shard, and no data.list; next: fix or remove what "
        "failed, then rerun `shardkit balance --corpus a=miss/data.list --world-size 1 --num-workers 1 -o bal "
        "--json`; `shardkit list check miss/data.list` names every bad line")

    index = cli("index", "miss/data.list", "-o", "idx/all.jsonl")
    assert index.exit_code == 1 and not (tmp_path / "idx").exists()
    assert last_line(index.stderr).startswith("index: 1 of 4 shards failed (miss/data.list:3); written: nothing; "
                                              "not written: the index idx/all.jsonl; next: fix or remove what failed, "
                                              "then rerun `shardkit index miss/data.list -o idx/all.jsonl`")

    validate = cli("validate", "miss/data.list")
    assert validate.exit_code == 1
    assert last_line(validate.stderr).startswith("validate: 1 findings in 1 of 4 shards (miss/data.list:3); written: "
                                                 "no report (--report FILE keeps one); not written: nothing in the "
                                                 "sources")


# --- 5. one vocabulary ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, suffix, level", [("zstd", ".tar.zst", 3), ("zst:19", ".tar.zst", 19),
                                                 ("zstd:19", ".tar.zst", 19), ("none", ".tar", None)])
def test_every_writer_takes_the_one_codec_grammar(make_shards, tmp_path, spec, suffix, level):
    shards = make_shards("none")
    result = cli("convert", *shards, "-o", tmp_path / "c", "--codec", spec, "-q")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "c" / "convert.json").read_text())
    assert manifest["settings"]["level"] == level
    assert all(p.endswith(suffix) for p in (tmp_path / "c" / "data.list").read_text().split())
    result = cli("balance", "--corpus", f"a={tmp_path / 'c' / 'data.list'}", "--world-size", "1", "--num-workers",
                 "1", "--num-shards", "1", "-o", tmp_path / "b", "--codec", spec, "-q")
    assert result.exit_code == 0, result.output
    assert all(p.endswith(suffix) for p in (tmp_path / "b" / "data.list").read_text().split())


@pytest.mark.parametrize("command", [["convert", "x.tar"], ["make", "x"],
                                     ["balance", "--corpus", "a=x", "--world-size", "1", "--num-workers", "1"]])
def test_a_bad_codec_is_refused_in_the_same_words_by_every_command(command, tmp_path):
    result = cli(*command, "-o", tmp_path / "o", "--codec", "lz4", "--json")
    assert result.exit_code == 2
    message = ("unknown codec 'lz4'; give none, zst[:LEVEL], bz2[:LEVEL], gz[:LEVEL] or xz[:LEVEL] (zstd = zst)")
    assert message in result.stderr
    # 6. a usage error under --json still prints the one JSON document
    doc = json.loads(result.stdout)
    assert doc == {"command": command[0], "error": f"Invalid value for '--codec': {message}", "exit_code": 2}
    bench = cli("bench", "-o", tmp_path / "b", "--formats", "none,lz4", "--json")
    assert bench.exit_code == 2 and message in bench.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "b").exists()


def test_bench_takes_zstd_as_convert_does():
    from shardkit.commands.bench import BenchSettings, check_settings
    from shardkit.io.codecs import parse_codec_spec

    check_settings(BenchSettings(formats=("zstd:3", "zst:19", "none"), loader_format="zstd:3"))
    assert parse_codec_spec("zstd:3") == parse_codec_spec("zst:3") == ("zst", 3)
    assert parse_codec_spec("zst", 7) == ("zst", 7)  # --level beside --codec


# --- 6. --json and exit codes at the edges: Ctrl-C ---------------------------------------------------


def test_ctrl_c_exits_130_with_json_leaves_no_temp_file_and_a_rerun_resumes(make_shards, tmp_path):
    shards = make_shards("bz2")[:2]
    out = tmp_path / "out"
    command = [sys.executable, "-m", "shardkit", "convert", *shards, "-", "-o", str(out), "-j", "1", "--json"]
    # the two files are converted first; then convert waits on standard input, half a shard in
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ENV, start_new_session=True)
    data = open(shards[0], "rb").read()
    proc.stdin.write(data[:len(data) // 2])
    proc.stdin.flush()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not glob.glob(str(out / ".stdin.tar.*.partial")):
        time.sleep(0.05)
    assert glob.glob(str(out / ".stdin.tar.*.partial")), "convert never started on standard input"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr.decode()
    assert json.loads(stdout) == {"command": "convert", "error": "interrupted", "exit_code": 130}
    assert last_line(stderr.decode()).startswith("interrupted: finished shards are kept and no partial output is "
                                                 "left; rerun `shardkit convert ")
    assert not [n for n in os.listdir(out) if n.endswith(".partial") or n.endswith(".lock")]
    assert sorted(n for n in os.listdir(out) if n.endswith(".tar")) == ["shards_000000000.tar",
                                                                        "shards_000000001.tar"]
    # the same command resumes: the two finished shards are skipped, the stream is converted
    done = subprocess.run(command, input=data, capture_output=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert (summary["skipped"], summary["ok"]) == (2, 1)


# --- 7. shardkit on the PATH, 10. the test command ------------------------------------------------


def test_readme_says_how_to_put_shardkit_on_the_path_and_what_the_two_commands_cost():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert "source .venv/bin/activate" in readme
    assert "Why plain tar is the default output" in readme
    assert "SHARDKIT_TEST_DRY_RUN=1" in readme
    recipe = open(os.path.join(REPO, "scripts", "run.sh"), encoding="utf-8").read()
    assert "source $root/.venv/bin/activate" in recipe


def test_test_sh_checks_python_and_venv_first_and_its_dry_run_changes_nothing(tmp_path, torch_index):
    script = os.path.join(REPO, "scripts", "test.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    assert "SHARDKIT_TORCH_INDEX-https://download.pytorch.org/whl/cpu}" in open(script).read()  # the default index
    # an index that answers (a local one: the dry run asks it, and this test needs no network)
    env = {**os.environ, "SHARDKIT_TEST_DRY_RUN": "1", "SHARDKIT_VENV": str(tmp_path / "venv"),
           "SHARDKIT_TORCH_INDEX": torch_index}
    dry = subprocess.run(["bash", script, "-q"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / "venv").exists()
    assert f"test.sh: creating the venv {tmp_path / 'venv'} (SHARDKIT_VENV=PATH puts it elsewhere)" in dry.stderr
    assert f"would run: python3 -m venv {tmp_path / 'venv'}" in dry.stderr
    assert f"installing torch and torchaudio, the CPU build, from {torch_index} (SHARDKIT_TORCH_INDEX)" in dry.stderr
    assert f"--index-url {torch_index} torch torchaudio" in dry.stderr
    assert last_line(dry.stderr) == f"test.sh: would run: {tmp_path / 'venv'}/bin/python -m pytest -q"
    old = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHON": str(tmp_path / "no-such-python")})
    assert old.returncode == 2 and "install Python 3.10 or newer" in old.stderr


@pytest.fixture
def torch_index(tmp_path):
    """A local package index that serves a torch page, as PyTorch's CPU index does."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    (tmp_path / "index" / "whl" / "cpu" / "torch").mkdir(parents=True)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "index"))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def test_test_sh_says_when_the_torch_index_does_not_answer_and_how_to_choose(tmp_path):
    import socket

    script = os.path.join(REPO, "scripts", "test.sh")
    with socket.socket() as closed:  # a port nothing listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        silent = f"http://127.0.0.1:{closed.getsockname()[1]}/whl/cpu"
    env = {**os.environ, "SHARDKIT_TEST_DRY_RUN": "1", "SHARDKIT_VENV": str(tmp_path / "venv"),
           "SHARDKIT_TORCH_INDEX": silent}
    dry = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    said = [line for line in dry.stderr.splitlines() if "did not answer" in line]
    assert said == [f"test.sh: the CPU torch index {silent} did not answer within 10 s: the registry's default torch "
                    "build comes with the extras below (on Linux x86-64 the CUDA build). For the CPU build, set "
                    "SHARDKIT_TORCH_INDEX to an index that serves it (a mirror or proxy of "
                    "https://download.pytorch.org/whl/cpu); SHARDKIT_TORCH_INDEX= (empty) takes the default build "
                    "without asking"]
    assert "--index-url" not in dry.stderr  # no pip run against it, so no ResolutionImpossible to read
    # said before the extras' install, the step that brings the default build
    assert dry.stderr.index("did not answer") < dry.stderr.index('-e .[all')
    empty = subprocess.run(["bash", script], capture_output=True, text=True, timeout=120,
                           env={**env, "SHARDKIT_TORCH_INDEX": ""})
    assert "test.sh: SHARDKIT_TORCH_INDEX is empty: the registry's default torch build comes with the extras" \
        in empty.stderr and "--index-url" not in empty.stderr
    made = tmp_path / "made"  # a venv there already: said, with the path that chose it
    made.mkdir()
    (made / "bin").mkdir()
    (made / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this venv's Python
    (made / "bin" / "python").chmod(0o755)
    reused = subprocess.run(["bash", script], capture_output=True, text=True, timeout=120,
                            env={**env, "SHARDKIT_VENV": str(made)})
    assert f"test.sh: using the venv {made} (SHARDKIT_VENV=PATH puts it elsewhere)" in reused.stderr
    if importlib.util.find_spec("torch"):
        import torch

        assert f"test.sh: torch {torch.__version__} is in {made} already" in reused.stderr


# --- 8. advice for the machine that is there --------------------------------------------------------


def test_bench_advice_says_when_it_guesses_the_gpus_and_explains_prefetch(monkeypatch):
    from shardkit.commands import bench

    monkeypatch.setattr(bench, "gpus_seen", lambda: (0, "torch.cuda.device_count()"))
    gpus, where, guessed = bench.gpus_for_advice(None)
    assert (gpus, guessed) == (1, True) and where.startswith("a guess: no GPU seen here")
    assert bench.gpus_for_advice(8) == (8, "--gpus-per-node", False)
    monkeypatch.setattr(bench, "gpus_seen", lambda: (4, "torch.cuda.device_count()"))
    assert bench.gpus_for_advice(None)[:2] == (4, "the GPUs seen here (torch.cuda.device_count())")

    row = {"format": "none", "audio": "wav", "size_ratio": 1.0, "decode": {"shardkit": {"hours_per_s": 20.0}}}
    starved = bench.recommend([row], [], cores=2, gpus_per_node=8, target_hps=0.42, fbank_hps=0.25)
    assert starved["cores_per_gpu"] == 0 and starved["num_workers"] == 0 and starved["prefetch"] is None
    assert "fewer cores (2) than GPUs (8)" in starved["why"]
    fed = bench.recommend([row], [], cores=2, gpus_per_node=1, target_hps=0.42, fbank_hps=0.25, gpus_from=where,
                          guessed=True)
    # 0.42 h/s x 3600 / 120-s batches = 12.6 batches/s; 2 s of them over 2 workers: 12.6 -> 13 each
    assert (fed["num_workers"], fed["prefetch"], fed["gpus_guessed"]) == (2, 13, True)
    assert fed["prefetch_why"].startswith("prefetch_factor=13: each of the 2 workers keeps 13 batches ready, so that "
                                          "together they hold 2 s of one GPU's consumption")
    text = bench.recommendation_text(fed)
    assert "1 GPU per node: a guess: no GPU seen here" in text and "Why prefetch_factor=13" in text


# --- 4, 9. the recipe: pasteable reruns, progress, finished stages skipped ----------------------------

TINY = ["--demo_minutes", "1", "--utts_per_shard", "3", "--world_size", "2", "--num_workers", "1",
        "--jobs", "1"]


def recipe(*args, cwd=REPO):
    env = {**ENV, "SHARDKIT_PYTHON": sys.executable}
    return subprocess.run(["bash", os.path.join(REPO, "scripts", "run.sh"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_recipe_rerun_skips_finished_stages_and_keeps_the_demo_files(tmp_path):
    work = tmp_path / "exp"
    first = recipe("--workdir", str(work), *TINY, "--stop_stage", "2")
    assert first.returncode == 0, first.stderr
    assert re.search(r"read\+check: 100%\|.*\| \d+/\d+", first.stderr)  # progress bars, not -q
    demo = sorted(glob.glob(str(work / "kaldi" / "*" / "*")))
    stamps = {p: os.stat(p).st_mtime_ns for p in demo}
    again = recipe("--workdir", str(work), *TINY, "--stop_stage", "2")
    assert again.returncode == 0, again.stderr
    banners = [line for line in again.stderr.splitlines() if line.startswith("==== stage")]
    assert len(banners) == 3 and all("done already with these options and inputs, skipped" in b for b in banners)
    assert {p: os.stat(p).st_mtime_ns for p in demo} == stamps  # stage 0 did not rewrite the demo
    # another option is another stage 2: it runs again (and the stages before it stay skipped)
    other = recipe("--workdir", str(work), *TINY, "--stop_stage", "2", "--seed", "0", "--sample_rate", "16000",
                   "--shard_duration", "30")
    banners = [line for line in other.stderr.splitlines() if line.startswith("==== stage")]
    assert other.returncode == 0, other.stderr
    assert "skipped" in banners[0] and "skipped" in banners[1] and "skipped" not in banners[2]
    # a deleted output is made again
    os.unlink(work / "data" / "train" / "data.list")
    redo = recipe("--workdir", str(work), *TINY, "--stop_stage", "2", "--shard_duration", "30")
    assert redo.returncode == 0 and (work / "data" / "train" / "data.list").exists()


@pytest.mark.slow
def test_recipe_stop_prints_the_full_command_that_goes_on(tmp_path):
    work = tmp_path / "my work"  # a space: the printed command must quote it
    stopped = recipe("--workdir", str(work), *TINY, "--demo_faults", "true", "--stop_stage", "2", cwd=tmp_path)
    assert stopped.returncode == 1
    line = last_line(stopped.stderr)
    assert line.startswith("run.sh: stage 2 stopped: validation found problems in aishell")
    command = line.split("train on the clean utterances only: ", 1)[1]
    assert command.startswith(f"bash {REPO}/scripts/run.sh --demo_minutes 1 --utts_per_shard 3 ")
    assert "--workdir " + str(work).replace(" ", "\\ ") in command and "--world_size 2" in command
    assert command.endswith("--stage 2 --allow_rejects true")
    # pasted as printed, from another folder, it goes on with the same workdir and options
    shutil.rmtree(work / "data", ignore_errors=True)
    went_on = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                             env={**ENV, "SHARDKIT_PYTHON": sys.executable})
    assert went_on.returncode == 0, went_on.stderr
    assert (work / "data" / "train" / "data.list").exists()
    assert not (tmp_path / "exp").exists()  # nothing went to the default workdir


def test_make_after_a_failed_shard_says_what_was_and_was_not_written(capsys):
    from shardkit.cli import make as make_cli
    from shardkit.cli._outcome import remember_arguments

    remember_arguments(["make", "--wav-scp", "d/wav.scp", "--text", "d/text", "-o", "out"])
    summary = {"findings": [], "shards": 2, "shard_status": {"ok": 2, "skipped": 0, "failed": 1, "empty": 0},
               "utterances": 40, "audio_seconds": 120.0, "bytes_out": 4_000_000, "skipped_utterances": 0,
               "data_list": "/x/out/data.partial.list", "manifest": "/x/out/make.json",
               "failures": [{"shard": "/x/out/shards_000000002.tar", "error": "disk full"}]}
    make_cli._print_summary(summary, as_json=False, quiet=False, codec="none")
    err = capsys.readouterr().err
    assert last_line(err) == (
        "make: 1 of 3 shards failed; written: 2 shards, /x/out/data.partial.list (the list without the failed "
        "shards), /x/out/make.json; not written: 1 shard, and no data.list; next: fix or remove what failed, then "
        "rerun `shardkit make --wav-scp d/wav.scp --text d/text -o out` (finished shards are skipped)")
