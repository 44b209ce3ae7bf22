"""Read the dated benchmark notes in benchmarks/results/*.md as data: sections, tables, commands, machines.

The notes are written for people (a heading per measurement, the command in a code block, a
"Machine:" paragraph, tables of figures, prose). ``make_performance.py`` takes the current figure
of each row from them through this module, so that no figure of the docs' performance page is
typed twice: a figure that is not in a results file cannot reach the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")
DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
# a shell line as the notes write commands to reproduce a figure
COMMAND_START = re.compile(r"^(flock \S+ |env \S+ |for \S+ in |git archive |export \S+=|python3? |\.venv/bin/"
                           r"|bash scripts/)")
INLINE_COMMAND = re.compile(r"`((?:flock \S+ )?(?:\.venv/bin/)?python3? benchmarks/[^`]+)`")


class ResultsError(ValueError):
    """A row of the performance page found nothing (or too much) in the results files."""


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    """One heading of a results file and what it holds; command and machine are inherited from the
    sections above it in the same file when it states none itself (a section that adds a table to
    the run described above)."""

    file: str
    title: str
    date: str | None
    text: str
    tables: list[Table] = field(default_factory=list)
    command: str | None = None
    machine: str | None = None


def plain(cell: str) -> str:
    """A table cell without emphasis (``**1.23**`` -> ``1.23``), as the page shows figures."""
    return cell.replace("**", "").strip()


def split_row(line: str) -> list[str]:
    """Cells of a markdown table row; a ``|`` escaped as ``\\|`` (inside code, in the notes) stays."""
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [plain(cell.replace("\\|", "|")) for cell in cells]


def parse_tables(lines: list[str]) -> list[Table]:
    tables: list[Table] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        is_header = line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1])
        if not is_header:
            i += 1
            continue
        header = split_row(line)
        rows = []
        i += 2
        while i < len(lines) and lines[i].startswith("|"):
            rows.append(split_row(lines[i]))
            i += 1
        tables.append(Table(header, rows))
    return tables


def normalize_command(lines: list[str]) -> str:
    """The notes' shell lines as one command a reader can paste: continuations joined, the shared
    machine's benchmark lock and the project venv's paths dropped, comments removed."""
    joined: list[str] = []
    for raw in lines:
        line = re.sub(r"\s+#\s.*$", "", raw.strip())
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + line
        elif line:
            joined.append(line)
    out = []
    for line in joined:
        line = re.sub(r"^flock \S+ ", "", line)
        line = re.sub(r"(?<![\w/])\.venv/bin/", "", line)
        line = line.replace("flock /tmp/shardkit-bench.lock ", "")
        out.append(re.sub(r"\s+", " ", line))
    return "; ".join(out)


def find_command(lines: list[str]) -> str | None:
    """The first indented or fenced block of shell lines in a section, else an inline code span that
    runs a benchmarks/ script."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            block = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                block.append(lines[i])
                i += 1
            if block and COMMAND_START.match(block[0].strip()):
                return normalize_command(block)
        elif line.startswith("    ") and COMMAND_START.match(line.strip()):
            block = []
            while i < len(lines) and lines[i].startswith("    "):
                block.append(lines[i])
                i += 1
            return normalize_command(block)
        i += 1
    for line in lines:
        match = INLINE_COMMAND.search(line)
        if match:
            return normalize_command([match.group(1)])
    return None


def find_machine(text: str, loose: bool) -> str | None:
    """The machine a section names, in a few words: cores, processor, GPU, Python, shared or quiet.
    ``loose``: a file that has no "Machine" paragraph names its machine beside the command."""
    match = re.search(r"\b(?:Machine|Same machine)\b[^\n]*(?:\n(?!\n)[^\n]*)*", text)
    if not match and loose:
        match = re.search(r"\b\d+[- ]v?CPU\b[^\n]*", text)
    if not match:
        return None
    said = match.group(0)
    cores = re.search(r"\b(\d+)[- ](?:v?CPUs?|cores?)\b", said)
    if not cores:
        return None
    processor = re.search(r"AMD EPYC|Intel Xeon|x86_64", said)
    words = [f"{cores.group(1)} vCPU {processor.group(0) + ' ' if processor else ''}VM"]
    gpu = re.search(r"\b[HA]\d00\b", said)
    if gpu:
        words.append(f"one {gpu.group(0)} GPU")
    python = re.search(r"Python (\d+\.\d+(?:\.\d+)?)", said)
    if python:
        words.append(f"Python {python.group(1)}")
    if re.search(r"\bshared\b|\bload\b|\bbusy\b", said):
        words.append("shared")
    elif "quiet" in said:
        words.append("quiet")
    return ", ".join(words)


def read_sections(path: str, name: str) -> list[Section]:
    """Every section of one results file, in the file's (chronological) order."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    bounds = [i for i, line in enumerate(lines) if HEADING.match(line)] or [0]
    if bounds[0] != 0:
        bounds.insert(0, 0)
    sections: list[Section] = []
    command = machine = None
    for start, end in zip(bounds, bounds[1:] + [len(lines)]):
        body = lines[start:end]
        heading = HEADING.match(body[0]) if body else None
        title = heading.group(2) if heading else name
        text = "\n".join(body)
        date = DATE.search(title)
        first_table = next((i for i, line in enumerate(body) if line.startswith("|")), len(body))
        # a block after a section's tables suggests a run on another machine; the tables came from the one before
        command = find_command(body[:first_table]) or command
        machine = find_machine(text, loose=machine is None) or machine
        sections.append(Section(name, title, date.group(1) if date else None, text, parse_tables(body),
                                command, machine))
    return sections


def table_cell(sections: list[Section], row: str, columns: list[str]) -> tuple[Section, dict[str, str]]:
    """The newest table row (the last in the file) whose joined cells match ``row`` and whose table has
    every column in ``columns`` (``name#2`` is the second column of that name): its section and the
    asked cells."""
    found = None
    pattern = re.compile(row)
    for section in sections:
        for table in section.tables:
            for cells in table.rows:
                if not pattern.search(" | ".join(cells)):
                    continue
                values = pick_columns(table.header, cells, columns)
                if values is not None:
                    found = (section, values)
    if found is None:
        raise ResultsError(f"{sections[0].file}: no table row matches {row!r} with columns {columns}")
    return found


def pick_columns(header: list[str], cells: list[str], columns: list[str]) -> dict[str, str] | None:
    values = {}
    for column in columns:
        name, _, nth = column.partition("#")
        positions = [i for i, cell in enumerate(header) if cell == name]
        index = int(nth or 1) - 1
        if index >= len(positions) or positions[index] >= len(cells):
            return None
        values[column] = cells[positions[index]]
    return values


def prose_match(sections: list[Section], pattern: str) -> tuple[Section, dict[str, str]]:
    """The newest prose match of ``pattern`` (its groups, emphasis removed, by number as strings)."""
    found = None
    compiled = re.compile(pattern, re.S)
    for section in sections:
        for match in compiled.finditer(section.text):
            found = (section, {str(i): plain(g or "") for i, g in enumerate(match.groups(), 1)})
    if found is None:
        raise ResultsError(f"{sections[0].file}: no text matches {pattern!r}")
    return found
