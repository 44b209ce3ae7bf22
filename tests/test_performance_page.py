"""docs/performance.md is benchmarks/make_performance.py's output, and the script takes each figure from the
newest entry of benchmarks/results/ that holds it (with that entry's machine and command)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")


@pytest.fixture(scope="module")
def tools():
    sys.path.insert(0, BENCHMARKS)
    try:
        yield importlib.import_module("results_files"), importlib.import_module("make_performance")
    finally:
        sys.path.remove(BENCHMARKS)


def test_committed_page_is_the_scripts_output(tools):
    _, make_performance = tools
    with open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8") as handle:
        committed = handle.read()
    assert committed == make_performance.render(), "run: python benchmarks/make_performance.py"


def test_check_mode_reports_a_stale_page(tmp_path, tools):
    _, make_performance = tools
    stale = tmp_path / "performance.md"
    stale.write_text(make_performance.render().replace("1.23x", "9.99x"), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=ROOT)
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import make_performance as m; "
            f"m.PAGE = {str(stale)!r}; sys.exit(m.main(['--check']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "stale" in done.stderr


def test_every_row_names_a_machine_and_a_benchmark_command(tools):
    _, make_performance = tools
    page = make_performance.render()
    table_rows = [line for line in page.splitlines() if line.startswith("| ") and "benchmarks/results/" in line]
    assert len(table_rows) == sum(len(command.rows) for command in make_performance.COMMANDS)
    for line in table_rows:
        assert "vCPU" in line, line
        assert "benchmarks/bench_" in line or "shardkit bench" in line or "scripts/run.sh" in line, line
    assert "flock" not in page  # the shared machine's benchmark lock is not part of the command


NOTES = textwrap.dedent("""\
    # convert: first measurement

    Command:

        flock /tmp/shardkit-bench.lock .venv/bin/python benchmarks/bench_convert.py --repeat 3 \\
            --corpus-mb 320

    Machine: 2 vCPU AMD EPYC VM, Python 3.11.7, quiet.

    | configuration | seconds | vs pipeline |
    |---|---:|---:|
    | `shardkit convert -j1` | 9.88 | **1.23** |

    ## 2026-11-30: after a change

        python benchmarks/bench_convert.py --repeat 5

    Machine: 16 vCPU Intel Xeon VM, Python 3.12.3, shared (load 3).

    | configuration | seconds | vs pipeline |
    |---|---:|---:|
    | `shardkit convert -j1` | 8.00 | 1.31 |

    ## Sizes

    | codec | zst:3 |
    |---|---:|
    | size / tar | 0.819 |

    Peak memory: **42.5 MB**.
    """)


def test_the_newest_entry_wins_with_its_machine_and_command(tmp_path, tools):
    results_files, make_performance = tools
    (tmp_path / "convert.md").write_text(NOTES, encoding="utf-8")
    sections = results_files.read_sections(str(tmp_path / "convert.md"), "convert")
    row = make_performance.Row("one job", "convert", "{vs pipeline}x", row=r"^`shardkit convert -j1`")
    measured = make_performance.measure(row, lambda name: sections)
    assert measured.figure == "1.31x"
    assert measured.command == "python benchmarks/bench_convert.py --repeat 5"
    assert measured.machine == "16 vCPU Intel Xeon VM, Python 3.12.3, shared"
    assert (measured.file, measured.section) == ("benchmarks/results/convert.md", "2026-11-30: after a change")
    # a later section without its own command or machine inherits the run above it
    sizes = make_performance.measure(make_performance.Row("size", "convert", "{zst:3}", row=r"^size / tar"),
                                     lambda name: sections)
    assert (sizes.figure, sizes.command) == ("0.819", "python benchmarks/bench_convert.py --repeat 5")
    memory = make_performance.Row("memory", "convert", "{1}", text=r"Peak memory: \*\*([\d.]+ MB)\*\*")
    prose = make_performance.measure(memory, lambda name: sections)
    assert prose.figure == "42.5 MB"
    first = results_files.read_sections(str(tmp_path / "convert.md"), "convert")[0]
    assert first.command == "python benchmarks/bench_convert.py --repeat 3 --corpus-mb 320"


def test_a_row_the_notes_do_not_hold_fails_the_page(tmp_path, tools):
    results_files, make_performance = tools
    (tmp_path / "convert.md").write_text(NOTES, encoding="utf-8")
    sections = results_files.read_sections(str(tmp_path / "convert.md"), "convert")
    for row in (make_performance.Row("gone", "convert", "{vs pipeline}", row=r"^`shardkit convert -j2`"),
                make_performance.Row("no column", "convert", "{MB/s}", row=r"^`shardkit convert -j1`"),
                make_performance.Row("no text", "convert", "{1}", text=r"Speed-up: ([\d.]+)x")):
        with pytest.raises(results_files.ResultsError):
            make_performance.measure(row, lambda name: sections)


def test_the_advice_section_reads_the_codes_constants(tools, monkeypatch):
    _, make_performance = tools
    from shardkit.planning import advice

    monkeypatch.setattr(advice, "TARGET_HOURS_PER_S", 1.5)
    text = "\n".join(make_performance.advice_section())
    assert "| 1.5 h of audio per second |" in text
    assert "every ~22 ms" in text  # 120-s batches at 1.5 h/s
