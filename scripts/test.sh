#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the test suite:
#   a venv (.venv, or the path in $SHARDKIT_VENV), shardkit with every extra and the test tools, Debian's
#   ffmpeg (torchaudio decodes through torchcodec/FFmpeg) when missing and running as root; then the
#   layer contract (lint-imports), the complexity check and pytest.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k convert -x
#
# torch: the CPU build, from $SHARDKIT_TORCH_INDEX (default PyTorch's CPU wheel index): the tests need no
# GPU, and the registry's default Linux x86-64 build bundles CUDA's libraries, several times the download.
# The index is asked first (10 s); when it does not answer, the script says so and takes the default build.
# SHARDKIT_TORCH_INDEX= (empty) takes the default build without asking. A second run installs nothing new.
# SHARDKIT_TEST_DRY_RUN=1 checks the machine (and the index) and prints what it would do, changing nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SHARDKIT_VENV:-.venv}
python=${PYTHON:-python3}
torch_index=${SHARDKIT_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
dry_run=${SHARDKIT_TEST_DRY_RUN:-}

say() { echo "test.sh: $*" >&2; }
run() {  # a step that changes the machine; printed, not run, in a dry run
  if [ -n "$dry_run" ]; then say "would run: $*"; else "$@"; fi
}
as_root_with_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=false
apt_install() {  # apt_install PACKAGE...: update the lists once (a failed update is not fatal), then install
  if [ "$apt_updated" = false ]; then
    run apt-get update -qq || say "apt-get update failed (offline mirror?); trying with the package lists at hand"
    apt_updated=true
  fi
  run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- the machine: Python >= 3.10 with venv, ffmpeg ------------------------------------------------
if ! command -v "$python" >/dev/null 2>&1; then
  say "no $python on the PATH: install Python 3.10 or newer (or set PYTHON=/path/to/python3)"; exit 2
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  say "$python is Python $("$python" -c 'import platform; print(platform.python_version())'); shardkit needs 3.10" \
      "or newer (set PYTHON=/path/to/python3.10+)"; exit 2
fi
if [ ! -x "$venv/bin/python" ] && ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  package="python3-venv python$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
  if as_root_with_apt; then
    say "$python has no venv module (Debian packs it apart): installing $package"
    # shellcheck disable=SC2086
    apt_install $package || apt_install python3-venv || true
  fi
  if [ -z "$dry_run" ] && ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    say "$python cannot make a virtual environment: install $package (apt-get install $package) and run again"
    exit 2
  fi
fi
if ! command -v ffmpeg >/dev/null 2>&1; then
  if as_root_with_apt; then
    say "installing Debian's ffmpeg"
    apt_install ffmpeg || say "could not install ffmpeg; the torchaudio tests that need it will be skipped"
  else
    say "ffmpeg is missing and we are not root; torchaudio tests will be skipped"
  fi
fi

# --- the venv: CPU torch first (where its index answers), then shardkit[all,test] ------------------
quiet=(-q)  # a venv made before: what follows is mostly "already satisfied", said quietly
if [ ! -x "$venv/bin/python" ]; then
  say "creating the venv $venv (SHARDKIT_VENV=PATH puts it elsewhere)"
  run "$python" -m venv "$venv"
  quiet=()  # the first install downloads the most: pip shows what it fetches
else
  say "using the venv $venv (SHARDKIT_VENV=PATH puts it elsewhere)"
fi
pip() { run "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q -U pip
index_answers() {  # the index serves torch's page within 10 s (pip alone would retry, then fail on resolution)
  case $1 in http://*|https://*) ;; *) return 0 ;; esac  # a file: index or path: pip reads it, nothing to ask
  "$python" - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).close()
PY
}
default_build="the registry's default torch build comes with the extras below (on Linux x86-64 the CUDA build)"
torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
# torch 2.14.1 + torchaudio 2.11.0 is the CPU pair known to work together (scripts/constraints.txt pins it).
if [ -n "$torch_version" ]; then
  say "torch $torch_version is in $venv already"
elif [ -z "$torch_index" ]; then
  say "SHARDKIT_TORCH_INDEX is empty: $default_build"
elif ! index_answers "$torch_index"; then
  say "the CPU torch index $torch_index did not answer within 10 s: $default_build. For the CPU build, set" \
      "SHARDKIT_TORCH_INDEX to an index that serves it (a mirror or proxy of https://download.pytorch.org/whl/cpu);" \
      "SHARDKIT_TORCH_INDEX= (empty) takes the default build without asking"
else
  say "installing torch and torchaudio, the CPU build, from $torch_index (SHARDKIT_TORCH_INDEX): the tests need" \
      "no GPU, and the default Linux build bundles CUDA's libraries"
  pip install ${quiet[@]+"${quiet[@]}"} --retries 1 --timeout 20 -c scripts/constraints.txt --index-url "$torch_index" \
      torch torchaudio ||
    say "pip could not install torch from $torch_index (its message above): $default_build." \
        "SHARDKIT_TORCH_INDEX chooses the index (empty: the default build)"
fi
[ ${#quiet[@]} -gt 0 ] || say "installing shardkit[all,test,docs] and the test tools (pip's progress below)"
pip install ${quiet[@]+"${quiet[@]}"} -c scripts/constraints.txt -e ".[all,test,docs]"
# --- NeMo's own dataset class, in an environment of its own ------------------------------------------
# nemo-toolkit[asr] brings its own torch, lightning, hydra and transformers, so it never enters the venv
# above: it gets $SHARDKIT_NEMO_VENV (default .venv-nemo), and the tests that read shardkit's NeMo output and
# check plan's scatter figures with NeMo's own TarredAudioToCharDataset run it there (SHARDKIT_NEMO_PYTHON).
# SHARDKIT_NEMO_PYTHON=/path/to/python uses a Python you have; SHARDKIT_NEMO=0 leaves NeMo out (those tests
# are then skipped, saying why). A failed install is said and skips them too, it does not stop the suite.
nemo_venv=${SHARDKIT_NEMO_VENV:-.venv-nemo}
nemo_ready="$nemo_venv/.shardkit-nemo-ready"
if [ -n "${SHARDKIT_NEMO_PYTHON:-}" ]; then
  say "NeMo's own dataset class: $SHARDKIT_NEMO_PYTHON (SHARDKIT_NEMO_PYTHON)"
elif [ "${SHARDKIT_NEMO:-1}" = 0 ]; then
  say "SHARDKIT_NEMO=0: the tests that read with NeMo's own dataset class are skipped"
else
  if [ ! -f "$nemo_ready" ]; then
    say "installing nemo_toolkit[asr] into $nemo_venv, its own environment (SHARDKIT_NEMO_VENV; SHARDKIT_NEMO=0" \
        "leaves it out): the first time takes minutes and several GB"
    if { [ -x "$nemo_venv/bin/python" ] || run "$python" -m venv "$nemo_venv"; } &&
       run "$nemo_venv/bin/python" -m pip --disable-pip-version-check install -q -U pip &&
       run "$nemo_venv/bin/python" -m pip --disable-pip-version-check install -q -c scripts/constraints-nemo.txt \
           'nemo_toolkit[asr]' &&
       run "$nemo_venv/bin/python" -c 'from nemo.collections.asr.data.audio_to_text import TarredAudioToCharDataset'
    then
      run touch "$nemo_ready"
    else
      say "nemo_toolkit[asr] could not be installed or imported in $nemo_venv (pip's message above): the tests" \
          "that read with NeMo's own dataset class are skipped"
    fi
  fi
  if [ -f "$nemo_ready" ]; then
    export SHARDKIT_NEMO_PYTHON="$PWD/$nemo_venv/bin/python"
    case $nemo_venv in /*) SHARDKIT_NEMO_PYTHON="$nemo_venv/bin/python" ;; esac
    say "NeMo's own dataset class: $SHARDKIT_NEMO_PYTHON"
  fi
fi
# The layer contract (.importlinter, ARCHITECTURE.md) and the complexity ceiling, before the tests.
run "$venv/bin/lint-imports" --config .importlinter
run "$venv/bin/python" scripts/check_complexity.py
if [ -n "$dry_run" ]; then say "would run: $venv/bin/python -m pytest $*"; exit 0; fi
exec "$venv/bin/python" -m pytest "$@"
