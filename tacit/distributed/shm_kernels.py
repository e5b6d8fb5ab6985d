"""The shared-memory communicator's C++ (csrc/shm_comm.cpp), compiled once on first use and
cached by source hash, like tacit.kernels.cpu_kernels but separate from it: it needs no AVX512
(plain -O3; the sums pick AVX2/AVX512 clones at load time on x86), so it builds on any Linux."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = ["shm_comm.cpp", "shm_bindings.cpp"]
_CFLAGS = ["-O3"]
_LDFLAGS = ["-lrt"]  # shm_open lives in librt on glibc < 2.34
_module: ModuleType | None = None
_tried = False


def _source_hash() -> str:
    """12 hex digits of sha256 over csrc/'s sources and headers and the flags."""
    h = hashlib.sha256(" ".join(_CFLAGS + _LDFLAGS).encode())
    for f in sorted(_CSRC.iterdir()):
        if f.suffix in (".cpp", ".h"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def load_shm_kernels() -> ModuleType | None:
    """The compiled module, or None (not Linux, TACIT_NO_SHM_COMM=1, or a failed build: the
    reason is printed)."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("TACIT_NO_SHM_COMM") or not sys.platform.startswith("linux"):
        return None
    from torch.utils.cpp_extension import load

    from tacit.loader.default_model import cache_dir

    if shutil.which("ninja") is None:  # pip's ninja lives beside this interpreter, maybe not on PATH
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    name = f"tacit_shm_comm_{_source_hash()}"
    build = cache_dir() / "kernels" / f"torch-{torch.__version__}" / name
    build.mkdir(parents=True, exist_ok=True)
    if not any(build.glob("*.so")):
        print("tacit: compiling the shared-memory communicator (once, ~20 s) ...", file=sys.stderr, flush=True)
    try:
        _module = load(
            name=name,
            sources=[str(_CSRC / s) for s in _SOURCES],
            build_directory=str(build),
            extra_include_paths=[str(_CSRC)],
            extra_cflags=_CFLAGS,
            extra_ldflags=_LDFLAGS,
            verbose=False,
        )
    except Exception as e:  # no compiler, no ninja, odd toolchain: the torch communicator remains
        print(
            f"tacit: shared-memory communicator unavailable ({type(e).__name__}: {str(e)[:300]})",
            file=sys.stderr,
        )
        _module = None
    return _module
