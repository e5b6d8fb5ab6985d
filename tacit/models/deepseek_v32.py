"""DeepSeek-V3.2 (DeepseekV32ForCausalLM): DeepSeek-V3 with DeepSeek Sparse Attention (DSA).

Everything but the attention's key selection is V3's (models/deepseek_v3.py). Each layer adds a
lightning indexer (transformers' DeepseekV32Indexer, the parity oracle: a bf16/float indexer
without the original code's Hadamard rotation, which preserves dot products, and its FP8):

    q_idx = wq_b(q_resid)                    [T, index_n_heads, index_head_dim]
    k_idx = LayerNorm(wk(x))                 [T, index_head_dim], one key per token
    the first qk_rope_head_dim values of both rotated half-split (MLA's own rope is interleaved)
    w = weights_proj(x) / sqrt(index_n_heads)   in float32 (transformers keeps it there)
    score[t, s] = sum_h w[t, h] relu(q_idx[t, h] . k_idx[s] / sqrt(index_head_dim))

and each query attends (MLA) only over its index_topk highest-scoring earlier tokens: every one
while its context is at most index_topk. The indexer's keys are cached beside the latent
(kv_cache_interface.MLAIndexerAttentionSpec); kernels/sparse_mla_attention.py does the rest.

GLM-5 (GlmMoeDsaForCausalLM, transformers' glm_moe_dsa) is built from the same pieces: its
indexer's rope is interleaved and some layers reuse the previous indexer layer's top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.forward_context import get_attention_metadata
from tacit.kernels.kv_quant import kv_row_width
from tacit.kernels.sparse_mla_attention import dsa_cache_views, sparse_mla_forward, write_dsa_kv
from tacit.kernels.torch_mla_attention import MLADims
from tacit.kv_cache_interface import KVCacheSpec, MLAAttentionSpec, MLAIndexerAttentionSpec
from tacit.layers.linear import Linear
from tacit.layers.rotary import RotaryEmbedding, rotate_interleaved, rotate_neox
from tacit.models.deepseek_v3 import DeepseekV3ForCausalLM, MLAAttention


class IndexerHeadWeights(nn.Module):
    """The indexer's per-head weights (weights_proj) in float32, as transformers keeps them
    (_keep_in_fp32_modules) and as DeepseekV3Gate keeps the router: they scale every head's
    ReLU score before the top-k, where a bf16 rounding flips near-ties. A plain parameter, not
    a Linear, so no bf16 or quantized linear method takes it."""

    keep_fp32 = True

    def __init__(self, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_heads, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, n_heads] float32."""
        return F.linear(x.float(), self.weight.float())


class DSAIndexer(nn.Module):
    """The lightning indexer's weights and its query/key. Whole on every tensor-parallel rank
    (its 64 heads of V3.2 are not split): each rank selects the same tokens for its MLA heads."""

    def __init__(self, cfg: ModelConfig, interleaved_rope: bool = False) -> None:
        """interleaved_rope: GLM-5's indexer rotates DeepSeek's interleaved pairs; V3.2's half-splits."""
        super().__init__()
        hf = cfg.hf
        hidden = hf["hidden_size"]
        self.n_heads, self.head_dim = int(hf["index_n_heads"]), int(hf["index_head_dim"])
        self.topk, self.rope_dim = int(hf["index_topk"]), int(hf["qk_rope_head_dim"])
        if self.rope_dim > self.head_dim or self.topk < 1:
            raise ValueError(
                f"{cfg.path}: index_head_dim={self.head_dim} must hold qk_rope_head_dim={self.rope_dim} and "
                f"index_topk={self.topk} must be >= 1"
            )
        self.wq_b = Linear(hf["q_lora_rank"], self.n_heads * self.head_dim, bias=False)
        self.wk = Linear(hidden, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = IndexerHeadWeights(self.n_heads, hidden)
        self.scale = self.head_dim**-0.5
        self._rope = rotate_interleaved if interleaved_rope else rotate_neox

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D]: its first rope_dim values rotated (transformers' rotate_half for V3.2)."""
        rot, rest = x.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        return torch.cat([self._rope(rot, cos, sin), rest], dim=-1)

    def key(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> each token's index key [T, index_head_dim] (what the cache keeps)."""
        k = self.k_norm(self.wk(x))
        return self._rotate(k[:, None, :], cos, sin)[:, 0]

    def query(
        self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> the index queries [T, n_heads, head_dim] and each head's weight [T, n_heads] float32."""
        q = self.wq_b(q_resid).view(x.shape[0], self.n_heads, self.head_dim)
        return self._rotate(q, cos, sin), self.weights_proj(x) * self.n_heads**-0.5


class DSAAttention(MLAAttention):
    """MLA whose queries attend only the indexer's top-k tokens. Its cache holds the latent rows
    and the indexer's keys (MLAIndexerAttentionSpec); the bound MLA backend supplies the step's
    metadata, the attention itself is kernels/sparse_mla_attention.py's."""

    def __init__(
        self,
        cfg: ModelConfig,
        tp: TensorParallel = SINGLE,
        *,
        interleaved_index_rope: bool = False,
        topk_carry: dict | None = None,
        shares_topk: bool = False,
    ) -> None:
        """GLM-5 (GlmMoeDsaForCausalLM): interleaved_index_rope, and layers whose indexer is
        shared (shares_topk: no indexer, no index keys cached; they attend the top-k the last
        indexer layer left in topk_carry, which every layer of the model holds)."""
        super().__init__(cfg, tp)
        if self.q_lora_rank is None:
            raise ValueError(f"{cfg.path}: DeepSeek-V3.2's indexer reads the q LoRA's output; q_lora_rank is null")
        self.indexer = None if shares_topk else DSAIndexer(cfg, interleaved_index_rope)
        self.index_head_dim = 0 if shares_topk else self.indexer.head_dim
        self.index_topk = int(cfg.hf["index_topk"])
        self.topk_carry = topk_carry
        self.block_size = 0  # set with the cache

    def get_kv_cache_spec(self, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        """The MLA backend's latent spec with the indexer's key row added (a layer sharing
        another's top-k caches the latent only)."""
        spec = super().get_kv_cache_spec(block_size, dtype)
        if self.indexer is None:
            return spec
        if not isinstance(spec, MLAAttentionSpec):
            raise ValueError(f"DSAAttention needs an MLA backend's latent cache spec, got {type(spec).__name__}")
        return MLAIndexerAttentionSpec(
            block_size=spec.block_size,
            dtype=spec.dtype,
            kv_lora_rank=spec.kv_lora_rank,
            rope_dim=spec.rope_dim,
            index_head_dim=self.index_head_dim,
        )

    def kv_numel_per_token(self, dtype: torch.dtype) -> int:
        return super().kv_numel_per_token(dtype) + kv_row_width(self.index_head_dim, dtype)

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        if self.indexer is None:
            return super().allocate_kv_cache(num_blocks, block_size, dtype, device)
        numel = self.kv_numel_per_token(dtype)
        self.kv_cache = torch.zeros(num_blocks, block_size * numel, dtype=dtype, device=device)

    def cache_views(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The cache's latent rows [blocks, block_size, row] and index keys [blocks, block_size, D_idx]
        (None in a layer sharing another's top-k)."""
        if self.indexer is None:
            return self.kv_cache, None
        dtype = self.kv_cache.dtype
        latent_width = MLAAttention.kv_numel_per_token(self, dtype)
        return dsa_cache_views(self.kv_cache, self.block_size, latent_width, kv_row_width(self.index_head_dim, dtype))

    def forward(
        self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor, reduce: bool = True
    ) -> torch.Tensor:
        meta = get_attention_metadata()
        t, h = x.shape[0], self.num_heads
        q_resid, q_nope, q_pe, latent, k_pe = self.project(x, rotary, cos, sin)
        latent_cache, index_cache = self.cache_views()
        if self.indexer is None:
            self.backend.write_kv(latent_cache, latent, k_pe, meta)
            q_idx = weights = None
            index_scale = 0.0
        else:
            write_dsa_kv(latent_cache, index_cache, meta.slot_mapping, latent, k_pe, self.indexer.key(x, cos, sin))
            q_idx, weights = self.indexer.query(x, q_resid, cos, sin)
            index_scale = self.indexer.scale
        query = torch.cat([q_nope, q_pe], dim=-1)
        kv_b = self.kv_b_proj.weight
        out = sparse_mla_forward(
            query,
            q_idx,
            weights,
            latent_cache,
            index_cache,
            meta,
            kv_b,
            MLADims.of(query, latent_cache, kv_b),
            self.scale,
            index_scale,
            self.index_topk,
            self.topk_carry,
        )
        return self.o_proj(out.reshape(t, h * self.v_dim), reduce=reduce)


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    attention_cls = DSAAttention


class GlmMoeDsaForCausalLM(DeepseekV3ForCausalLM):
    """GLM-5 (glm_moe_dsa): DeepSeek-V3.2's pieces (MLA, the indexer, sigmoid-routed MoE) with
    two differences, as transformers' GlmMoeDsaForCausalLM has them: the indexer's rope rotates
    interleaved pairs, and config.indexer_types may mark layers "shared", which run no indexer
    and attend the top-k of the last "full" layer before them (the first layer must be full)."""

    attention_cls = DSAAttention

    def make_attention(self, cfg: ModelConfig, layer: int, tp: TensorParallel) -> MLAAttention:
        kinds = cfg.hf.get("indexer_types") or ["full"] * cfg.num_layers
        if len(kinds) < cfg.num_layers or set(kinds) - {"full", "shared"} or kinds[0] != "full":
            raise ValueError(
                f"{cfg.path}: indexer_types={kinds!r} must give each of the {cfg.num_layers} layers 'full' or "
                f"'shared', the first 'full'"
            )
        if layer == 0:
            self._topk_carry: dict = {}  # the selections of the step's last indexer layer
        return DSAAttention(
            cfg,
            tp,
            interleaved_index_rope=True,
            topk_carry=self._topk_carry,
            shares_topk=kinds[layer] == "shared",
        )
