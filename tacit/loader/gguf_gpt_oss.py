"""OpenAI's gpt-oss in llama.cpp's `gpt-oss` GGUF layout, both ways: HF checkpoint -> GGUF
tensors and metadata (gguf_writer.py), GGUF -> the config keys and HF-named tensors that
models/gpt_oss.py loads (gguf_file.py).

The layout is what llama.cpp's converter writes (convert_hf_to_gguf.py GptOssModel) and its
`gpt-oss` graph reads:
- post_attention_layernorm is `post_attention_norm` (not llama's ffn_norm);
- each head's sink logit is `attn_sinks.weight` [heads], float32;
- the router is `ffn_gate_inp`, with its bias;
- HF's gate_up_proj [E, H, 2I] (gate and up interleaved as even / odd columns) is split into
  ffn_gate_exps / ffn_up_exps [E, I, H], its bias into their .bias [E, I]; down_proj
  [E, I, H] is transposed to ffn_down_exps [E, H, I], its bias is ffn_down_exps.bias [E, H];
- metadata: expert_count, expert_used_count, expert_feed_forward_length (= intermediate_size),
  sliding_window, and the YaRN keys.
What the file cannot say, llama.cpp's graph fixes: layer i slides when i is even
(set_swa_pattern(2)), the clamped SwiGLU's alpha 1.702 and limit 7.0, softmax over the top-k
logits, YaRN without rounding its correction range (no GGUF key for transformers' `truncate`;
every gpt-oss checkpoint says false). The writer refuses a config that differs; the reader
sets them. llama.cpp itself rounds YaRN's correction range out to whole dimensions
(ggml_rope_yarn_corr_dims): on gpt-oss-20b's rope (head_dim 64, base 150000, original context
4096) its ramp spans dims 8..18 where transformers' spans 8.09..17.40, so llama.cpp on such a
file computes slightly otherwise than transformers on the checkpoint (tacit follows transformers).

MXFP4 experts: a float checkpoint's stacks are quantized to MXFP4 by export_hf_to_gguf's
ggml_types ({"_exps.weight": "MXFP4"}, the gguf package's quantizer) and load back through
gguf_moe_import.expert_tensors, kept as MXFP4 blocks (kernels/ggml_quant.MXFP4). Writing a GGUF
from an HF MXFP4 checkpoint (OpenAI's release) would repack its `*_blocks` / `*_scales` pairs
(loader/mxfp4_checkpoint.py) rather than requantize them: not built, refused in `gguf_tensors`
(tacit itself loads such a checkpoint directly).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import torch

ARCH = "gpt-oss"
HF_ARCH = "GptOssForCausalLM"
_ALPHA, _LIMIT = 1.702, 7.0  # llama.cpp's gpt-oss graph: ggml_swiglu_oai(..., 1.702f, 7.0f)
_LAYER_TYPES = ("sliding_attention", "full_attention")

# HF module inside a decoder layer -> llama.cpp tensor (the .weight/.bias suffix carries over).
LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.router": "ffn_gate_inp",
}
LAYER_HF = {v: k for k, v in LAYER.items()}  # the reader's direction
SINKS = "attn_sinks"
_STACKS = {"gate": "ffn_gate_exps", "up": "ffn_up_exps", "down": "ffn_down_exps"}
BIAS_STACKS = {v: k for k, v in _STACKS.items()}  # "ffn_gate_exps" -> "gate"

Meta = Callable[..., Any]  # GGUFFile._meta / _size, as in gguf_moe_import


def _rope(cfg: dict) -> dict:
    return {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}


def _layer_types(cfg: dict) -> list[str]:
    n = cfg["num_hidden_layers"]
    return list(cfg.get("layer_types") or [_LAYER_TYPES[i % 2] for i in range(n)])


def check_exportable(cfg: dict, where: str) -> None:
    """Refuse what llama.cpp's gpt-oss graph would compute differently from this config."""
    types = _layer_types(cfg)
    want = [_LAYER_TYPES[i % 2] for i in range(len(types))]
    if types != want:
        raise ValueError(
            f"{where}: llama.cpp's gpt-oss slides on even layers and attends fully on odd ones; layer_types={types}"
        )
    alpha, limit = float(cfg.get("swiglu_alpha", _ALPHA)), float(cfg.get("swiglu_limit", _LIMIT))
    if (alpha, limit) != (_ALPHA, _LIMIT):
        raise ValueError(
            f"{where}: llama.cpp's gpt-oss fixes swiglu_alpha={_ALPHA}, swiglu_limit={_LIMIT}; got {alpha}, {limit}"
        )
    rope = _rope(cfg)
    if rope.get("rope_type", rope.get("type")) == "yarn" and rope.get("truncate", True):
        raise ValueError(
            f"{where}: YaRN with truncate=true (rounded correction range): a gpt-oss GGUF has no key for it "
            "and loads as gpt-oss's truncate=false"
        )


def write_metadata(w: Any, cfg: dict) -> None:
    """gpt-oss's keys beyond the llama family's common ones (the caller writes those)."""
    import gguf

    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_head_count_kv(cfg.get("num_key_value_heads", heads))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_expert_count(int(cfg["num_local_experts"]))
    w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
    w.add_expert_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_sliding_window(int(cfg["sliding_window"]))
    rope = _rope(cfg)
    if rope.get("rope_type", rope.get("type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        w.add_rope_scaling_yarn_beta_fast(float(rope.get("beta_fast") or 32.0))
        w.add_rope_scaling_yarn_beta_slow(float(rope.get("beta_slow") or 1.0))


def gguf_tensors(items: Iterable[tuple[str, torch.Tensor]], cfg: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor) for a gpt-oss checkpoint's layer tensors; globals pass through."""
    for name, tensor in items:
        parts = name.split(".")
        if len(parts) < 5 or parts[0] != "model" or parts[1] != "layers":
            yield name, tensor  # a global tensor: the caller's table
            continue
        blk, inner = f"blk.{parts[2]}", ".".join(parts[3:])
        if inner.endswith(("_blocks", "_scales")):
            raise ValueError(
                f"{name}: an MXFP4 checkpoint's experts; export from bf16 experts (quantize them to MXFP4 "
                'with ggml_types={"_exps.weight": "MXFP4"}) until its blocks are repacked here'
            )
        if inner == "self_attn.sinks":
            yield f"{blk}.{SINKS}.weight", tensor
        elif inner == "mlp.experts.gate_up_proj":
            w = tensor.transpose(1, 2)  # [E, 2I, H]: rows interleaved gate, up
            yield f"{blk}.{_STACKS['gate']}.weight", w[:, 0::2].contiguous()
            yield f"{blk}.{_STACKS['up']}.weight", w[:, 1::2].contiguous()
        elif inner == "mlp.experts.gate_up_proj_bias":
            yield f"{blk}.{_STACKS['gate']}.bias", tensor[:, 0::2].contiguous()
            yield f"{blk}.{_STACKS['up']}.bias", tensor[:, 1::2].contiguous()
        elif inner == "mlp.experts.down_proj":
            yield f"{blk}.{_STACKS['down']}.weight", tensor.transpose(1, 2).contiguous()
        elif inner == "mlp.experts.down_proj_bias":
            yield f"{blk}.{_STACKS['down']}.bias", tensor
        elif inner.rsplit(".", 1)[0] in LAYER:
            module, suffix = inner.rsplit(".", 1)
            yield f"{blk}.{LAYER[module]}.{suffix}", tensor


def hf_config(meta: Meta, size: Meta, rope_scaling: dict | None) -> dict[str, Any]:
    """The config keys of a gpt-oss GGUF beyond the llama family's (GGUFFile.hf_config)."""
    layers = size("block_count")
    cfg: dict[str, Any] = {
        "num_local_experts": size("expert_count"),
        "num_experts_per_tok": size("expert_used_count"),
        "intermediate_size": size("expert_feed_forward_length"),
        "sliding_window": size("attention.sliding_window"),
        "layer_types": [_LAYER_TYPES[i % 2] for i in range(layers)],
        "swiglu_alpha": _ALPHA,
        "swiglu_limit": _LIMIT,
        "attention_bias": True,
    }
    if rope_scaling is not None and rope_scaling["rope_type"] == "yarn":
        cfg["rope_scaling"] = {
            **rope_scaling,
            "beta_fast": float(meta("rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(meta("rope.scaling.yarn_beta_slow", 1.0)),
            "truncate": False,
        }
    return cfg


class BiasJoiner:
    """The gate and up bias stacks [E, I] of a layer, held until both arrived, become HF's
    interleaved gate_up_proj_bias [E, 2I]; the down bias passes as down_proj_bias."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, layer: str, stack: str, bias: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        prefix = f"model.layers.{layer}.mlp.experts"
        which = BIAS_STACKS[stack]
        if which == "down":
            return f"{prefix}.down_proj_bias", bias
        got = self.pending.setdefault(layer, {})
        got[which] = bias
        if len(got) < 2:
            return None
        del self.pending[layer]
        return f"{prefix}.gate_up_proj_bias", torch.stack([got["gate"], got["up"]], -1).flatten(-2)

    def check_done(self, path: str) -> None:
        for layer, got in self.pending.items():
            (have,) = got
            missing = _STACKS["up" if have == "gate" else "gate"]
            raise ValueError(f"{path}: blk.{layer}.{_STACKS[have]}.bias has no blk.{layer}.{missing}.bias beside it")
