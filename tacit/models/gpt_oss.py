"""gpt-oss (OpenAI's gpt-oss-20b / -120b): GQA with q/k/v/o biases and a learned sink logit per
head, sliding-window (128) and full layers alternating, YaRN rope, and an MoE whose router has
a bias and whose experts have biases and a clamped SwiGLU (kernels/torch_moe.py gate_activation).

transformers' gpt_oss is the reference. Its checkpoint keeps each layer's experts as stacks:
gate_up_proj [E, H, 2I] with gate and up interleaved as even / odd columns, gate_up_proj_bias
[E, 2I] interleaved alike, down_proj [E, I, H], down_proj_bias [E, H]; they load into FusedMoE's
[E, 2I, H] (gate rows, then up rows) and [E, H, I]. OpenAI's release ships the two weight stacks
in MXFP4 (`*_blocks` / `*_scales` pairs, quantization_config quant_method "mxfp4"): the loader
re-packs each pair into MXFP4 expert stacks named as a GGUF's (loader/mxfp4_checkpoint.py), kept
in their 17-byte blocks (4.25 bits a weight) and loaded as the other MoE models load GGUF stacks.
A llama.cpp `gpt-oss` GGUF (loader/gguf_gpt_oss.py) gives the stacks per projection, float or
GGML blocks (FusedMoE.load_expert_stack), and the biases as HF's stacks.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.communicator import Communicator
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.kernels.ggml_quant import GGMLExpertStack
from tacit.kernels.moe_kernel import ExpertActivation
from tacit.kernels.moe_routing import MoERouting
from tacit.layers.attention import Attention
from tacit.layers.linear import Linear
from tacit.layers.moe import FusedMoE
from tacit.models.base import CausalLM
from tacit.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaModel
from tacit.models.qwen3_moe import load_expert_tensor

LAYER_TYPES = ("sliding_attention", "full_attention")
# HF's stacked expert tensors: "model.layers.{i}.mlp.experts.{gate_up_proj,down_proj}[_bias]".
_STACK = re.compile(r"^(.*\.mlp)\.experts\.(gate_up_proj|down_proj)(_bias)?$")
_SINKS = re.compile(r"^(.*\.self_attn)\.sinks$")


def layer_types(cfg: ModelConfig) -> list[str]:
    """config.json's layer_types, or transformers' default when it has none: sliding first,
    then alternating (GptOssConfig.__post_init__)."""
    n = cfg.num_layers
    types = cfg.hf.get("layer_types") or [LAYER_TYPES[i % 2] for i in range(n)]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise ValueError(
            f"{cfg.path}: layer_types={types!r} must name each of the {n} layers one of {', '.join(LAYER_TYPES)}"
        )
    return list(types)


class GptOssAttention(LlamaAttention):
    """Llama's GQA with biases on q/k/v/o and gpt-oss's sinks; a sliding layer attends to each
    query's last `sliding_window` positions. Under tensor parallelism each rank holds its heads'
    sinks (checkpoint_shards)."""

    def __init__(self, cfg: ModelConfig, layer_type: str, tp: TensorParallel = SINGLE) -> None:
        super().__init__(cfg, qkv_bias=True, o_bias=True, qk_norm=False, tp=tp)
        self.tp = tp
        # As transformers: a sliding layer with no sliding_window in the config attends to all.
        window = cfg.hf.get("sliding_window") if layer_type == "sliding_attention" else None
        self.attn = Attention(
            self.num_heads, self.head_dim, self.num_kv_heads, self.head_dim**-0.5, sliding_window=window, sinks=True
        )

    def checkpoint_shards(self, name: str) -> dict[str, tuple[int, int, int]]:
        start, n = self.tp.part(self.num_heads * self.tp.size, "num_attention_heads")
        return {f"{name}.sinks": (0, start, n)}


class GptOssMLP(nn.Module):
    """The router (a biased linear, whole on every rank) and the experts. Routing is top-k of
    the logits, softmax over the k: the same weights as softmax over all experts renormalized
    over the top k, which is the softmax routing rule (kernels/moe_routing.py)."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        hf = cfg.hf
        self.tp = tp
        experts, hidden, inter = int(hf["num_local_experts"]), hf["hidden_size"], hf["intermediate_size"]
        self.router = Linear(hidden, experts, bias=True)
        activation = ExpertActivation(
            "swigluoai", alpha=float(hf.get("swiglu_alpha", 1.702)), limit=float(hf.get("swiglu_limit", 7.0))
        )
        routing = MoERouting(int(hf["num_experts_per_tok"]), "softmax", renormalize=True)
        self.experts = FusedMoE(experts, hidden, inter, routing, tp=tp, activation=activation, has_bias=True)

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        # The router product in the model's dtype, as transformers computes it; top-k and softmax in float32.
        logits = F.linear(x, self.router.weight, self.router.bias)
        return self.experts(x, logits, reduce=reduce)

    def checkpoint_shards(self, name: str) -> dict[str, tuple[int, int, int] | None]:
        """Each rank reads its part of the four stacks: its experts (by expert), or every
        expert's features [start, start + n), which in the interleaved gate_up columns are the
        contiguous [2 start, 2 (start + n)). down_proj_bias is read whole (FusedMoE.load_stacked)."""
        m, base = self.experts, f"{name}.experts"
        if m.expert_parallel:
            part = (0, m.expert_start, m.num_local_experts)
            return {f"{base}.{t}": part for t in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")}
        start, n = m.tp.part(m.full_intermediate_size, "intermediate_size")
        return {
            f"{base}.gate_up_proj": (2, 2 * start, 2 * n),
            f"{base}.gate_up_proj_bias": (1, 2 * start, 2 * n),
            f"{base}.down_proj": (1, start, n),
        }

    def load_stack(self, proj: str, bias: bool, tensor: torch.Tensor) -> str:
        """One of transformers' stacks (this rank's part) into FusedMoE's layout; -> the parameter filled."""
        experts = self.experts
        # The biases' own dtype: under an MXFP4 checkpoint w13 / w2 hold GGML blocks (uint8).
        dtype = experts.w13_bias.dtype if bias else experts.w13.dtype
        if proj == "gate_up_proj":
            # Even columns gate, odd columns up -> gate rows, then up rows.
            if bias:
                experts.load_stacked("w13_bias", torch.cat([tensor[..., 0::2], tensor[..., 1::2]], -1).to(dtype))
                return "w13_bias"
            halves = [tensor[..., 0::2].transpose(1, 2), tensor[..., 1::2].transpose(1, 2)]
            experts.load_stacked("w13", torch.cat(halves, 1).to(dtype))
            return "w13"
        if bias:
            experts.load_stacked("w2_bias", tensor.to(dtype))
            return "w2_bias"
        experts.load_stacked("w2", tensor.transpose(1, 2).to(dtype))
        return "w2"


class GptOssForCausalLM(CausalLM):
    supports_tensor_parallel = True
    # The router: F.linear over its weight and bias in GptOssMLP. The experts: their checkpoint
    # stacks are not the per-expert matrices --quantization int8/int4 quantizes as they load
    # (models/quantize_at_load.py), so those quantize the attention and leave the experts in
    # the model's dtype.
    dense_weight_linears = ("mlp.router", "mlp.experts")

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        if cfg.expert_cache_memory is not None:
            raise ValueError("expert_cache_memory: gpt-oss's experts (stacks with biases) do not stream; drop it")
        self.tp = tp
        self.comm: Communicator | None = None  # the tensor-parallel group's (layers/linear.use_communicator)
        types = layer_types(cfg)

        def make_layer(i: int) -> nn.Module:
            return LlamaDecoderLayer(cfg, GptOssAttention(cfg, types[i], tp.attention), GptOssMLP(cfg, tp), tp)

        self.model = LlamaModel(cfg, make_layer, rotary_dim=cfg.head_dim, tp=tp)
        self._init_head(cfg, tp)

    def weight_hook(self, name: str, tensor: torch.Tensor | GGMLExpertStack) -> str | None:
        if name.endswith(("_blocks", "_scales")):  # a pair the config did not declare mxfp4
            raise ValueError(
                f"{name}: an MXFP4 expert tensor in a checkpoint whose config.json has no quantization_config "
                "quant_method 'mxfp4'"
            )
        sinks = _SINKS.match(name)
        if sinks is not None:
            attn = self.get_submodule(sinks.group(1)).attn
            if tuple(tensor.shape) != tuple(attn.sinks.shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)}, the model expects {tuple(attn.sinks.shape)}")
            with torch.no_grad():
                attn.sinks.copy_(tensor)
            return f"{sinks.group(1)}.attn.sinks"
        # Stacks per projection: a GGUF's (loader/gguf_gpt_oss.py) or an MXFP4 checkpoint's, re-packed.
        filled = load_expert_tensor(self, name, tensor)
        if filled is not None:
            return filled
        stack = _STACK.match(name)
        if stack is not None:
            mlp, proj, bias = stack.groups()
            filled = self.get_submodule(mlp).load_stack(proj, bias is not None, tensor)
            return f"{mlp}.experts.{filled}"
        return super().weight_hook(name, tensor)
