"""bench.md for a person: the tables, the note on a corpus too small for the workers figures, and the
recommendation in words; pure functions of a report's JSON (``BenchReport.to_json()``)."""

from __future__ import annotations

import time

from shardkit.commands.bench.webdataset import WDS_LOADERS

MIN_LOADER_PASS_S = 2.0  # a pass shorter than this is mostly worker start-up: workers cannot show a speed-up


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _spread(stat: dict | None) -> str:
    return "-" if not stat else f"±{stat['spread'] * 50:.0f}%"


def format_tables(report: dict) -> str:
    """bench.md: the tables and the recommendation, from a report's JSON (pure)."""
    lines = _formats_table(report) + _loader_table(report) + format_webdataset_table(report)
    lines += ["", "## Recommendation", "", recommendation_text(report["recommendation"]), ""]
    return "\n".join(lines)


def _formats_table(report: dict) -> list[str]:
    c, m = report["corpus"], report["machine"]
    decoders = report["settings"]["decoders"]
    lines = [f"# shardkit bench ({time.strftime('%Y-%m-%d', time.gmtime())})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}. Corpus ({c['source']}): "
             f"{c['utterances']} utterances, {c['hours']:.2f} h, {c['wav_tar_bytes'] / 1e6:.1f} MB of WAV tar, "
             f"{c['shards']} shards. One core per measurement; medians of >= {report['settings']['repeat']} runs "
             f"(± is half the spread). Hours/s count audio; 1 h/s of 16 kHz 16-bit audio is 115 MB/s.", "",
             "| format | audio | size | write MB/s | decompress MB/s | read+group utt/s | "
             + " | ".join(f"{d} utt/s | {d} h/s | {d} x RT" for d in decoders) + " | WeNet-style h/s |",
             "|---|---|---:|---:|---:|---:|" + "---:|---:|---:|" * len(decoders) + "---:|"]
    return lines + [_format_line(row, decoders) for row in report["formats"]]


def _format_line(row: dict, decoders: list[str]) -> str:
    cells = [row["format"], row["audio"], f"{row['size_ratio']:.3f}", _fmt(row["write"]["mb_per_s"]),
             f"{_fmt(row['decompress']['mb_per_s'], 0)} {_spread(row['decompress'])}",
             f"{_fmt(row['group']['utterances_per_s'], 0)} {_spread(row['group'])}"]
    for d in decoders:
        stat = row["decode"][d]
        cells += [f"{_fmt(stat['utterances_per_s'], 0)} {_spread(stat)}", _fmt(stat["hours_per_s"], 3),
                  _fmt(stat["x_realtime"], 0)]
    ref = row.get("reference")
    cells.append(f"{_fmt(ref['hours_per_s'], 3)} {_spread(ref)}" if ref else "-")
    return "| " + " | ".join(cells) + " |"


def _loader_table(report: dict) -> list[str]:
    if not report["loader"]:
        return []
    lines = ["", f"DataLoader over ShardDataset ({report['loader'][0]['format']} "
                 f"{report['loader'][0]['audio']}, batch_size={report['settings']['loader_batch_size']} "
                 "padded in the workers, persistent workers; start-up = time to the first batch of a fresh "
                 "loader; rates over later epochs; CPU = this process + its workers; int16 batches are "
                 "scaled on the trainer's device):", "",
             "| workers | start method | batch dtype | start-up s | utt/s | h/s | h per CPU-s | vs 0 workers |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in report["loader"]:
        lines.append(f"| {r['workers']} | {r['mp_context']} | {r.get('dtype', 'float32')} | {r['startup_s']:.3f} | "
                     f"{_fmt(r['utterances_per_s'], 0)} {_spread(r)} | {_fmt(r['hours_per_s'], 3)} | "
                     f"{_fmt(r.get('hours_per_cpu_s'), 3)} | {_fmt(r.get('per_cpu_vs_main'), 2)} |")
    note = loader_panel_note(report)
    if note:
        lines += ["", f"Note: {note}."]
    return lines


def loader_panel_note(report: dict) -> str | None:
    """Why the workers figures cannot be read as a speed-up, when the corpus is too small (pure), else None.

    Too small: one pass in the main process takes under ``MIN_LOADER_PASS_S``, or the corpus has
    fewer than two shards per worker (WeNet's split gives each worker whole shards).
    """
    rows = report.get("loader") or []
    started = [r["workers"] for r in rows if r["workers"] > 0]
    if not started:
        return None
    why = _too_small(rows, report["corpus"]["shards"], max(started))
    if not why:
        return None
    most = max(started)
    return ("corpus too small to measure what workers gain: " + "; ".join(why)
            + f". Give bench a corpus of at least {2 * most} shards and {MIN_LOADER_PASS_S:.0f} s of decoding "
            "(--corpus-mb, or more --max-bytes of your shards) to see it")


def _too_small(rows: list[dict], shards: int, most: int) -> list[str]:
    """The reasons the corpus is too small for ``most`` workers to show a speed-up ([] when it is not)."""
    main = [r for r in rows if r["workers"] == 0]
    why = []
    if main and main[0]["median_s"] < MIN_LOADER_PASS_S:
        why.append(f"one pass takes {main[0]['median_s']:.2g} s in the main process, less than starting workers costs")
    if shards < 2 * most:
        why.append(f"{shards} shards for up to {most} workers (each worker reads whole shards)")
    return why


def recommendation_text(rec: dict) -> str:
    """bench.md's recommendation as Markdown bullets (format, loader settings per GPU, and why), or the
    reason there is none."""
    if not rec.get("format"):
        return rec.get("reason", "no recommendation")
    text = (f"- Format: **{rec['format']} with {rec['audio'].upper()} members**: {rec['why']}.\n"
            f"- Loader per GPU ({rec['gpus_per_node']} GPU{'s' if rec['gpus_per_node'] != 1 else ''} per node: "
            f"{rec.get('gpus_from', '--gpus-per-node')}; {rec['cores']} cores): num_workers={rec['num_workers']}, "
            f"prefetch={rec['prefetch']}, persistent_workers={rec.get('persistent_workers', True)} ({rec['rule']}). "
            f"Why {rec.get('prefetch_why') or 'this prefetch'}.")
    if rec.get("batches"):
        text += _batches_text(rec["batches"])
    if rec.get("start_method"):
        sm = rec["start_method"]
        text += (f"\n- Start method: {sm['mp_context']} started workers fastest here ({sm['startup_s']:.2f} s to the "
                 f"first batch); {sm['note']}.")
    if rec.get("webdataset"):
        text += (f"\n- WebDataset users: {rec['webdataset']['how']}. Speed vs a soundfile handler: "
                 f"{rec['webdataset']['summary']}.")
    return text


def _batches_text(b: dict) -> str:
    return (f"\n- Batches: `ShardDataset(dtype=\"{b['dtype']}\")` + `collate_padded`"
            + (f", scaled on the GPU with `{b['scale']}`" if b["scale"] else "")
            + f": {b['hours_per_cpu_s']:.2f} h of audio per CPU-second with {b['workers']} worker(s) here"
            + (f" ({b['per_cpu_vs_main']:.2f}x the same loader in the main process)" if b["per_cpu_vs_main"] else "")
            + (f", float32 batches {b['float32_hours_per_cpu_s']:.2f}" if b["float32_hours_per_cpu_s"] else "")
            + ".")


def format_webdataset_table(report: dict) -> list[str]:
    """bench.md's WebDataset section (pure); [] without WebDataset rows."""
    rows = report.get("webdataset") or []
    if not rows:
        return []
    names = [n for n in WDS_LOADERS if any(n in r["loaders"] for r in rows)]
    lines = ["", "WebDataset loaders, interleaved in one run (h/s of audio per core; x = speed vs shardkit's reader):",
             "", "| format | audio | " + " | ".join(names) + " | stage gain | drop-in gain |",
             "|---|---|" + "---:|" * (len(names) + 2)]
    lines += [_webdataset_line(r, names) for r in rows]
    lines += ["", "; ".join(f"{n}: {WDS_LOADERS[n]}" for n in names) + "."]
    return lines


def _webdataset_line(row: dict, names: list[str]) -> str:
    cells = [row["format"], row["audio"]]
    cells += [_loader_cell(row["loaders"].get(n), row["gains"]["vs_shardkit_reader"].get(n)) for n in names]
    g = row["gains"]
    cells += [_gain_cell(g["stage_vs_soundfile"]), _gain_cell(g["dropin_vs_soundfile"])]
    return "| " + " | ".join(cells) + " |"


def _loader_cell(stat: dict | None, vs: float | None) -> str:
    if stat is None:
        return "-"
    return f"{_fmt(stat['hours_per_s'], 3)} {_spread(stat)}" + (f" ({vs:.2f}x)" if vs else "")


def _gain_cell(gain: float | None) -> str:
    return f"{gain:.2f}x" if gain else "-"

