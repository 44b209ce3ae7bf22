"""shardkit.commands.validate as a package: one import path for every name, simple functions, and the
run's options, events and report file as the library takes and gives them."""

from __future__ import annotations

import ast
import importlib
import json
import os

import pytest

import shardkit.commands.validate as validate
from shardkit.errors import UsageError
from shardkit.io.synth import CorpusSpec, corpus_utterances
from shardkit.io.tar import TarWriter
from shardkit.run.options import RunOptions

PACKAGE = os.path.dirname(validate.__file__)
MODULES = sorted(name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py") and name != "__init__.py")
CLI = os.path.join(os.path.dirname(os.path.dirname(PACKAGE)), "cli", "validate.py")


def _sources():
    return [os.path.join(PACKAGE, name) for name in sorted(os.listdir(PACKAGE)) if name.endswith(".py")] + [CLI]


def test_every_public_name_of_the_modules_is_importable_from_the_package():
    for name in MODULES:
        module = importlib.import_module(f"shardkit.commands.validate.{name}")
        for attr in dir(module):
            value = getattr(module, attr)
            if not attr.startswith("_") and getattr(value, "__module__", None) == module.__name__:
                assert getattr(validate, attr) is value, (name, attr)


def test_every_function_stays_simple_and_takes_few_parameters():
    radon = pytest.importorskip("radon.complexity")
    for path in _sources():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for block in radon.cc_visit(text):
            for item in [block, *getattr(block, "methods", [])]:
                assert item.complexity <= 10, (path, item.fullname, item.complexity)
        if path == CLI:
            continue  # click passes each option as a parameter
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                args = node.args
                count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
                assert count - (args.args[:1] and args.args[0].arg in ("self", "cls")) <= 8, (path, node.name)


def test_the_cli_claims_nothing_and_imports_no_other_command():
    with open(CLI, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.startswith("shardkit.cli.") and not m.startswith("shardkit.cli._")}
    called = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
              for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert not called & {"claim_output_file", "claimed_output_dir", "makedirs", "atomic_write_json", "open"}


def _shard(path, seed):
    spec = CorpusSpec(f"s{seed}", 2, 0.3, 0.5, "mix")
    with open(path, "wb") as f:
        tar = TarWriter(f)
        for key, text, audio, _ in corpus_utterances(spec, seed=seed, audio_format="wav"):
            tar.add(f"{key}.txt", text.encode())
            tar.add(f"{key}.wav", audio)
        tar.close()
    return str(path)


def test_progress_is_one_stage_and_a_done_event_per_shard_in_list_order(tmp_path):
    paths = [_shard(tmp_path / f"{i}.tar", i) for i in range(3)]
    seen = []
    report = validate.run_validate(paths, validate.ValidateOptions(), RunOptions(jobs=2, on_event=seen.append))
    assert [(e.kind, e.stage, e.total) for e in seen[:1]] == [("stage", "validate", 3)]
    assert [(e.kind, e.result["shard"]) for e in seen[1:]] == [("done", p) for p in paths]
    assert report.exit_code == 0 and report.report_path is None


def test_the_report_file_is_written_claimed_and_named_per_slice(tmp_path):
    paths = [_shard(tmp_path / f"{i}.tar", i) for i in range(2)]
    report = validate.run_validate(paths, validate.ValidateOptions(), RunOptions(jobs=1, split=(2, 2)),
                                   report_path=str(tmp_path / "new" / "validate.json"))
    assert report.report_path == str(tmp_path / "new" / "validate.slice-2-of-2.json")
    with open(report.report_path, encoding="utf-8") as f:
        assert json.load(f)["slice"] == report.slice
    with pytest.raises(UsageError, match="is input"):
        validate.run_validate(paths, validate.ValidateOptions(), report_path=paths[0])


def test_threads_none_are_chosen_for_the_run_and_named_in_the_report(tmp_path):
    paths = [_shard(tmp_path / "0.tar", 0)]
    report = validate.run_validate(paths, validate.ValidateOptions(threads=None), RunOptions(jobs=1))
    assert report.options.threads == max(1, os.cpu_count() or 1)
    assert report.to_json()["options"]["threads"] == report.options.threads
