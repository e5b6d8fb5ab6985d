"""tacit's AVX512-BF16 CPU kernels, compiled once on first use and cached:

- csrc/gemv_bf16.cpp: the skinny GEMM (1-8 activation rows) behind bf16 `Linear` in decode;
- csrc/ggml_gemv.cpp: the same over GGUF's Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K blocks (layers/ggml_linear_method.py);
- csrc/head_bmm.cpp: per-head products of a few tokens with [H, K, N] weights (absorbed MLA);
- csrc/fused_decode.cpp: a whole decode step in one call (kernels/cpu_fused_decode.py), for GQA
  models (Llama, Qwen2/3, Qwen3-MoE) and DeepSeek's MLA alike;
- csrc/fused_moe.cpp: a sparse MoE layer's routing and experts (kernels/cpu_fused_moe.py);
- csrc/decode_attention.cpp: that step's attention, read straight from the paged KV cache
  (csrc/decode_attention_int8.cpp for an int8 cache, scales applied in the kernel); the same
  kernel runs MLA's absorbed decode over the latent cache (one kv head, V = each row's latent),
  and decode_attention_int8.cpp's MLA kernel over an int8 latent cache.

Batch-1 decode is ~60% GEMV time; on this CPU torch.mv streams bf16 weights at 13-19 GB/s
and this kernel at 22-27 GB/s (SmolLM2's layer shapes, weights cold in DRAM); with 2-4 rows
it reads each weight once for all of them. Machines without AVX512-BF16, or where the build
fails, keep torch.mv / torch.mm: same results, slower.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from types import ModuleType

from tacit.kernels.jit_build import build_extension

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = [
    "gemv_bf16.cpp",
    "head_bmm.cpp",
    "ggml_gemv.cpp",
    "decode_attention.cpp",
    "decode_attention_int8.cpp",
    "decode_attention_op.cpp",
    "fused_decode.cpp",
    "fused_moe.cpp",
    "bindings.cpp",
]
# AVX512-VNNI (vpdpbusd) for the int8 KV cache's scores: every CPU with AVX512-BF16 has it.
_CFLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mavx512vnni", "-mavx512vl", "-mf16c", "-fopenmp"]
_module: ModuleType | None = None
_tried = False


def cpu_supports_avx512_bf16() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f in flags for f in ("avx512_bf16", "avx512f", "avx512_vnni"))


def cpu_kernels_default() -> bool:
    """Whether the CPU kernels are on when nobody says (EngineArgs.cpu_kernels' default):
    TACIT_NO_CPU_KERNELS=1 turns them off."""
    return not os.environ.get("TACIT_NO_CPU_KERNELS")


def ggml_bf16_activations_default() -> bool:
    """EngineArgs.ggml_bf16_activations' default: TACIT_GGML_BF16_ACTIVATIONS=1 turns it on."""
    return bool(os.environ.get("TACIT_GGML_BF16_ACTIVATIONS"))


def load_cpu_kernels(enabled: bool | None = None) -> ModuleType | None:
    """The compiled module, or None (turned off, unsupported CPU, or a failed build).

    enabled: the engine's choice (EngineConfig's model.cpu_kernels), so two engines in one
    process can differ; None (tools outside an engine) takes cpu_kernels_default()."""
    if not (cpu_kernels_default() if enabled is None else enabled):
        return None
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    if not cpu_supports_avx512_bf16():
        return None
    _module = build_extension(
        "tacit_cpu_kernels",
        _CSRC,
        _SOURCES,
        _CFLAGS,
        ["-fopenmp"],
        _CFLAGS,
        "compiling the AVX512-BF16 CPU kernels (once, ~100 s on 2 cores)",
        "AVX512-BF16 CPU kernels unavailable, using the torch path",
    )
    return _module
