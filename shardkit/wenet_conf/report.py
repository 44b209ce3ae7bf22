"""What ``--wenet-conf`` hands a person: the report's text (stderr) and the dropped keys' file."""

from __future__ import annotations

from typing import Sequence


def write_dropped_keys(path: str, keys: Sequence[str]) -> None:
    """The dropped keys, one per line, written atomically."""
    from shardkit.io.files import atomic_write_lines, output_error

    try:
        atomic_write_lines(path, iter(keys))
    except OSError as err:
        raise output_error(err, path) from None


def format_report(report: dict, warnings: Sequence[str]) -> str:
    """The human text of a ``wenet_conf`` report (stderr)."""
    lines = [f"WeNet conf {report['conf']}: tokens: {report['tokens']}"]
    lines.extend(f"warning: {w}" for w in warnings)
    f = report["filter"]
    lines.append(f"filter_conf drops {f['dropped_utterances']} of {f['utterances']} utterances, "
                 f"{f['dropped_seconds']:.1f} s ({100 * f['dropped_share']:.2f}% of the audio)")
    lines.append(f"  {'corpus':<16} {'utts':>9} {'dropped':>9} {'seconds':>12} {'share':>8}   reasons; examples")
    for c in f["corpora"]:
        reasons = ", ".join(f"{k} {v}" for k, v in c["reasons"].items()) or "-"
        lines.append(f"  {c['corpus']:<16} {c['utterances']:>9} {c['dropped_utterances']:>9} "
                     f"{c['dropped_seconds']:>12.1f} {100 * c['dropped_share']:>7.2f}%   {reasons}"
                     + (f"; {', '.join(c['example_keys'][:3])}" if c["example_keys"] else ""))
    b = report["batches"]
    how = ", ".join(f"{k} {v}" for k, v in b["batching"].items())
    lines.append(f"batches ({how}; shuffle_size {b['shuffle_size']}, sort_size {b['sort_size']}): steps per rank")
    for e in b["epochs"]:
        left = e["equal_steps_left_out"]
        lines.append(f"  epoch {e['epoch']}: {e['steps_per_rank']} (spread {e['steps_spread']}); equal_steps leaves "
                     f"out {left['batches']} batches, {sum(left['seconds']):.1f} s "
                     f"({100 * left['share_of_seconds']:.2f}%)")
    lines.append(f"order: {b['order_model']}")
    return "\n".join(lines)
