"""DeepSeek-V3/R1 and Kimi-K2: multi-head latent attention (MLA) and sigmoid-routed MoE.

The KV cache keeps MLA's compressed latent (kv_lora_rank + rope dim per token, 576 values for
V3) instead of full K and V (2 * 128 heads * 192 = 49152): 85x less cache per token, which is
the point of MLA. How the latent is cached and attended is an MLA attention backend's job
(kernels/torch_mla_attention.py is the reference).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.communicator import Communicator
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.forward_context import get_attention_metadata
from tacit.kernels.attention_backend import AttentionBackend
from tacit.kernels.kv_quant import kv_row_width
from tacit.kernels.moe_kernel import ExpertWeights
from tacit.kernels.moe_routing import MoERouting
from tacit.kernels.torch_moe import TorchMoEKernel
from tacit.layers.ggml_linear_method import MixedGGMLLinearMethod, linear_ggml_type
from tacit.layers.kv_cache import KVCacheLayer
from tacit.layers.linear import ColumnParallelLinear, Linear, RowParallelLinear
from tacit.layers.moe import FusedMoE
from tacit.layers.norm import RMSNorm
from tacit.layers.rotary import RotaryEmbedding, yarn_mscale
from tacit.models.base import CausalLM
from tacit.models.llama import LlamaDecoderLayer, LlamaMLP, LlamaModel
from tacit.models.qwen3_moe import load_expert_tensor


class MLAAttention(nn.Module, KVCacheLayer):
    use_mla = True
    kv_block_dim = 0  # [num_blocks, block_size, kv_lora_rank + rope_dim (+ 2 x 4 scale bytes in int8)]

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        """With tensor parallelism each rank holds 1/N of the heads (q, kv_b_proj rows, o_proj
        columns); the latent projections are whole on every rank, so each rank caches the same
        latent: the cache is not split (one latent serves all heads). Under data-parallel
        attention the model passes tp.attention (SINGLE): each rank holds every head and caches
        only its own requests' latents, the cache split by request."""
        super().__init__()
        hf = cfg.hf
        hidden, full_heads = hf["hidden_size"], hf["num_attention_heads"]
        self.num_heads = tp.split(full_heads, "num_attention_heads")
        self.q_lora_rank = hf.get("q_lora_rank")
        self.kv_lora_rank, self.rope_dim = hf["kv_lora_rank"], hf["qk_rope_head_dim"]
        self.nope_dim, self.v_dim = hf["qk_nope_head_dim"], hf["v_head_dim"]
        self.qk_head_dim = self.nope_dim + self.rope_dim
        bias = bool(hf.get("attention_bias", False))
        eps = cfg.get("rms_norm_eps", 1e-6)
        heads = "num_attention_heads"
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, full_heads * self.qk_head_dim, False, tp, what=heads)
        else:
            self.q_a_proj = Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, full_heads * self.qk_head_dim, False, tp, what=heads)
        self.kv_a_proj_with_mqa = Linear(hidden, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps)
        kv_b_rows = full_heads * (self.nope_dim + self.v_dim)
        self.kv_b_proj = ColumnParallelLinear(self.kv_lora_rank, kv_b_rows, False, tp, what=heads)
        self.o_proj = RowParallelLinear(full_heads * self.v_dim, hidden, bias=bias, tp=tp, what=heads)
        self.scale = self.qk_head_dim**-0.5
        rope = cfg.rope
        if rope["rope_type"] != "default" and rope.get("mscale_all_dim"):
            m = yarn_mscale(rope["factor"], rope["mscale_all_dim"])
            self.scale *= m * m
        # Bound by the model runner: its selected MLA backend, and the cache once the pool is sized.
        self.backend: AttentionBackend | None = None
        self.kv_cache: torch.Tensor | None = None

    def kv_numel_per_token(self, dtype: torch.dtype) -> int:
        # In int8 the latent and the rotated key part are two rows with a scale each: k_pe is not
        # normed, so one scale across both would cost the normed latent its resolution.
        return kv_row_width(self.kv_lora_rank, dtype) + kv_row_width(self.rope_dim, dtype)

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        numel = self.kv_numel_per_token(dtype)
        self.kv_cache = torch.zeros(num_blocks, block_size, numel, dtype=dtype, device=device)

    def project(
        self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (q_resid [T, q_lora_rank], None without a q LoRA; q_nope [T, H, nope];
        rotated q_pe [T, H, rope]; the normed latent [T, rank]; rotated k_pe [T, rope]). DeepSeek-V3.2's
        indexer reads q_resid too (models/deepseek_v32.py)."""
        t, h = x.shape[0], self.num_heads
        q_resid = None if self.q_lora_rank is None else self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_proj(x) if q_resid is None else self.q_b_proj(q_resid)
        q_nope, q_pe = q.view(t, h, self.qk_head_dim).split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        q_pe, k_pe = rotary(q_pe, k_pe[:, None, :], cos, sin)
        return q_resid, q_nope, q_pe, latent, k_pe[:, 0]

    def forward(
        self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor, reduce: bool = True
    ) -> torch.Tensor:
        meta = get_attention_metadata()
        t, h = x.shape[0], self.num_heads
        _, q_nope, q_pe, latent, k_pe = self.project(x, rotary, cos, sin)

        self.backend.write_kv(self.kv_cache, latent, k_pe, meta)
        out = self.backend.forward(
            torch.cat([q_nope, q_pe], dim=-1), self.kv_cache, meta, self.scale, kv_b_proj=self.kv_b_proj.weight
        )
        return self.o_proj(out.reshape(t, h * self.v_dim), reduce=reduce)


class DeepseekV3Gate(nn.Module):
    # Routing in float32 as the reference does: bf16 sigmoid scores tie often enough to flip experts.
    keep_fp32 = True

    def __init__(self, num_experts: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts))


class DeepseekV3MoE(nn.Module):
    """Under tensor parallelism the routed experts split as FusedMoE says (by feature, or by
    expert), the shared expert always by feature; FusedMoE's one all-reduce sums both when the
    kernel fuses the shared expert, the shared MLP's own down_proj all-reduces when it runs apart."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        hf = cfg.hf
        num_experts, hidden, inter = hf["n_routed_experts"], hf["hidden_size"], hf["moe_intermediate_size"]
        routing = MoERouting(
            top_k=int(hf["num_experts_per_tok"]),
            scoring="sigmoid",
            renormalize=bool(hf.get("norm_topk_prob", True)),
            num_groups=int(hf.get("n_group") or 1),
            topk_groups=int(hf.get("topk_group") or 1),
            scaling=float(hf.get("routed_scaling_factor", 1.0)),
        )
        self.gate = DeepseekV3Gate(num_experts, hidden)
        self.experts = FusedMoE(num_experts, hidden, inter, routing, tp=tp)
        n_shared = int(hf.get("n_shared_experts") or 0)
        self.shared_experts = LlamaMLP(hidden, inter * n_shared, tp=tp) if n_shared else None

    def shared_expert_weights(self) -> ExpertWeights | None:
        """The shared expert as a stack of one for kernels that fuse it (None: run it apart).
        Built once per kernel and weight storage: rebuilding it every forward cost ~37 us a
        layer of random:deepseek-v3-1b's torch decode step (cProfile)."""
        mlp = self.shared_experts
        if mlp is None or isinstance(self.experts.kernel, TorchMoEKernel):
            return None
        key = (id(self.experts.kernel), mlp.gate_up_proj.weight.data_ptr(), mlp.down_proj.weight.data_ptr())
        cached = self.__dict__.get("_shared_weights")
        if cached is not None and cached[0] == key:
            return cached[1]
        if isinstance(mlp.gate_up_proj.linear_method, MixedGGMLLinearMethod):
            weights = None  # gate and up in different GGML types: the expert kernel takes one type a stack
        else:
            weights = ExpertWeights(
                mlp.gate_up_proj.weight.data[None],
                mlp.down_proj.weight.data[None],
                linear_ggml_type(mlp.gate_up_proj),
                linear_ggml_type(mlp.down_proj),
            )
        self.__dict__["_shared_weights"] = (key, weights)
        return weights

    @property
    def correction_bias(self) -> torch.Tensor:
        return self.gate.e_score_correction_bias

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.gate.weight.float())

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        shared = self.shared_expert_weights()
        out = self.experts(x, self.router_logits(x), self.correction_bias, shared, reduce=reduce)
        if self.shared_experts is not None and shared is None:
            out = out + self.shared_experts(x, reduce=reduce)
        return out


class DeepseekV3ForCausalLM(CausalLM):
    dense_weight_linears = ("self_attn.kv_b_proj",)  # MLA attention absorbs its weight directly
    supports_tensor_parallel = True
    # Each layer's attention: DeepSeek-V3.2 swaps in its sparse (DSA) subclass (models/deepseek_v32.py).
    attention_cls: ClassVar[type[MLAAttention]] = MLAAttention

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.comm: Communicator | None = None  # the tensor-parallel group's (layers/linear.use_communicator)
        hf = cfg.hf
        first_dense = int(hf.get("first_k_dense_replace") or 0)

        def make_layer(i: int) -> nn.Module:
            mlp = (
                DeepseekV3MoE(cfg, tp)
                if i >= first_dense and hf.get("n_routed_experts")
                else LlamaMLP(hf["hidden_size"], hf["intermediate_size"], tp=tp)
            )
            return LlamaDecoderLayer(cfg, self.make_attention(cfg, i, tp.attention), mlp, tp)

        self.model = LlamaModel(
            cfg,
            make_layer,
            rotary_dim=hf["qk_rope_head_dim"],
            interleaved_rope=bool(hf.get("rope_interleave", True)),
            tp=tp,
        )
        self._init_head(cfg, tp)

    def make_attention(self, cfg: ModelConfig, layer: int, tp: TensorParallel) -> MLAAttention:
        """Layer `layer`'s attention (GLM-5 picks per layer whether its indexer runs)."""
        return self.attention_cls(cfg, tp)

    def weight_hook(self, name: str, tensor: torch.Tensor) -> str | None:
        return load_expert_tensor(self, name, tensor) or super().weight_hook(name, tensor)
