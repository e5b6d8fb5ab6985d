"""--quantization int8 | int4 on a Hugging Face checkpoint: which weights, and their conversion
as they stream in.

Quantized: the weights of the linear layers (q/k/v/o, gate/up/down, DeepSeek's q/kv_a
projections, shared experts) and MoE expert stacks (FusedMoE; one type per layer's experts,
overridable by the experts' module name, e.g. 'model.layers.*.mlp.experts=int8'). They become
GGML-method layers (use_ggml_weights, FusedMoE.use_ggml_weights) before the weights exist, and each checkpoint tensor is quantized as the loader yields it, so peak memory
is the quantized model plus one tensor in float32, never the whole model in bf16. A merged
layer (qkv, gate_up) is quantized shard by shard: each row is its own run of blocks.

Kept in the model's dtype:
- embeddings and norms (not linear layers);
- lm_head: the output logits are the most sensitive to weight error (llama.cpp likewise keeps
  output.weight at Q6_K / Q8_0 in its 4-bit types), and a tied head is the embedding table;
- the linear layers a model reads directly (CausalLM.dense_weight_linears: a MoE router's
  F.linear, DeepSeek's absorbed kv_b_proj);

Mixed precision (--quantization-overrides, as llama.cpp's --tensor-type): {fnmatch pattern over
HF module names: none | int8 | int4}, the first matching pattern wins, unmatched layers take
--quantization (none included, to quantize only some layers). lm_head may be overridden (a tied
head then gets its own blocks, quantized from the embedding table); the layers a model reads
directly may not, and a pattern that matches no layer is refused rather than ignored.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from types import SimpleNamespace
from typing import Iterator

import torch
from torch import nn

from tacit.config import HF_QUANTIZATIONS, ModelConfig
from tacit.kernels.ggml_quant import QK, GGMLTensor
from tacit.kernels.weight_quant import (
    GROUP_SIZES,
    Q4_1,
    Q8_0,
    quantize_int4_groupwise,
    quantize_int8_groupwise,
    quantize_int8_per_channel,
)
from tacit.layers.linear import LinearBase, checkpoint_weight_names
from tacit.layers.moe import FusedMoE, expert_weight_names

_KEPT = ("lm_head",)  # see the module docstring
_TYPES = {"int8": Q8_0, "int4": Q4_1}
INT4_DEFAULT_GROUP = 32


def group_size_of(qtype: str, group: int | None) -> int | None:
    """Values per scale of a type under cfg.quantization_group_size: unset, int4 takes groups of
    32 and int8 one scale per output channel (None); set, both take that group."""
    if group is None and qtype == "int4":
        return INT4_DEFAULT_GROUP
    return group


def _matches(module: str, pattern: str) -> bool:
    return fnmatchcase(module, pattern) or fnmatchcase(f"{module}.weight", pattern)


def _override_for(module: str, overrides: dict[str, str]) -> tuple[str, str] | None:
    """(pattern, type) of the first override matching an HF module name."""
    return next(((p, t) for p, t in overrides.items() if _matches(module, p)), None)


def _layer_types(model: nn.Module, cfg: ModelConfig) -> list[tuple[str, LinearBase, str]]:
    """(module name, layer, none | int8 | int4) of every linear layer: cfg.quantization for the
    quantized ones (none unless int8/int4), none for the kept ones, unless an override matches
    one of the layer's HF module names (a merged layer's: its shards', q/k/v_proj)."""
    base = cfg.quantization if cfg.quantization in HF_QUANTIZATIONS else "none"
    dense = tuple(getattr(model, "dense_weight_linears", ()))
    overrides = cfg.quantization_overrides
    used: set[str] = set()  # patterns that match some layer, first or not
    hf_names: list[str] = []
    result = []
    for name, m in model.named_modules():
        if not isinstance(m, (LinearBase, FusedMoE)):
            continue
        shards = (
            [name] if isinstance(m, FusedMoE) else [w.removesuffix(".weight") for w in checkpoint_weight_names(name, m)]
        )
        hf_names += shards
        kept = name in _KEPT or name.endswith(_KEPT + dense)
        qtype = "none" if kept else base
        used |= {p for p in overrides if any(_matches(s, p) for s in shards)}
        per_shard = {s: _override_for(s, overrides) for s in shards}
        hits = [hit for hit in per_shard.values() if hit is not None]
        if hits:
            types = {s: hit[1] if hit else qtype for s, hit in per_shard.items()}
            if len(set(types.values())) > 1:
                got = ", ".join(f"{s.rsplit('.', 1)[-1]}: {t}" for s, t in types.items())
                raise ValueError(
                    f"quantization_overrides: {name} is one merged layer whose shards need one type; got {got}"
                )
            pattern, qtype = hits[0]
            if qtype != "none" and name.endswith(dense):
                raise ValueError(
                    f"quantization_overrides: {pattern!r} makes {name} {qtype}, but the model reads this "
                    f"layer's weight directly (a MoE router, an absorbed MLA projection), so it stays in the "
                    f"model's dtype; narrow the pattern or put '{name}=none' before it"
                )
        result.append((name, m, qtype))
    unused = [p for p in overrides if p not in used]
    if unused:
        shown = ", ".join(hf_names[:6]) + (f" ... ({len(hf_names)} in all)" if len(hf_names) > 6 else "")
        raise ValueError(
            f"quantization_overrides: pattern {unused[0]!r} matches no linear layer; patterns are fnmatch "
            f"patterns over Hugging Face module names such as {shown}"
        )
    return result


def _check_groups(layers: list[tuple[str, LinearBase]], qtype: str, group: int) -> None:
    """A layer whose inputs are not whole groups is a ValueError naming it and the valid sizes."""
    ragged = [f"{name} ({m.in_features} inputs)" for name, m in layers if m.in_features % group]
    if not ragged:
        return
    shown = ", ".join(ragged[:4]) + (f" and {len(ragged) - 4} more" if len(ragged) > 4 else "")
    if qtype == "int8" and group == QK:
        raise ValueError(
            f"quantization='int8' stores each row as 32-value Q8_0 blocks; {shown}: inputs not a multiple of 32"
        )
    fits = [g for g in GROUP_SIZES if all(m.in_features % g == 0 for _, m in layers)]
    raise ValueError(
        f"quantization={qtype!r} with quantization_group_size={group}: {shown}: inputs not a multiple of {group}; "
        f"valid group sizes: {', '.join(map(str, GROUP_SIZES))}, one that divides every quantized "
        f"layer's inputs" + (f" (here: {', '.join(map(str, fits))})" if fits else " (none does here)")
    )


def quantization_plan(model: nn.Module, cfg: ModelConfig) -> dict[str, int]:
    """{HF weight name: GGML type} of the checkpoint tensors quantized at load, for a model built
    on the meta device: cfg.quantization's layers, then cfg.quantization_overrides ({fnmatch
    pattern over HF module names: none | int8 | int4}, the first matching pattern wins). A
    pattern that matches nothing, an override of a layer the model reads directly and a layer
    whose inputs are not whole groups are ValueErrors naming them, before anything is allocated."""
    layers = _layer_types(model, cfg)
    for qtype in ("int8", "int4"):
        group = group_size_of(qtype, cfg.quantization_group_size) or QK  # per channel: whole Q8_0 blocks
        _check_groups([row for name, m, t in layers if t == qtype for row in _matrices(name, m)], qtype, group)
    return {n: _TYPES[t] for name, m, t in layers if t != "none" for n in _weight_names(name, m)}


def _matrices(name: str, m: nn.Module) -> list[tuple[str, nn.Module | SimpleNamespace]]:
    """(name, something with in_features) per distinct matrix input width: an expert stack has two."""
    if not isinstance(m, FusedMoE):
        return [(name, m)]
    return [
        (f"{name} (gate/up)", SimpleNamespace(in_features=m.hidden_size)),
        (f"{name} (down)", SimpleNamespace(in_features=m.intermediate_size)),
    ]


def _weight_names(name: str, m: nn.Module) -> list[str]:
    if isinstance(m, FusedMoE):
        return expert_weight_names(name, m.num_experts)
    return checkpoint_weight_names(name, m)


def quantized_as_loaded(
    tensors: Iterator[tuple[str, torch.Tensor | GGMLTensor]],
    plan: dict[str, int],
    group: int | None,
    head_from_embedding: bool = False,
) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
    """The checkpoint's tensors, those named in `plan` quantized one at a time as they stream by.
    head_from_embedding: a tied lm_head quantized by an override gets its own blocks, quantized
    from the embedding table and yielded just before it (CausalLM.load_weights then derives no
    head); a lm_head.weight the file also stores is the same table and is skipped."""
    for name, tensor in tensors:
        if head_from_embedding and name == "lm_head.weight":
            continue
        if head_from_embedding and name == "model.embed_tokens.weight":
            yield "lm_head.weight", _quantized("lm_head.weight", tensor, plan["lm_head.weight"], group)
        ggml_type = plan.get(name)
        if ggml_type is not None and isinstance(tensor, torch.Tensor):
            tensor = _quantized(name, tensor, ggml_type, group)
        yield name, tensor


def _quantized(name: str, tensor: torch.Tensor, ggml_type: int, group: int | None) -> GGMLTensor:
    """group: cfg.quantization_group_size (group_size_of says what unset means per type)."""
    try:
        if ggml_type == Q8_0:
            g = group_size_of("int8", group)
            return quantize_int8_per_channel(tensor) if g is None else quantize_int8_groupwise(tensor, g)
        return quantize_int4_groupwise(tensor, group_size_of("int4", group))
    except ValueError as e:
        raise ValueError(f"checkpoint tensor {name!r}: {e}") from None
