"""Where tacit keeps what it makes once and reuses: the default model, compiled kernels, random
benchmark checkpoints, GGUF exports. One place, so every layer can find it without importing the
layer that happens to fill it (the kernels once imported the model loader for this)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$TACIT_CACHE_DIR, else ~/.cache/tacit."""
    return Path(os.environ.get("TACIT_CACHE_DIR", Path.home() / ".cache" / "tacit"))
