"""Llama family: Llama 2/3, SmolLM2, Qwen2/2.5 (QKV bias), Qwen3 dense (q/k RMSNorm).

Weight names are Hugging Face's, so a checkpoint loads by name with no mapping table.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Generator, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.communicator import Communicator
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.kernels.cpu_fused_decode import DecoderLayerWeights, ShardedDecoder, bind_llama_decoder
from tacit.kernels.ggml_quant import BF16, GGMLTensor
from tacit.kernels.torch_attention import TorchAttentionBackend
from tacit.layers.attention import Attention
from tacit.layers.data_parallel import over_every_rank
from tacit.layers.embedding import GGMLEmbedding
from tacit.layers.ggml_linear_method import ggml_or_bf16, weight_parts
from tacit.layers.linear import (
    ColumnParallelLinear,
    Linear,
    MergedColumnParallelLinear,
    MergedLinear,
    RowParallelLinear,
)
from tacit.layers.norm import RMSNorm
from tacit.layers.rotary import RotaryEmbedding
from tacit.layers.vocab_parallel import VocabParallelEmbedding, vocab_is_sharded
from tacit.models.weights import load_named_weights


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
        self, cfg: ModelConfig, qkv_bias: bool, o_bias: bool, qk_norm: bool, tp: TensorParallel = SINGLE
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
        self.attn = Attention(self.num_heads, self.head_dim, self.num_kv_heads, self.head_dim**-0.5)

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

    def begin_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> "DecoderState":
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        return DecoderState(x, cos, sin)

    def forward_layers(self, state: "DecoderState", begin: int, end: int) -> None:
        x = state.hidden
        for layer in itertools.islice(self.layers, begin, end):  # slicing a ModuleList builds a new one
            x = layer(x, self.rotary, state.cos, state.sin)
        state.hidden = x

    def end_forward(self, state: "DecoderState") -> torch.Tensor:
        return self.norm(state.hidden)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        state = self.begin_forward(input_ids, positions)
        self.forward_layers(state, 0, len(self.layers))
        return self.end_forward(state)


@dataclass
class DecoderState:
    """A forward in progress between two decoder layers: the model runner drives the layer loop
    (ModelRunner._run_layers) so that other work can run at a layer boundary."""

    hidden: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class CausalLM(nn.Module):
    """model + lm_head; subclasses build `self.model` and may add weight hooks."""

    model: LlamaModel
    # Suffixes of the linear layers whose weight the model reads itself rather than through
    # their linear method (a router's F.linear, MLA's absorbed kv_b_proj): --quantization
    # int8/int4 leaves them in the model's dtype (models/quantize_at_load.py).
    dense_weight_linears: tuple[str, ...] = ()

    def _init_head(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        hf = cfg.hf
        self.tie_word_embeddings = bool(hf.get("tie_word_embeddings", False))
        if vocab_is_sharded(hf["vocab_size"], tp):
            # Each rank scores its slice of the vocabulary; the slices are gathered into full logits.
            self.lm_head = ColumnParallelLinear(hf["hidden_size"], hf["vocab_size"], False, tp, gather_output=True)
        else:
            self.lm_head = Linear(hf["hidden_size"], hf["vocab_size"], bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    # The layer loop, exposed so the model runner can drive it (see DecoderState).
    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    def begin_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> DecoderState:
        return self.model.begin_forward(input_ids, positions)

    def forward_layers(self, state: DecoderState, begin: int, end: int) -> None:
        self.model.forward_layers(state, begin, end)

    def end_forward(self, state: DecoderState) -> torch.Tensor:
        return self.model.end_forward(state)

    def forward_stages(
        self, state: DecoderState, begin: int, end: int
    ) -> Generator[tuple[nn.Module, torch.Tensor], torch.Tensor, None]:
        """forward_layers() under tensor parallelism, paused at each partial sum: yields (the
        decoder layer, its partial sum) and takes back the all-reduced sum (LlamaDecoderLayer.stages)."""
        x = state.hidden
        for layer in itertools.islice(self.model.layers, begin, end):
            stages = layer.stages(x, self.model.rotary, state.cos, state.sin)
            reduced = None
            try:
                while True:
                    reduced = yield layer, stages.send(reduced)
            except StopIteration as done:
                x = done.value
        state.hidden = x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def fused_decoder_unsupported_reason(self) -> str | None:
        """Why kernels/cpu_fused_decode.py cannot run this model's decode step, or None if it can
        (the architectures that have one override this and _bind_fused_decoder)."""
        return f"{type(self).__name__} has no fused decode step"

    def _bind_fused_decoder(self, kernels: ModuleType, block_size: int, max_positions: int) -> Any:
        raise NotImplementedError

    def fused_tensor_parallel_reason(self) -> str | None:
        """Under tensor parallelism the fused step all-reduces in C++: it needs the communicator's
        C all-reduce (the models that fuse set self.tp and self.comm)."""
        if self.tp.size > 1 and (self.comm is None or self.comm.c_all_reduce_f32() is None):
            return f"tensor parallel over a communicator with no C all-reduce ({getattr(self.comm, 'name', None)})"
        return None

    def fused_mlp_unsupported_reason(self, mlp: nn.Module) -> str | None:
        """Why the fused step cannot run this layer's MLP (the models with other MLPs override)."""
        if type(mlp) is not LlamaMLP:
            return "not a dense Llama MLP"
        if mlp.gate_up_proj.bias is not None or mlp.down_proj.bias is not None:
            return "MLP biases"
        return None

    def fused_mlp_weights(self, mlp: nn.Module) -> dict[str, Any]:
        """The DecoderLayerWeights fields of this layer's MLP."""
        gate_up, gate_up_types = weight_parts(mlp.gate_up_proj)
        return dict(
            gate_up=gate_up,
            down=mlp.down_proj.weight.data,
            gate_up_types=gate_up_types,
            down_type=ggml_or_bf16(mlp.down_proj),
        )

    def build_fused_decoder(self, kernels: ModuleType | None, block_size: int, max_positions: int) -> Any | None:
        """The C++ decode step bound to this model's weights and KV caches, or None if it cannot run it."""
        if kernels is None or self.fused_decoder_unsupported_reason() is not None:
            return None
        try:
            return self._bind_fused_decoder(kernels, block_size, max_positions)
        except (ValueError, RuntimeError) as e:  # a shape the kernel does not take: the torch path still runs it
            print(f"tacit: fused decode step unavailable for this model ({e}); using the torch path", file=sys.stderr)
            return None

    def weight_hook(self, name: str, tensor: torch.Tensor) -> str | None:
        """HF's separate q/k/v and gate/up tensors go into their slice of the merged layer."""
        if not hasattr(self, "_shards"):
            self._shards = {}
            for mod_name, mod in self.named_modules():
                if isinstance(mod, MergedLinear):
                    parent = mod_name.rsplit(".", 1)[0]
                    for shard in mod.shard_names:
                        self._shards[f"{parent}.{shard}"] = (mod, shard, mod_name)
        prefix, _, kind = name.rpartition(".")
        hit = self._shards.get(prefix)
        if hit is None:
            return None
        mod, shard, mod_name = hit
        mod.load_shard(shard, kind, tensor)
        return f"{mod_name}.{kind}"

    @property
    def _head_shares_embedding(self) -> bool:
        # False when build_model gave a tied head the embedding's GGML blocks as its own weight.
        return self.tie_word_embeddings and self.lm_head.weight is self.model.embed_tokens.weight

    def ignore_weight(self, name: str) -> bool:
        return self._head_shares_embedding and name == "lm_head.weight"

    def _with_head_from_embedding(
        self, weights: Iterable[tuple[str, torch.Tensor | GGMLTensor]]
    ) -> Iterable[tuple[str, torch.Tensor | GGMLTensor]]:
        head_given = False  # a head quantized at load comes ahead of the table (quantized_as_loaded)
        for name, tensor in weights:
            head_given |= name == "lm_head.weight"
            yield name, tensor
            if name == "model.embed_tokens.weight" and not head_given:
                yield "lm_head.weight", tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        derived = ["lm_head.weight"] if self._head_shares_embedding else []
        # Experts streamed from the checkpoint are read by their cache, not loaded here.
        derived += [f"{n}.{w}" for n, m in self.named_modules() if getattr(m, "streamed", False) for w in ("w13", "w2")]
        if self.tie_word_embeddings and not self._head_shares_embedding:
            weights = self._with_head_from_embedding(weights)
        load_named_weights(self, weights, hook=self.weight_hook, ignore=self.ignore_weight, derived=derived)
        for name, module in self.named_modules():
            check = getattr(module, "check_fully_loaded", None)
            if check is not None:
                check(name)


# csrc/decode_attention_int8.cpp's kMaxGroup: query heads per kv head it keeps in registers.
_INT8_KV_MAX_GROUP = 16


class LlamaForCausalLM(CausalLM):
    qkv_bias_default = False
    qk_norm = False
    supports_tensor_parallel = True

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.comm: Communicator | None = None  # the fused decode step's all-reduce (tensor parallel)
        hf = cfg.hf
        bias = bool(hf.get("attention_bias", False))
        qkv_bias = bias or self.qkv_bias_default
        o_bias = bias and not self.qkv_bias_default

        def make_layer(i: int) -> nn.Module:
            attn = LlamaAttention(cfg, qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=self.qk_norm, tp=tp.attention)
            return LlamaDecoderLayer(cfg, attn, self.make_mlp(cfg, i), tp)

        self.model = LlamaModel(cfg, make_layer, rotary_dim=cfg.head_dim, tp=tp)
        self._init_head(cfg, tp)

    def make_mlp(self, cfg: ModelConfig, layer_idx: int) -> nn.Module:
        bias = bool(cfg.hf.get("mlp_bias", False))
        return LlamaMLP(cfg.hf["hidden_size"], cfg.hf["intermediate_size"], bias=bias, tp=self.tp)

    def fused_decoder_unsupported_reason(self) -> str | None:
        """Why kernels/cpu_fused_decode.py cannot run this model's decode step, or None if it can."""
        reason = self.fused_tensor_parallel_reason()
        if reason is not None:
            return reason
        if self.model.rotary.interleaved:
            return "interleaved rotary"
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            if not isinstance(attn, LlamaAttention):
                return f"layer {i} is not a Llama attention layer"
            reason = self.fused_mlp_unsupported_reason(layer.mlp)
            if reason is not None:
                return f"layer {i}: {reason}"
            # The fused step reads the cache in place and attends itself, as the torch paged backend does.
            if attn.attn.backend is None or attn.attn.backend.name != TorchAttentionBackend.name:
                return f"layer {i} uses another attention backend"
            cache = attn.attn.kv_cache
            if cache is None or cache.dtype not in (torch.bfloat16, torch.int8) or cache.device.type != "cpu":
                return f"layer {i} has no bf16 or int8 CPU KV cache"
            if cache.dtype == torch.int8 and attn.num_heads // attn.num_kv_heads > _INT8_KV_MAX_GROUP:
                return f"more than {_INT8_KV_MAX_GROUP} query heads per kv head over an int8 KV cache"
        # GGML blocks (uint8: linear layers, embedding tables, MoE expert stacks) run as they are.
        if any(p.dtype not in (torch.bfloat16, torch.uint8) for p in self.parameters()):
            return "weights are not bf16"
        return None

    def _bind_fused_decoder(self, kernels: ModuleType, block_size: int, max_positions: int) -> Any:
        lm = self.model
        layers = list(lm.layers)
        first = layers[0].self_attn
        norms = [lm.norm] + [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        if first.qk_norm:
            norms += [n for layer in layers for n in (layer.self_attn.q_norm, layer.self_attn.k_norm)]
        eps = {n.eps for n in norms}
        if len(eps) != 1:
            raise ValueError(f"RMSNorm eps differs between layers ({sorted(eps)}); the fused decoder takes one")
        # One table for every position, built by the same torch ops the model uses, so the fused
        # path rotates by exactly the cos/sin values the torch path would compute per step.
        cos, sin = lm.rotary.cos_sin(torch.arange(max_positions), torch.bfloat16)

        def data(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.data

        weights = [
            DecoderLayerWeights(
                input_norm=layer.input_layernorm.weight.data,
                qkv=qkv,
                qkv_bias=data(a.qkv_proj.bias),
                q_norm=a.q_norm.weight.data if a.qk_norm else None,
                k_norm=a.k_norm.weight.data if a.qk_norm else None,
                o_proj=a.o_proj.weight.data,
                o_bias=data(a.o_proj.bias),
                post_attention_norm=layer.post_attention_layernorm.weight.data,
                kv_cache=a.attn.kv_cache,
                qkv_types=qkv_types,
                o_type=ggml_or_bf16(a.o_proj),
                **self.fused_mlp_weights(layer.mlp),
            )
            for layer in layers
            for a in [layer.self_attn]
            for qkv, qkv_types in [weight_parts(a.qkv_proj)]
        ]
        table = lm.embed_tokens
        decoder = bind_llama_decoder(
            kernels,
            table.weight.data,
            table.ggml_type if isinstance(table, GGMLEmbedding) else BF16,
            lm.norm.weight.shape[0],
            lm.norm.weight.data,
            cos,
            sin,
            first.num_heads,
            first.num_kv_heads,
            first.head_dim,
            next((layer.mlp.intermediate for layer in layers if isinstance(layer.mlp, LlamaMLP)), 0),
            eps.pop(),
            first.attn.scale,
            block_size,
            weights,
        )
        if self.tp.size == 1:
            return decoder
        decoder.set_all_reduce(*self.comm.c_all_reduce_f32())
        return ShardedDecoder(decoder, table, self.tp.data_parallel)


class Qwen2ForCausalLM(LlamaForCausalLM):
    # Qwen2 always has q/k/v bias and never an o_proj bias, whatever attention_bias says.
    qkv_bias_default = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
