"""DeepSeek-V3/R1's (and V3.2's) multi-token-prediction (MTP) layers, as the checkpoint ships them after the
decoder stack (`model.layers.{num_hidden_layers + i}`, num_nextn_predict_layers of them; V3 and
R1 ship one, layer 61; tacit runs the first).

An MTP layer predicts the token after next: at position p it takes the target's final hidden
state of position p - 1 and the embedding of token p, normalises each (hnorm, enorm), projects
their concatenation back to the hidden size (eh_proj), runs one full decoder layer (MLA and MoE,
with its own KV cache), and normalises (shared_head.norm); the target's head then scores it. Its
embedding and head are the target's (the copies the checkpoint stores under the layer are not
loaded: 1.8 GB each on V3). Chained for more drafts (as vLLM chains V3's one layer), each further
step feeds the layer its own previous output in place of the target's hidden state, as
transformers' MtpModel feeds its next layer.
"""

from __future__ import annotations

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.layers.linear import Linear
from tacit.layers.norm import RMSNorm
from tacit.layers.rotary import RotaryEmbedding
from tacit.models.base import CausalLM
from tacit.models.deepseek_v3 import DeepseekV3MoE, MLAAttention
from tacit.models.llama import LlamaDecoderLayer, LlamaMLP
from tacit.models.qwen3_moe import load_expert_tensor
from tacit.models.registry import get_model_class


class SharedHead(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden, eps)


class DeepseekV3MTPLayer(LlamaDecoderLayer):
    """A decoder layer (its weights under the checkpoint's names for it) with the MTP inputs' norms
    and projection around it."""

    def __init__(self, cfg: ModelConfig) -> None:
        hf = cfg.hf
        hidden, eps = hf["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        mlp = DeepseekV3MoE(cfg) if hf.get("n_routed_experts") else LlamaMLP(hidden, hf["intermediate_size"])
        # DeepSeek-V3.2's MTP layer is a V3.2 decoder layer: its sparse attention, indexer included.
        attention_cls = getattr(get_model_class(cfg.architecture), "attention_cls", MLAAttention)
        super().__init__(cfg, attention_cls(cfg), mlp)
        self.enorm = RMSNorm(hidden, eps)
        self.hnorm = RMSNorm(hidden, eps)
        self.eh_proj = Linear(2 * hidden, hidden, bias=False)
        self.shared_head = SharedHead(hidden, eps)

    def predict(
        self,
        embeds: torch.Tensor,
        previous_hidden: torch.Tensor,
        rotary: RotaryEmbedding,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """[tokens, hidden] embeddings of tokens p and final hidden states of positions p - 1 ->
        the normalised hidden states the head scores for tokens p + 1 (writing position p's KV)."""
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(previous_hidden.to(embeds.dtype))], dim=-1))
        return self.shared_head.norm(self(x, rotary, cos, sin))


class DeepseekV3MTP(CausalLM):
    """The checkpoint's MTP layers, built and loaded by build_model(model_class=DeepseekV3MTP) from
    the same checkpoint as the target; unsplit (it runs in the process that samples)."""

    dense_weight_linears = ("self_attn.kv_b_proj",)

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tie_word_embeddings = False  # no head of its own: the target's scores its output
        # The first MTP layer only (V3 and R1 ship one): chained drafts reuse it, as vLLM does.
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(cfg.num_layers): DeepseekV3MTPLayer(cfg)})
        self.mtp_layers: list[DeepseekV3MTPLayer] = list(self.model.layers.values())

    @staticmethod
    def weight_prefixes(cfg: ModelConfig) -> tuple[str, ...]:
        return (f"model.layers.{cfg.num_layers}.",)

    def weight_hook(self, name: str, tensor: torch.Tensor) -> str | None:
        return load_expert_tensor(self, name, tensor) or super().weight_hook(name, tensor)
