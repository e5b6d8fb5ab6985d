"""Llama family: Llama 2/3, SmolLM2, Qwen2/2.5 (QKV bias), Qwen3 dense (q/k RMSNorm).

Weight names are Hugging Face's, so a checkpoint loads by name with no mapping table
(models/base.py's CausalLM loads them).
"""

from __future__ import annotations

import itertools
from typing import Callable, Generator

import torch
import torch.nn.functional as F
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.communicator import Communicator
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.layers.attention import Attention
from tacit.layers.data_parallel import over_every_rank
from tacit.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from tacit.layers.norm import RMSNorm
from tacit.layers.rotary import RotaryEmbedding
from tacit.layers.vocab_parallel import VocabParallelEmbedding
from tacit.models.base import CausalLM, DecoderState


class LlamaMLP(nn.Module):
    """SwiGLU; with tensor parallelism each rank holds 1/N of the intermediate features (gate/up
    split by output, down by input) and one all-reduce ends the layer."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        what = ["intermediate_size"] * 2
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate, intermediate], ["gate_proj", "up_proj"], bias=bias, tp=tp, what=what
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias, tp=tp, what="intermediate_size")
        self.intermediate = intermediate // tp.size

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up, reduce=reduce)


class LlamaAttention(nn.Module):
    """With tensor parallelism each rank holds 1/N of the query and kv heads (and their KV cache)."""

    def __init__(
        self,
        cfg: ModelConfig,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        tp: TensorParallel = SINGLE,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        hidden = cfg.hf["hidden_size"]
        self.num_heads = tp.split(cfg.hf["num_attention_heads"], "num_attention_heads")
        self.num_kv_heads = tp.split(cfg.num_kv_heads, "num_key_value_heads")
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q_full, kv_full = self.q_size * tp.size, self.kv_size * tp.size
        what = ["num_attention_heads", "num_key_value_heads", "num_key_value_heads"]
        self.qkv_proj = MergedColumnParallelLinear(
            hidden, [q_full, kv_full, kv_full], ["q_proj", "k_proj", "v_proj"], bias=qkv_bias, tp=tp, what=what
        )
        self.o_proj = RowParallelLinear(q_full, hidden, bias=o_bias, tp=tp, what="num_attention_heads")
        self.qk_norm = qk_norm
        if qk_norm:
            eps = cfg.get("rms_norm_eps", 1e-6)
            self.q_norm = RMSNorm(self.head_dim, eps)
            self.k_norm = RMSNorm(self.head_dim, eps)
        self.attn = Attention(
            self.num_heads, self.head_dim, self.num_kv_heads, self.head_dim**-0.5, sliding_window=sliding_window
        )

    def forward(
        self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor, reduce: bool = True
    ) -> torch.Tensor:
        t, h, hkv = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x)
        # q and k sit side by side in the fused output: viewed as H + Hkv heads they take one
        # rotation instead of two (a dozen fewer tiny ops per layer in a decode step).
        qk = qkv[:, : self.q_size + self.kv_size].view(t, h + hkv, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, hkv, self.head_dim)
        if self.qk_norm:
            q, k = rotary(self.q_norm(qk[:, :h]), self.k_norm(qk[:, h:]), cos, sin)
        else:
            qk = rotary.rotate(qk, cos, sin)
            q, k = qk[:, :h], qk[:, h:]
        return self.o_proj(self.attn(q, k, v), reduce=reduce)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: nn.Module, mlp: nn.Module, tp: TensorParallel = SINGLE) -> None:
        """tp: the model's split; under data-parallel attention (tp.data_parallel) attn is whole
        and this rank's own, mlp split, and the layer gathers every rank's tokens for it."""
        super().__init__()
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.self_attn, self.mlp = attn, mlp
        self.input_layernorm = RMSNorm(cfg.hf["hidden_size"], eps)
        self.post_attention_layernorm = RMSNorm(cfg.hf["hidden_size"], eps)
        # Two-micro-batch steps all-reduce this layer's partial sums themselves (stages()):
        # seconds they blocked, and seconds they travelled while the other micro-batch computed.
        # Data-parallel attention: seconds its gathers and scatters blocked.
        self.comm_seconds = self.comm_hidden_seconds = 0.0
        self.data_parallel = tp.data_parallel
        if self.data_parallel:
            self.tp, self.comm = tp, None  # use_communicator binds comm (it reads tp.size)

    def forward(self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not self.data_parallel:
            x = x + self.self_attn(self.input_layernorm(x), rotary, cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))
        if len(x):  # a rank with no requests this step attends over nothing but joins the MLP
            x = x + self.self_attn(self.input_layernorm(x), rotary, cos, sin)
        return x + over_every_rank(lambda h: self.mlp(h, reduce=False), self.post_attention_layernorm(x), self)

    def stages(
        self, x: torch.Tensor, rotary: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor
    ) -> Generator[torch.Tensor, torch.Tensor, torch.Tensor]:
        """forward() under tensor parallelism as two halves that each end in a partial sum: it
        yields the attention's, then the MLP's, and the caller sends back their all-reduced sums
        (so it can run another micro-batch while they travel: models/two_batch_overlap.py)."""
        x = x + (yield self.self_attn(self.input_layernorm(x), rotary, cos, sin, reduce=False))
        return x + (yield self.mlp(self.post_attention_layernorm(x), reduce=False))


class LlamaModel(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        make_layer: Callable[[int], nn.Module],
        rotary_dim: int,
        interleaved_rope: bool = False,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        hf = cfg.hf
        self.embed_tokens = VocabParallelEmbedding(hf["vocab_size"], hf["hidden_size"], tp)
        self.layers = nn.ModuleList(make_layer(i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(hf["hidden_size"], cfg.get("rms_norm_eps", 1e-6))
        # Built on the CPU explicitly: the model itself is constructed on the meta device.
        with torch.device("cpu"):
            self.rotary = RotaryEmbedding(
                rotary_dim, int(cfg.get("max_position_embeddings", 2048)), cfg.rope, interleaved=interleaved_rope
            )

    def begin_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> DecoderState:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        return DecoderState(x, cos, sin)

    def forward_layers(self, state: DecoderState, begin: int, end: int) -> None:
        x = state.hidden
        for layer in itertools.islice(self.layers, begin, end):  # slicing a ModuleList builds a new one
            x = layer(x, self.rotary, state.cos, state.sin)
        state.hidden = x

    def end_forward(self, state: DecoderState) -> torch.Tensor:
        return self.norm(state.hidden)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        state = self.begin_forward(input_ids, positions)
        self.forward_layers(state, 0, len(self.layers))
        return self.end_forward(state)


class LlamaForCausalLM(CausalLM):
    qkv_bias_default = False
    qk_norm = False
    supports_tensor_parallel = True

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.comm: Communicator | None = None  # the tensor-parallel group's (layers/linear.use_communicator)
        hf = cfg.hf
        bias = bool(hf.get("attention_bias", False))
        qkv_bias = bias or self.qkv_bias_default
        o_bias = bias and not self.qkv_bias_default

        def make_layer(i: int) -> nn.Module:
            attn = LlamaAttention(
                cfg, qkv_bias, o_bias, self.qk_norm, tp.attention, sliding_window=cfg.sliding_window_of(i)
            )
            return LlamaDecoderLayer(cfg, attn, self.make_mlp(cfg, i), tp)

        self.model = LlamaModel(cfg, make_layer, rotary_dim=cfg.head_dim, tp=tp)
        self._init_head(cfg, tp)

    def make_mlp(self, cfg: ModelConfig, layer_idx: int) -> nn.Module:
        bias = bool(cfg.hf.get("mlp_bias", False))
        return LlamaMLP(cfg.hf["hidden_size"], cfg.hf["intermediate_size"], bias=bias, tp=self.tp)


class Qwen2ForCausalLM(LlamaForCausalLM):
    # Qwen2 always has q/k/v bias and never an o_proj bias, whatever attention_bias says.
    qkv_bias_default = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
