"""Qwen3-MoE: Qwen3 attention (q/k norm) with softmax top-k routed experts."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.kernels.ggml_quant import GGMLExpertStack
from tacit.kernels.moe_routing import MoERouting
from tacit.layers.linear import Linear
from tacit.layers.moe import FusedMoE
from tacit.models.llama import LlamaMLP, Qwen3ForCausalLM

_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(?:(\d+)\.)?(gate_proj|up_proj|down_proj)\.weight$")


def load_expert_tensor(model: nn.Module, name: str, tensor: torch.Tensor | GGMLExpertStack) -> str | None:
    """Route HF's per-expert tensors, or a GGUF's whole stack of one projection
    (`...experts.{proj}.weight`, GGMLExpertStack), into the stacked FusedMoE parameters."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    try:
        experts: FusedMoE = model.get_submodule(m.group(1))
    except AttributeError:
        return None  # e.g. DeepSeek's MTP layer past num_hidden_layers: not part of this model
    proj = m.group(3)
    if isinstance(tensor, GGMLExpertStack):
        experts.load_expert_stack(proj, tensor)
    elif m.group(2) is None:
        raise ValueError(f"{name}: a stack of all experts comes as GGML blocks; got {type(tensor).__name__}")
    else:
        experts.load_expert_weight(int(m.group(2)), proj, tensor)
    return m.group(1) + (".w2" if proj == "down_proj" else ".w13")


class Qwen3MoeSparseBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        hf = cfg.hf
        routing = MoERouting(int(hf["num_experts_per_tok"]), "softmax", bool(hf.get("norm_topk_prob", False)))
        # The router is whole on every rank: each routes every token the same way.
        self.gate = Linear(hf["hidden_size"], hf["num_experts"], bias=False)
        self.experts = FusedMoE(hf["num_experts"], hf["hidden_size"], hf["moe_intermediate_size"], routing, tp=tp)

    correction_bias = None

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        # The router product in the model's dtype, as HF's Qwen3-MoE computes it; softmax and
        # top-k run in float32 inside the kernel.
        return F.linear(x, self.gate.weight)

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        return self.experts(x, self.router_logits(x), reduce=reduce)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    dense_weight_linears = ("mlp.gate",)  # the router: F.linear over its weight in Qwen3MoeSparseBlock

    def make_mlp(self, cfg: ModelConfig, layer_idx: int) -> nn.Module:
        hf = cfg.hf
        sparse = (
            layer_idx not in (hf.get("mlp_only_layers") or [])
            and hf.get("num_experts", 0) > 0
            and (layer_idx + 1) % int(hf.get("decoder_sparse_step", 1)) == 0
        )
        if sparse:
            return Qwen3MoeSparseBlock(cfg, self.tp)
        return LlamaMLP(hf["hidden_size"], hf["intermediate_size"], tp=self.tp)

    def weight_hook(self, name: str, tensor: torch.Tensor) -> str | None:
        return load_expert_tensor(self, name, tensor) or super().weight_hook(name, tensor)
