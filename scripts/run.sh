#!/usr/bin/env bash
# shardkit recipe, in WeNet's style: Kaldi data dirs (or existing shards) -> validated, balanced training
# shards and the data/train/data.list a WeNet recipe trains on.
#
#   bash scripts/run.sh                                   # the demo: 3 synthetic corpora, W=2 ranks x K=2 workers
#   bash scripts/run.sh --stage 2 --stop_stage 2          # redo only the dataset preparation
#   bash scripts/run.sh --workdir exp/mix --world_size 8 --num_workers 4 --gpus_per_node 8 --train_cores 64 \
#       --corpus aishell=/data/aishell/data.list --corpus libri=/data/kaldi/train_960
#
# Stages: 0 demo data (only without --corpus); 1 make: Kaldi dirs -> source shards (shards/source/NAME);
# 2 prep: validate + balance in one read -> data/train (data.list, prep.json, rejects.jsonl); 3 bench on
# the training list; 4 loader check; 5 summary (reports/summary.md). Everything is written under --workdir.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ------------------------------------------------------------------ options (--name value or --name=value)
stage=0               # first stage to run (0-5)
stop_stage=5          # last stage to run (0-5)
workdir=exp/demo      # where everything is written
world_size=2          # W: ranks (GPUs, all nodes together) the list is balanced for
num_workers=2         # K: DataLoader workers per rank (train.py --num_workers)
gpus_per_node=        # the training node's GPUs, for the loader advice [default: the GPUs torch sees here, else 1]
train_cores=          # the training node's cores (nproc there), for the loader advice [default: unknown, said so]
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
with_torch=false      # true: the recipe's .venv gets torch + torchaudio (the registry's build) for the torch checks
train_python=         # the Python that runs WeNet's train.py [default: the recipe's]: the zstd hook is checked there
seed=0                # shuffle and demo seed
jobs=$(nproc 2>/dev/null || echo 2)  # parallel processes
redo=false            # true: run every stage again, even those a previous run finished with the same options and inputs

options="stage stop_stage workdir world_size num_workers gpus_per_node train_cores codec audio allow_rejects
         demo_minutes demo_faults source_codec utts_per_shard shard_duration sample_rate batch_size bench_formats
         bench_audio bench_workers bench_seconds with_torch train_python seed jobs redo"
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

given_args=("$@")  # as the user typed them: every "rerun with" line repeats them, with its changes
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
for o in gpus_per_node train_cores; do
  if [ -n "${!o}" ]; then
    { is_int "${!o}" && [ "${!o}" -ge 1 ]; } || usage_error "--$o must be an integer >= 1 (got '${!o}')"
  fi
done
case $codec in none|zst) ;; *) usage_error "--codec must be none or zst (got '$codec')" ;; esac
case $audio in keep|wav|flac) ;; *) usage_error "--audio must be keep, wav or flac (got '$audio')" ;; esac
for o in allow_rejects demo_faults with_torch redo; do
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

# The command that was run, with the options "$@" (name=value) changed, quoted to be pasted as it is:
# the corpora, --workdir (absolute) and every other option the user gave come with it.
rerun_with() {
  local -a out=(bash "$root/scripts/run.sh") changed=() args=("${given_args[@]+"${given_args[@]}"}")
  local i=0 a name value c skip
  for c in "$@"; do changed+=("${c%%=*}"); done
  changed+=(workdir)
  while [ $i -lt ${#args[@]} ]; do
    a=${args[$i]}
    if [[ $a == --*=* ]]; then name=${a%%=*}; value=${a#*=}; i=$((i + 1))
    else name=$a; value=${args[$((i + 1))]:-}; i=$((i + 2)); fi
    name=${name#--}; name=${name//-/_}
    skip=false
    for c in "${changed[@]}"; do [ "$c" = "$name" ] && skip=true; done
    [ "$skip" = true ] || out+=("--$name" "$value")
  done
  out+=(--workdir "$workdir")
  for c in "$@"; do out+=("--${c%%=*}" "${c#*=}"); done
  printf '%q ' "${out[@]}" | sed 's/ $//'
}

# A stage that finished is skipped by a rerun when its options and the files it reads and writes are as
# they were (sizes and modification times, and those of the shards a list or wav.scp names): a rerun of a
# finished recipe takes seconds. --redo true runs every stage again; each command resumes on its own too.
stage_dir=$workdir/.stages
fingerprint() {  # a digest of the arguments: option values, and files (lists and wav.scp: what they name)
  "$python" - "$@" <<'PY'
import glob, hashlib, os, sys
digest = hashlib.sha256()
def stat(path):
    try:
        st = os.stat(path)
        return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return f"{path}:missing"
for arg in sys.argv[1:]:
    digest.update(arg.encode() + b"\n")
    paths = []
    if os.path.isdir(arg):
        paths = sorted(os.path.join(arg, n) for n in os.listdir(arg))
    elif os.path.isfile(arg):
        paths = [arg]
        if arg.endswith((".list", ".lst", "wav.scp")):
            base = os.path.dirname(os.path.abspath(arg))
            with open(arg, encoding="utf-8", errors="replace") as f:
                for line in f:
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    if arg.endswith("wav.scp"):
                        fields = line.split(maxsplit=1)
                        line = fields[1] if len(fields) == 2 and not fields[1].endswith("|") else ""
                    if line and "://" not in line:
                        paths.append(line if os.path.isabs(line) else os.path.join(base, line))
    elif "/" in arg and set("*?[") & set(arg):
        paths = sorted(glob.glob(arg))
    for path in paths:
        digest.update(stat(path).encode() + b"\n")
print(digest.hexdigest())
PY
}
stage_inputs=()   # set by each stage before stage_done/stage_finished: what it reads ...
stage_outputs=()  # ... and what it writes
stage_done() {  # stage_done N: finished before with these inputs and outputs (the banner then says so)
  [ "$redo" != true ] && [ -f "$stage_dir/$1" ] &&
    [ "$(cat "$stage_dir/$1")" = "$(fingerprint "${stage_inputs[@]+"${stage_inputs[@]}"}") $(fingerprint \
      "${stage_outputs[@]+"${stage_outputs[@]}"}")" ]
}
stage_finished() {  # stage_finished N: record it, for the next run
  mkdir -p "$stage_dir"
  echo "$(fingerprint "${stage_inputs[@]+"${stage_inputs[@]}"}") $(fingerprint \
    "${stage_outputs[@]+"${stage_outputs[@]}"}")" > "$stage_dir/$1"
}
skip_banner() { stage_banner "$1" "$2: done already with these options and inputs, skipped (--redo true runs it again)"; }

# ------------------------------------------------------------------ python with shardkit
# A fresh machine gets its own venv; an installed shardkit (or the repo's .venv) is used as it is.
# torch (the registry serves Linux x86-64 torch as the CUDA build, several times the CPU one) comes only with
# --with_torch true.
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
    echo "run.sh: setting up $root/.venv: shardkit[$extras] with torch (the registry's build: CUDA on Linux)" >&2
  else
    echo "run.sh: setting up $root/.venv: shardkit[$extras], no torch (--with_torch true adds torch)" >&2
  fi
  [ -x "$root/.venv/bin/python" ] || python3 -m venv "$root/.venv"
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -U pip
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -c "$root/scripts/constraints.txt" \
    -e "$root[$extras]"
  python=$root/.venv/bin/python
fi
shardkit() { "$python" -m shardkit "$@"; }
# Long steps show tqdm bars on stderr; in a log (not a terminal) one redraw every 5 s at most.
[ -t 2 ] || export TQDM_MININTERVAL=${TQDM_MININTERVAL:-5}
has_command() { shardkit "$1" --help >/dev/null 2>&1; }
json_field() {  # print a Python expression of the JSON document d in file $1
  "$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
has_torch=false
"$python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' 2>/dev/null && has_torch=true
gpus_guessed=false
if [ -z "$gpus_per_node" ]; then
  gpus_seen=0
  [ "$has_torch" = true ] && gpus_seen=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$gpus_seen" -ge 1 ] 2>/dev/null; then
    gpus_per_node=$gpus_seen; gpus_from="the GPUs torch sees"
  else
    gpus_per_node=1
    if [ "$has_torch" = true ]; then gpus_from="torch sees no GPU here"; else gpus_from="torch is not installed here"; fi
    gpus_from="a guess: $gpus_from, so 1 GPU per node is assumed; set --gpus_per_node for the training nodes"
    gpus_guessed=true
  fi
else
  gpus_from="--gpus_per_node"
fi
train_python=${train_python:-$python}

# corpora.txt (NAME=PATH per line) carries the corpus set from stage to stage
corpora_file=$workdir/corpora.txt
if [ ${#corpus[@]} -gt 0 ] && [ "$(printf '%s\n' "${corpus[@]}")" != "$(cat "$corpora_file" 2>/dev/null)" ]; then
  printf '%s\n' "${corpus[@]}" > "$corpora_file"  # only when it changes: later stages' fingerprints read it
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
  stage_inputs=(demo "$demo_minutes" "$seed" "$demo_faults")
  stage_outputs=("$corpora_file" "$workdir/kaldi" "$workdir/kaldi/aishell/wav.scp" "$workdir/kaldi/librispeech/wav.scp"
                 "$workdir/kaldi/accented/wav.scp")
  if [ ${#corpus[@]} -gt 0 ]; then
    stage_banner 0 "demo data: skipped, corpora given ($(corpus_names | paste -sd' ' -))"
  elif stage_done 0; then
    skip_banner 0 "demo data"  # the demo's files stay as they are: later stages see them unchanged
  else
    stage_banner 0 "demo data: 3 synthetic corpora (~$demo_minutes min of audio) as Kaldi data dirs"
    faults=()
    [ "$demo_faults" = true ] && faults=(--faults)
    shardkit demo -o "$workdir/kaldi" --minutes "$demo_minutes" --seed "$seed" ${faults[@]+"${faults[@]}"} \
      > "$corpora_file.tmp"
    mv "$corpora_file.tmp" "$corpora_file"
    stage_finished 0
  fi
fi

kaldi_files() {  # the Kaldi files of every corpus that is a Kaldi data dir (stage 1's inputs)
  local name path
  for name in $(corpus_names); do
    path=$(corpus_path "$name")
    if is_kaldi_dir "$path"; then
      echo "$path/wav.scp"; echo "$path/text"
      if [ -f "$path/segments" ]; then echo "$path/segments"; fi
    fi
  done
}
if run_stage 1; then
  require_corpora
  stage_inputs=(make "$source_codec" "$utts_per_shard" "$allow_rejects" "$(cat "$corpora_file")" $(kaldi_files))
  stage_outputs=()
  for name in $(corpus_names); do
    if is_kaldi_dir "$(corpus_path "$name")"; then stage_outputs+=("$workdir/shards/source/$name/data.list"); fi
  done
fi
if run_stage 1 && stage_done 1; then
  skip_banner 1 "make"
elif run_stage 1; then
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
      -j "$jobs" --json > "$reports/make_$name.json" && rc=0 || rc=$?
    case $rc in
      0) ;;
      1) echo "  $name: make skipped utterances (no audio, no transcript, unreadable):" \
              "see $workdir/shards/source/$name/make.json" >&2
         [ "$allow_rejects" = true ] ||
           die "stage 1 stopped: fix the data dir of $name, or go on without those utterances: $(rerun_with \
             allow_rejects=true)" ;;
      *) die "stage 1: make could not read the data dir of $name (exit $rc)" ;;
    esac
  done
  stage_finished 1
fi

if run_stage 2; then
  require_corpora
  stage_inputs=(prep "$codec" "$audio" "$world_size" "$num_workers" "$sample_rate" "$allow_rejects" "$shard_duration"
                "$seed" "$(cat "$corpora_file")")
  for name in $(corpus_names); do stage_inputs+=("$(source_shards "$name")"); done
  stage_outputs=("$workdir/data/train/data.list" "$reports/plan_before.json" "$reports/plan_after.json")
  for name in $(corpus_names); do stage_outputs+=("$reports/validate_$name.json"); done
fi
if run_stage 2 && stage_done 2; then
  skip_banner 2 "dataset prep (shardkit prep: validate and balance in one read)"
elif run_stage 2; then
  stage_banner 2 "dataset prep in one read (shardkit prep): validate (rejects listed, never trained on) and balance" \
    "(W=$world_size ranks x K=$num_workers workers) -> $codec shards, audio $audio"
  prep_args=()
  for name in $(corpus_names); do
    prep_args+=(--corpus "$name=$(source_shards "$name")")
  done
  duration=()
  [ -n "$shard_duration" ] && duration=(--shard-duration "$shard_duration")
  mkdir -p "$workdir/data/train"
  echo "  prep $(corpus_names | paste -sd' ' -) -> $workdir/data/train" >&2
  shardkit prep "${prep_args[@]}" --world-size "$world_size" --num-workers "$num_workers" --codec "$codec" \
    --audio "$audio" --sample-rate "$sample_rate" --channels 1 --seed "$seed" ${duration[@]+"${duration[@]}"} \
    -o "$workdir/data/train" -j "$jobs" --json > "$reports/prep.json" && rc=0 || rc=$?
  [ "$rc" -le 1 ] || die "stage 2: prep failed (exit $rc); see $reports/prep.json"
  # the per-corpus findings, the before/after rank figures and the summary lines, from the one pass's own report
  # (no second read), in one Python start: "R name" per corpus with findings, then "B balanced", "S"/"P" lines
  prep_lines=$("$python" - "$workdir/data/train/prep.json" "$reports" $(corpus_names) <<'PY'
import json, os, sys
doc, reports, names = json.load(open(sys.argv[1], encoding="utf-8")), sys.argv[2], sys.argv[3:]
for which in ("before", "after"):
    with open(os.path.join(reports, f"plan_{which}.json"), "w", encoding="utf-8") as f:
        json.dump(doc[f"plan_{which}"], f, indent=2, sort_keys=True)
corpus_of = {s["shard"]: names[s["corpus"]] for s in doc["sources"]}
for c, name in enumerate(names):
    sources = [s for s in doc["sources"] if s["corpus"] == c]
    findings = [f for f in doc["findings"] if corpus_of.get(f["shard"]) == name]
    by_check = {}
    for f in findings:
        by_check[f["check"]] = by_check.get(f["check"], 0) + 1
    seconds = sum(s["accepted_seconds"] for s in sources)
    totals = {"shards": len(sources), "utterances": sum(s["utterances"] for s in sources),
              "audio_hours": round(seconds / 3600, 4), "findings": len(findings), "by_check": by_check}
    with open(os.path.join(reports, f"validate_{name}.json"), "w", encoding="utf-8") as f:
        json.dump({"command": "prep", "totals": totals, "findings": findings}, f, indent=2, sort_keys=True)
    if findings:
        print("R", name)
s = doc["summary"]
print("B", s["balanced"])
print("S", "%d shards of %d utterances, %.1f-%.1f s each; %d repeated, %d dropped; read in %.1f s" % (
    s["num_shards"], s["utterances_per_shard"], s["min_shard_seconds"], s["max_shard_seconds"], s["repeated"],
    s["dropped"], s["elapsed_seconds"]))
print("P", len(doc["plan_after"]["epochs"]), "%.3g" % doc["plan_before"]["worst_rank_spread"],
      "%.3g" % doc["plan_after"]["worst_rank_spread"])
PY
  )
  rejected=($(sed -n 's/^R //p' <<< "$prep_lines"))
  if [ ${#rejected[@]} -gt 0 ]; then
    echo "  validate: problems found in ${rejected[*]}; rejected utterances are listed in" \
         "$workdir/data/train/rejects.jsonl and are in no training shard" >&2
    show_findings "${rejected[@]}"
    if [ "$allow_rejects" != true ]; then
      rm -f "$workdir/data/train/data.list"  # no training list until the findings are accepted (the shards stay)
      echo "run.sh: stage 2 stopped: validation found problems in ${rejected[*]} (reports in $reports);" \
           "fix the data, or train on the clean utterances only: $(rerun_with stage=2 allow_rejects=true)" >&2
      exit 1
    fi
    echo "  --allow_rejects true: going on with the clean utterances of ${rejected[*]}" >&2
  fi
  [ "$(sed -n 's/^B //p' <<< "$prep_lines")" = True ] ||
    die "stage 2: the shards are not balanced within tolerance; see $reports/prep.json (more --pool-mb helps)"
  echo "  balanced: $(sed -n 's/^S //p' <<< "$prep_lines")" >&2
  read -r epochs_n spread_before spread_after <<< "$(sed -n 's/^P //p' <<< "$prep_lines")"
  echo "  rank balance (W=$world_size ranks x K=$num_workers loader workers per rank), seconds of audio per rank," \
       "worst max/min ratio over $epochs_n shuffled epochs: $spread_before before balancing," \
       "$spread_after after (1 = equal)" >&2
  echo "  training list: $workdir/data/train/data.list" >&2
  stage_finished 2
fi

train_list=$workdir/data/train/data.list
gpus_option=()  # a guess is bench's to make (and say): it sees the GPUs itself
[ "$gpus_guessed" = true ] || gpus_option=(--gpus-per-node "$gpus_per_node")
if run_stage 3; then
  require_corpora
  stage_inputs=(bench "$bench_formats" "$bench_audio" "$bench_workers" "$bench_seconds" "$has_torch"
                ${gpus_option[@]+"${gpus_option[@]}"} "$train_list")
  stage_outputs=("$reports/bench.json" "$workdir/bench/bench.md")
fi
if run_stage 3 && stage_done 3; then
  skip_banner 3 "bench"
elif run_stage 3; then
  stage_banner 3 "bench: decode throughput of $bench_formats x $bench_audio on the training list (quick settings)"
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
      "${bench_extra[@]}" --min-seconds "$bench_seconds" --repeat 1 ${gpus_option[@]+"${gpus_option[@]}"} \
      --work-dir "$workdir" -j "$jobs" -q --json > "$reports/bench.json" ||
      die "stage 3: bench failed on $train_list (exit $?)"
    echo "  table: $workdir/bench/bench.md, chart: $workdir/bench/bench.png" >&2
    stage_finished 3
  else
    echo "  bench skipped: this shardkit has no 'bench' command" >&2
  fi
fi

if run_stage 4; then
  stage_inputs=(loader-check "$world_size" "$num_workers" "$batch_size" "$seed" "$has_torch" "$train_list")
  stage_outputs=("$reports/loader_check.json")
fi
if run_stage 4 && stage_done 4; then
  skip_banner 4 "loader check"
elif run_stage 4; then
  if [ "$has_torch" = true ]; then
    how="a torch DataLoader over shardkit's dataset"
  else
    how="shardkit's reader in K worker processes per rank (torch is not installed; --with_torch true adds it)"
  fi
  stage_banner 4 "loader check: each of W=$world_size ranks reads data/train with K=$num_workers workers: $how"
  [ -s "$workdir/data/train/data.list" ] || die "stage 4: no $workdir/data/train/data.list yet: run stage 2 first"
  shardkit loader-check "$workdir/data/train/data.list" --world-size "$world_size" --num-workers "$num_workers" \
    --batch-size "$batch_size" --seed "$seed" --json > "$reports/loader_check.json" && stage_finished 4 || {
      echo "run.sh: stage 4: ranks read different numbers of utterances or batches (see" \
           "$reports/loader_check.json); the summary follows, the exit code will be 1" >&2
      final_rc=1
    }
fi

if run_stage 5; then
  require_corpora
  stage_banner 5 "summary"
  node_option=()  # the training node's figures, when given: without them the summary says what it cannot know
  [ -z "$train_cores" ] || node_option+=(--train-cores "$train_cores")
  [ "$gpus_guessed" = true ] || node_option+=(--gpus-per-node "$gpus_per_node")
  "$python" -m shardkit.commands.recipe_summary "$workdir" --codec "$codec" --audio "$audio" \
    --world-size "$world_size" --num-workers "$num_workers" ${node_option[@]+"${node_option[@]}"} \
    --gpus-from="$gpus_from" --train-python="$train_python" \
    --rerun-balance="$(rerun_with stage=2 num_workers=NUM_WORKERS)" \
    --rerun-summary="$(rerun_with stage=5 stop_stage=5 train_cores=TRAIN_CORES gpus_per_node=GPUS_PER_NODE)" ||
    die "stage 5: the summary could not be written (exit $?)"
fi
if [ "$python" = "$root/.venv/bin/python" ] && ! command -v shardkit >/dev/null 2>&1; then
  echo "run.sh: shardkit is installed in $root/.venv; to run the README's \`shardkit ...\` commands, put it on" \
       "the PATH: source $root/.venv/bin/activate" >&2
fi
exit $final_rc
