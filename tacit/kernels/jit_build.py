"""Compile a directory's C++ once, on first use, into tacit's cache, keyed by a hash of the
sources and flags: the CPU kernels (kernels/cpu_kernels.py) and the shared-memory communicator
(distributed/shm_kernels.py) both load this way."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch


def source_hash(csrc: Path, flags: list[str]) -> str:
    """12 hex digits of sha256 over every .cpp and .h in csrc (headers included) and the flags."""
    h = hashlib.sha256(" ".join(flags).encode())
    for f in sorted(csrc.iterdir()):
        if f.suffix in (".cpp", ".h"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def build_extension(
    prefix: str,
    csrc: Path,
    sources: list[str],
    cflags: list[str],
    ldflags: list[str],
    hashed_flags: list[str],
    compiling: str,
    unavailable: str,
) -> ModuleType | None:
    """The module built from csrc/sources, or None after printing why (no compiler, no ninja, an
    odd toolchain: the caller keeps its torch fallback). One build directory and module name per
    source version: a build keyed only by torch's version let a changed source (another
    checkout, an older install) load a .so compiled from different code, and two checkouts
    building at once overwrote each other's ninja files. compiling: the message printed before a
    first build; unavailable: how a failure is announced."""
    from torch.utils.cpp_extension import load

    from tacit.loader.default_model import cache_dir

    if shutil.which("ninja") is None:  # pip's ninja lives beside this interpreter, maybe not on PATH
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    name = f"{prefix}_{source_hash(csrc, hashed_flags)}"
    build = cache_dir() / "kernels" / f"torch-{torch.__version__}" / name
    build.mkdir(parents=True, exist_ok=True)
    if not any(build.glob("*.so")):
        print(f"tacit: {compiling} ...", file=sys.stderr, flush=True)
    try:
        return load(
            name=name,
            sources=[str(csrc / s) for s in sources],
            build_directory=str(build),
            extra_include_paths=[str(csrc)],
            extra_cflags=cflags,
            extra_ldflags=ldflags,
            verbose=False,
        )
    except Exception as e:
        print(f"tacit: {unavailable} ({type(e).__name__}: {str(e)[:300]})", file=sys.stderr)
        return None
