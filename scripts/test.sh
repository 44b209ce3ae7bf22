#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the test suite:
#   a venv (.venv, or $SHARDKIT_VENV), shardkit with every extra and the test tools, Debian's ffmpeg
#   (torchaudio decodes through torchcodec/FFmpeg) when missing and running as root; then the layer
#   contract (lint-imports), the complexity check and pytest.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k convert -x
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SHARDKIT_VENV:-.venv}

if ! command -v ffmpeg >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Debian's ffmpeg" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ffmpeg >/dev/null
  else
    echo "test.sh: ffmpeg is missing and we are not root; torchaudio tests will be skipped" >&2
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -U pip
# torch 2.14.1 + torchaudio 2.11.0 is the CPU pair known to work together (see README).
"$venv/bin/python" -m pip install -q --disable-pip-version-check -c scripts/constraints.txt -e ".[all,test]"
# The layer contract (.importlinter, ARCHITECTURE.md) and the complexity ceiling, before the tests.
"$venv/bin/lint-imports" --config .importlinter
"$venv/bin/python" scripts/check_complexity.py
exec "$venv/bin/python" -m pytest "$@"
