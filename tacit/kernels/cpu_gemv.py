"""The AVX512-BF16 skinny GEMM (csrc/gemv_bf16.cpp: 1-4 activation rows), compiled once on
first use and cached.

Batch-1 decode is ~60% GEMV time; on this CPU torch.mv streams bf16 weights at 13-19 GB/s
and this kernel at 22-27 GB/s (SmolLM2's layer shapes, weights cold in DRAM); with 2-4 rows
it reads each weight once for all of them. Machines without AVX512-BF16, or where the build
fails, keep torch.mv / torch.mm: same results, slower.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from types import ModuleType

import torch

_SOURCE = Path(__file__).parent / "csrc" / "gemv_bf16.cpp"
_module: ModuleType | None = None
_tried = False


def cpu_supports_avx512_bf16() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags and "avx512f" in flags


def load_gemv_kernel() -> ModuleType | None:
    """The compiled module, or None (unsupported CPU, TACIT_NO_CPU_KERNELS=1, or a failed build)."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("TACIT_NO_CPU_KERNELS") or not cpu_supports_avx512_bf16():
        return None
    import shutil

    from torch.utils.cpp_extension import load

    from tacit.loader.default_model import cache_dir

    if shutil.which("ninja") is None:  # pip's ninja lives beside this interpreter, maybe not on PATH
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

    build = cache_dir() / "kernels" / f"torch-{torch.__version__}"
    build.mkdir(parents=True, exist_ok=True)
    if not any(build.glob("*.so")):
        print("tacit: compiling the AVX512-BF16 GEMV kernel (once, ~30 s) ...", file=sys.stderr, flush=True)
    try:
        _module = load(name="tacit_gemv_bf16", sources=[str(_SOURCE)], build_directory=str(build),
                       extra_cflags=["-O3", "-mavx512f", "-mavx512bf16", "-fopenmp"],
                       extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, no ninja, odd toolchain: fall back, do not fail the engine
        print(f"tacit: AVX512-BF16 GEMV kernel unavailable ({type(e).__name__}: {str(e)[:200]}); using torch.mv",
              file=sys.stderr)
        _module = None
    return _module
