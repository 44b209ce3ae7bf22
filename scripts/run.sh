#!/usr/bin/env bash
# shardkit recipe, in WeNet's style: Kaldi data dirs (or existing shards) -> converted, validated,
# balanced shards and the data/train/data.list a WeNet recipe trains on.
#
#   bash scripts/run.sh                                   # the demo: 3 synthetic corpora, W=2 ranks x K=2 workers
#   bash scripts/run.sh --stage 2 --stop_stage 2          # redo only the dataset preparation
#   bash scripts/run.sh --workdir exp/mix --world_size 8 --num_workers 4 --gpus_per_node 8 \
#       --corpus aishell=/data/aishell/data.list --corpus libri=/data/kaldi/train_960
#
# Stages: 0 demo data (only without --corpus), 1 make shards from Kaldi dirs, 2 convert -> validate
# -> balance -> plan, 3 bench on the training list, 4 loader check, 5 summary. Everything is written
# under --workdir.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ------------------------------------------------------------------ options (--name value or --name=value)
stage=0               # first stage to run (0-5)
stop_stage=5          # last stage to run (0-5)
workdir=exp/demo      # where everything is written
world_size=2          # W: ranks (GPUs, all nodes together) the list is balanced for
num_workers=2         # K: DataLoader workers per rank (train.py --num_workers)
gpus_per_node=        # GPUs per node, for the loader advice [default: the GPUs torch sees, else 1]
codec=none            # training shards: none (plain tar, any WeNet reads it) or zst (WeNet needs the zstd hook)
audio=keep            # their audio members: keep (as the sources have them), flac (lossless, smaller), wav
corpus=()             # NAME=PATH, repeatable: a Kaldi data dir (wav.scp, text[, segments]) or shards
allow_rejects=false   # true: go on with the clean utterances when validation finds problems
demo_minutes=15       # minutes of demo audio in all three corpora
demo_faults=false     # true: plant an 8 kHz and a stereo utterance in the demo, for validate to find
source_codec=         # stage 1's codec [default: bz2 for the demo, like the users' shards; else --codec]
utts_per_shard=       # stage 1's utterances per shard [default: 20 for the demo; else 1000, WeNet's]
shard_duration=       # seconds per balanced shard [default: balance decides]
sample_rate=16000     # what validate expects
batch_size=8          # loader check: utterances per batch
bench_formats=none,bz2,zst:3  # bench: shard compressions to compare
bench_audio=wav,flac  # bench: audio members to compare
bench_workers=0,2     # bench: DataLoader num_workers values ('' skips the loader rows; needs torch)
bench_seconds=0.3     # bench: minimum seconds per measurement
with_torch=false      # true: the recipe's .venv gets torch + torchaudio (CUDA build, ~6 GB) for the torch checks
train_python=         # the Python that runs WeNet's train.py [default: the recipe's]: the zstd hook is checked there
seed=0                # shuffle and demo seed
jobs=$(nproc 2>/dev/null || echo 2)  # parallel processes

options="stage stop_stage workdir world_size num_workers gpus_per_node codec audio allow_rejects demo_minutes
         demo_faults source_codec utts_per_shard shard_duration sample_rate batch_size bench_formats bench_audio
         bench_workers bench_seconds with_torch train_python seed jobs"
for o in $options; do printf -v "default_$o" '%s' "${!o}"; done  # for --help, before any option changes them
usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  echo
  echo "Options (--name value or --name=value; default in brackets):"
  local o comment default
  for o in $(echo $options | sed 's/ audio / audio corpus /'); do
    comment=$(grep -m1 "^$o=" "$0" | sed 's/^[^#]*# *//')
    default=default_$o; default=${!default:-}
    if [ "$o" = corpus ]; then
      printf '  --%-16s %s\n' "corpus N=PATH" "$comment"
    elif [ -z "$default" ]; then
      printf '  --%-16s %s\n' "$o" "$comment"
    else
      printf '  --%-16s %s [%s]\n' "$o" "$comment" "$default"
    fi
  done
}
usage_error() {  # a usage error: exit 2, before anything is set up
  { echo "run.sh: $*"; echo; usage; } >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --*=*) opt=${1%%=*}; value=${1#*=}; shift ;;
    --*)
      opt=$1
      [ $# -ge 2 ] || usage_error "option $1 needs a value"
      value=$2; shift 2 ;;
    *) usage_error "unexpected argument $1 (options are --name value or --name=value)" ;;
  esac
  name=${opt#--}
  name=${name//-/_}
  if [ "$name" = corpus ]; then
    corpus+=("$value")
  elif [[ " $(echo $options) " == *" $name "* ]]; then
    printf -v "$name" '%s' "$value"
  else
    usage_error "unknown option $opt"
  fi
done

# every value is checked before anything is set up
is_int() { [[ $1 =~ ^[0-9]+$ ]]; }
for o in stage stop_stage; do
  { is_int "${!o}" && [ "${!o}" -le 5 ]; } || usage_error "--$o must be a stage from 0 to 5 (got '${!o}')"
done
[ "$stage" -le "$stop_stage" ] || usage_error "--stage $stage comes after --stop_stage $stop_stage: nothing to run"
for o in world_size batch_size jobs; do
  { is_int "${!o}" && [ "${!o}" -ge 1 ]; } || usage_error "--$o must be an integer >= 1 (got '${!o}')"
done
is_int "$num_workers" || usage_error "--num_workers must be an integer >= 0 (got '$num_workers')"
[[ $seed =~ ^-?[0-9]+$ ]] || usage_error "--seed must be an integer (got '$seed')"
if [ -n "$gpus_per_node" ]; then
  { is_int "$gpus_per_node" && [ "$gpus_per_node" -ge 1 ]; } ||
    usage_error "--gpus_per_node must be an integer >= 1 (got '$gpus_per_node')"
fi
case $codec in none|zst) ;; *) usage_error "--codec must be none or zst (got '$codec')" ;; esac
case $audio in keep|wav|flac) ;; *) usage_error "--audio must be keep, wav or flac (got '$audio')" ;; esac
for o in allow_rejects demo_faults with_torch; do
  case ${!o} in true|false) ;; *) usage_error "--$o must be true or false (got '${!o}')" ;; esac
done
for c in ${corpus[@]+"${corpus[@]}"}; do
  [[ $c =~ ^[A-Za-z0-9_.-]+=.+ ]] || usage_error "--corpus wants NAME=PATH, got '$c'"
  if [ ! -e "${c#*=}" ] && ! compgen -G "${c#*=}" >/dev/null; then
    usage_error "--corpus $c: no such file, folder or glob match"
  fi
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
# torch (the registry serves Linux torch only as the CUDA build, ~6 GB) comes only with --with_torch true.
extras=bench
needs='import shardkit'
if [ "$with_torch" = true ]; then extras=bench,torch; needs='import shardkit, torch'; fi
# Checked from / : `python -c` puts the current folder first on sys.path, so from the repository root
# any python3 would import the checkout's shardkit without its dependencies (soundfile, click, ...).
has_needs() { (cd / && "$1" -c "$needs") 2>/dev/null; }
if [ -n "${SHARDKIT_PYTHON:-}" ]; then
  python=$SHARDKIT_PYTHON
elif [ -x "$root/.venv/bin/python" ] && has_needs "$root/.venv/bin/python"; then
  python=$root/.venv/bin/python
elif command -v python3 >/dev/null && has_needs python3; then
  python=python3
else
  if [ "$with_torch" = true ]; then
    echo "run.sh: setting up $root/.venv: shardkit[$extras] with torch (several GB, a few minutes)" >&2
  else
    echo "run.sh: setting up $root/.venv: shardkit[$extras], no torch (~250 MB, under a minute;" \
         "--with_torch true adds torch)" >&2
  fi
  [ -x "$root/.venv/bin/python" ] || python3 -m venv "$root/.venv"
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -U pip
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -c "$root/scripts/constraints.txt" \
    -e "$root[$extras]"
  python=$root/.venv/bin/python
fi
shardkit() { "$python" -m shardkit "$@"; }
has_command() { shardkit "$1" --help >/dev/null 2>&1; }
json_field() {  # print a Python expression of the JSON document d in file $1
  "$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
has_torch=false
"$python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' 2>/dev/null && has_torch=true
if [ -z "$gpus_per_node" ]; then
  gpus_seen=0
  [ "$has_torch" = true ] && gpus_seen=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$gpus_seen" -ge 1 ] 2>/dev/null; then
    gpus_per_node=$gpus_seen; gpus_from="the GPUs torch sees"
  else
    gpus_per_node=1
    if [ "$has_torch" = true ]; then gpus_from="torch sees no GPU here"; else gpus_from="torch is not installed here"; fi
    gpus_from="$gpus_from: 1 GPU per node assumed; set --gpus_per_node for the training nodes"
  fi
else
  gpus_from="--gpus_per_node"
fi
train_python=${train_python:-$python}

# corpora.txt (NAME=PATH per line) carries the corpus set from stage to stage
corpora_file=$workdir/corpora.txt
if [ ${#corpus[@]} -gt 0 ]; then
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
format_dir=$codec; [ "$audio" = keep ] || format_dir=$codec-$audio  # shards/<format_dir>/NAME: convert's output
show_findings() {  # the findings table of the validate reports of corpora "$@" (first ones, a count, the reports)
  "$python" - "$reports" "$@" <<'PY' >&2
import json, os, sys
reports, names, shown = sys.argv[1], sys.argv[2:], 12
rows, paths = [], []
for name in names:
    path = os.path.join(reports, f"validate_{name}.json")
    paths.append(path)
    with open(path, encoding="utf-8") as f:
        rows += [(name, x["shard"], x["key"] or "-", x["check"], x["message"]) for x in json.load(f)["findings"]]
print(f"  {len(rows)} findings (shard, key, check):")
width = [max([len(h)] + [len(r[i]) for r in rows[:shown]]) for i, h in enumerate(("corpus", "shard", "key", "check"))]
print(f"    {'corpus':<{width[0]}}  {'shard':<{width[1]}}  {'key':<{width[2]}}  {'check':<{width[3]}}  reason")
for r in rows[:shown]:
    print(f"    {r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]:<{width[2]}}  {r[3]:<{width[3]}}  {r[4]}")
if len(rows) > shown:
    print(f"    ... and {len(rows) - shown} more")
print("  every finding: " + ", ".join(paths))
PY
}

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
  stage_banner 2 "dataset prep: convert ($codec, audio $audio) -> validate (quarantine) ->" \
    "balance (W=$world_size ranks x K=$num_workers workers) -> plan"
  rejected=()
  balance_args=()
  before_lists=()
  for name in $(corpus_names); do
    src=$(source_shards "$name")
    converted=$workdir/shards/$format_dir/$name/data.list
    if is_kaldi_dir "$(corpus_path "$name")" && [ "$source_codec" = "$codec" ] && [ "$audio" = keep ]; then
      echo "  $name: convert: stage 1 wrote $codec shards already" >&2
      converted=$src
    else
      echo "  $name: convert $src -> $workdir/shards/$format_dir/$name" >&2
      shardkit convert "$src" -o "$workdir/shards/$format_dir/$name" --codec "$codec" --audio "$audio" -j "$jobs" \
        -q --json \
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
    # convert and make leave index.parquet beside data.list: with no findings the clean list is those
    # shards as they are, so balance plans from that index instead of reading every shard again
    by_product=$(dirname "$converted")/index.parquet
    if [ "$rc" = 0 ] && [ -f "$by_product" ]; then
      balance_args+=(--corpus "$name=$by_product")
    else
      balance_args+=(--corpus "$name=$(prepared_list "$name")")
    fi
  done
  if [ ${#rejected[@]} -gt 0 ]; then
    show_findings "${rejected[@]}"
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
    echo "  rank balance (W=$world_size ranks x K=$num_workers loader workers per rank), seconds of audio per rank," \
         "worst max/min ratio over $(json_field "$reports/plan_after.json" 'len(d["epochs"])') shuffled epochs:" \
         "$(json_field "$reports/plan_before.json" '"%.3g" % d["worst_rank_spread"]') before balancing," \
         "$(json_field "$reports/plan_after.json" '"%.3g" % d["worst_rank_spread"]') after (1 = equal)" >&2
  else
    echo "  plan skipped: this shardkit has no 'plan' command" >&2
  fi
  echo "  training list: $workdir/data/train/data.list" >&2
fi

if run_stage 3; then
  require_corpora
  stage_banner 3 "bench: decode throughput of $bench_formats x $bench_audio on the training list (quick settings)"
  train_list=$workdir/data/train/data.list
  if has_command bench; then
    [ -s "$train_list" ] || die "stage 3: no $train_list yet: run stage 2 first"
    bench_extra=()
    if [ "$has_torch" != true ]; then
      echo "  torch is not installed (--with_torch true adds it): no WeNet-style torchaudio row," \
           "no DataLoader rows" >&2
      bench_extra=(--reference '' --workers '')
    else
      bench_extra=(--workers "$bench_workers" --mp-context fork)
    fi
    shardkit bench "$train_list" -o "$workdir/bench" --formats "$bench_formats" --audio "$bench_audio" \
      "${bench_extra[@]}" --min-seconds "$bench_seconds" --repeat 1 --gpus-per-node "$gpus_per_node" \
      --work-dir "$workdir" -j "$jobs" -q --json > "$reports/bench.json" ||
      die "stage 3: bench failed on $train_list (exit $?)"
    echo "  table: $workdir/bench/bench.md, chart: $workdir/bench/bench.png" >&2
  else
    echo "  bench skipped: this shardkit has no 'bench' command" >&2
  fi
fi

if run_stage 4; then
  if [ "$has_torch" = true ]; then
    how="a torch DataLoader over shardkit's dataset"
  else
    how="shardkit's reader in K worker processes per rank (torch is not installed; --with_torch true adds it)"
  fi
  stage_banner 4 "loader check: each of W=$world_size ranks reads data/train with K=$num_workers workers: $how"
  [ -s "$workdir/data/train/data.list" ] || die "stage 4: no $workdir/data/train/data.list yet: run stage 2 first"
  shardkit loader-check "$workdir/data/train/data.list" --world-size "$world_size" --num-workers "$num_workers" \
    --batch-size "$batch_size" --seed "$seed" --json > "$reports/loader_check.json" || {
      echo "run.sh: stage 4: ranks read different numbers of utterances or batches (see" \
           "$reports/loader_check.json); the summary follows, the exit code will be 1" >&2
      final_rc=1
    }
fi

if run_stage 5; then
  require_corpora
  stage_banner 5 "summary"
  "$python" - "$workdir" "$codec" "$audio" "$world_size" "$num_workers" "$gpus_per_node" "$gpus_from" \
    "$train_python" <<'EOF'
# Gathers the stage reports into reports/summary.json and reports/summary.md (printed too).
import json, os, subprocess, sys

from shardkit.planning.advice import format_evidence, format_label, loader_advice, training_decode_rate

workdir, codec, audio = sys.argv[1:4]
world_size, num_workers, gpus_per_node = (int(x) for x in sys.argv[4:7])
gpus_from, train_python = sys.argv[7:9]
reports = os.path.join(workdir, "reports")


def load(path):
    try:
        with open(path if os.path.isabs(path) else os.path.join(reports, path), encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_list(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


def list_bytes(path):
    try:
        return sum(os.path.getsize(p) for p in read_list(path)) if read_list(path) else None
    except OSError:
        return None


def g(x):  # 2-3 significant digits
    return "-" if x is None else f"{x:.3g}"


def rank_seconds(plan):
    return [r["seconds"] for r in plan["epochs"][0]["ranks"]] if plan else None


def zstd_hook(python, shard):
    """Whether WeNet's call, tarfile.open(fileobj=f, mode="r:*"), reads a .tar.zst shard in that Python."""
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
bench_rows = bench and [{"format": r["format"], "codec": r["codec"], "audio": r["audio"], "size_ratio": r["size_ratio"],
                         "hours_per_s": r["decode"]["shardkit"]["hours_per_s"],
                         "wenet_style_hours_per_s": (r.get("reference") or {}).get("hours_per_s")}
                        for r in bench["formats"]]
try:
    cores = len(os.sched_getaffinity(0))
except AttributeError:
    cores = os.cpu_count() or 1
decode_rate, measured_on = training_decode_rate(bench_rows or [], codec, audio)
advice = loader_advice(cores=cores, gpus_per_node=gpus_per_node, decode_hours_per_s=decode_rate,
                       num_workers_used=num_workers, measured_on=measured_on)
shards = read_list(train_list)
hook = zstd_hook(train_python, shards[0]) if codec == "zst" and shards else None
summary = {
    "workdir": workdir,
    "corpora": corpora,
    "format": {"codec": codec, "audio": audio, "label": format_label(codec, audio),
               "needs_zstd_hook": codec == "zst", "zstd_hook": hook},
    "bytes_source": sum(c["bytes_source"] or 0 for c in corpora.values()),
    "bytes_converted": sum(c["bytes_converted"] or 0 for c in corpora.values()),
    "bytes_balanced": list_bytes(train_list),
    "hours": round(sum(c["hours"] or 0 for c in corpora.values()), 4),
    "findings": sum(c["findings"] or 0 for c in corpora.values()),
    "world_size": world_size, "num_workers": num_workers,
    "rank_seconds_before": rank_seconds(before),
    "rank_seconds_after": rank_seconds(after),
    "rank_spread_before": before and before["worst_rank_spread"],
    "rank_spread_after": after and after["worst_rank_spread"],
    "bench": bench_rows,
    "loader_check": loader and {k: loader.get(k) for k in ("ok", "engine", "equal_utterances", "equal_batches",
                                                           "ranks")},
    "loader_advice": {**advice, "gpus_per_node_from": gpus_from},
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
    secs = lambda plan: "[" + ", ".join(f"{s:.0f}" for s in rank_seconds(plan)) + "]"
    lines.append(f"- rank balance for W={world_size} ranks (GPUs) x K={num_workers} loader workers per rank: seconds "
                 f"of audio per rank in epoch 0: {secs(before)} before balancing, {secs(after)} after; worst "
                 f"max/min ratio over {len(after['epochs'])} shuffled epochs: {g(before['worst_rank_spread'])} "
                 f"before, {g(after['worst_rank_spread'])} after (1 = every rank reads the same)")
if loader:
    lines.append(f"- loader check ({loader.get('engine', 'torch')} engine): "
                 + ", ".join(f"rank {r['rank']} {r['utterances']} utts / {r['batches']} batches"
                             for r in loader["ranks"]) + (" (all equal)" if loader["ok"] else " (UNEQUAL)"))
lines.append(f"- training list format: {format_label(codec, audio)}: "
             + ("WeNet reads it with no hook" if codec == "none" else
                "WeNet on Python < 3.14 reads it only with shardkit's zstd hook"))
if bench_rows:
    lines.append("  measured on a sample of the training list (stage 3; size vs the plain WAV tar, read + decode "
                 "h of audio/s on one core):")
    lines += [f"  - {line}" for line in format_evidence(bench_rows, codec, audio)]
if hook:
    if hook["reads_zstd"]:
        lines.append(f"- zstd hook: {hook['python']} reads these .tar.zst shards with WeNet's tarfile call")
    else:
        lines.append(f"- zstd hook: NOT active in {hook['python']} (the training environment; --train_python "
                     f"picks another): WeNet would skip every shard. Run there: `{hook['command']}`")
lines.append(f"- loader advice ({gpus_from}): {advice['text']}")
lines += ["", f"- training list: {train_list}", f"- reports: {reports} (summary.json, validate_*.json, plan_*.json)",
          f"- balance report: {summary['where']['balance_report']}", f"- quarantine: {summary['where']['quarantine']}",
          f"- bench table and chart: {summary['where']['bench_table']}, {summary['where']['bench_chart']}"]
with open(os.path.join(reports, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
with open(os.path.join(reports, "summary.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
fi
exit $final_rc
