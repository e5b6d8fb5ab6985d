"""HF Qwen3-MoE and DeepSeek-V3 checkpoints in llama.cpp's `qwen3moe` and `deepseek2` GGUF layouts.

The metadata keys and tensor layouts are those llama.cpp's convert_hf_to_gguf.py writes and
its loader reads: each layer's experts stacked per projection as [experts, rows, cols], and
MLA's kv_b_proj split per head into k_b / v_b (the form llama.cpp's absorbed-MLA path needs;
with it the K/V cache holds the compressed latent, as tacit's does).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from tacit.loader.gguf_moe_names import EXPERT_STACKS, K_B, MOE_LAYER, ROUTER_BIAS_GGUF, ROUTER_BIAS_HF, V_B

MOE_ARCHS = {"Qwen3MoeForCausalLM": "qwen3moe", "DeepseekV3ForCausalLM": "deepseek2"}


def _num_experts(cfg: dict) -> int:
    # transformers 5 saves Qwen3-MoE's num_experts as num_local_experts (config/model.py's aliases).
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        if cfg.get(key):
            return int(cfg[key])
    raise ValueError("the config gives no expert count (num_experts / n_routed_experts / num_local_experts)")


def check_exportable(arch: str, cfg: dict, where: str) -> None:
    """Refuse what llama.cpp's graph for the arch cannot express, rather than write a file it
    would load and then compute differently (or not load)."""
    if arch == "qwen3moe":
        # llama.cpp's qwen3moe graph runs a MoE block in every layer, with top-k weights renormalized.
        dense = cfg.get("mlp_only_layers") or []
        step = int(cfg.get("decoder_sparse_step") or 1)
        if dense or step != 1:
            raise ValueError(
                f"{where}: llama.cpp's qwen3moe has experts in every layer; this model has dense layers "
                f"(mlp_only_layers={dense}, decoder_sparse_step={step})"
            )
        if not cfg.get("norm_topk_prob", False):
            raise ValueError(
                f"{where}: llama.cpp's qwen3moe always renormalizes the top-k weights; norm_topk_prob=false"
            )
    elif arch == "deepseek2":
        if not int(cfg.get("n_shared_experts") or 0):
            raise ValueError(
                f"{where}: llama.cpp's deepseek2 runs a shared expert in every MoE layer; n_shared_experts=0"
            )
        scoring = cfg.get("scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise ValueError(f"{where}: scoring_func={scoring!r}; tacit exports DeepSeek-V3's sigmoid routing only")


def write_moe_metadata(w: Any, arch: str, cfg: dict) -> None:
    """The arch's attention-shape and MoE keys (the caller writes the llama-family common ones)."""
    import gguf

    heads = cfg["num_attention_heads"]
    w.add_expert_count(_num_experts(cfg))
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch == "qwen3moe":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        w.add_head_count_kv(cfg.get("num_key_value_heads", heads))
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
        return
    rank, rope_dim = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    # Absorbed MLA is multi-query attention over the latent: one KV head of kv_lora_rank + rope
    # values; the per-head sizes that k_b / v_b expand it to go in the _mla keys.
    w.add_head_count_kv(1)
    w.add_key_length(rank + rope_dim)
    w.add_value_length(rank)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope_dim)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_kv_lora_rank(rank)
    # 0 for none (q_proj instead of q_a/q_b): llama.cpp requires the key whatever the rank.
    w.add_q_lora_rank(int(cfg.get("q_lora_rank") or 0))
    w.add_rope_dimension_count(rope_dim)
    w.add_leading_dense_block_count(int(cfg.get("first_k_dense_replace") or 0))
    w.add_expert_shared_count(int(cfg["n_shared_experts"]))
    w.add_expert_weights_scale(float(cfg.get("routed_scaling_factor", 1.0)))
    w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", True)))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(int(cfg.get("n_group") or 1))
    w.add_expert_group_used_count(int(cfg.get("topk_group") or 1))
    rope = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    if rope.get("rope_type", rope.get("type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        # llama.cpp divides this by 0.1 again ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]): it is mscale_all_dim.
        w.add_rope_scaling_yarn_log_mul(0.1 * float(rope.get("mscale_all_dim") or 0.0))
        if rope.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(float(rope["beta_fast"]))
        if rope.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(float(rope["beta_slow"]))


def split_kv_b(w: torch.Tensor, heads: int, nope: int, v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj [heads * (nope + v), rank] -> k_b [heads, rank, nope], v_b [heads, v, rank]."""
    per_head = w.reshape(heads, nope + v_dim, w.shape[-1])
    return per_head[:, :nope].transpose(1, 2).contiguous(), per_head[:, nope:].contiguous()


def moe_gguf_tensors(
    items: Iterable[tuple[str, torch.Tensor]], cfg: dict, arch: str, layer_names: dict[str, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor) for a MoE checkpoint's tensors: layer_names maps the llama-family
    modules, MOE_LAYER the rest; each expert stack comes out once all its experts were read."""
    names = {**layer_names, **MOE_LAYER}
    num_experts = _num_experts(cfg)
    pending: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, tensor in items:
        parts = name.split(".")
        if len(parts) < 5 or parts[0] != "model" or parts[1] != "layers":
            yield name, tensor  # a global tensor: the caller's table
            continue
        layer = parts[2]
        if int(layer) >= cfg["num_hidden_layers"]:
            continue  # DeepSeek's multi-token-prediction layer: llama.cpp's graph does not run it
        inner = ".".join(parts[3:-1])
        if parts[3:5] == ["mlp", "experts"] and len(parts) == 8 and parts[6] in EXPERT_STACKS:
            got = pending.setdefault((layer, parts[6]), {})
            got[int(parts[5])] = tensor
            if len(got) == num_experts:
                del pending[(layer, parts[6])]
                yield f"blk.{layer}.{EXPERT_STACKS[parts[6]]}.weight", torch.stack([got[e] for e in range(num_experts)])
        elif ".".join(parts[3:]) == ROUTER_BIAS_HF:
            yield f"blk.{layer}.{ROUTER_BIAS_GGUF}", tensor
        elif inner == "self_attn.kv_b_proj":
            k_b, v_b = split_kv_b(tensor, cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"])
            yield f"blk.{layer}.{K_B}.weight", k_b
            yield f"blk.{layer}.{V_B}.weight", v_b
        elif inner in names:
            yield f"blk.{layer}.{names[inner]}.{parts[-1]}", tensor
    if pending:
        (layer, proj), got = next(iter(pending.items()))
        raise ValueError(f"layer {layer} has {len(got)} of {num_experts} experts' {proj} in the checkpoint")
