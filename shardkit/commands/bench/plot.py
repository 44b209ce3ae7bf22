"""bench.png: read + decode per format and decoder, the DataLoader against its worker count, and the
WebDataset pipelines, one panel each (matplotlib, the bench extra; ImportError without it)."""

from __future__ import annotations

import io

from shardkit.commands.bench.report import loader_panel_note
from shardkit.commands.bench.webdataset import WDS_LOADERS
from shardkit.planning.bench import LOADER_DTYPE


def plot(report: dict) -> bytes:
    """bench.png's bytes: decode rate per format and decoder (h/s per core), loader rate vs workers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_loader = bool(report["loader"])
    has_wds = bool(report.get("webdataset"))
    columns = 1 + has_loader + has_wds
    fig, axes = plt.subplots(1, columns, figsize=(5 + 4.5 * columns, 5), squeeze=False)
    if has_wds:
        plot_webdataset(axes[0][columns - 1], report)
    plot_decode(axes[0][0], report)
    if has_loader:
        plot_loader(axes[0][1], report)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _grouped_bars(ax, series: list[tuple[str, list[float]]], groups: int) -> float:
    """One bar per series in each of ``groups`` groups, side by side; returns the bar width."""
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        ax.bar([x + i * width for x in range(groups)], values, width, label=name)
    return width


def _decode_series(report: dict) -> list[tuple[str, list[float]]]:
    """h/s per format for each decoder, and the WeNet-style reference where any row measured it (0: not)."""
    rows = report["formats"]
    series = [(d, [r["decode"][d]["hours_per_s"] for r in rows]) for d in report["settings"]["decoders"]]
    if any(r.get("reference") for r in rows):
        series.append(("WeNet-style", [(r["reference"] or {}).get("hours_per_s") or 0 for r in rows]))
    return series


def plot_decode(ax, report: dict) -> None:
    """bench.png's first panel: read + decode h/s per format, one bar per decoder (and the WeNet-style
    reference where measured), on a log scale so slow and fast formats share it, against what one GPU
    consumes: the format choice at a glance."""
    rows = report["formats"]
    labels = [f"{r['format']}\n{r['audio']}\n{r['size_ratio']:.2f}x" for r in rows]
    width = _grouped_bars(ax, _decode_series(report), len(rows))
    target = report["recommendation"].get("target_hours_per_s_per_gpu")
    if target:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"one GPU consumes ({target} h/s)")
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("hours of audio per second, one core (log)")
    ax.set_title("read + decode per format (size vs WAV tar under each)")
    ax.legend(fontsize=8)


def _loader_lines(report: dict) -> list[tuple[str, list[dict]]]:
    """(start method, its ``LOADER_DTYPE`` rows by worker count, from the main-process row) per start method."""
    loader_rows = [r for r in report["loader"] if r.get("dtype", LOADER_DTYPE) == LOADER_DTYPE]
    contexts = sorted({r["mp_context"] for r in loader_rows if r["workers"] > 0})
    main = [r for r in loader_rows if r["workers"] == 0][:1]
    return [(context, main + sorted((r for r in loader_rows if r["mp_context"] == context), key=lambda r: r["workers"]))
            for context in contexts]


def plot_loader(ax, report: dict) -> None:
    """bench.png's workers panel: DataLoader h/s (wall) and h per CPU-second vs num_workers, one colour
    per start method, each line starting from the main-process row; the two rates together show
    whether more workers buy speed or only burn cores. A too-small corpus gets its note over the panel."""
    for i, (context, rows_c) in enumerate(_loader_lines(report)):
        xs = [r["workers"] for r in rows_c]
        color = f"C{i}"
        ax.plot(xs, [r["hours_per_s"] or 0 for r in rows_c], marker="o", color=color,
                label=f"{context}: h/s (wall)")
        ax.plot(xs, [r.get("hours_per_cpu_s") or 0 for r in rows_c], marker="x", linestyle="--", color=color,
                label=f"{context}: h per CPU-second")
    ax.set_xticks(sorted({r["workers"] for r in report["loader"]}))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("hours of audio per second")
    ax.set_title(f"DataLoader over ShardDataset ({report['loader'][0]['format']}, {LOADER_DTYPE} batches)")
    ax.legend(fontsize=8)
    note = loader_panel_note(report)
    if note:
        _note_box(ax, note)


def _note_box(ax, note: str) -> None:
    import textwrap

    ax.text(0.5, 0.5, textwrap.fill(note, 60), transform=ax.transAxes, ha="center", va="center",
            fontsize=8, color="darkred", bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "darkred"})


def plot_webdataset(ax, report: dict) -> None:
    """bench.png's WebDataset panel: h/s per loader, grouped by format."""
    rows = report["webdataset"]
    names = [n for n in WDS_LOADERS if any(n in r["loaders"] for r in rows)]
    series = [(name, [(r["loaders"].get(name) or {}).get("hours_per_s") or 0 for r in rows]) for name in names]
    width = _grouped_bars(ax, series, len(rows))
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels([f"{r['format']}\n{r['audio']}" for r in rows], fontsize=8)
    ax.set_ylabel("hours of audio per second, one core (log)")
    ax.set_title("WebDataset pipelines vs shardkit's reader")
    ax.legend(fontsize=7)
