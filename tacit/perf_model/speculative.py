"""What speculative decoding's drafting costs, as the engine drafts.

ngram and suffix drafts are lookups in the request's own tokens: free next to a model step.
An MTP draft is a forward of the checkpoint's MTP module (tacit/models/deepseek_mtp.py,
worker/mtp_proposer.py): eh_proj over [embedding; previous hidden state], one decoder layer
built as the model's own layers are (DeepSeek-V3's is a MoE layer: DeepseekV3MoE wherever the
config has n_routed_experts), and the target's head on each sequence's last row. The proposer
chains k forwards per verify step: the first computes the entries of the tokens the verify just
settled (the accepted drafts and the bonus token: tokens_per_verify rows a sequence, on
average), each further one a single row a sequence. After a prompt, the first forward runs over
the whole prompt's entries (the engine times it as propose_catch_up_s), before the first token
is handed back.

Each forward is priced as a one-layer model's mixed step (step_model.py), in the target's
layout and weight/KV dtypes (the MTP layer loads with the target's quantization), as vLLM and
SGLang shard their MTP layer like the target's layers. tacit's own engine runs it unsplit on the
sampling rank (DeepseekV3MTP is built without a TensorParallel); at TP 1 that is the same.
"""

from __future__ import annotations

from dataclasses import replace

from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.op_types import gemm_op
from tacit.perf_model.roofline import OpTime, op_time
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_times

SPECULATIVE_METHODS = ("ngram", "suffix", "mtp")
FREE_DRAFTS = ("ngram", "suffix")


def tokens_per_verify(acceptance: float, k: int) -> float:
    """Tokens a verify step yields a sequence on average: 1 + a + a^2 + ... + a^k (each draft
    accepted with probability a given the ones before it were; the bonus token always)."""
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


def mtp_layer_shape(s: ModelShape) -> ModelShape:
    """The MTP module as a one-layer model of the target's shape: a MoE layer in a MoE model
    (its num_dense_layers counts the target's first_k_dense_replace layers, not this one), a
    dense one otherwise, full attention."""
    return replace(s, num_layers=1, num_dense_layers=0, windows=())


def draft_forward(p: Pricing, chunks: list[Chunk]) -> tuple[float, list[OpTime]]:
    """Seconds of one MTP forward over `chunks` (each sequence's rows at its context, the last
    row of each sampling) and its operators' times."""
    step = MixedStep(chunks)
    _, times = mixed_step_times(replace(p, shape=mtp_layer_shape(p.shape)), step)
    h = p.shape.hidden_size
    # eh_proj: [rows, 2h] @ [2h, h], whole on every device (vLLM's ReplicatedLinear; tacit's
    # Linear of the unsplit module); the layer's own projections are in mixed_step_times.
    # Under data-parallel attention a device projects its own group's rows only: the busiest
    # group's share of the sequences, at the step's mean rows a sequence.
    rows = p.parallel.sequences_per_device(len(step.chunks)) * step.tokens / max(len(step.chunks), 1)
    eh = gemm_op("mtp_eh_proj", "attn_proj", rows, 2 * h, h, p.weight_dtype, p.group_size, 1, p.activation_dtype)
    times = [op_time(eh, p.spec, p.profile, not step.prefills), *times]
    # Its operators and one torch layer's fixed cost: not the step's (the accelerator profile's
    # 1 ms is scheduling and sampling, which a draft forward inside the runner's step does not do)
    return sum(t.seconds for t in times) + p.profile.layer_overhead_s.get("torch", 0.0), times


def _settled_rows(batch: int, mean_rows: float, context: float) -> list[Chunk]:
    """`batch` sequences whose rows average `mean_rows`: the floor for some, the ceiling for the
    rest (as many as the fraction asks, rounded), at one context."""
    lo = int(mean_rows)
    hi_count = round(batch * (mean_rows - lo))
    return [Chunk(lo + (i < hi_count), context, True) for i in range(batch)]  # type: ignore[arg-type]


def decode_drafting(p: Pricing, batch: int, context: float, k: int, acceptance: float) -> tuple[float, list[OpTime]]:
    """Seconds of one verify step's k MTP draft forwards and the first forward's operators: the
    first over the tokens the verify settled (tokens_per_verify a sequence), then k - 1 of one
    row a sequence, each a token further along."""
    rows = tokens_per_verify(acceptance, k)
    first, times = draft_forward(p, _settled_rows(batch, rows, context))
    rest = sum(draft_forward(p, [Chunk(1, context + rows + j, True)] * batch)[0] for j in range(k - 1))
    return first + rest, times


def prompt_drafting(p: Pricing, prompts: list[Chunk], k: int) -> float:
    """Seconds of the MTP forwards after prompts complete: one over each prompt's computed
    tokens (the chunk's new_tokens standing for the whole computed prompt, at its cached
    context), then k - 1 of one row each."""
    if not prompts:
        return 0.0
    first = draft_forward(p, prompts)[0]
    ends = [c.context + c.new_tokens for c in prompts]
    return first + sum(draft_forward(p, [Chunk(1, e + j, True) for e in ends])[0] for j in range(k - 1))
