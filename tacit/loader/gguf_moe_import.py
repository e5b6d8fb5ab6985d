"""llama.cpp's `qwen3moe` / `deepseek2` GGUF files -> the config keys and HF-named tensors that
tacit's Qwen3MoeForCausalLM and DeepseekV3ForCausalLM load.

Config: the MoE and MLA keys, each required one named in the error when absent. Tensors: each
[experts, rows, cols] expert stack becomes one GGMLExpertStack or its experts' HF tensors
(`expert_tensors`), and MLA's per-head k_b / v_b pair becomes kv_b_proj again (`KVBJoiner`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import torch

from tacit.kernels.ggml_quant import GGML_TYPES, GGMLExpertStack
from tacit.loader.gguf_moe_names import EXPERT_STACKS, K_B, V_B

MOE_ARCHS = {"qwen3moe": "Qwen3MoeForCausalLM", "deepseek2": "DeepseekV3ForCausalLM"}
_GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's llama_expert_gating_func_type
STACK_PROJ = {v: k for k, v in EXPERT_STACKS.items()}  # "ffn_gate_exps" -> "gate_proj"

Meta = Callable[..., Any]  # GGUFFile._meta: (key after the arch prefix, default) -> value
Size = Callable[..., int]  # GGUFFile._size: the same, checked as a size; no default: required


def moe_hf_config(arch: str, path: str, meta: Meta, size: Size, heads: int) -> dict[str, Any]:
    """The HF config keys of a MoE GGUF beyond the llama family's (GGUFFile.hf_config)."""
    gating = meta("expert_gating_func")
    cfg: dict[str, Any] = {
        "num_experts_per_tok": size("expert_used_count"),
        "moe_intermediate_size": size("expert_feed_forward_length"),
    }
    experts = size("expert_count")
    if arch == "qwen3moe":
        # llama.cpp's qwen3moe graph: softmax, top-k renormalized, experts in every layer.
        if gating is not None and gating != 1:
            raise ValueError(
                f"{path}: {arch}.expert_gating_func={gating} ({_GATING.get(gating, 'unknown')}); qwen3moe routes by softmax"
            )
        return {**cfg, "num_experts": experts, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
    if gating != 2:
        # Absent means softmax to llama.cpp (DeepSeek-V2's files); tacit runs V3's sigmoid routing only.
        got = "absent (softmax to llama.cpp)" if gating is None else f"{gating} ({_GATING.get(gating, 'unknown')})"
        raise ValueError(
            f"{path}: {arch}.expert_gating_func is {got}; tacit runs DeepSeek-V3's sigmoid routing (2) only"
        )
    rope_dim = size("rope.dimension_count")
    if meta("attention.key_length_mla") is not None:
        key_len, v_dim = size("attention.key_length_mla"), size("attention.value_length_mla")
    else:  # older files: kv_b whole, the per-head sizes in the plain keys
        key_len, v_dim = size("attention.key_length"), size("attention.value_length")
    if key_len <= rope_dim:
        raise ValueError(f"{path}: {arch} key length {key_len} leaves no room beside rope.dimension_count={rope_dim}")
    groups, used_groups = size("expert_group_count", 1), size("expert_group_used_count", 1)
    if experts % groups or used_groups > groups:
        raise ValueError(
            f"{path}: {arch}.expert_group_count={groups} / expert_group_used_count={used_groups} "
            f"do not split expert_count={experts} into groups"
        )
    dense = meta("leading_dense_block_count", 0)
    if not isinstance(dense, int) or isinstance(dense, bool) or dense < 0:
        raise ValueError(f"{path}: {arch}.leading_dense_block_count={dense!r} is invalid: must be an integer >= 0")
    q_lora = meta("attention.q_lora_rank", 0)
    return {
        **cfg,
        "n_routed_experts": experts,
        "n_shared_experts": size("expert_shared_count"),
        "n_group": groups,
        "topk_group": used_groups,
        "norm_topk_prob": bool(meta("expert_weights_norm", False)),  # llama.cpp's default too
        "routed_scaling_factor": float(meta("expert_weights_scale", 1.0)),
        "first_k_dense_replace": dense,
        "q_lora_rank": size("attention.q_lora_rank") if q_lora else None,  # 0: q_proj, no LoRA
        "kv_lora_rank": size("attention.kv_lora_rank"),
        "qk_rope_head_dim": rope_dim,
        "qk_nope_head_dim": key_len - rope_dim,
        "v_head_dim": v_dim,
        "rope_interleave": True,  # llama.cpp's deepseek2 ropes adjacent pairs, as HF's interleaved mode
        # MLA caches one latent per token; HF's config has these per-head numbers.
        "num_key_value_heads": heads,
        "head_dim": rope_dim,
    }


def yarn_extras(meta: Meta) -> dict[str, float]:
    """deepseek2's yarn attention scale: llama.cpp's converter stores 0.1 * mscale_all_dim."""
    out: dict[str, float] = {}
    log_mul = meta("rope.scaling.yarn_log_multiplier")
    if log_mul:
        out["mscale"] = out["mscale_all_dim"] = float(log_mul) / 0.1
    for key in ("beta_fast", "beta_slow"):
        value = meta(f"rope.scaling.yarn_{key}")
        if value is not None:
            out[key] = float(value)
    return out


def expert_tensors(
    prefix: str, stack: str, shape: tuple[int, ...], ggml_type: int, data: np.ndarray
) -> Iterator[tuple[str, torch.Tensor | GGMLExpertStack]]:
    """One [experts, rows, cols] GGUF stack -> `{prefix}.experts.{proj}.weight`, a
    GGMLExpertStack, for a type tacit has kernels for (FusedMoE keeps or dequantizes it);
    otherwise `{prefix}.experts.{e}.{proj}.weight` float [rows, cols] per expert, one expert
    dequantized at a time."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if len(shape) != 3:
        raise ValueError(f"{prefix}: {stack} has shape {shape}; an expert stack is [experts, rows, cols]")
    proj = STACK_PROJ[stack]
    if ggml_type in GGML_TYPES:
        # A copy: the file is mapped read-only.
        yield f"{prefix}.experts.{proj}.weight", GGMLExpertStack(torch.from_numpy(np.array(data)), ggml_type, shape)
        return
    qtype = GGMLQuantizationType(ggml_type)
    for e in range(shape[0]):
        weight = torch.from_numpy(np.array(dequantize(data[e], qtype), dtype=np.float32))
        yield f"{prefix}.experts.{e}.{proj}.weight", weight.reshape(shape[1:])


def join_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """k_b [heads, rank, nope] + v_b [heads, v, rank] -> kv_b_proj [heads * (nope + v), rank]."""
    heads, rank, _ = k_b.shape
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, rank)


class KVBJoiner:
    """Holds each layer's k_b or v_b until its partner arrives (file order is the writer's)."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, layer: str, which: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        got = self.pending.setdefault(layer, {})
        got[which] = tensor
        if len(got) < 2:
            return None
        del self.pending[layer]
        return f"model.layers.{layer}.self_attn.kv_b_proj.weight", join_kv_b(got[K_B], got[V_B])

    def check_done(self, path: str) -> None:
        for layer, got in self.pending.items():
            (have,) = got
            missing = V_B if have == K_B else K_B
            raise ValueError(f"{path}: blk.{layer}.{have}.weight has no blk.{layer}.{missing}.weight beside it")
