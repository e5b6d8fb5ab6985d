"""The shared-memory communicator's C++ (csrc/shm_comm.cpp), compiled once on first use and
cached by source hash, like tacit.kernels.cpu_kernels but separate from it: it needs no AVX512
(plain -O3; the sums pick AVX2/AVX512 clones at load time on x86), so it builds on any Linux."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

from tacit.kernels.jit_build import build_extension

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = ["shm_comm.cpp", "shm_bindings.cpp"]
_CFLAGS = ["-O3"]
_LDFLAGS = ["-lrt"]  # shm_open lives in librt on glibc < 2.34
_module: ModuleType | None = None
_tried = False


def load_shm_kernels() -> ModuleType | None:
    """The compiled module, or None (not Linux, TACIT_NO_SHM_COMM=1, or a failed build: the
    reason is printed)."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("TACIT_NO_SHM_COMM") or not sys.platform.startswith("linux"):
        return None
    _module = build_extension(
        "tacit_shm_comm",
        _CSRC,
        _SOURCES,
        _CFLAGS,
        _LDFLAGS,
        _CFLAGS + _LDFLAGS,
        "compiling the shared-memory communicator (once, ~10 s)",
        "shared-memory communicator unavailable",
    )
    return _module
