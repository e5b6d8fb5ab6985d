"""The time of one mixed engine step: any set of prefill chunks and decode rows, each at its own
context, as the real scheduler hands them to the runner.

`predict.step_time` prices a uniform step (every sequence the same new tokens and context).
A continuous-batching step is not uniform, so this module splits the operators by what they
scale with: the weight GEMMs, MoE, norms and collectives with the step's total token count (the
weights are read once for all rows); attention with each sequence's own (chunk, context); the
lm_head and sampler with the rows that sample. Decode rows share one attention op at their mean
context (attention is linear in context, so the sum of FLOPs and bytes is exact), or, where
tacit's torch_paged backend runs them (Pricing.padded_decode_block), one per group it pads them
into, at the group's longest context; each prefill
chunk gets its own, merged into one op per name so launches are counted once per layer, as one
varlen attention call would, or, under a profile fitted on tacit's own engine with its
torch_paged backend, the one call the backend makes of all the step's chunks
(torch_paged_prefill_scores).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tacit.kernels.torch_attention import runs_flat
from tacit.perf_model.dtypes import activation_dtype
from tacit.perf_model.efficiency import Profile, fitted_roofs
from tacit.perf_model.fit_attention import causal_fraction_scored
from tacit.perf_model.micro_batch_overlap import deepgemm_sm_share, two_batch_seconds
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.operators import (
    Op,
    Parallel,
    StepShape,
    attention_ops,
    communication_ops,
    elementwise_ops,
    head_ops,
    mlp_ops,
)
from tacit.perf_model.roofline import OpTime, op_time, step_seconds
from tacit.platforms.specs import HardwareSpec
from tacit.worker.paths.two_batch_overlap import split_point

# Projection GEMMs whose cost depends only on the step's token count (not on any context).
_TOKEN_GEMMS = frozenset(
    {"qkv_proj", "o_proj", "q_a_proj", "q_b_proj", "q_proj", "kv_a_proj", "index_q_proj", "index_k_proj"}
    | {"index_weights_proj"}
)


@dataclass(frozen=True)
class Chunk:
    """One sequence's share of a step: `new_tokens` computed on top of `context` cached ones."""

    new_tokens: int
    context: int
    samples: bool  # the chunk ends the prompt (or is a decode): its row reaches the lm_head


@dataclass(frozen=True)
class MixedStep:
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(c.new_tokens for c in self.chunks)

    @property
    def decodes(self) -> list[Chunk]:
        return [c for c in self.chunks if c.new_tokens == 1]

    @property
    def prefills(self) -> list[Chunk]:
        return [c for c in self.chunks if c.new_tokens > 1]

    @property
    def sampled_rows(self) -> int:
        return sum(c.samples for c in self.chunks)


@dataclass(frozen=True)
class Pricing:
    """What the step model needs besides the step: model, device, dtypes, parallelism."""

    shape: ModelShape
    spec: HardwareSpec
    profile: Profile
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    group_size: int = 32
    parallel: Parallel = Parallel()
    # The KV block size where decode attention runs on tacit's torch_paged backend (a CPU
    # without the C++ decode kernels): it pads each group of decodes to the group's longest
    # context (padded_decode_contexts). None: a paged kernel reads each sequence's own context.
    padded_decode_block: int | None = None
    # With padded_decode_block and a profile fitted on tacit's engine (its prefill curve is
    # torch_paged's): a step's prefill chunks as the one group that backend attends them in
    # (torch_paged_prefill_scores). False: each chunk on its own, as a varlen kernel runs them.
    prefill_one_group: bool = True
    # The quantized linears' activations as asked (--activation-dtype; auto: the format's usual
    # one), resolved against the part in __post_init__ as the uniform step resolves them
    # (dtypes.activation_dtype): W4A8's prompts at the int8 peak, block fp8 on a part without fp8
    # units as W8A16. Left at auto, a W4A8 DeepSeek-V3 prompt on a 910C die priced its
    # projections at the bf16 peak, 1.3x the uniform step's 402.7 ms.
    activation_dtype: str = "auto"

    def __post_init__(self) -> None:
        # this-cpu's roofs as its profile was fitted against, not as this process measured them:
        # priced with each process's own probe, one configuration of the bursty scenario read
        # goodputs of 0.131, 0.140 and 0.181 req/s in three runs on the same fit (fitted_roofs)
        object.__setattr__(self, "spec", fitted_roofs(self.spec, self.profile))
        act = activation_dtype(self.weight_dtype, self.activation_dtype, fp8_units="fp8" in self.spec.flops)
        object.__setattr__(self, "activation_dtype", act)


def padded_decode_contexts(contexts: list[int], block_size: int) -> list[tuple[int, int]]:
    """(rows, attended context) of each group torch_paged runs a step's decodes in
    (kernels/torch_attention.group_requests: power-of-two buckets of blocks), each row of a
    group attending its longest member's blocks whole. The bursty-priority replay on the AVX2
    EPYC priced its 17-64-row decode steps 29% under their measured time at their mean context."""
    groups: dict[int, list[int]] = {}
    for c in contexts:
        blocks = -(-(c + 1) // block_size)  # the cached tokens and the one decoded
        groups.setdefault((blocks - 1).bit_length(), []).append(blocks)
    return [(len(g), max(g) * block_size - 1) for _, g in sorted(groups.items())]


def torch_paged_prefill_scores(chunks: list[tuple[int, int]], block_size: int) -> tuple[float, float, float]:
    """(query rows, keys gathered, query-key scores) of the one group torch_paged attends a
    step's prefill chunks (new tokens, cached context) in, as kernels/torch_attention.build_group
    picks its form (runs_flat): padded (every chunk to the longest chunk's queries and the most blocks) or
    flat (every query against every key of the group, masked to its own request), whichever
    scores fewer. Either way SDPA with a boolean mask scores every key it is given, not the
    causal half: the bursty-priority replay's steps of 6-9 chunks score 5-9x their causal
    count, and priced chunk by chunk its 20 mixed steps of 17+ rows read 29% and 33% under
    their measured time in two recordings (scripts/replay_step_prices.py --steps)."""
    n = np.array([q for q, _ in chunks])
    c = np.array([c for _, c in chunks])
    blocks = -(-(n + c) // block_size)
    rows, keys = int(n.max()), int(blocks.max()) * block_size
    if runs_flat(n, c, rows, keys):
        gathered = int(blocks.sum()) * block_size
        return float(n.sum()), float(gathered), float(int(n.sum()) * gathered)
    return float(rows), float(len(chunks) * keys), float(len(chunks) * rows * keys)


def _torch_paged_prefill(p: Pricing, prefills: list[Chunk], block_size: int) -> list[Op]:
    """The prefill group's attention as torch_paged runs it (torch_paged_prefill_scores): its
    scores in the fitted curve's frame (fit_attention priced its prompts' scores at the causal
    count, causal_fraction_scored of them), its gathered keys read, at the group's query rows
    on the curve. Only for models whose layers all attend every key: a sliding window's group
    is cut per window (torch_attention._padded_window), priced per chunk instead."""
    rows, keys, scores = torch_paged_prefill_scores([(c.new_tokens, c.context) for c in prefills], block_size)
    tokens = sum(c.new_tokens for c in prefills)
    # the new tokens' writes and queries at their count, the gathered keys as cached rows
    shape = StepShape(1, tokens, max(keys - tokens, 0))  # type: ignore[arg-type]
    equivalent = scores * causal_fraction_scored(rows)
    return [replace(op, flops=op.flops * equivalent / shape.key_positions, rows=rows) for op in _attention(p, shape)]


def _merge(ops: list[Op]) -> list[Op]:
    """One op per name: FLOPs, bytes and rows summed, launches of one call per layer; every other
    field (is_gemm, kernel, act_dtype, layers) the first chunk's. Rebuilt from the seven fields
    alone, a 16-chunk MLA prefill's kv_b_proj lost is_gemm and was priced at the elementwise
    efficiency: 287 ms where o_proj, the same 12.9 GFLOP, took 80 (deepseek-v3-1b, 16 x 32)."""
    merged: dict[str, Op] = {}
    for op in ops:
        prev = merged.get(op.name)
        merged[op.name] = (
            op
            if prev is None
            else replace(
                prev,
                flops=prev.flops + op.flops,
                bytes=prev.bytes + op.bytes,
                rows=prev.rows + op.rows,
                launches=max(prev.launches, op.launches),
            )
        )
    return list(merged.values())


def _attention(p: Pricing, step: StepShape) -> list[Op]:
    ops = attention_ops(p.shape, step, p.parallel, p.weight_dtype, p.kv_dtype, p.group_size, p.activation_dtype)
    return [op for op in ops if op.name not in _TOKEN_GEMMS]


def mixed_step_times(p: Pricing, step: MixedStep) -> tuple[float, list[OpTime]]:
    """Seconds of the step as one forward and each operator's time; an empty step costs nothing
    (mixed_step_seconds: the step as the engine runs it, two micro-batches under overlap)."""
    if not step.chunks:
        return 0.0, []
    s, par, m = p.shape, p.parallel, step.tokens
    whole = StepShape(1, m, 0)  # token-count-only operators see the step as m rows
    decode_only = not step.prefills
    graphs = p.spec.graphs and decode_only  # a step with a prefill chunk runs eagerly
    times: list[OpTime] = []
    prefills, attn_rows, ranks = step.prefills, m, par.attention_ranks
    if ranks > 1:
        # Each attention group runs attention (its projections too) over its own sequences only:
        # price the busiest group's share, prompt chunks dealt largest first and decodes evenly,
        # as the uniform step's attention_step does (a chunk's attention op is one whole group's).
        prefills = sorted(prefills, key=lambda c: c.new_tokens * (c.context + c.new_tokens), reverse=True)[::ranks]
        attn_rows = par.sequences_per_device(len(step.decodes)) + sum(c.new_tokens for c in prefills)
        # The operators priced per device (DeepEP's own tokens, a dense group's rows) deal the
        # step's sequences over the groups: its chunks as that many sequences of their mean
        # length (exact for a uniform step, the uniform step_ops' own split).
        n = len(step.chunks)
        whole = StepShape(n, m / n, 0)  # type: ignore[arg-type]
    proj = attention_ops(
        s, StepShape(1, attn_rows, 0), par, p.weight_dtype, p.kv_dtype, p.group_size, p.activation_dtype
    )
    shared = [op for op in proj if op.name in _TOKEN_GEMMS]
    # experts read: each chunk's tokens route alike (ModelShape.sequence_draws), chunks independently
    draws = sum(s.sequence_draws(c.new_tokens) for c in step.chunks)
    shared += mlp_ops(s, whole, par, p.weight_dtype, p.group_size, draws, p.activation_dtype)
    shared += elementwise_ops(s, whole, par)
    sampled = step.sampled_rows
    if sampled:
        shared += head_ops(s, whole, par, sampled, p.weight_dtype, p.activation_dtype)
    # Collectives carry every row's hidden state; the logits' all-gather only the sampled rows.
    shared += [op for op in communication_ops(s, whole, par, sampled, p.profile.reduce_bytes) if op.bytes > 0]
    times += [op_time(op, p.spec, p.profile, decode_only, graphs=graphs) for op in shared]
    decodes = step.decodes
    decode_path = p.profile.decode_path(s.architecture, s.layer_kind)
    if decodes and p.padded_decode_block and decode_path != "decode_fused":
        # One attention call per group and layer, as the backend makes them: not merged
        groups = padded_decode_contexts([c.context for c in decodes], p.padded_decode_block)
        for i, (rows, ctx) in enumerate(groups):
            group = [
                op_time(op, p.spec, p.profile, True, graphs=graphs) for op in _attention(p, StepShape(rows, 1, ctx))
            ]
            if i:  # a group past the first: its own gather, padding and SDPA call a layer
                extra = group[0].op.launches * p.profile.attention_decode_torch_group_s
                group[0] = replace(group[0], seconds=group[0].seconds + extra)
            times += group
    elif decodes:
        # Mean context as a float: attention's FLOPs and bytes are linear in it, so this is exact
        # (a sliding window or DSA's top-k caps them at min(context, limit): an upper bound there).
        mean_ctx = sum(c.context for c in decodes) / len(decodes)
        dec = StepShape(len(decodes), 1, mean_ctx)  # type: ignore[arg-type]
        times += [op_time(op, p.spec, p.profile, True, graphs=graphs) for op in _attention(p, dec)]
    # a fitted profile's prefill curve is torch_paged's (fit_attention), and that backend runs
    # every chunk of a step in one group; p.parallel's attention groups are a deployment's
    one_group = p.prefill_one_group and p.padded_decode_block and p.profile.roofs is not None and ranks == 1
    if prefills and one_group and not s.is_mla and set(s.layer_counts) == {0}:
        prefill_ops = _torch_paged_prefill(p, prefills, p.padded_decode_block)
    else:
        prefill_ops = _merge([op for c in prefills for op in _attention(p, StepShape(1, c.new_tokens, c.context))])
    times += [op_time(op, p.spec, p.profile, False) for op in prefill_ops]
    return sum(t.seconds for t in times) + _fixed_seconds(p, step), times


def runs_tacit_engine(spec: HardwareSpec) -> bool:
    """Whether `spec` is the machine tacit's own engine is priced on (this-cpu): a verify step's
    rows attend one by one (the fused decoder) and tacit's scheduler defaults hold. Any other
    part is priced as the serving engines (vLLM, SGLang) run on it."""
    return spec.name == "this-cpu"


def _fixed_seconds(p: Pricing, step: MixedStep) -> float:
    """The step's fixed cost on the path it runs: per step and layer, per sequence (the host's
    work), or one graph launch for a decode-only step on a part that captures graphs."""
    decode_only = not step.prefills
    path = p.profile.decode_path(p.shape.architecture, p.shape.layer_kind) if decode_only else "prefill"
    graphs = p.spec.graphs and decode_only
    rows = p.parallel.sequences_per_device(len(step.chunks))
    return step_seconds([], p.profile, path, p.shape.num_layers, graphs, rows)


def mixed_step_seconds(p: Pricing, step: MixedStep) -> float:
    """The step as the engine runs it: under --two-batch-overlap a step of 2+ sequences as two
    micro-batches of nearly equal tokens, whole sequences each (tacit's split_point), priced by
    micro_batch_overlap.two_batch_seconds; but a decode-only step the fused C++ decoder takes
    runs whole (it precedes the two-batch path in tacit's engine)."""
    s, decode_only = p.shape, not step.prefills
    # the serve replay prices every step here: the common case (no overlap) decides first
    if not p.parallel.two_batch_overlap or len(step.chunks) < 2:
        return mixed_step_times(p, step)[0]
    if (
        decode_only
        and runs_tacit_engine(p.spec)
        and p.profile.decode_path(s.architecture, s.layer_kind) == "decode_fused"
    ):
        return mixed_step_times(p, step)[0]
    k = split_point([c.new_tokens for c in step.chunks])
    halves = tuple(
        deepgemm_sm_share(mixed_step_times(p, MixedStep(part))[1], p.spec, decode_only)
        for part in (step.chunks[:k], step.chunks[k:])
    )
    return two_batch_seconds(halves, s.num_layers, s.num_moe_layers, decode_only) + _fixed_seconds(p, step)
