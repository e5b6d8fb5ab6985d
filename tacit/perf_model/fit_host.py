"""What the engine computes in on this CPU, so `this-cpu`'s fit times the engine's own paths.

The fit was written for an AVX512-BF16 host: bf16 everywhere, tacit's C++ kernels. On an
AVX2-only CPU (an AMD EPYC host this project ran on) the engine computes in float32
(platforms/cpu.py: torch's bf16 matmul there is a scalar fallback, 0.001 TFLOP/s against
float32's 0.18) and has no C++ kernels, so no fused decode step, no int8 GEMV, no experts kernel.
Timing bf16 there measured a path the engine never runs, for hours (a 512-row bf16 GEMM curve
alone is ~100 GFLOP a pass), and the decode-attention stage raised for want of the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tacit.platforms.specs import HardwareSpec


def torch_dtype(dtype: str) -> torch.dtype:
    """The perf model's compute dtype name ("bf16", "fp32") as a torch dtype."""
    return torch.float32 if dtype == "fp32" else torch.bfloat16


def engine_dtype(dtype: str) -> str:
    """The same as EngineArgs.dtype spells it."""
    return "float32" if dtype == "fp32" else "bfloat16"


@dataclass(frozen=True)
class HostPrecision:
    dtype: str  # the perf model's name for the engine's compute dtype: "bf16" or "fp32"
    kernels: bool  # tacit's C++ CPU kernels load here (the fused decode step, int8, experts)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def engine_dtype(self) -> str:
        """EngineArgs.dtype for the engines the fit and the validation run."""
        return engine_dtype(self.dtype)

    @property
    def fused_decode(self) -> bool:
        """The fused C++ decode step runs bf16 on the C++ kernels (model_runner.why_not_fused)."""
        return self.kernels and self.dtype == "bf16"

    @property
    def weight_dtypes(self) -> tuple[str, ...]:
        """The weight formats the engine runs natively here: int8 (GGML Q8_0) needs the kernels
        (without them every call dequantizes the whole matrix, a path the model does not price)."""
        return (self.dtype, "int8") if self.fused_decode else (self.dtype,)


def host_precision() -> HostPrecision:
    """The CPU platform's default dtype (bf16 where oneDNN has a bf16 matmul) and whether the C++
    kernels load (they need AVX512-BF16/VNNI, and bf16: layers/ggml_linear_method._kernels_for)."""
    from tacit.kernels.cpu_kernels import load_cpu_kernels
    from tacit.platforms.cpu import CpuPlatform

    bf16 = CpuPlatform().default_dtype() == torch.bfloat16
    return HostPrecision("bf16" if bf16 else "fp32", bf16 and load_cpu_kernels() is not None)


def priced_dtypes(
    spec: HardwareSpec, quantization: str, kv_cache_dtype: str, checkpoint_format: str
) -> tuple[str, str]:
    """(weights, KV cache) as `tacit predict`, `--serve` and `tacit tune`'s model stage price
    them: --quantization and --kv-cache-dtype resolved, and on this-cpu an unquantized checkpoint
    in the dtype the engine computes in here (--dtype auto: float32 on a CPU without a native
    bf16 matmul), with an auto KV cache in that dtype too, as the engine holds them. So is a
    GGUF's blocks where the C++ kernels do not load: `--quantization auto` dequantizes them at load
    there (the default model's layers ran UnquantizedLinearMethod in float32 on an AVX2 EPYC)."""
    from tacit.perf_model.dtypes import KV_DTYPES, normalize_dtype, resolve_weight_format
    from tacit.perf_model.ggml_mixes import GGML_TYPES

    wdt = resolve_weight_format(quantization, checkpoint_format)
    if spec.name == "this-cpu" and quantization in ("", "auto", "none", None):  # none: dequantized at load
        host = host_precision()
        if wdt == "bf16" or (wdt in GGML_TYPES and not host.kernels):
            wdt = host.dtype
    kvdt = normalize_dtype(kv_cache_dtype)
    if kvdt not in KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not known; valid: auto, {', '.join(KV_DTYPES)}")
    if kv_cache_dtype in ("", "auto", None) and wdt == "fp32":
        kvdt = "fp32"
    return wdt, kvdt
