"""Seams between features merged from separate branches: each test reproduces a bug found on the
integrated build (the recipe as a newcomer runs it, commands chained the way the README chains them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_recipe_does_not_take_a_python3_that_only_sees_the_checkout(tmp_path):
    # From the repository root `python3 -c "import shardkit"` imports the checkout itself (the current
    # folder is on sys.path), even where python3 lacks shardkit's dependencies. The recipe must then
    # set up its own venv, not run shardkit on that python3 and die in a traceback (soundfile, click).
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "run.sh"), repo / "scripts" / "run.sh")
    os.symlink(os.path.join(ROOT, "shardkit"), repo / "shardkit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"  # a python3 without site-packages; `-m venv` stops the set-up there
    python3.write_text(f'#!/bin/sh\n[ "$1 $2" = "-m venv" ] && {{ echo FAKE-VENV >&2; exit 3; }}\n'
                       f'exec {sys.executable} -S "$@"\n')
    python3.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(["bash", "scripts/run.sh", "--workdir", str(tmp_path / "w"), "--stop_stage", "0"],
                            cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert "run.sh: setting up" in result.stderr, result.stderr
    assert "FAKE-VENV" in result.stderr and "Traceback" not in result.stderr
    assert result.returncode != 0
