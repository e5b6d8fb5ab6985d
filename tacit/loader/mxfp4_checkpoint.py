"""MXFP4 checkpoints: gpt-oss's experts as Hugging Face ships them, kept as ggml's MXFP4 blocks.

config.json carries quantization_config {"quant_method": "mxfp4", "modules_to_not_convert": [...]}
and each quantized expert projection `p` (transformers' GptOssExperts: `...mlp.experts.gate_up_proj`
and `...mlp.experts.down_proj`) is a pair

  p_blocks  uint8 [E, N, K / 32, 16]  FP4 E2M1 codes, two a byte: value 2i in byte i's low
                                      nibble, value 2i + 1 in its high one
  p_scales  uint8 [E, N, K / 32]      E8M0 exponents; weight = e2m1(code) * 2^(scale - 127)

for an [N, K] matrix per expert (N outputs, K inputs: transformers' convert_moe_packed_tensors
returns its transpose). gate_up_proj interleaves its rows: gate is rows 0, 2, 4, ..., up rows
1, 3, 5, ... (GptOssExperts' gate_up[..., ::2], gate_up[..., 1::2]).

ggml's MXFP4 block (kernels/ggml_quant.py) holds the same 32 values with the same exponent: one
scale byte, then 16 bytes pairing value j (low nibble) with value j + 16 (high), so the conversion
moves nibbles and nothing else: the values are not re-quantized, and dequantizing either gives the
same float32 tensor (ggml's 2 * e2m1 times 2^(e - 128) is e2m1 * 2^(e - 127) exactly; llama.cpp's
convert_hf_to_gguf.py re-packs gpt-oss the same way). The experts then stream at 17 bytes per 32
weights through the GGML GEMV and the fused MoE kernel.
"""

from __future__ import annotations

from typing import Iterator

import torch

from tacit.kernels.ggml_quant import MXFP4, QK, GGMLExpertStack

BLOCKS_SUFFIX = "_blocks"
SCALES_SUFFIX = "_scales"
_PARTS = (BLOCKS_SUFFIX, SCALES_SUFFIX)


def mxfp4_ggml_blocks(blocks: torch.Tensor, scales: torch.Tensor, name: str = "mxfp4") -> torch.Tensor:
    """HF's uint8 [..., N, K / 32, 16] codes and [..., N, K / 32] exponents -> ggml MXFP4 blocks,
    uint8 [..., N, K / 32 * 17], of the same values."""
    if blocks.dtype != torch.uint8 or blocks.dim() < 3 or blocks.shape[-1] != QK // 2:
        raise ValueError(
            f"{name}{BLOCKS_SUFFIX}: uint8 [..., N, K / 32, 16] (two FP4 codes a byte); "
            f"got {blocks.dtype} {list(blocks.shape)}"
        )
    if scales.dtype != torch.uint8 or tuple(scales.shape) != tuple(blocks.shape[:-1]):
        raise ValueError(
            f"{name}{SCALES_SUFFIX}: one uint8 exponent per 32-value block, {list(blocks.shape[:-1])}; "
            f"got {scales.dtype} {list(scales.shape)}"
        )
    values = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(*blocks.shape[:-1], QK)  # value order
    qs = values[..., : QK // 2] | (values[..., QK // 2 :] << 4)  # byte j: value j low, j + 16 high
    out = torch.cat([scales.unsqueeze(-1), qs], dim=-1)  # [..., N, K / 32, 17]
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * (1 + QK // 2)).contiguous()


def mxfp4_expert_stack(blocks: torch.Tensor, scales: torch.Tensor, name: str = "mxfp4") -> GGMLExpertStack:
    """An expert projection's HF pair, [E, N, K / 32, 16] and [E, N, K / 32] -> one MXFP4
    GGMLExpertStack of shape (E, N, K), each expert's [N, K] matrix in its blocks."""
    if blocks.dim() != 4:
        raise ValueError(f"{name}{BLOCKS_SUFFIX}: an expert stack is [E, N, K / 32, 16]; got {list(blocks.shape)}")
    e, n, nb, _ = blocks.shape
    return GGMLExpertStack(mxfp4_ggml_blocks(blocks, scales, name), MXFP4, (e, n, nb * QK))


def split_gate_up(stack: GGMLExpertStack) -> tuple[GGMLExpertStack, GGMLExpertStack]:
    """gpt-oss's interleaved gate_up_proj stack (E, 2 * I, K) -> (gate, up), each (E, I, K): its
    even and odd rows (blocks never cross a row, so rows are selected as they lie)."""
    e, rows, k = stack.shape
    if rows % 2:
        raise ValueError(f"gate_up_proj experts {stack.shape}: gate and up interleave, so the rows must be even")
    gate, up = stack.data[:, 0::2].contiguous(), stack.data[:, 1::2].contiguous()
    return (
        GGMLExpertStack(gate, stack.ggml_type, (e, rows // 2, k)),
        GGMLExpertStack(up, stack.ggml_type, (e, rows // 2, k)),
    )


def expert_stacks(prefix: str, proj: str, stack: GGMLExpertStack) -> list[tuple[str, GGMLExpertStack]]:
    """`{prefix}.gate_up_proj` or `{prefix}.down_proj` as the stacks FusedMoE.load_expert_stack
    takes, named as a GGUF's are: `{prefix}.gate_proj.weight`, `.up_proj.weight`, `.down_proj.weight`."""
    if proj == "gate_up_proj":
        gate, up = split_gate_up(stack)
        return [(f"{prefix}.gate_proj.weight", gate), (f"{prefix}.up_proj.weight", up)]
    if proj == "down_proj":
        return [(f"{prefix}.down_proj.weight", stack)]
    raise ValueError(f"{prefix}.{proj}: MXFP4 experts are gate_up_proj or down_proj (gpt-oss's); got {proj!r}")


def mxfp4_weight_names(keys: list[str]) -> dict[str, int]:
    """{name mxfp4_converted yields: MXFP4} for each `p_blocks` among a checkpoint's tensor names."""
    out = {}
    for key in keys:
        if key.endswith(BLOCKS_SUFFIX):
            prefix, _, proj = key.removesuffix(BLOCKS_SUFFIX).rpartition(".")
            projs = ("gate_proj", "up_proj") if proj == "gate_up_proj" else (proj,)
            out.update({f"{prefix}.{p}.weight": MXFP4 for p in projs})
    return out


def mxfp4_converted(
    tensors: Iterator[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor | GGMLExpertStack]]:
    """The checkpoint's tensors with each `p_blocks` + `p_scales` pair yielded, as soon as its second
    half streams by, as MXFP4 expert stacks (expert_stacks' names); every other tensor as it is."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        part = next((s for s in _PARTS if name.endswith(s)), None)
        if part is None:
            yield name, tensor
            continue
        base = name.removesuffix(part)
        parts = pending.setdefault(base, {})
        parts[part] = tensor
        if len(parts) == 2:
            del pending[base]
            prefix, _, proj = base.rpartition(".")
            yield from expert_stacks(prefix, proj, mxfp4_expert_stack(parts[BLOCKS_SUFFIX], parts[SCALES_SUFFIX], base))
    if pending:
        missing = [base + s for base, parts in pending.items() for s in _PARTS if s not in parts]
        raise ValueError(f"MXFP4 checkpoint is missing {', '.join(sorted(missing)[:8])}")
