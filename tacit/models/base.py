"""CausalLM: a decoder layer stack with its language-model head, and the layer loop the model
runner drives. Every architecture subclasses it and builds its own stack (`self.model`); the
base knows nothing of any architecture's layers.

Weight names are Hugging Face's, so a checkpoint loads by name with no mapping table.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Generator, Iterable

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.kernels.ggml_quant import GGMLTensor
from tacit.layers.linear import ColumnParallelLinear, Linear, MergedLinear
from tacit.layers.vocab_parallel import vocab_is_sharded
from tacit.models.weights import load_named_weights


@dataclass
class DecoderState:
    """A forward in progress between two decoder layers: the model runner drives the layer loop
    (ModelRunner._run_layers) so that other work can run at a layer boundary."""

    hidden: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class CausalLM(nn.Module):
    """model + lm_head; subclasses build `self.model` (the layer stack) and may add weight hooks.

    `self.model` has embed_tokens, layers, norm and rotary, and runs the layer loop in pieces:
    begin_forward, forward_layers, end_forward (models/llama.py's LlamaModel is the one in use;
    DeepSeek-V3 builds it with its own layers)."""

    model: nn.Module
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
