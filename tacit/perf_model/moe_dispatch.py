"""Expert parallelism's two costs beyond the experts' own: the busiest rank's share of the routed
tokens, and DeepEP's dispatch / combine (SGLang's --moe-a2a-backend deepep, the Ascend
deployments' all-to-all-v): each device sends its own tokens to the ranks holding their top-k
experts, and gets the expert outputs back.
"""

from __future__ import annotations

import math

from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.op_types import Op, Parallel, StepShape
from tacit.perf_model.routing_skew import busiest_rank_load

# DeepEP's dispatch sends fp8 (a byte a value and a float32 scale per 128), its combine bf16: the
# DeepSeek-V3 report's section 3.3 and DeepEP's kernels, low-latency and normal alike.
DISPATCH_BYTES_PER_VALUE = 1 + 4 / 128
COMBINE_BYTES_PER_VALUE = 2


def expert_slots(s: ModelShape, par: Parallel) -> tuple[int, int]:
    """(experts held by the busiest EP rank, expert copies in all): E + R slots over EP ranks,
    ceil((E + R) / EP) on the busiest (EP need not divide them)."""
    slots = s.num_experts + par.redundant_experts
    return math.ceil(slots / par.expert_ranks), slots


def expert_load_factor(s: ModelShape, par: Parallel, draws: float) -> float:
    """The busiest EP rank's routed pairs over the mean rank's. --expert-load-imbalance when
    given; else a trained router's (routing_skew.py: DeepSeek-R1's measured spread of expert
    popularity without redundant experts, EPLB's drift from its plan with them) over draws * k
    pairs, where `draws` counts a sequence's alike-routed tokens once
    (ModelShape.routing_draws), so a prefill of one prompt is lumpier than as many independent
    tokens. A rank holding more slots than the mean (EP not dividing E + R) gets their share more."""
    r = par.expert_ranks
    if r <= 1:
        return 1.0
    if par.expert_load_imbalance:
        return par.expert_load_imbalance
    _, slots = expert_slots(s, par)
    return busiest_rank_load(s.num_experts, r, slots, draws * s.top_k / r)


def busiest_pairs(s: ModelShape, step: StepShape, par: Parallel, draws: float) -> float:
    """Token-expert pairs the busiest device computes a step: every pair of the stage's tokens
    under TP experts; under EP its ranks' mean times expert_load_factor."""
    pairs = step.tokens * s.top_k
    if not par.ep:
        return pairs
    return pairs / par.expert_ranks * expert_load_factor(s, par, draws)


def distinct_of(picks: int, bins: int) -> float:
    """Expected distinct bins `picks` uniform picks land in (each bin equally likely)."""
    return bins * (1 - (1 - 1 / bins) ** picks)


def deepep_mode(par: Parallel, step: StepShape) -> str:
    if par.deepep_mode != "auto":
        return par.deepep_mode
    return "low_latency" if step.new_tokens == 1 else "normal"


def dispatch_copies(top_k: int, ranks: int, per_node: int, mode: str) -> tuple[float, float]:
    """(copies of one token inside the sender's node, copies across nodes), itself excluded.
    low_latency: one message per remote expert, k * (N-1)/N of them, k * (g-1)/N to the g-1
    other ranks of the node and k * (N-g)/N beyond. normal: one copy per distinct rank (a rank
    receives with probability 1 - (1 - 1/N)^k), sent across nodes once per distinct node and
    forwarded inside it over the node's links ((g-1)/g of the remote ranks' copies)."""
    n = ranks
    g = min(per_node or n, n)
    if mode == "low_latency":
        return top_k * (g - 1) / n, top_k * (n - g) / n
    p_rank = 1 - (1 - 1 / n) ** top_k
    nodes = math.ceil(n / g)
    remote_nodes = distinct_of(top_k, nodes) * (nodes - 1) / nodes if nodes > 1 else 0.0
    local = (g - 1) * p_rank + (n - g) * p_rank * (g - 1) / g
    return local, remote_nodes


def deepep_ops(s: ModelShape, step: StepShape, par: Parallel, load: float) -> list[Op]:
    """Dispatch then combine, every MoE layer, from one device's own tokens (Parallel.own_tokens),
    sized for the busiest rank (`load` times the mean's bytes arrive there)."""
    mode = deepep_mode(par, step)
    local, remote = dispatch_copies(s.top_k, par.expert_ranks, par.devices_per_node, mode)
    rows, h, L = par.own_tokens(step), s.hidden_size, s.num_moe_layers
    ops = []
    for name, per_value in (("moe_dispatch", DISPATCH_BYTES_PER_VALUE), ("moe_combine", COMBINE_BYTES_PER_VALUE)):
        row = rows * h * per_value * load * L
        ops.append(
            Op(
                name,
                "communication",
                0,
                row * (local + remote),
                launches=L,
                collective="all_to_all_v",
                participants=par.expert_ranks,
                algorithm=mode,
                inter_bytes=row * remote,
            )
        )
    return ops
