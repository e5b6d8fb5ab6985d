"""How alike one sequence's tokens route, measured on a loaded model: ModelShape.routing_draws.

The operator model reads E * (1 - (1 - k/E)^draws) distinct experts a step, one draw per token
when tokens route independently. That holds across sequences, and for a trained router with its
load balancing; a random model's tokens of one prompt route alike (its hidden states share one
direction), so a prefill reads far fewer experts than its tokens would at random:
random:qwen3-moe-2b, one 32-token prompt, 36 of 128 experts a layer (averaged over its 6
layers), where 32 independent tokens read 112; 16 prompts' last tokens read 83 (82 at random).
The measurement: one prompt of T tokens prefilled, each MoE layer's routing recomputed from its
router logits by its own kernel, the distinct experts averaged over layers, and turned back into
the number of independent draws that read as many.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn


def draws_from_distinct(distinct: float, experts: int, top_k: int, tokens: int) -> float:
    """The independent draws that read `distinct` experts on average: the inverse of
    operators.expected_distinct_experts, clamped to [1, tokens] (every expert read: `tokens`)."""
    if distinct >= experts:
        return float(tokens)
    draws = math.log(1 - distinct / experts) / math.log(1 - top_k / experts)
    return min(float(tokens), max(1.0, draws))


def measure_routing_draws(
    model: nn.Module, prefill: Callable[[int], None], token_counts: tuple[int, ...]
) -> tuple[tuple[float, float], ...]:
    """((T, draws), ...) for each T in token_counts: `prefill(T)` runs one T-token prompt through
    the model (the torch path, where every FusedMoE layer's forward is called) while a hook
    counts the experts each layer's routing picks."""
    from tacit.layers.moe import FusedMoE

    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    if not layers:
        raise ValueError("the model has no MoE layer whose routing could be measured")
    counts: list[int] = []
    want = [0]

    def count(module: FusedMoE, args: tuple, kwargs: dict) -> None:
        x, logits = args[0], args[1]
        if x.shape[0] != want[0]:
            return  # not the measured prompt's prefill (a decode step, another request)
        bias = args[2] if len(args) > 2 else kwargs.get("correction_bias")
        _, ids = module.kernel.route(logits.float(), module.routing, bias)
        counts.append(int(ids.unique().numel()))

    hooks = [m.register_forward_pre_hook(count, with_kwargs=True) for m in layers]
    points = []
    try:
        for t in token_counts:
            counts.clear()
            want[0] = t
            prefill(t)
            if len(counts) != len(layers):
                raise RuntimeError(f"a {t}-token prefill routed {len(counts)} of {len(layers)} MoE layers")
            distinct = sum(counts) / len(counts)
            m = layers[0]
            points.append((float(t), round(draws_from_distinct(distinct, m.num_experts, m.routing.top_k, t), 3)))
    finally:
        for h in hooks:
            h.remove()
    return tuple(points)
