"""Write docs/performance.md: one current table per command, every figure taken from benchmarks/results/.

    python benchmarks/make_performance.py            # rewrite docs/performance.md
    python benchmarks/make_performance.py --check    # exit 1 if the committed page differs

Each row below names where its figure is measured (a results file, a table row and its columns, or
a sentence) and how to show it; the figure itself, the machine and the command that reproduces it
are read from the results file, from the newest entry (the last in the file) that holds the row. A
new dated entry with the same row moves the page when this script runs again, and
tests/test_performance_page.py fails until it has. The section on the advice's assumptions reads
the constants of shardkit.planning.advice, so the page says what the code assumes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
PAGE = os.path.join(ROOT, "docs", "performance.md")
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from results_files import ResultsError, prose_match, read_sections, table_cell  # noqa: E402

PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


@dataclass(frozen=True)
class Row:
    """One figure of the page: ``what`` it measures, the results file, and either a table ``row``
    (a regular expression over the row's cells joined by `` | ``) or a ``text`` pattern (its groups
    are ``{1}``, ``{2}``...). ``figure`` shows the cells: ``{column header}``, ``{header#2}`` for
    the second column of that name."""

    what: str
    file: str
    figure: str
    row: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class Command:
    title: str
    about: str
    rows: tuple[Row, ...]


COMMANDS = (
    Command("convert: bz2 to zst, codecs, memory", "`shardkit convert`, every run verifying what it wrote.", (
        Row("one job, bz2 -> zst:3, against `lbzip2 -dc -n1 | zstd -3 -T1`", "convert",
            "{vs pipeline}x ({h of audio/s} h of audio/s)", row=r"^`shardkit convert -j1` \(default"),
        Row("one job pinned to one thread, against the same pipeline", "convert",
            "{vs pipeline}x ({h of audio/s} h/s)", row=r"^`shardkit convert -j1 --threads 1`"),
        Row("the whole machine (`-j` = cores) against `lbzip2 -dc -n2 | zstd -3 -T2`", "convert",
            "{quiet, 1 round (load ~1.2)} quiet, {busy: per-round ratio, median} busy",
            row=r"^shardkit convert after \(threads"),
        Row("the whole machine, quiet, against `lbzip2 -dc -n2 | zstd -3 -T2` per shard (per round)",
            "2026-11-28-convert-reader", "{vs pipeline, per round}", row=r"^this: shardkit convert \(defaults\)"),
        Row("the whole machine on 16 cores, defaults, 16 unequal shards, against `lbzip2 -dc -n16 | zstd -3 -T16` "
            "per shard (per round)", "2026-11-28-sixteen-cores", "{vs pipeline, per round} ({wall (median)})",
            row=r"^call 3: \+ threads by size"),
        Row("ceiling of that ratio: the pipeline's CPU over indexed_bzip2 + zstandard alone", "convert",
            "{median}x", row=r"^ceiling"),
        Row("two jobs on two cores against one (`--threads 1`)", "scaling", "{scaling}",
            row=r"^convert bz2 -> zst:3, `--threads 1`"),
        Row("peak memory converting one large shard (plain -> zst:3, verified)", "convert",
            "{2} max RSS ({1} shard)", text=r"Peak memory converting one ([\d.]+ GB) shard.*?\*\*([\d.]+ MB)\*\*"),
        Row("size relative to the plain WAV tar (synthetic speech)", "convert",
            "zst:3 {zst:3}, zst:19 {zst:19}, gz {gz (6)}, xz {xz (6)}, bz2 {bz2 (9)}", row=r"^size / tar"),
        Row("plain -> zst:3 in zstd's seekable format (1 MiB frames), `-j 2`: MB/s of tar (x one frame)",
            "zst_seekable", "{MB/s of tar}", row=r"^after \(seekable\) \| 2 \|"),
    )),
    Command("convert --audio flac: lossless FLAC members", "`shardkit convert --audio flac`.", (
        Row("CLI, `--codec none --audio flac -j1`, verified, against libsndfile encode + decode", "transcode",
            "{h of audio per CPU-s} h of audio per CPU-s",
            row=r"^CLI `convert --codec none --audio flac -j1`, verified"),
        Row("CLI, verified (libFLAC's verify mode), quiet, against soundfile encode + decode", "2026-11-28-flac",
            "{limit's CPU / this (per round)}x ({h of audio per CPU-s} h of audio per CPU-s)",
            row=r"^CLI after \(this checkout\), verified \|"),
        Row("CLI, `--no-verify`, against libsndfile's encoder alone", "transcode",
            "{h of audio per CPU-s} h of audio per CPU-s", row=r"^CLI, `--no-verify`"),
        Row("bz2 -> FLAC-in-tar, two jobs on two cores", "transcode",
            "{h of audio/s} h of audio/s", row=r"^shardkit bz2 -> flac `-j2 --threads 1`"),
        Row("plain WAV tar -> FLAC-in-tar, two jobs, verified", "transcode",
            "{h of audio/s} h of audio/s", row=r"^shardkit plain WAV tar -> flac `-j2`, verified"),
    )),
    Command("validate", "`shardkit validate` (checks on: sample rate, channels, header against data, NaN, "
                        "transcripts).", (
        Row("plain WAV, soundfile, one core", "validate", "{hours of audio/s} h of audio/s ({utterances/s} utt/s)",
            row=r"^plain WAV \| soundfile \|"),
        Row("zst:3 WAV, soundfile, one core", "validate", "{hours of audio/s} h of audio/s",
            row=r"^zst WAV \| soundfile \|"),
        Row("FLAC in plain tar, soundfile, one core", "validate", "{hours of audio/s} h of audio/s",
            row=r"^plain FLAC \| soundfile \|"),
        Row("plain WAV against the WeNet way (`tarfile` + `torchaudio.load`, same checks)", "validate",
            "{1}x faster", text=r"\*\*Speed-up: ([\d.]+)x\*\*"),
        Row("`-j 2` on a started pool against `-j 1` (torchaudio backend, CPU-bound)", "validate",
            "{-j 2 on a started pool}", row=r"^plain WAV, torchaudio \|"),
        Row("`-j 16` against `-j 1` on 16 cores (soundfile, zst:3)", "scaling",
            "{validate (soundfile) on the zst:3 output} ({scaling#2})", row=r"^16 \|"),
    )),
    Command("index, plan, balance", "Planning from the indexes (`--dry-run`: no shard written) and balance's "
                                   "writing phase.", (
        Row("`balance --dry-run` of 1.33 M utterances from 3 JSON-lines indexes", "balance",
            "{median}, {memory}", row=r"^`shardkit balance --dry-run` from the 3 indexes"),
        Row("the planning function alone on the same 1.33 M durations", "balance", "{median}",
            row=r"^`plan_balance`"),
        Row("rank spread after balancing (max/min seconds per rank, epochs 0/1/2), 8 ranks x 4 workers",
            "balance", "{rank spread (max/min seconds), epochs 0/1/2}", row=r"^balanced \|"),
        Row("rank spread of WeNet's writer (1000 utterances a shard, corpus by corpus)", "balance",
            "{rank spread (max/min seconds), epochs 0/1/2}", row=r"^naive"),
        Row("balance's writing phase against `convert` on the same sources (time)", "balance", "{1}x",
            text=r"balance / convert time: ([\d.]*\d)"),
        Row("`balance --dry-run`, 20 M utterances, Parquet index (plan version 2)", "plan_scale",
            "{version 2 (runs)}, peak RSS {peak RSS v2 / before}", row=r"^20 M \| Parquet \| [\d.]+ s"),
        Row("`balance --dry-run`, 20 M utterances, Parquet index, plan version 3 (quiet)", "2026-11-28-plan-scale",
            "{wall median}, peak RSS {peak RSS}", row=r"^version 3 \(default\)"),
        Row("`balance --dry-run`, 100 M utterances, Parquet index, plan version 3 (quiet)", "2026-11-28-plan-scale",
            "{wall median}, peak RSS {peak RSS}", row=r"^100 M: version 3 \(default\)"),
        Row("`balance --dry-run --wenet-conf`, 20 M utterances, Parquet", "plan_scale",
            "{this branch (runs)}, peak RSS {peak RSS (branch / c8af364)}",
            row=r"^20 M \| Parquet \| `balance --dry-run --wenet-conf`"),
        Row("`plan --wenet-conf` against `plan` on a 1 M-utterance JSON-lines index", "wenet_conf",
            "{median}", row=r"^ratio \|"),
    )),
    Command("prep: the recipe's dataset-prep stage", "`shardkit prep` (convert, validate, balance in one read) "
                                                    "against decoding the bz2 sources once (`lbzip2 -dc`).", (
        Row("prep against the lbzip2 floor, 2 cores (median of the per-repeat ratios)", "prep",
            "{prep after}x", row=r"^median ratio \|"),
        Row("prep against the lbzip2 floor, 2 cores, quiet (median of 3 repeats)", "2026-11-28-prep",
            "{prep@base}x", row=r"^ratio to the floor"),
        Row("recipe stage 2 (prep and the script) against the floor, 2 cores", "prep",
            "{stage after}x", row=r"^median ratio \|"),
        Row("prep against the floor, 16 cores (largest corpus)", "prep", "{prep after}x",
            row=r"^median / median floor \|"),
        Row("prep and the stage against `lbzip2 -dc -n16`, 16 cores, same run (scale 3)", "2026-11-28-sixteen-cores",
            "prep {prep after}x, stage {stage after}x", row=r"^median / median floor \|"),
        Row("peak work folder against the training shards it leaves", "prep", "{prep after}x",
            row=r"^peak work folder / training shards"),
    )),
    Command("make and the recipe", "`shardkit make` from each source kind (keep mode, plain tar, verified) and "
                                  "`scripts/run.sh`.", (
        Row("pack, Kaldi source, 8 h corpus, cold cache (`-j 1` / `-j 2`)", "make",
            "{pack cold (h/s)} h of audio/s ({pack / read cold} of reading the audio alone)", row=r"^kaldi \|.*/"),
        Row("pack, Parquet source, same corpus, cold cache (`-j 1` / `-j 2`)", "make",
            "{pack cold (h/s)} h of audio/s", row=r"^parquet \|.*/"),
        Row("planning a 1,000,000-line NeMo manifest (no output)", "make", "{1} peak RSS",
            text=r"1,000,000-line NeMo manifest.*?peak RSS \*\*([\d.]+ MB)\*\*"),
        Row("the recipe's default demo, all stages (`scripts/run.sh`, first run)", "first_hour", "{wall time}",
            row=r"^first run \|"),
        Row("rerunning a finished recipe with nothing changed", "first_hour", "{wall time}",
            row=r"^rerun, nothing changed"),
    )),
    Command("bench", "`shardkit bench`'s default run (generated corpus, every format, one core per measurement).", (
        Row("shardkit's reader, plain WAV tar", "bench", "{shardkit h/s} h of audio/s ({soundfile h/s} with soundfile)",
            row=r"^none \| wav \|"),
        Row("shardkit's reader, zst:3 WAV", "bench", "{shardkit h/s} h/s, size {size} of the WAV tar",
            row=r"^zst:3 \| wav \|"),
        Row("shardkit's reader, FLAC in plain tar", "bench", "{shardkit h/s} h/s, size {size}",
            row=r"^none \| flac \|"),
        Row("shardkit's reader, bz2 WAV; the WeNet-style row (tarfile + torchaudio)", "bench",
            "{shardkit h/s} h/s; WeNet-style {WeNet-style h/s} h/s", row=r"^bz2 \| wav \|"),
        Row("DataLoader, zst:3 WAV, 2 fork workers (after the first batch)", "bench",
            "{h/s after the first batch (incl. shut-down)} h/s", row=r"^2 \| fork \|"),
        Row("the whole default run", "bench", "{1} s", text=r"The whole run took \*\*(\d+) s\*\*"),
    )),
    Command("the reader and ShardDataset", "`shardkit.iter_samples` (one core, float32 unless said) and "
                                          "`ShardDataset` in a torch `DataLoader`.", (
        Row("plain WAV tar, read + decode", "reader", "{MB/s of tar} MB/s of tar ({h of audio/s} h of audio/s)",
            row=r"^plain: shardkit float32"),
        Row("zst:3 WAV, read + decode", "reader", "{MB/s of tar} MB/s of tar ({h of audio/s} h/s)",
            row=r"^zst:3: shardkit float32"),
        Row("zst:3 against zstd decompression alone", "reader", "{measured}",
            row=r"^zst:3 WAV read \+ decode >= 0.8x"),
        Row("zst:3, float32, against zstd decompression alone (quiet, CPU)", "2026-11-28-convert-reader", "{1}x",
            text=r"zst:3 float32 vs zstd alone \(>= 0.8; issue 39: >= 0.9\): ([\d.]+)"),
        Row("zst:3, int16, against zstd decompression alone (quiet, CPU)", "2026-11-28-convert-reader", "{1}x",
            text=r"- zst:3 int16 vs zstd alone: ([\d.]+)"),
        Row("bz2, WeNet-style (`tarfile` + `torchaudio.load`)", "reader", "{MB/s of tar} MB/s of tar",
            row=r"^bz2: WeNet-style"),
        Row("`iter_samples` as documented against a process tuned with `reuse_freed_memory()`", "reader",
            "{ratio}", row=r"^this branch \| [\d.]+ \|"),
        Row("DataLoader, plain WAV float32 batches: 2 workers against in-process, h per CPU-s", "reader",
            "{branch 2 / 0 workers}x ({branch 2 workers} h per CPU-s)", row=r"^plain WAV, float32"),
        Row("DataLoader, zst:3 WAV int16 batches: 2 workers against in-process", "reader",
            "{branch 2 / 0 workers}x ({branch 2 workers} h per CPU-s)", row=r"^zst:3 WAV, int16"),
        Row("DataLoader on 16 cores, 8 fork workers: wall s, h of audio/s (time to the first batch)", "scaling",
            "{fork}", row=r"^8 \| [\d.]+ s"),
    )),
    Command("WebDataset stages", "`shardkit.training.wds` inside WebDataset pipelines, against shardkit's own "
                                "reader (h of audio per CPU-second).", (
        Row("`shardkit.wds.WebDataset(urls).map(decode_audio())`, plain WAV / zst:3", "webdataset",
            "{vs reader} / {vs reader#2} of the reader", row=r"^`shardkit.wds.WebDataset\(urls\).map"),
        Row("`wds.WebDataset(urls).map(decode_audio())` on WebDataset's tarfile, plain / zst:3", "webdataset",
            "{vs reader} / {vs reader#2}", row=r"^`.map\(shardkit.wds.decode_audio\(\)\)`"),
        Row("WebDataset with its soundfile handler (users today), plain / zst:3", "webdataset",
            "{plain WAV h/s} / {zst:3 WAV h/s} h/s", row=r"^`wds.WebDataset\(urls\).decode\(soundfile"),
    )),
    Command("resume", "The first batch after a mid-epoch restore (`StatefulDataLoader`, 2 workers), against a "
                     "fresh start's, restored at 10% / 50% / 90% of an epoch (medians).", (
        Row("plain tar", "resume", "{restored at 10% / 50% / 90% (x fresh, median)}", row=r"^plain tar \| 2 \|"),
        Row("zst:3 as convert writes it (seekable, 1 MiB frames)", "resume",
            "{restored at 10% / 50% / 90% (x fresh, median)}", row=r"^zst:3 as convert writes it.* \| 2 \|"),
        Row("zst:3 in one frame (older shards, other tools)", "resume",
            "{restored at 10% / 50% / 90% (x fresh, median)}", row=r"^zst:3 one frame.* \| 2 \|"),
    )),
    Command("equal_steps", "`shardkit.training.equal_steps` between 2 gloo ranks on the CPU (microseconds per "
                          "step, three runs).", (
        Row("the collective alone: one int32 all-reduce per step", "equal_steps",
            "{run 1, us per step} / {run 2} / {run 3} us",
            row=r"^synthetic, bare \+ one int32"),
        Row("equal_steps over synthetic batches", "equal_steps", "{run 1, us per step} / {run 2} / {run 3} us",
            row=r"^synthetic, equal_steps \|"),
        Row("the wrapper's own work (no process group)", "equal_steps", "{run 1, us per step} / {run 2} / {run 3} us",
            row=r"^equal_steps without a process group"),
    )),
    Command("executors and scaling", "The local process pool and Ray on real conversions (bz2 -> zst:3), and "
                                    "convert over 16 cores.", (
        Row("forkserver pool, `-j2`, 20 conversions, against inline", "executor", "{speed-up vs inline}x",
            row=r"^forkserver pool"),
        Row("Ray, local instance of 2 CPUs, same work", "executor",
            "{speed-up vs inline}x ({marginal ms per task} ms per task)", row=r"^Ray, local instance"),
        Row("convert `-j 16` against `-j 1` on 16 cores", "scaling", "{scaling}", row=r"^16 \|"),
    )),
)


@dataclass(frozen=True)
class Profile:
    """Where the seconds of one measurement go, against the alternative a user would script: the first
    table of the newest section of ``file`` whose heading matches ``section``, copied whole (with the machine
    and the command of that section)."""

    what: str
    file: str
    section: str


# issue 39: one profile per row of the table, each from the results file its branch wrote
PROFILES: tuple[Profile, ...] = (
    Profile("convert bz2 -> zst:3 against `lbzip2 -dc | zstd -3`: by part, one shard, one thread",
            "2026-11-28-convert-reader", r"^Quiet rerun, 2026-11-28"),
    Profile("prep against `lbzip2 -dc -n2`: CPU by part, 2 cores", "2026-11-28-prep", r"^Quiet profile"),
    Profile("WAV tar -> FLAC-in-tar, verified, one core: by part and against the other encoders", "2026-11-28-flac",
            r"^Quiet rerun"),
    Profile("the zst:3 reader against zstd decompression alone, one core", "2026-11-28-convert-reader",
            r"^Quiet rerun of the reader"),
    Profile("`balance --dry-run` of 20 M utterances, by phase, before and after the index read (measured under load)",
            "2026-11-28-plan-scale", r"^Where the CPU goes now"),
)


@dataclass(frozen=True)
class Measured:
    row: Row
    figure: str
    machine: str
    command: str
    file: str
    section: str


def measure(row: Row, sections_of) -> Measured:
    sections = sections_of(row.file)
    columns = PLACEHOLDER.findall(row.figure)
    if row.row is not None:
        section, values = table_cell(sections, row.row, [c for c in columns])
    else:
        section, values = prose_match(sections, row.text)
    missing = [c for c in columns if not values.get(c)]
    if missing:
        raise ResultsError(f"{row.file}: {row.what!r}: empty or missing {missing}")
    if not section.machine or not section.command:
        raise ResultsError(f"{row.file}: {section.title!r} names no machine or no command")
    figure = PLACEHOLDER.sub(lambda m: values[m.group(1)], row.figure)
    return Measured(row, figure, section.machine, section.command, f"benchmarks/results/{row.file}.md", section.title)


def cell(text: str) -> str:
    """Table-safe text; a code span keeps its ``|`` (Python-Markdown's tables leave code spans whole)."""
    return text.replace("\n", " ").strip()


def code(command: str) -> str:
    ticks = "``" if "`" in command else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{command}{pad}{ticks}"


def advice_section() -> list[str]:
    from shardkit.planning import advice

    target, fbank = advice.TARGET_HOURS_PER_S, advice.FBANK_HOURS_PER_S_PER_CORE
    batch, prefetch = advice.BATCH_SECONDS, advice.PREFETCH_SECONDS
    step_ms = batch / (target * 3600) * 1000
    return [
        "## What the advice assumes",
        "",
        "The loader advice (`shardkit bench`'s recommendation, the recipe's summary) weighs the decode rates "
        "measured above against the GPU side, which no benchmark here measures: no GPU machine was lent to "
        "the sessions that wrote them. These are the code's defaults (`shardkit/planning/advice.py`); pass "
        "your own with `shardkit bench --target-hours-per-second`.",
        "",
        "| assumption | value in the code |",
        "|---|---|",
        f"| audio one GPU consumes (an H100 training a WeNet Conformer at WeNet's default batches) | "
        f"{target:g} h of audio per second |",
        f"| Kaldi fbank in a loader worker, per core | {fbank:g} h of audio per second |",
        f"| one batch (WeNet's default dynamic batch: 12,000 frames of 10 ms) | {batch:g} s of audio |",
        f"| batches kept ready in the workers | {prefetch:g} s of the GPU's consumption |",
        "",
        f"So one GPU takes a {batch:g}-s batch every ~{step_ms:.0f} ms, and a loader worker that decodes at `d` "
        "h/s per core supplies `1 / (1/d + 1/fbank)` h/s: one GPU needs `target x (1/d + 1/fbank)` workers, "
        "and the node's cores bound workers x GPUs.",
        "",
    ]


def profile_section(sections_of) -> list[str]:
    if not PROFILES:
        return []
    out = ["## Where the time goes", "",
           "Per measurement, where shardkit's seconds go against the tool a user would otherwise script "
           "(the table as measured, copied from its results file).", ""]
    for profile in PROFILES:
        pattern = re.compile(profile.section)
        found = [s for s in sections_of(profile.file) if pattern.search(s.title) and s.tables]
        if not found:
            raise ResultsError(f"{profile.file}: no section with a table matches {profile.section!r}")
        section = found[-1]
        if not section.machine or not section.command:
            raise ResultsError(f"{profile.file}: {section.title!r} names no machine or no command")
        table = section.tables[0]
        out += [f"### {profile.what}", "",
                f"Machine: {section.machine}. Command: {code(section.command)}. "
                f"From `benchmarks/results/{profile.file}.md` ({cell(section.title)}).", "",
                "| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table.rows]
        out.append("")
    return out


def render(sections_of=None) -> str:
    cache: dict[str, list] = {}

    def default_sections_of(name: str):
        if name not in cache:
            cache[name] = read_sections(os.path.join(RESULTS, f"{name}.md"), name)
        return cache[name]

    sections_of = sections_of or default_sections_of
    out = [
        "# Performance",
        "",
        "<!-- Generated by benchmarks/make_performance.py from benchmarks/results/*.md; do not edit by hand: "
        "run `python benchmarks/make_performance.py`. -->",
        "",
        "The current figure of each measurement, the machine it was measured on and the command that "
        "reproduces it (run from the repository root, with the `bench` extra installed). Each figure is "
        "the newest entry for that row in the dated notes of `benchmarks/results/`, which also say how "
        "the corpus was built, what every run checked and what was tried before. Most machines were a "
        "shared 2-vCPU VM: treat a single figure as +-15% and compare ratios, which were measured in one "
        "run on the same data with the configurations interleaved.",
        "",
    ]
    for command in COMMANDS:
        out += [f"## {command.title}", "", command.about, "",
                "| measurement | figure | machine | command | notes |", "|---|---|---|---|---|"]
        for row in command.rows:
            m = measure(row, sections_of)
            out.append(f"| {cell(row.what)} | {cell(m.figure)} | {cell(m.machine)} | {code(m.command)} | "
                       f"{code(m.file)} ({cell(m.section)}) |")
        out.append("")
    out += profile_section(sections_of)
    out += advice_section()
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed page instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        with open(PAGE, encoding="utf-8") as handle:
            if handle.read() != text:
                print(f"{PAGE} is stale: run python benchmarks/make_performance.py", file=sys.stderr)
                return 1
        return 0
    os.makedirs(os.path.dirname(PAGE), exist_ok=True)
    with open(PAGE, "w", encoding="utf-8") as handle:
        handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
