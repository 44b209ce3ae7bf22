"""The recipe's closing summary (``scripts/run.sh``, stage 5), from what the stages really wrote.

Two halves, so that the figures can be tested against the files:

* :func:`read_recipe` (the reader): prep's report and manifest, the rejects file, the sizes of the
  source shards prep read and of the training shards ``data.list`` names (each file stat'ed), the
  training list's own format (the first shard's codec and its audio members), bench's and
  loader-check's reports, and whether the training Python reads ``.tar.zst``. Only paths that exist
  are kept.
* :func:`build_summary` and :func:`format_summary` (pure): the summary document and its lines, from
  those facts. The loader advice comes from :mod:`shardkit.planning.advice`, on the bench row of
  the list's own format, for the training node's cores when the recipe was told them; without them
  it says it cannot know them here and how to measure on that node.

``python -m shardkit.commands.recipe_summary WORKDIR [options]`` writes ``reports/summary.json`` and
``reports/summary.md`` and prints the lines (run.sh's stage 5).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

from shardkit.planning.advice import (format_evidence, format_label, loader_advice, prefetch_factor,
                                      training_decode_rate, workers_needed)
from shardkit.planning.advice import FBANK_HOURS_PER_S_PER_CORE, TARGET_HOURS_PER_S

CODEC_NAMES = {"none": "plain tar", "zst": "zst tar", "bz2": "bz2 tar", "gz": "gz tar", "xz": "xz tar"}
NUM_WORKERS_SLOT = "NUM_WORKERS"  # where the rerun command templates take the advised figures
CORES_SLOT, GPUS_SLOT = "TRAIN_CORES", "GPUS_PER_NODE"


@dataclass(frozen=True)
class RecipeSettings:
    """What run.sh knows that the files do not: its options, and the commands a summary may suggest.

    ``train_cores``/``gpus_per_node``: the training node's, None when not given; ``gpus_from`` says
    where ``gpus_per_node`` came from. ``rerun_balance`` is run.sh's command for stage 2 with
    ``--num_workers NUM_WORKERS``; ``rerun_summary`` its command for stage 5 with ``--train_cores
    TRAIN_CORES --gpus_per_node GPUS_PER_NODE``.
    """

    codec: str = "none"
    audio: str = "keep"
    world_size: int = 1
    num_workers: int = 1
    train_cores: int | None = None
    gpus_per_node: int | None = None
    gpus_from: str = "--gpus_per_node"
    train_python: str | None = None
    rerun_balance: str = ""
    rerun_summary: str = ""


@dataclass
class ListFormat:
    """The training list's own format, read from its first shard: codec (by magic) and the share of its
    audio members per extension (``{"wav": 1.0}``)."""

    shard: str
    codec: str
    audio: dict[str, float]

    @property
    def label(self) -> str:
        kinds = ", ".join(f"{k.upper()} {share:.0%}" if len(self.audio) > 1 else k.upper()
                          for k, share in sorted(self.audio.items(), key=lambda x: -x[1]))
        return f"{CODEC_NAMES.get(self.codec, self.codec + ' tar')}, {kinds or 'no audio'} members"


@dataclass
class RecipeFacts:
    """What the stages wrote, as read from the work folder (see :func:`read_recipe`)."""

    workdir: str
    names: list[str]
    prep: dict | None = None  # prep's --json report (reports/prep.json)
    manifest: dict | None = None  # prep's own prep.json beside the training shards
    rejects: int | None = None  # lines of rejects.jsonl, None when there is none
    source_bytes: dict[str, int | None] = field(default_factory=dict)  # each source shard prep read: its size
    shard_bytes: dict[str, int | None] = field(default_factory=dict)  # each shard of data.list: its size
    list_format: ListFormat | None = None
    made: dict[str, dict] = field(default_factory=dict)  # stage 1's make report per corpus made from a Kaldi dir
    bench: dict | None = None
    loader_check: dict | None = None
    zstd_hook: dict | None = None
    this_machine_cores: int = 1
    where: dict[str, str] = field(default_factory=dict)  # what the summary may point to: paths that exist


# ---------------------------------------------------------------------------------------------
# The reader


def read_recipe(workdir: str, settings: RecipeSettings) -> RecipeFacts:
    """Everything the summary states, read from ``workdir`` (files that are missing are left out)."""
    from shardkit.io.files import load_json, local_size
    from shardkit.run.executor import usable_cores

    reports = os.path.join(workdir, "reports")
    facts = RecipeFacts(workdir, _corpus_names(workdir), this_machine_cores=usable_cores())
    facts.prep = load_json(os.path.join(reports, "prep.json"))
    train_list, manifest, rejects = _prep_outputs(facts.prep, workdir)
    facts.manifest = load_json(manifest)
    facts.rejects = _count_lines(rejects)
    facts.source_bytes = {s["shard"]: local_size(s["shard"]) for s in (facts.manifest or {}).get("sources", [])}
    shards = _list_shards(train_list)
    facts.shard_bytes = {p: local_size(p) for p in shards}  # a URL or a gone file: no size stated
    facts.list_format = list_format(shards[0]) if shards else None  # prep mixes every corpus into each shard
    made = {name: load_json(os.path.join(reports, f"make_{name}.json")) for name in facts.names}
    facts.made = {name: report for name, report in made.items() if report}
    facts.bench = load_json(os.path.join(reports, "bench.json"))
    facts.loader_check = load_json(os.path.join(reports, "loader_check.json"))
    if facts.list_format and facts.list_format.codec == "zst":  # WeNet skips a shard its tarfile cannot open
        facts.zstd_hook = probe_zstd_hook(settings.train_python or sys.executable, shards[0])
    facts.where = _existing({"train_list": train_list, "manifest": manifest, "rejects": rejects, "reports": reports,
                             "plan_before": os.path.join(reports, "plan_before.json"),
                             "plan_after": os.path.join(reports, "plan_after.json"),
                             "loader_check": os.path.join(reports, "loader_check.json"),
                             "bench_table": os.path.join(workdir, "bench", "bench.md"),
                             "bench_chart": os.path.join(workdir, "bench", "bench.png")})
    return facts


def _existing(paths: dict[str, str]) -> dict[str, str]:
    """The paths that exist: a summary points to nothing a stage did not write."""
    return {what: path for what, path in paths.items() if os.path.exists(path)}


def _prep_outputs(prep: dict | None, workdir: str) -> tuple[str, str, str]:
    """(data.list, prep.json, rejects.jsonl) as prep's report names them; where prep writes them without one."""
    out_dir = os.path.join(workdir, "data", "train")
    prep = prep or {}
    return (prep.get("data_list") or os.path.join(out_dir, "data.list"),
            prep.get("manifest") or os.path.join(out_dir, "prep.json"),
            prep.get("rejects") or os.path.join(out_dir, "rejects.jsonl"))


def _corpus_names(workdir: str) -> list[str]:
    """The corpora in run.sh's order (corpora.txt, NAME=PATH a line): prep's corpus numbers index it."""
    try:
        with open(os.path.join(workdir, "corpora.txt"), encoding="utf-8") as f:
            return [line.split("=", 1)[0] for line in f if "=" in line]
    except FileNotFoundError:
        return []


def _count_lines(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return None


def _list_shards(train_list: str) -> list[str]:
    from shardkit.errors import UsageError
    from shardkit.io.inputs import read_list

    try:
        return read_list(train_list)
    except UsageError:
        return []


def list_format(shard: str) -> ListFormat | None:
    """The codec (by magic, as a reader sniffs it) and the audio members' extensions of ``shard``, read
    member by member without holding any; None when the shard cannot be read (the summary says so)."""
    from collections import Counter

    from shardkit.errors import ShardkitError
    from shardkit.io.codecs import detect_codec
    from shardkit.io.tar import AUDIO_EXTENSIONS, iter_shard_members, split_key

    counts: Counter[str] = Counter()
    try:
        with open(shard, "rb") as f:
            codec = detect_codec(f.read(16))
        for name, _ in iter_shard_members(shard, stream_over=0):  # every member streamed and skipped, none held
            ext = split_key(name)[1].lower()
            if ext in AUDIO_EXTENSIONS:
                counts[ext] += 1
    except (OSError, ShardkitError):
        return None
    total = sum(counts.values())
    return ListFormat(shard, codec, {k: round(n / total, 4) for k, n in counts.items()} if total else {})


def probe_zstd_hook(python: str, shard: str) -> dict:
    """Whether WeNet's call, ``tarfile.open(fileobj=f, mode="r:*")``, reads a .tar.zst shard in ``python``;
    the command that enables it when not."""
    import subprocess

    probe = ("import sys, tarfile\n"
             "with open(sys.argv[1], 'rb') as f, tarfile.open(fileobj=f, mode='r:*') as t: t.next()")
    try:
        ok = subprocess.run([python, "-c", probe, shard], capture_output=True, timeout=120).returncode == 0
        has_shardkit = subprocess.run([python, "-c", "import shardkit"], capture_output=True,
                                      timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return {"python": python, "reads_zstd": False, "command": None, "error": f"cannot run {python}"}
    command = None if ok else ((f"{python} -m pip install shardkit && " if not has_shardkit else "")
                               + f"{python} -m shardkit wenet enable-zstd")
    return {"python": python, "reads_zstd": ok, "command": command}


# ---------------------------------------------------------------------------------------------
# The summary document (pure)


def build_summary(facts: RecipeFacts, settings: RecipeSettings) -> dict:
    """The summary document (summary.json) from the facts read; no I/O."""
    manifest = facts.manifest or {}
    prep_summary = manifest.get("summary") or {}
    corpora = corpus_rows(facts)
    bench_rows = _bench_rows(facts.bench)
    fmt = facts.list_format
    return {
        "workdir": facts.workdir,
        "corpora": corpora,
        "bytes_source": _known_sum(facts.source_bytes.values()),
        "source_shards": len(facts.source_bytes),
        "bytes_balanced": _known_sum(facts.shard_bytes.values()),
        "training_shards": len(facts.shard_bytes),
        "sizes_from": "os.stat of the source shards prep.json lists and of the shards data.list names",
        "hours": round(sum(c["hours"] for c in corpora.values()), 4),
        "training_hours": round(prep_summary["seconds"] / 3600, 4) if "seconds" in prep_summary else None,
        "repeated": prep_summary.get("repeated"), "dropped": prep_summary.get("dropped"),
        "findings": sum(c["findings"] for c in corpora.values()),
        "rejected_utterances": prep_summary.get("rejected_utterances"), "rejects_lines": facts.rejects,
        "format": {"codec": settings.codec, "audio": settings.audio,
                   "label": format_label(settings.codec, settings.audio),
                   "list": fmt and {"shard": fmt.shard, "codec": fmt.codec, "audio": fmt.audio, "label": fmt.label},
                   "needs_zstd_hook": bool(fmt and fmt.codec == "zst"), "zstd_hook": facts.zstd_hook},
        "world_size": settings.world_size, "num_workers": settings.num_workers,
        **_rank_figures(manifest),
        "bench": bench_rows,
        "loader_check": facts.loader_check and {k: facts.loader_check.get(k) for k in (
            "ok", "engine", "equal_utterances", "equal_batches", "ranks")},
        "loader_advice": advise(bench_rows, fmt, settings, facts.this_machine_cores),
        "where": dict(facts.where),
    }


def corpus_rows(facts: RecipeFacts) -> dict[str, dict]:
    """Per corpus, from prep's manifest: its source shards and their sizes on disk, utterances read and
    accepted, hours accepted, validation findings by check; whether stage 1 made its shards."""
    manifest = facts.manifest or {}
    sources = manifest.get("sources") or []
    corpus_of = {s["shard"]: s["corpus"] for s in sources}
    findings = manifest.get("findings") or []
    return {name: _corpus_row([s for s in sources if s["corpus"] == number],
                              [f for f in findings if corpus_of.get(f.get("shard")) == number],
                              facts.source_bytes, name in facts.made)
            for number, name in enumerate(facts.names)}


def _corpus_row(sources: list[dict], findings: list[dict], sizes: dict, made: bool) -> dict:
    from collections import Counter

    return {"source_shards": len(sources), "bytes_source": _known_sum(sizes.get(s["shard"]) for s in sources),
            "utterances": sum(s["utterances"] for s in sources), "accepted": sum(s["accepted"] for s in sources),
            "hours": round(sum(s["accepted_seconds"] for s in sources) / 3600, 4),
            "findings": len(findings), "findings_by_check": dict(sorted(Counter(f["check"] for f in findings).items())),
            "made_by_stage_1": made}


def _known_sum(sizes) -> int | None:
    """The sum of the sizes, None when none is known (no file to stat)."""
    known = [s for s in sizes if s is not None]
    return sum(known) if known else None


def _bench_rows(bench: dict | None) -> list[dict] | None:
    if not bench:
        return None
    return [{"format": r["format"], "codec": r["codec"], "audio": r["audio"], "size_ratio": r["size_ratio"],
             "hours_per_s": r["decode"]["shardkit"]["hours_per_s"],
             "wenet_style_hours_per_s": (r.get("reference") or {}).get("hours_per_s")} for r in bench["formats"]]


def _rank_figures(manifest: dict) -> dict:
    """Seconds of audio per rank in epoch 0 before and after balancing, and the worst spread, from prep.json."""
    before, after = manifest.get("plan_before"), manifest.get("plan_after")

    def seconds(plan):
        return [r["seconds"] for r in plan["epochs"][0]["ranks"]] if plan else None

    return {"rank_seconds_before": seconds(before), "rank_seconds_after": seconds(after),
            "rank_spread_before": before and before["worst_rank_spread"],
            "rank_spread_after": after and after["worst_rank_spread"],
            "rank_epochs": len(after["epochs"]) if after else None}


def list_decode_rate(bench_rows: list[dict], fmt: ListFormat) -> tuple[float | None, str, list[str]]:
    """(h/s per core, what it was measured on, the audio kinds bench did not measure) for the list's own
    format: the bench row of its codec and member kind; a mix of kinds costs the sum of each kind's
    share of core-seconds (1 / rate = sum of share / rate)."""
    rates, on, missing = {}, [], []
    for kind in sorted(fmt.audio, key=lambda k: -fmt.audio[k]):
        rate, measured_on = training_decode_rate(bench_rows, fmt.codec, kind)
        if rate is None:
            missing.append(kind)
        else:
            rates[kind] = rate
            on.append(measured_on if len(fmt.audio) == 1 else f"{measured_on} ({fmt.audio[kind]:.0%} of its members)")
    if missing or not rates:
        return None, "nothing", missing
    if len(rates) == 1:  # one kind: its row's rate as measured (1 / (1 / r) can differ from r in the last bit)
        return next(iter(rates.values())), on[0], []
    return 1 / sum(fmt.audio[k] / r for k, r in rates.items()), " and ".join(on), []


def evidence_lines(bench_rows: list[dict], fmt: ListFormat) -> list[str]:
    """bench's rows, the list's own (its codec and each of its member kinds) marked ``<- this list``."""
    per_kind = [format_evidence(bench_rows, fmt.codec, kind) for kind in fmt.audio or [""]]
    return [next((lines[i] for lines in per_kind if lines[i].endswith("<- this list")), per_kind[0][i])
            for i in range(len(bench_rows))]


def advise(bench_rows: list[dict] | None, fmt: ListFormat | None, settings: RecipeSettings,
           this_machine_cores: int) -> dict:
    """Loader workers per GPU for the list's own format: :func:`shardkit.planning.advice.loader_advice`
    for the training node's cores when they were given; otherwise what one GPU needs, and how to
    learn the node's figures. ``rerun`` is the command that rebalances when the advice differs."""
    rate, measured_on, unmeasured = (list_decode_rate(bench_rows or [], fmt) if fmt else (None, "nothing", []))
    base = {"measured_on": measured_on, "decode_hours_per_s": rate, "unmeasured_audio": unmeasured,
            "this_machine_cores": this_machine_cores, "train_cores": settings.train_cores,
            "gpus_per_node": settings.gpus_per_node, "gpus_per_node_from": settings.gpus_from}
    if settings.train_cores:
        gpus = settings.gpus_per_node or 1
        advice = loader_advice(cores=settings.train_cores, gpus_per_node=gpus, decode_hours_per_s=rate,
                               num_workers_used=settings.num_workers, measured_on=measured_on)
        advice = {**advice, **base, "gpus_per_node": gpus, "node_known": True}
    else:
        advice = {**_per_gpu_need(rate, measured_on, settings), **base, "node_known": False}
    if advice["num_workers"] and advice["num_workers"] != settings.num_workers and settings.rerun_balance:
        advice["rerun"] = settings.rerun_balance.replace(NUM_WORKERS_SLOT, str(advice["num_workers"]))
    return advice


def _per_gpu_need(rate: float | None, measured_on: str, settings: RecipeSettings) -> dict:
    """What one GPU needs whatever the node, when its cores are not known: workers, prefetch, and a sentence."""
    needed = workers_needed(TARGET_HOURS_PER_S, rate, FBANK_HOURS_PER_S_PER_CORE)
    num_workers = max(1, math.ceil(needed - 1e-9))
    prefetch, prefetch_why = prefetch_factor(TARGET_HOURS_PER_S, num_workers)
    measured = (f"read + decode {rate:.3g} h/s per core measured on {measured_on}" if rate else
                "no decode rate measured for this list's format (fbank's cost alone counted)")
    text = (f"{measured}, fbank {FBANK_HOURS_PER_S_PER_CORE:g} h/s per core: one GPU consumes "
            f"~{TARGET_HOURS_PER_S:g} h/s, so it needs {needed:.3g} workers -> num_workers={num_workers}, "
            f"prefetch_factor={prefetch}, if the training node has at least {num_workers} cores per GPU")
    if settings.num_workers == num_workers:
        text += " (the --num_workers this list was balanced for)"
    else:
        text += f"; this list was balanced for --num_workers {settings.num_workers}"
    return {"num_workers": num_workers, "prefetch_factor": prefetch, "prefetch_why": prefetch_why,
            "workers_needed": round(needed, 3), "num_workers_used": settings.num_workers,
            "target_hours_per_s": TARGET_HOURS_PER_S, "fbank_hours_per_s": FBANK_HOURS_PER_S_PER_CORE, "text": text}


# ---------------------------------------------------------------------------------------------
# The lines (pure)


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB"


def format_summary(summary: dict, settings: RecipeSettings) -> list[str]:
    """summary.md's lines (also printed by the recipe)."""
    names = list(summary["corpora"])
    lines = ["# shardkit recipe summary", "",
             f"- audio: {summary['hours']:.3f} h accepted from {len(names)} corpora ({', '.join(names)})"
             + (f"; the training shards hold {summary['training_hours']:.3f} h ({summary['repeated']} "
                f"utterances repeated, {summary['dropped']} dropped to keep the counts equal)"
                if summary["training_hours"] is not None else ""),
             f"- sizes on disk: {summary['source_shards']} source shards {_mb(summary['bytes_source'])} -> "
             f"{summary['training_shards']} training shards {_mb(summary['bytes_balanced'])}"]
    lines += [f"  - {name}: {c['source_shards']} source shard{'s' if c['source_shards'] != 1 else ''}"
              f"{' (stage 1 made them)' if c['made_by_stage_1'] else ''},"
              f" {_mb(c['bytes_source'])}; {c['utterances']} utterances read, {c['accepted']} accepted, "
              f"{c['hours']:.3f} h" for name, c in summary["corpora"].items()]
    lines.append(_findings_line(summary))
    lines += _balance_lines(summary)
    lines += _format_lines(summary)
    lines += _advice_lines(summary["loader_advice"], summary, settings)
    lines += [""] + _where_lines(summary["where"], summary["rejects_lines"])
    return lines


def _findings_line(summary: dict) -> str:
    line = f"- validation findings: {summary['findings']}" + "".join(
        f"; {n}: {c['findings']} ({', '.join(f'{k} {v}' for k, v in sorted(c['findings_by_check'].items()))})"
        for n, c in summary["corpora"].items() if c["findings"])
    if summary["rejected_utterances"]:
        line += (f"; {summary['rejected_utterances']} utterances rejected (in no training shard), "
                 f"{summary['rejects_lines']} lines in {summary['where'].get('rejects', 'rejects.jsonl')}")
    return line


def _balance_lines(summary: dict) -> list[str]:
    lines = []
    before, after = summary["rank_seconds_before"], summary["rank_seconds_after"]
    if before and after:
        secs = lambda values: "[" + ", ".join(f"{s:.0f}" for s in values) + "]"  # noqa: E731
        lines.append(f"- rank balance for W={summary['world_size']} ranks (GPUs) x K={summary['num_workers']} loader "
                     f"workers per rank: seconds of audio per rank in epoch 0: {secs(before)} before balancing, "
                     f"{secs(after)} after; worst max/min ratio over {summary['rank_epochs']} shuffled epochs: "
                     f"{summary['rank_spread_before']:.3g} before, {summary['rank_spread_after']:.3g} after "
                     f"(1 = every rank reads the same)")
    check = summary["loader_check"]
    if check:
        lines.append(f"- loader check ({check.get('engine') or 'torch'} engine): "
                     + ", ".join(f"rank {r['rank']} {r['utterances']} utts / {r['batches']} batches"
                                 for r in check["ranks"]) + (" (all equal)" if check["ok"] else " (UNEQUAL)"))
    return lines


def _format_lines(summary: dict) -> list[str]:
    fmt = summary["format"]
    listed = fmt["list"]
    if not listed:
        return ["- training list format: unknown (no readable shard in the training list)"]
    lines = [f"- training list format (read from its first shard): {listed['label']}: "
             + ("WeNet reads it with no hook" if listed["codec"] == "none" else
                "WeNet on Python < 3.14 reads it only with shardkit's zstd hook" if listed["codec"] == "zst" else
                "WeNet's tarfile reads it")]
    if summary["bench"]:
        as_list = ListFormat(listed["shard"], listed["codec"], listed["audio"])
        lines.append("  measured on a sample of the training list (stage 3; size vs the plain WAV tar, read + decode "
                     "h of audio/s on one core):")
        lines += [f"  - {line}" for line in evidence_lines(summary["bench"], as_list)]
    hook = fmt["zstd_hook"]
    if hook and hook["reads_zstd"]:
        lines.append(f"- zstd hook: {hook['python']} reads these .tar.zst shards with WeNet's tarfile call")
    elif hook:
        lines.append(f"- zstd hook: NOT active in {hook['python']} (the training environment; --train_python "
                     f"picks another): WeNet would skip every shard. Run there: `{hook['command']}`")
    return lines


def _advice_lines(advice: dict, summary: dict, settings: RecipeSettings) -> list[str]:
    if advice["unmeasured_audio"]:
        listed = summary["format"]["list"]
        kinds = ",".join(sorted(listed["audio"], reverse=True))  # wav,flac: bench's own order
        missing = "/".join(advice["unmeasured_audio"]).upper()
        unmeasured = [f"  stage 3 measured no {listed['codec']} row with {missing} "
                      f"members (this list's own): rerun stages 3-5 with --bench_audio {kinds} for its decode rate"]
    else:
        unmeasured = []
    if advice["node_known"]:
        gpus = advice["gpus_per_node"]
        head = (f"- loader advice for the training node ({advice['train_cores']} cores: --train_cores; "
                f"{gpus} GPU{'s' if gpus != 1 else ''} per node: {advice['gpus_per_node_from']}): {advice['text']}")
        lines = [head]
    else:
        lines = [f"- loader advice per GPU: {advice['text']}",
                 f"  the training node's cores are not known here: this machine has {advice['this_machine_cores']} "
                 "cores, and the box that prepares the data is seldom the one that trains. Give them to the "
                 f"summary: {_with_node(settings)} (`nproc` and `nvidia-smi -L` on that node), or measure there: "
                 f"`shardkit bench {summary['where'].get('train_list', 'data.list')} --gpus-per-node G` and "
                 f"`shardkit loader-check {summary['where'].get('train_list', 'data.list')} --world-size "
                 f"{summary['world_size']} --num-workers {advice['num_workers']}`"]
    lines += unmeasured
    if advice.get("prefetch_why"):
        lines.append(f"  why {advice['prefetch_why']}")
    if advice.get("rerun"):
        lines.append(f"  to balance for {advice['num_workers']} workers: {advice['rerun']}")
    return lines


def _with_node(settings: RecipeSettings) -> str:
    if not settings.rerun_summary:
        return "--train_cores N --gpus_per_node G"
    return settings.rerun_summary.replace(CORES_SLOT, "N").replace(GPUS_SLOT, "G")


def _where_lines(where: dict, rejects: int | None) -> list[str]:
    labels = [("train_list", "training list"), ("manifest", "prep report (per shard, per source, the repeats)"),
              ("rejects", f"rejected utterances ({rejects} lines: shard, member, key, checks)"),
              ("reports", "reports (summary.json, prep.json, validate_*.json, plan_*.json, bench.json)"),
              ("loader_check", "loader check"), ("bench_table", "bench table"), ("bench_chart", "bench chart")]
    return [f"- {label}: {where[key]}" for key, label in labels if key in where]


# ---------------------------------------------------------------------------------------------
# What run.sh calls


def write_summary(workdir: str, settings: RecipeSettings) -> tuple[dict, list[str]]:
    """Read the work folder, write reports/summary.json and reports/summary.md; (summary, lines)."""
    from shardkit.io.files import atomic_write_bytes, atomic_write_json

    reports = os.path.join(workdir, "reports")
    os.makedirs(reports, exist_ok=True)  # before reading: the summary lands there, so the summary may name it
    summary = build_summary(read_recipe(workdir, settings), settings)
    lines = format_summary(summary, settings)
    atomic_write_json(os.path.join(reports, "summary.json"), summary)
    atomic_write_bytes(os.path.join(reports, "summary.md"), ("\n".join(lines) + "\n").encode("utf-8"))
    return summary, lines


def main(argv: list[str] | None = None) -> int:
    """run.sh's stage 5: ``python -m shardkit.commands.recipe_summary WORKDIR --codec ... --num-workers ...``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m shardkit.commands.recipe_summary",
                                     description="The recipe's closing summary (scripts/run.sh, stage 5).")
    parser.add_argument("workdir")
    parser.add_argument("--codec", default="none")
    parser.add_argument("--audio", default="keep")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--train-cores", type=int, default=None)
    parser.add_argument("--gpus-per-node", type=int, default=None)
    parser.add_argument("--gpus-from", default="--gpus_per_node")
    parser.add_argument("--train-python", default=None)
    parser.add_argument("--rerun-balance", default="", help=f"stage 2's command with {NUM_WORKERS_SLOT}")
    parser.add_argument("--rerun-summary", default="", help=f"stage 5's command with {CORES_SLOT}, {GPUS_SLOT}")
    args = vars(parser.parse_args(argv))
    workdir = args.pop("workdir")
    _, lines = write_summary(os.path.abspath(workdir), RecipeSettings(**args))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
