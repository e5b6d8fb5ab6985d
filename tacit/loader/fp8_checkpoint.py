"""FP8 block-scaled checkpoints: the format DeepSeek-V3/R1, Kimi-K2 and Qwen3-*-FP8 ship in.

config.json carries quantization_config {"quant_method": "fp8", "fmt": "e4m3",
"activation_scheme": "dynamic", "weight_block_size": [bn, bk]} (128 x 128 in every such model),
and each quantized linear layer `p` stores

  p.weight            float8_e4m3fn [N, K]
  p.weight_scale_inv  float32 [ceil(N / bn), ceil(K / bk)]
  weight[n, k] = float(p.weight[n, k]) * p.weight_scale_inv[n // bn, k // bk]

(DeepSeek's own weight_dequant, transformers' FineGrainedFP8 and vLLM's block-FP8 layers read it
so). Layers the quantizer skipped (modules_to_not_convert: norms, the router, lm_head) are plain
bf16 tensors without a scale and load as any checkpoint's do.

Each layer becomes one FP8_E4M3 GGMLTensor (kernels/ggml_quant.py): per 32 values of a row, the
fp32 scale of its block, then the 32 e4m3 bytes unchanged. The values are not re-quantized:
dequantizing the blocks gives exactly the formula above, and the GEMV, the fused decode step and
the MoE kernels stream the weight at 1.125 bytes a weight (36 per 32) as they stream Q8_0.
Activations stay in the model's dtype: this is weight-only FP8 (vLLM's w8a16 path on GPUs without
FP8 matmuls), so "dynamic" activation quantization is not applied; "static" (fixed input scales)
is refused rather than ignored.

A weight whose K is not a multiple of 32 (no such layer in the models above) cannot be blocks of
32: it is yielded dequantized to float32. NaN codes (0x7F / 0xFF) are refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from tacit.kernels.ggml_quant import FP8_E4M3, QK, GGMLTensor
from tacit.loader.safetensors_check import check_safetensors_file

SCALE_SUFFIX = "weight_scale_inv"
_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_fp8_config(qc: dict, where: str) -> tuple[int, int]:
    """quantization_config of an fp8 checkpoint -> (bn, bk), or a ValueError naming the setting."""
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise ValueError(f"{where}: fmt={fmt!r} is not supported; tacit loads e4m3 FP8 checkpoints")
    scheme = str(qc.get("activation_scheme", "dynamic")).lower()
    if scheme != "dynamic":
        raise ValueError(
            f"{where}: activation_scheme={scheme!r} is not supported; tacit runs FP8 weights with bf16 "
            "activations (weight-only), which only a dynamic-activation checkpoint leaves unchanged"
        )
    block = qc.get("weight_block_size")
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ValueError(
            f"{where}: weight_block_size={block!r}; tacit loads block-scaled FP8 checkpoints, which name "
            "[rows, cols] of each scale's block (e.g. [128, 128])"
        )
    bn, bk = block
    if bk % QK:
        raise ValueError(f"{where}: weight_block_size={block}: the column block {bk} is not a multiple of {QK}")
    return bn, bk


def fp8_weight_names(files: list[Path]) -> dict[str, int]:
    """{HF weight name: FP8_E4M3} for every float8 weight with a scale whose rows are whole
    32-value blocks (headers only)."""
    out = {}
    for f in files:
        check_safetensors_file(f)
        with safe_open(str(f), framework="pt") as handle:
            keys = set(handle.keys())
            for key in keys:
                if not key.endswith("." + SCALE_SUFFIX):
                    continue
                weight = key.removesuffix(SCALE_SUFFIX) + "weight"
                if weight in keys and handle.get_slice(weight).get_shape()[-1] % QK == 0:
                    out[weight] = FP8_E4M3
    return out


def fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], name: str) -> GGMLTensor:
    """float8_e4m3fn [N, K] and its block scales -> FP8_E4M3 blocks of the same values."""
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(
            f"{name}.weight: a 2-D float8_e4m3fn tensor has a {SCALE_SUFFIX}; got {weight.dtype} {tuple(weight.shape)}"
        )
    n, k = weight.shape
    bn, bk = block
    want = (-(-n // bn), -(-k // bk))
    if tuple(scale_inv.shape) != want or scale_inv.dtype not in _SCALE_DTYPES:
        raise ValueError(
            f"{name}.{SCALE_SUFFIX}: a [{n}, {k}] weight in {bn} x {bk} blocks needs a float scale of shape "
            f"{list(want)}; got {scale_inv.dtype} {list(scale_inv.shape)}"
        )
    s = scale_inv.float()
    if not torch.isfinite(s).all():
        raise ValueError(f"{name}.{SCALE_SUFFIX} holds a value that is not finite")
    q = weight.contiguous().view(torch.uint8)
    if ((q & 0x7F) == 0x7F).any():
        raise ValueError(f"{name}.weight holds a NaN (e4m3 code 0x7F / 0xFF); a checkpoint's weights must be finite")
    if k % QK:
        return _dequantized(q, s, bn, bk)
    nb = k // QK
    per_row = s.repeat_interleave(bn, dim=0)[:n]  # [N, ceil(K / bk)]
    per_block = per_row.repeat_interleave(bk // QK, dim=1)[:, :nb].contiguous()  # [N, K / 32]
    scale_bytes = per_block.view(torch.uint8).reshape(n, nb, 4)
    data = torch.cat([scale_bytes, q.reshape(n, nb, QK)], dim=2).reshape(n, nb * (QK + 4))
    return GGMLTensor(data, FP8_E4M3, (n, k))


def _dequantized(q: torch.Tensor, s: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = q.shape
    full = s.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return q.view(torch.float8_e4m3fn).float() * full


def fp8_converted(
    tensors: Iterator[tuple[str, torch.Tensor]], block: tuple[int, int]
) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
    """The checkpoint's tensors with each `p.weight` + `p.weight_scale_inv` pair yielded as one
    `p.weight` in FP8_E4M3 blocks as soon as its second half streams by."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        prefix, _, part = name.rpartition(".")
        is_fp8_weight = part == "weight" and tensor.dtype == torch.float8_e4m3fn
        if part != SCALE_SUFFIX and not is_fp8_weight:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if len(parts) == 2:
            del pending[prefix]
            yield f"{prefix}.weight", fp8_blocks(parts["weight"], parts[SCALE_SUFFIX], block, prefix)
    if pending:
        missing = [f"{p}.{'weight' if 'weight' not in parts else SCALE_SUFFIX}" for p, parts in pending.items()]
        raise ValueError(f"FP8 checkpoint is missing {', '.join(sorted(missing)[:8])}")
