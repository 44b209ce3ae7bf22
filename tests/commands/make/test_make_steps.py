"""The named steps of make's CLI and of ``write_shards``, each on its own (no audio written)."""

from __future__ import annotations

import hashlib
import os

import pytest

from shardkit.cli.make import _check_run_options
from shardkit.commands.make import DEFAULT_SHARD_SECONDS, MakeSettings, _plan_writes, _split_done, shard_fingerprint
from shardkit.commands.make.source import MakeSource, check_field_options, resolve_source
from shardkit.commands.make.sources import SourceOptions
from shardkit.errors import UsageError
from shardkit.run.events import Events


def test_run_options_default_the_shard_duration_and_parse_the_slice():
    assert _check_run_options(None, "local", None, None, None) == (None, DEFAULT_SHARD_SECONDS)
    assert _check_run_options(None, "local", "2/3", None, 5) == ((2, 3), None)
    with pytest.raises(UsageError, match="--ray-address needs --executor ray"):
        _check_run_options("auto", "local", None, None, None)
    with pytest.raises(UsageError, match="not both"):
        _check_run_options(None, "local", None, 10.0, 5)


def test_a_kaldi_folder_gives_its_files_and_its_segments(tmp_path):
    for name in ("wav.scp", "text", "segments"):
        (tmp_path / name).write_text("")
    src = resolve_source((str(tmp_path),), None, None, None, None)
    assert (src.fmt, src.wav_scp, src.text, src.segments) == (
        "kaldi", os.path.join(tmp_path, "wav.scp"), os.path.join(tmp_path, "text"), os.path.join(tmp_path, "segments"))
    given = resolve_source((str(tmp_path),), "kaldi", None, None, "mine")
    assert given.segments == "mine"
    assert resolve_source((), None, "w", "t", None) == MakeSource("kaldi", [], "w", "t", None)
    with pytest.raises(UsageError, match="without SOURCE or --from"):
        resolve_source((str(tmp_path),), None, "w", "t", None)
    with pytest.raises(UsageError, match="needs both"):
        resolve_source((), None, "w", None, None)
    with pytest.raises(UsageError, match="name a SOURCE"):
        resolve_source((), None, None, None, None)
    with pytest.raises(UsageError, match="one data directory"):
        resolve_source((str(tmp_path / "text"),), "kaldi", None, None, None)


def test_field_options_fit_the_format_and_settle_kaldi_audio():
    kaldi = MakeSource("kaldi", [], "w", "t", None)
    assert check_field_options(kaldi, SourceOptions(), None, None) == "keep"
    assert check_field_options(kaldi, SourceOptions(), None, 8000) == "wav"
    assert check_field_options(MakeSource("kaldi", [], "w", "t", "s"), SourceOptions(), None, None) == "wav"
    assert check_field_options(kaldi, SourceOptions(), "flac", None) == "flac"
    with pytest.raises(UsageError, match="not for Kaldi directories"):
        check_field_options(kaldi, SourceOptions(None, None, None, 0), None, None)
    raw = MakeSource("wenet-raw", ["data.list"])
    assert check_field_options(raw, SourceOptions("k", "t", "a", 1), None, None) is None
    with pytest.raises(UsageError, match="--segments is for Kaldi"):
        check_field_options(MakeSource("wenet-raw", ["data.list"], segments="s"), SourceOptions(), None, None)


def _utts(i):
    return [{"key": f"u{i}", "text": "x", "source": "a.wav", "start": 0.0, "end": None}]


def test_plan_names_every_shard_and_a_slice_keeps_its_block_and_own_records(tmp_path):
    out, settings = str(tmp_path / "out"), MakeSettings(codec="none")
    whole = _plan_writes(5, _utts, [], out, out, settings, None)
    assert [t[0] for t in whole.tasks] == [os.path.join(out, f"shards_{i:09d}.tar") for i in range(5)]
    assert [t[3] for t in whole.tasks] == [shard_fingerprint(_utts(i), settings) for i in range(5)]
    assert (whole.manifest_path, whole.data_list, whole.slice_info) == (
        os.path.join(out, "make.json"), os.path.join(out, "data.list"), None)
    part = _plan_writes(5, _utts, [], out, out, settings, (2, 2))
    assert part.tasks == whole.tasks[part.slice_info["start"]:part.slice_info["stop"]] and part.tasks
    assert part.manifest_path == os.path.join(out, "make.slice-2-of-2.json")
    assert part.reports == [part.manifest_path, os.path.join(out, "make.json")]
    assert part.journal_path == os.path.join(out, ".make.journal.slice-2-of-2.jsonl")


def test_split_done_skips_unchanged_shards_of_the_same_fingerprint_and_reports_them(tmp_path):
    tasks = [(str(tmp_path / f"s{i}.tar"), i, None, f"fp{i}") for i in range(3)]
    with open(tasks[0][0], "wb") as f:
        f.write(b"shard bytes")
    output = {"path": tasks[0][0], "size": 11, "sha256": hashlib.sha256(b"shard bytes").hexdigest()}
    previous = {tasks[0][0]: {"status": "ok", "fingerprint": "fp0", "output": output},
                tasks[1][0]: {"status": "ok", "fingerprint": "other", "output": output}}
    seen = []
    results, todo = _split_done(tasks, previous, False, Events(lambda event: seen.append(event.result)))
    assert list(results) == [0] and seen == [results[0]] and todo == [(1, tasks[1]), (2, tasks[2])]
    assert (results[0]["status"], results[0]["this_run"], results[0]["planned_path"]) == ("skipped", "skipped",
                                                                                        tasks[0][0])
    assert _split_done(tasks, previous, True, Events()) == ({}, list(enumerate(tasks)))
