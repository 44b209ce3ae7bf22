"""Profile: where a balance dry run's CPU and memory go, phase by phase (issue 39).

balance's steps run one after the other in this process, in the order a dry run takes them (the index
read into columns, the unique-key check, the planner, the repeats, the report); each phase's CPU (user +
sys, ``getrusage``) and peak RSS (a thread sampling /proc/self/statm every 5 ms) are printed as a
markdown table. The planner's own steps are timed by wrapping them: version 1 and 2's ``_Planner`` steps,
version 3's ``direct`` functions. In a real run the unique-key check overlaps the planner, so the phases
add up to more than the whole process. The indexes are those ``bench_plan_scale.py`` generates.

    python benchmarks/profile_plan_phases.py --size 20 --version 3
    PYTHONPATH=/tmp/plan39/base python benchmarks/profile_plan_phases.py --size 20   # another checkout's code
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time

START = time.perf_counter()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default="/tmp/shardkit-bench-plan-scale")
    p.add_argument("--size", default="20", help="Millions of utterances (an index bench_plan_scale.py made).")
    p.add_argument("--version", type=int, default=3, help="Plan version.")
    return p.parse_args()


class Phases:
    """Each phase's wall and CPU seconds, sys seconds, peak and final RSS."""

    def __init__(self):
        self.rows = []
        self.peak = 0.0
        self.last = (time.perf_counter(), *self._cpu())
        threading.Thread(target=self._sample, daemon=True).start()

    @staticmethod
    def _rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    @staticmethod
    def _cpu() -> tuple[float, float]:
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime, u.ru_stime

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.005)

    def mark(self, name: str) -> None:
        now, cpu, sys_cpu = time.perf_counter(), *self._cpu()
        rss = self._rss()
        self.rows.append((name, now - self.last[0], cpu - self.last[1], sys_cpu - self.last[2], max(self.peak, rss), rss))
        self.last, self.peak = (now, cpu, sys_cpu), rss

    def table(self) -> str:
        lines = ["| phase | wall s | CPU s (user+sys) | of it sys | peak RSS (MB) | RSS after (MB) |",
                 "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {n} | {w:.2f} | {c:.2f} | {s:.2f} | {p:.0f} | {r:.0f} |" for n, w, c, s, p, r in self.rows
                  if w >= 0.02 or not n.startswith("(")]
        cpu, sys_cpu = self._cpu()
        return "\n".join(lines + [f"| total | {time.perf_counter() - START:.2f} | {cpu:.2f} | {sys_cpu:.2f} | | |"])


def wrap(owner, name: str, label: str, phases: Phases) -> None:
    """Mark a phase before and after ``owner.name`` (a generator's result is consumed inside)."""
    # a phase is what runs between two marks: a planner step marks where it starts, so what ran before it
    # (since the last mark) is not counted as the step
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        phases.mark("(between steps)")
        result = inner(*args, **kwargs)
        result = list(result) if name == "_filled" else result
        phases.mark(label)
        return result

    setattr(owner, name, timed)


def main(args) -> None:
    phases = Phases()
    import numpy as np

    from shardkit.commands.balance import columns, report, sources
    from shardkit.planning import balance
    from shardkit.planning.balance import direct
    from shardkit.planning.partition import plan_figures

    phases.mark("start-up (imports)")
    if args.version == 3:
        # weigh and fill run per corpus in threads (marks would interleave): they are the "(between steps)"
        # row before the deal
        # the tolerance's median is tolerance_seconds since the later round of issue 39, median_seconds before it
        # (the same script profiles either checkout: PYTHONPATH=CHECKOUT)
        median = "tolerance_seconds" if hasattr(direct, "tolerance_seconds") else "median_seconds"
        for name, label in [("deal", "planner: deal (keys, sort, rounds, places)"),
                            (median, "planner: tolerance (median)"), ("shuffle_shards", "planner: in-shard shuffle")]:
            wrap(direct, name, label, phases)
    else:
        for name, label in [("_weighed", "planner: weights"), ("_filled", "planner: padding"),
                            ("_dealt", "planner: deal (keys, sort, rounds, placement)"),
                            ("_refined", "planner: totals, median, swaps"), ("_gathered", "planner: output gathers")]:
            wrap(balance._Planner, name, label, phases)
    names = ["mandarin", "english", "accented"]
    mix = columns.load_columns(names, [[f"{args.work_dir}/{args.size}M-{n}.parquet"] for n in names])
    phases.mark("read Parquet -> arrays (load_columns)")
    sources.check_unique_keys(mix)
    phases.mark("unique-key check (hash sort)")
    settings = balance.PlanSettings(world_size=64, num_workers=4, shard_duration=3600.0, version=args.version)
    plan = balance.plan_balance([c.durations for c in mix.corpora], [1.0] * 3, settings, names=names, threads=2)
    phases.mark("planner: the rest (swaps; version 1/2: in-shard shuffle)")
    report.Repeats(plan, mix, {}).check()
    phases.mark("repeats (count, clash check)")
    plan_figures(np.full(plan.num_shards, plan.utts_per_shard), plan.shard_seconds, world_size=64, num_workers=4,
                 epochs=3, seed=0)
    summary = plan.summary()  # a dry run builds no shard table since the later round of issue 39 (only if read)
    phases.mark("report (figures, summary)")
    print(json.dumps({"utterances_M": args.size, "plan_version": args.version, "digest": balance.plan_digest(plan),
                      "max_deviation_seconds": summary["max_deviation_seconds"], "shards": summary["num_shards"]}),
          file=sys.stderr)
    print(phases.table())


if __name__ == "__main__":
    main(parse_args())
