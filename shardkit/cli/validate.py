from __future__ import annotations

import sys

import click

from shardkit.cli import CONTEXT_SETTINGS, EXIT_CODES_HELP, emit_json
from shardkit.cli._options import executor_options, io_options, jobs_option, json_option, run_options

SHOWN_FINDINGS = 20


@click.command("validate", context_settings=CONTEXT_SETTINGS, epilog=f"""{EXIT_CODES_HELP} Here 1 means at least one finding.

\b
Examples:
  shardkit validate data/data.list --sample-rate 16000 --channels 1 --report validate.json
  shardkit validate 'shards/*.tar.zst' --backend torchaudio -j 8 --json > report.json
  shardkit validate data/data.list --quarantine data/quarantine   # cleaned copies + rejects
  shardkit validate data.list --executor ray --report out/validate.json   # one Ray task per shard
  shardkit validate data.list --split 2/3 --report out/validate.json      # writes out/validate.slice-2-of-3.json
  shardkit merge-reports out --command validate                           # then: out/validate.json
  shardkit validate nemo/tarred_audio_manifest.json    # a NeMo tarred dataset: audio, texts, durations
  shardkit validate shar_ds/shar --report shar.json    # a Lhotse Shar folder""")
@click.argument("shards", nargs=-1, required=True)
@click.option("--backend", type=click.Choice(["soundfile", "torchaudio"]), default="soundfile", show_default=True,
              help="Decoder: soundfile (fast) or torchaudio.load(io.BytesIO(...)), the call WeNet makes "
                   "(needs the torch extra).")
@jobs_option
@click.option("--sample-rate", type=click.IntRange(min=1), default=None, metavar="HZ",
              help="Report audio at any other sample rate.")
@click.option("--channels", type=click.IntRange(min=1), default=None, metavar="N",
              help="Report audio with any other channel count.")
@click.option("--strict", is_flag=True,
              help="More than one sample rate, channel count or audio format in SHARDS is a finding (exit 1), "
                   "not a warning; --sample-rate/--channels also name the odd utterances.")
@click.option("--min-duration", type=click.FloatRange(min=0), default=None, metavar="S",
              help="Report audio shorter than S seconds.")
@click.option("--max-duration", type=click.FloatRange(min=0), default=None, metavar="S",
              help="Report audio longer than S seconds.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the JSON report to FILE.")
@io_options
@json_option
@click.option("--quarantine", "quarantine_dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="For each shard with findings write DIR/<stem>.tar[.ext] (good utterances) and "
                   "DIR/<stem>.rejects.tar[.ext] (the rest, untouched), plus DIR/rejects.jsonl and DIR/data.list.")
@click.option("--keep-tree/--flat", "keep_tree", default=None,
              help="Quarantine outputs mirror the input folders below their common parent (--keep-tree), or all "
                   "go directly in DIR (--flat; two inputs with one file name are then an error) "
                   "[default: mirror only when input file names repeat].")
@click.option("--max-member-bytes", type=click.IntRange(min=1), default=2 << 30, show_default=True,
              help="Report members larger than this instead of reading them (memory stays bounded).")
@click.option("--max-decoded-seconds", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
              help="Report audio that decodes to more than S seconds (decoded_too_long) instead of decoding it: a "
                   "tiny member can decode to hours [default: no limit with soundfile, which decodes in blocks; "
                   "3600 with --backend torchaudio, which decodes a member whole].")
@executor_options("Validate only slice I of N of the shard list (job arrays); needs --report FILE, and writes "
                  "FILE's slice (validate.slice-I-of-N.json); join with `shardkit merge-reports`.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary on stderr.")
def command(shards, backend, jobs, sample_rate, channels, strict, min_duration, max_duration, report_path, as_json,
            quarantine_dir, keep_tree, max_member_bytes, max_decoded_seconds, executor, ray_address, split, quiet):
    """Check that every utterance in SHARDS will reach training intact, and report each one that won't.

    SHARDS are shard files (plain, gz, bz2, xz, zst), folders of shards, glob patterns or WeNet
    data.list files. One pass checks the container (complete stream, sound tar headers, no unsafe
    member, not empty; list lines that name no file), WeNet's grouping (one audio and one txt member
    per key, adjacent, no key repeated in or across shards), the transcripts (UTF-8, not empty) and
    the audio, decoded in full from the member bytes: length as the header promises, no NaN/inf,
    and the sample rate, channels and duration asked for. Each finding names shard, key, member,
    check and reason. Sources are never modified.

    A NeMo tarred dataset (its manifest) or a Lhotse Shar folder is checked as its trainer reads
    it: every line or supervision has its audio member and a text, the audio decodes, and the
    duration the line or cut declares is the decoded audio's (within 10 ms); a line no tar holds
    and a member no line names are findings (--quarantine and --split take shards only).
    """
    from shardkit.cli._progress import ProgressBars
    from shardkit.commands.validate import run_validate
    from shardkit.commands.validate.options import ValidateOptions

    # threads=None: decompressor threads per task chosen by run_validate from the cores and --jobs
    settings = ValidateOptions(backend=backend, sample_rate=sample_rate, channels=channels, min_duration=min_duration,
                               max_duration=max_duration, max_member_bytes=max_member_bytes, strict=strict,
                               max_decoded_seconds=max_decoded_seconds, threads=None)
    with ProgressBars(quiet=quiet) as bars:
        options = run_options(jobs=jobs, executor=executor, ray_address=ray_address, split=split, on_event=bars)
        if options.split and report_path is None:
            from shardkit.errors import UsageError

            raise UsageError("--split needs --report FILE (each slice writes FILE's slice report for merge-reports)")
        report = run_validate(list(shards), settings, options, quarantine_dir=quarantine_dir, keep_tree=keep_tree,
                              report_path=report_path)
    if as_json:
        emit_json(report.to_json())
    if not quiet:
        _print_summary(report, list(shards))
    sys.exit(report.exit_code)


def _print_summary(report, args: list[str]) -> None:
    """The closing lines on stderr: what was checked and found, and after findings what was written."""
    from shardkit.commands.validate.report import format_finding

    for line in summary_lines(report, format_finding):
        click.echo(line, err=True)
    if report.exit_code:
        click.echo(_last_line(report, args, report.report_path), err=True)


def _last_line(report, args: list[str], report_path: str | None) -> str:
    """After findings: what was written, what was not, and what to run next (the words convert uses)."""
    from shardkit.cli._outcome import failure_line
    from shardkit.commands.validate.names import CORPUS

    t = report.totals()
    written = [f"the report {report_path}"] if report_path else ["no report (--report FILE keeps one)"]
    if report.quarantine is not None:
        written.append(f"cleaned shards and {report.quarantine['data_list']} (the utterances without findings)")
    failed = sorted({f["shard"] for f in report.findings} - {CORPUS})
    headline = f"{t['findings']} findings in {len(failed)} of {t['shards']} shards" + (
        " and the corpus's audio mix (--strict)" if report.mix_findings() else "")
    return failure_line("validate", failed=failed, total=t["shards"], args=args, written=", ".join(written),
                        headline=headline, resumes=False,
                        not_written="nothing in the sources (validate never changes them)",
                        next_step=(f"train on {report.quarantine['data_list']} (the utterances without findings), "
                                   "or fix the data and rerun" if report.quarantine is not None else
                                   "fix the data, or set the bad utterances apart with --quarantine DIR, then rerun"))


def summary_lines(report, format_finding) -> list[str]:
    """The summary a person reads: totals, findings by check and the first of them, the audio mix, warnings,
    quarantine."""
    t = report.totals()
    part = f"slice {report.slice['index']} of {report.slice['count']}: " if report.slice else ""
    lines = [f"{part}validated {t['shards']} shards: {t['utterances']} utterances, {t['audio_hours']:.3f} h of audio, "
             f"{t['bytes'] / 1e6:.1f} MB in {t['elapsed_s']:.1f} s ({report.options.backend})"]
    lines.extend(_finding_lines(report, t, format_finding))
    lines.extend(_mix_lines(report))
    warnings = report.warnings
    if warnings:  # warning level: reported, not counted in the exit code
        lines.append(f"{len(warnings)} warnings (not findings: exit code and quarantine ignore them):")
        lines.extend(_first_lines(warnings, format_finding))
    q = report.quarantine
    if q is not None:
        cleaned = sum(1 for s in q["shards"] if s["cleaned"])
        lines.append(f"quarantine: {cleaned} cleaned shards, {q['rejected_members']} members set apart "
                     f"({q['kept_members']} kept) in {q['dir']}; see {q['rejects_jsonl']} and {q['data_list']}")
    return lines


def _finding_lines(report, t: dict, format_finding) -> list[str]:
    if not t["findings"]:
        return ["no findings"]
    lines = [f"{t['findings']} findings in {t['shards_with_findings']} of {t['shards']} shards:"]
    width = max(len(check) for check in t["by_check"])
    lines.extend(f"  {check:<{width}}  {count}" for check, count in t["by_check"].items())
    return lines + _first_lines(report.findings, format_finding)


def _first_lines(findings: list[dict], format_finding) -> list[str]:
    """The first SHOWN_FINDINGS findings (or warnings), one line each, and how many more the report lists."""
    lines = [f"  {format_finding(f)}" for f in findings[:SHOWN_FINDINGS]]
    if len(findings) > SHOWN_FINDINGS:
        lines.append(f"  ... and {len(findings) - SHOWN_FINDINGS} more (--report FILE or --json lists all)")
    return lines


def _mix_lines(report) -> list[str]:
    mixed = report.mixed()
    if not mixed or report.options.strict:  # --strict lists them among the findings
        return []
    return ["warning: mixed audio (WeNet trains on whatever it is given; --strict makes this a finding, "
            "--sample-rate/--channels name each odd utterance):"] + [f"  {text}" for text in mixed]
