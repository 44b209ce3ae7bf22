"""The house in folders: the layer contract (import-linter), the complexity ceiling (radon), the
public import paths users' training scripts rely on, and the size of the top folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import REPO

BIN = os.path.dirname(sys.executable)


def test_the_layer_contract_holds():
    lint = os.path.join(BIN, "lint-imports")
    if not os.path.exists(lint):
        pytest.skip("import-linter is not installed (scripts/test.sh installs it)")
    done = subprocess.run([lint, "--config", os.path.join(REPO, ".importlinter")], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_layer_contract_catches_an_upward_import(tmp_path):
    """The contract is not vacuous: a copy of the package with io importing a command breaks it."""
    lint = os.path.join(BIN, "lint-imports")
    if not os.path.exists(lint):
        pytest.skip("import-linter is not installed (scripts/test.sh installs it)")
    import shutil

    shutil.copytree(os.path.join(REPO, "shardkit"), tmp_path / "shardkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "shardkit" / "io" / "codecs.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef _upward():\n    from shardkit.commands.convert import run_convert  # noqa: F401\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([lint, "--config", os.path.join(REPO, ".importlinter"), "--no-cache"], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert done.returncode != 0
    assert "shardkit.io.codecs -> shardkit.commands.convert" in done.stdout


def test_no_function_above_complexity_30_outside_the_tar_parser():
    pytest.importorskip("radon")
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        from check_complexity import offenders
    finally:
        sys.path.pop(0)
    assert offenders(os.path.join(REPO, "shardkit"), 30) == []


def test_the_house_rules_hold():
    """cli/ functions <= 10, grade C+ <= 3 per 1,000 lines, modules <= 800 lines, <= 8 parameters, no cli/
    command module importing another: every finding of scripts/check_complexity.py, none expected."""
    pytest.importorskip("radon")
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        from check_complexity import house_findings
    finally:
        sys.path.pop(0)
    assert house_findings(os.path.join(REPO, "shardkit")) == []


def test_the_house_check_finds_a_wide_function_and_a_cli_cross_import(tmp_path):
    """The rules are not vacuous: a copy of cli/ with a 9-parameter library function and a command that
    imports another command is caught on both counts."""
    pytest.importorskip("radon")
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        from check_complexity import cli_cross_imports, wide_functions
    finally:
        sys.path.pop(0)
    (tmp_path / "cli").mkdir()
    (tmp_path / "io").mkdir()
    (tmp_path / "cli" / "plan.py").write_text("command = None\n")
    (tmp_path / "cli" / "balance.py").write_text("from shardkit.cli.plan import command\n")
    (tmp_path / "io" / "wide.py").write_text("def wide(a, b, c, d, e, f, g, h, i):\n    return a\n")
    assert cli_cross_imports(str(tmp_path)) == [os.path.join("cli", "balance.py") + ": imports shardkit.cli.plan"]
    assert [line.split(":")[0] for line in wide_functions(str(tmp_path))] == [os.path.join("io", "wide.py")]


def test_at_most_eight_modules_beside_the_packages():
    top = [name for name in os.listdir(os.path.join(REPO, "shardkit"))
           if name.endswith(".py") and name not in ("__init__.py", "__main__.py")]
    assert len(top) <= 8, top


def test_python_dash_m_and_the_console_script_list_every_command():
    done = subprocess.run([sys.executable, "-m", "shardkit", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in ("balance", "bench", "convert", "demo", "index", "list", "loader-check", "make", "merge-reports",
                 "plan", "validate", "verify", "wenet"):
        assert f"  {name} " in done.stdout
