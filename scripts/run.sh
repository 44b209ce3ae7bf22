#!/usr/bin/env bash
# shardkit recipe, in WeNet's style: Kaldi data dirs (or existing shards) -> converted, validated,
# balanced shards and the data/train/data.list a WeNet recipe trains on.
#
#   bash scripts/run.sh                                   # the demo: 3 synthetic corpora, W=2 ranks x K=2 workers
#   bash scripts/run.sh --stage 2 --stop_stage 2          # redo only the dataset preparation
#   bash scripts/run.sh --workdir exp/mix --world_size 8 --num_workers 4 \
#       --corpus aishell=/data/aishell/data.list --corpus libri=/data/kaldi/train_960
#
# Stages: 0 demo data (only without --corpus), 1 make shards from Kaldi dirs, 2 convert -> validate
# -> balance -> plan, 3 bench, 4 loader check, 5 summary. Everything is written under --workdir.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ------------------------------------------------------------------ options (--name value)
stage=0
stop_stage=5
workdir=exp/demo
world_size=2          # simulated ranks (GPUs)
num_workers=2         # DataLoader workers per rank
codec=zst             # codec of the prepared shards: zst (fastest to read) or none (plain tar, any WeNet)
corpus=()             # NAME=PATH, repeatable: a Kaldi data dir (wav.scp, text[, segments]) or shards
allow_rejects=false   # go on with the clean utterances when validation finds problems
demo_minutes=15       # minutes of demo audio in all three corpora
demo_faults=false     # plant an 8 kHz and a stereo utterance in the demo, for validate to find
source_codec=         # stage 1's codec [default: bz2 for the demo, like the users' shards; else --codec]
utts_per_shard=       # stage 1's utterances per shard [default: 20 for the demo; else 1000, WeNet's]
shard_duration=       # seconds per balanced shard [default: balance decides]
sample_rate=16000     # what validate expects
batch_size=8          # loader check: utterances per batch
bench_formats=none,bz2,zst:3  # bench: shard compressions to compare
bench_audio=wav,flac  # bench: audio members to compare
bench_workers=0,2     # bench: DataLoader num_workers values ('' skips the loader rows)
bench_seconds=0.3     # bench: minimum seconds per measurement
seed=0
jobs=$(nproc 2>/dev/null || echo 2)

options="stage stop_stage workdir world_size num_workers codec allow_rejects demo_minutes demo_faults source_codec
         utts_per_shard shard_duration sample_rate batch_size bench_formats bench_audio bench_workers bench_seconds
         seed jobs"
usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  echo
  echo "Options (--name value; the defaults as set in this script):"
  sed -n '/^stage=0/,/^jobs=/p' "$0" | sed 's/^/  --/'
}

while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --*)
      name=${1#--}
      name=${name//-/_}
      if [ $# -lt 2 ]; then echo "run.sh: option $1 needs a value" >&2; exit 2; fi
      if [ "$name" = corpus ]; then
        corpus+=("$2")
      elif [[ " $(echo $options) " == *" $name "* ]]; then
        printf -v "$name" '%s' "$2"
      else
        echo "run.sh: unknown option $1 (see --help)" >&2; exit 2
      fi
      shift 2 ;;
    *) echo "run.sh: unexpected argument $1 (options are --name value; see --help)" >&2; exit 2 ;;
  esac
done

if [ ${#corpus[@]} -eq 0 ]; then  # the demo
  source_codec=${source_codec:-bz2}
  utts_per_shard=${utts_per_shard:-20}
else
  source_codec=${source_codec:-$codec}
  utts_per_shard=${utts_per_shard:-1000}
fi
mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd)
reports=$workdir/reports
mkdir -p "$reports"

stage_banner() {  # stage number and what it does, as WeNet recipes echo them
  local number=$1; shift
  echo "==== stage $number: $* ($(date '+%H:%M:%S'))" >&2
}
run_stage() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }
die() { echo "run.sh: $*" >&2; exit 1; }
final_rc=0

# ------------------------------------------------------------------ python with shardkit
# A fresh machine gets its own venv; an installed shardkit (or the repo's .venv) is used as it is.
if [ -n "${SHARDKIT_PYTHON:-}" ]; then
  python=$SHARDKIT_PYTHON
elif [ -x "$root/.venv/bin/python" ] && "$root/.venv/bin/python" -c 'import shardkit' 2>/dev/null; then
  python=$root/.venv/bin/python
elif command -v python3 >/dev/null && python3 -c 'import shardkit, torch' 2>/dev/null; then
  python=python3
else
  echo "run.sh: shardkit is not installed; setting up $root/.venv (torch included, a few minutes)" >&2
  python3 -m venv "$root/.venv"
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -U pip
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -c "$root/scripts/constraints.txt" \
    -e "$root[all]"
  python=$root/.venv/bin/python
fi
shardkit() { "$python" -m shardkit "$@"; }
has_command() { shardkit "$1" --help >/dev/null 2>&1; }
json_field() {  # print a Python expression of the JSON document d in file $1
  "$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# corpora.txt (NAME=PATH per line) carries the corpus set from stage to stage
corpora_file=$workdir/corpora.txt
if [ ${#corpus[@]} -gt 0 ]; then
  for c in "${corpus[@]}"; do
    if [[ ! $c =~ ^[A-Za-z0-9_.-]+=.+ ]]; then echo "run.sh: --corpus wants NAME=PATH, got '$c'" >&2; exit 2; fi
    if [ ! -e "${c#*=}" ] && ! compgen -G "${c#*=}" >/dev/null; then
      echo "run.sh: --corpus $c: no such file, folder or glob match" >&2; exit 2
    fi
  done
  printf '%s\n' "${corpus[@]}" > "$corpora_file"
fi
require_corpora() {  # called outside $(...), so that its exit ends the script
  if [ ! -s "$corpora_file" ]; then
    echo "run.sh: no corpora in $workdir yet: run stage 0 (the demo) or give --corpus NAME=PATH" >&2; exit 1
  fi
}
corpus_names() { cut -d= -f1 "$corpora_file"; }
corpus_path() { grep -m1 "^$1=" "$corpora_file" | cut -d= -f2-; }
is_kaldi_dir() { [ -f "$1/wav.scp" ] && [ -f "$1/text" ]; }
# the shards a corpus starts from: stage 1's output for a Kaldi dir, the given shards otherwise
source_shards() {
  local path; path=$(corpus_path "$1")
  if is_kaldi_dir "$path"; then echo "$workdir/shards/source/$1/data.list"; else echo "$path"; fi
}
prepared_list() { echo "$workdir/quarantine/$1/data.list"; }

# ------------------------------------------------------------------ stages
if run_stage 0; then
  if [ ${#corpus[@]} -gt 0 ]; then
    stage_banner 0 "demo data: skipped, corpora given ($(corpus_names | paste -sd' ' -))"
  else
    stage_banner 0 "demo data: 3 synthetic corpora (~$demo_minutes min of audio) as Kaldi data dirs"
    faults=()
    [ "$demo_faults" = true ] && faults=(--faults)
    shardkit demo -o "$workdir/kaldi" --minutes "$demo_minutes" --seed "$seed" ${faults[@]+"${faults[@]}"} \
      > "$corpora_file"
  fi
fi

if run_stage 1; then
  require_corpora
  stage_banner 1 "make: Kaldi data dirs -> $source_codec shards of $utts_per_shard utterances (as the users had them)"
  for name in $(corpus_names); do
    path=$(corpus_path "$name")
    if ! is_kaldi_dir "$path"; then
      echo "  $name: shards given ($path), nothing to make" >&2
      continue
    fi
    segments=()
    [ -f "$path/segments" ] && segments=(--segments "$path/segments")
    echo "  $name: $path" >&2
    shardkit make --wav-scp "$path/wav.scp" --text "$path/text" ${segments[@]+"${segments[@]}"} \
      -o "$workdir/shards/source/$name" --codec "$source_codec" --utts-per-shard "$utts_per_shard" \
      -j "$jobs" -q --json > "$reports/make_$name.json" && rc=0 || rc=$?
    case $rc in
      0) ;;
      1) echo "  $name: make skipped utterances (no audio, no transcript, unreadable):" \
              "see $workdir/shards/source/$name/make.json" >&2
         [ "$allow_rejects" = true ] ||
           die "stage 1 stopped: fix the data dir of $name, or rerun with --allow_rejects true" ;;
      *) die "stage 1: make could not read the data dir of $name (exit $rc)" ;;
    esac
  done
fi

if run_stage 2; then
  require_corpora
  stage_banner 2 "dataset prep: convert ($codec) -> validate (quarantine) ->" \
    "balance (W=$world_size x K=$num_workers) -> plan"
  rejected=()
  balance_args=()
  before_lists=()
  for name in $(corpus_names); do
    src=$(source_shards "$name")
    converted=$workdir/shards/$codec/$name/data.list
    if is_kaldi_dir "$(corpus_path "$name")" && [ "$source_codec" = "$codec" ]; then
      echo "  $name: convert: stage 1 wrote $codec shards already" >&2
      converted=$src
    else
      echo "  $name: convert $src -> $workdir/shards/$codec/$name" >&2
      shardkit convert "$src" -o "$workdir/shards/$codec/$name" --codec "$codec" -j "$jobs" -q --json \
        > "$reports/convert_$name.json" ||
        die "stage 2: convert failed on shards of $name; see $reports/convert_$name.json"
    fi
    before_lists+=("$converted")
    shardkit validate "$converted" --sample-rate "$sample_rate" --channels 1 \
      --quarantine "$workdir/quarantine/$name" --report "$reports/validate_$name.json" -j "$jobs" -q && rc=0 || rc=$?
    case $rc in
      0) echo "  $name: validate: no findings" >&2 ;;
      1) rejected+=("$name")
         echo "  $name: validate: problems found, see $reports/validate_$name.json;" \
              "bad utterances set apart in $workdir/quarantine/$name" >&2 ;;
      *) echo "run.sh: stage 2: validate could not check $name (exit $rc)" >&2; exit "$rc" ;;
    esac
    balance_args+=(--corpus "$name=$(prepared_list "$name")")
  done
  if [ ${#rejected[@]} -gt 0 ]; then
    if [ "$allow_rejects" != true ]; then
      echo "run.sh: stage 2 stopped: validation found problems in ${rejected[*]} (reports in $reports);" \
           "fix the data, or rerun with --stage 2 --allow_rejects true to train on the clean utterances only" >&2
      exit 1
    fi
    echo "  --allow_rejects true: going on with the clean utterances of ${rejected[*]}" >&2
  fi
  mkdir -p "$workdir/data/train"
  if has_command balance; then
    duration=()
    [ -n "$shard_duration" ] && duration=(--shard-duration "$shard_duration")
    echo "  balance -> $workdir/data/train" >&2
    shardkit balance "${balance_args[@]}" --world-size "$world_size" --num-workers "$num_workers" \
      -o "$workdir/data/train" --codec "$codec" --seed "$seed" ${duration[@]+"${duration[@]}"} -j "$jobs" -q --json \
      > "$reports/balance.json" || die "stage 2: balance failed; see $reports/balance.json"
    json_field "$reports/balance.json" \
      '"  balanced: %d shards of %d utterances, %.1f-%.1f s each" % (d["num_shards"], '\
'd["utterances_per_shard"], d["min_shard_seconds"], d["max_shard_seconds"])' >&2
  else
    echo "  balance skipped: this shardkit has no 'balance' command; data/train/data.list is the clean," \
         "unbalanced union of the corpora" >&2
    for name in $(corpus_names); do cat "$(prepared_list "$name")"; done > "$workdir/data/train/data.list"
  fi
  if has_command plan; then
    shardkit plan "${before_lists[@]}" --world-size "$world_size" --num-workers "$num_workers" --seed "$seed" \
      -q --json > "$reports/plan_before.json"
    shardkit plan "$workdir/data/train/data.list" --world-size "$world_size" --num-workers "$num_workers" \
      --seed "$seed" -q --json > "$reports/plan_after.json"
    echo "  seconds per rank, max/min over $(json_field "$reports/plan_after.json" 'len(d["epochs"])') shuffled" \
         "epochs: $(json_field "$reports/plan_before.json" 'd["worst_rank_spread"]') before," \
         "$(json_field "$reports/plan_after.json" 'd["worst_rank_spread"]') after balancing" >&2
  else
    echo "  plan skipped: this shardkit has no 'plan' command" >&2
  fi
  echo "  training list: $workdir/data/train/data.list" >&2
fi

if run_stage 3; then
  require_corpora
  stage_banner 3 "bench: decode throughput of $bench_formats x $bench_audio on the corpora (quick settings)"
  if has_command bench; then
    bench_inputs=()
    for name in $(corpus_names); do bench_inputs+=("$(source_shards "$name")"); done
    shardkit bench "${bench_inputs[@]}" -o "$workdir/bench" --formats "$bench_formats" --audio "$bench_audio" \
      --workers "$bench_workers" --mp-context fork --min-seconds "$bench_seconds" --repeat 1 \
      --work-dir "$workdir" -j "$jobs" -q --json > "$reports/bench.json"
    echo "  table: $workdir/bench/bench.md, chart: $workdir/bench/bench.png" >&2
  else
    echo "  bench skipped: this shardkit has no 'bench' command" >&2
  fi
fi

if run_stage 4; then
  stage_banner 4 "loader check: each of W=$world_size ranks reads data/train with K=$num_workers workers" \
    "(torch dataset)"
  if "$python" -c 'import importlib.util as u, sys
sys.exit(not (u.find_spec("torch") and u.find_spec("shardkit.dataset")))'; then
    [ -s "$workdir/data/train/data.list" ] || die "stage 4: no $workdir/data/train/data.list yet: run stage 2 first"
    shardkit loader-check "$workdir/data/train/data.list" --world-size "$world_size" --num-workers "$num_workers" \
      --batch-size "$batch_size" --seed "$seed" --json > "$reports/loader_check.json" || {
        echo "run.sh: stage 4: ranks read different numbers of utterances or batches (see" \
             "$reports/loader_check.json); the summary follows, the exit code will be 1" >&2
        final_rc=1
      }
  else
    echo "  loader check skipped: shardkit's torch dataset (shardkit.dataset, torch) cannot be imported" >&2
  fi
fi

if run_stage 5; then
  require_corpora
  stage_banner 5 "summary"
  "$python" - "$workdir" <<'EOF'
# Gathers the stage reports into reports/summary.json and reports/summary.md (printed too).
import json, os, sys

workdir = sys.argv[1]
reports = os.path.join(workdir, "reports")


def load(path):
    try:
        with open(path if os.path.isabs(path) else os.path.join(reports, path), encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def list_bytes(path):
    try:
        with open(path, encoding="utf-8") as f:
            return sum(os.path.getsize(line.strip()) for line in f if line.strip())
    except OSError:
        return None


def rank_seconds(plan):
    return [r["seconds"] for r in plan["epochs"][0]["ranks"]] if plan else None


names = [line.split("=", 1)[0] for line in open(os.path.join(workdir, "corpora.txt"), encoding="utf-8") if "=" in line]
train_list = os.path.join(workdir, "data", "train", "data.list")
corpora = {}
for name in names:
    conv, val = load(f"convert_{name}.json") or {}, load(f"validate_{name}.json") or {}
    if not conv and load(f"make_{name}.json"):  # stage 1 wrote the target codec: nothing converted
        made = load(f"make_{name}.json")["bytes_out"]
        conv = {"bytes_in": made, "bytes_out": made}
    totals = val.get("totals", {})
    corpora[name] = {"bytes_source": conv.get("bytes_in"), "bytes_converted": conv.get("bytes_out"),
                     "utterances": totals.get("utterances"), "hours": totals.get("audio_hours"),
                     "findings": totals.get("findings"), "findings_by_check": totals.get("by_check")}
before, after = load("plan_before.json"), load("plan_after.json")
bench, loader = load("bench.json"), load("loader_check.json")
bench_rows = bench and [{"format": r["format"], "audio": r["audio"], "size_ratio": r["size_ratio"],
                         "hours_per_s": r["decode"]["shardkit"]["hours_per_s"],
                         "wenet_style_hours_per_s": (r.get("reference") or {}).get("hours_per_s")}
                        for r in bench["formats"]]
summary = {
    "workdir": workdir,
    "corpora": corpora,
    "bytes_source": sum(c["bytes_source"] or 0 for c in corpora.values()),
    "bytes_converted": sum(c["bytes_converted"] or 0 for c in corpora.values()),
    "bytes_balanced": list_bytes(train_list),
    "hours": round(sum(c["hours"] or 0 for c in corpora.values()), 4),
    "findings": sum(c["findings"] or 0 for c in corpora.values()),
    "rank_seconds_before": rank_seconds(before),
    "rank_seconds_after": rank_seconds(after),
    "rank_spread_before": before and before["worst_rank_spread"],
    "rank_spread_after": after and after["worst_rank_spread"],
    "bench": bench_rows,
    "loader_check": loader and {k: loader[k] for k in ("ok", "equal_utterances", "equal_batches", "ranks")},
    "where": {"train_list": train_list, "reports": reports,
              "balance_report": os.path.join(workdir, "data", "train", "balance.json"),
              "quarantine": os.path.join(workdir, "quarantine"),
              "bench_chart": os.path.join(workdir, "bench", "bench.png"),
              "bench_table": os.path.join(workdir, "bench", "bench.md")},
}
mb = lambda n: "-" if n is None else f"{n / 1e6:.1f} MB"
lines = ["# shardkit recipe summary", "",
         f"- audio: {summary['hours']:.3f} h in {len(names)} corpora ({', '.join(names)})",
         f"- sizes: source {mb(summary['bytes_source'])} -> converted {mb(summary['bytes_converted'])} -> "
         f"balanced {mb(summary['bytes_balanced'])}",
         f"- validation findings: {summary['findings']}"
         + "".join(f"; {n}: {c['findings']}" for n, c in corpora.items() if c["findings"])]
if before and after:
    lines.append(f"- seconds of audio per rank in epoch 0: before {rank_seconds(before)}, after balancing "
                 f"{rank_seconds(after)}; max/min over {len(after['epochs'])} shuffled epochs: before "
                 f"{before['worst_rank_spread']}, after {after['worst_rank_spread']}")
if loader:
    lines.append("- loader check: " + ", ".join(f"rank {r['rank']} {r['utterances']} utts / {r['batches']} batches"
                                                for r in loader["ranks"])
                 + (" (all equal)" if loader["ok"] else " (UNEQUAL)"))
if bench:
    lines.append("- decode throughput, hours of audio per second on one core "
                 "(shardkit reader; WeNet's way where measured):")
    for row in bench["formats"]:
        wenet = f", WeNet-style {row['reference']['hours_per_s']}" if row.get("reference") else ""
        lines.append(f"  - {row['format']} {row['audio']}: {row['decode']['shardkit']['hours_per_s']} h/s{wenet} "
                     f"(size x{row['size_ratio']})")
    rec = bench["recommendation"]
    lines.append(f"- bench recommends {rec['format']} shards with {rec['audio']} members, "
                 f"num_workers={rec['num_workers']}")
lines += ["", f"- training list: {train_list}", f"- reports: {reports} (summary.json, validate_*.json, plan_*.json)",
          f"- balance report: {summary['where']['balance_report']}", f"- quarantine: {summary['where']['quarantine']}",
          f"- bench chart: {summary['where']['bench_chart']}"]
with open(os.path.join(reports, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
with open(os.path.join(reports, "summary.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
fi
exit $final_rc
