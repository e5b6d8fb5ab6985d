#!/usr/bin/env bash
# One command from a fresh clone: a venv, tacit with its test extras, and the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch is pinned first and explicitly: an unpinned resolve would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/tacit fetch
