#!/usr/bin/env bash
# One command from a fresh clone: a venv, tacit with its test extras, the default model, and the
# C++ kernels compiled (so the first `tacit chat` answers without compiling).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch is pinned first and explicitly: an unpinned resolve would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev]'
# CLIP's BPE vocabulary for single-file SD/SDXL checkpoints (tacit/diffusion/clip_bpe.py): only the
# file is read, never imported; with its dependencies it would pull a CUDA torchvision.
.venv/bin/python -m pip install -q --no-deps open-clip-torch
.venv/bin/tacit fetch
# A failed build is not fatal: tacit runs on its torch path and says so; the compiler's reason is above.
.venv/bin/tacit build-kernels || echo "setup: a kernel build failed (see above); tacit will use its torch path" >&2
