"""How alike one sequence's tokens route: ModelShape.routing_draws in the operator counts, and
its measurement on a loaded model (perf_model/routing.py) against the reference's router."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import StepShape, expected_distinct_experts, step_ops
from tacit.perf_model.routing import draws_from_distinct, measure_routing_draws
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_times
from tacit.platforms.hardware_table import get_hardware_spec

from .test_counts import MOE


def _experts_bytes(shape, step: StepShape) -> float:
    return next(o.bytes for o in step_ops(shape, step) if o.name == "experts")


def test_uniform_routing_is_one_draw_a_token():
    s = shape_from_hf(MOE)
    assert s.routing_draws == () and s.sequence_draws(37) == 37
    # a 32-token prompt reads what 32 independent tokens read
    one_prompt = _experts_bytes(s, StepShape(1, 32, 0))
    assert one_prompt == pytest.approx(_experts_bytes(s, StepShape(32, 1, 0)))  # same pairs, same experts


def test_sequence_draws_interpolate_the_measured_points():
    s = replace(shape_from_hf(MOE), routing_draws=((8.0, 3.0), (64.0, 6.0)))
    assert s.sequence_draws(1) == 1 and s.sequence_draws(8) == pytest.approx(3.0)
    assert s.sequence_draws(64) == pytest.approx(6.0)
    # log-log between the points: 3 * (32 / 8) ** (log 2 / log 8) = 3 * 4 ** (1/3)
    assert s.sequence_draws(32) == pytest.approx(3 * 4 ** (1 / 3))
    # through (1, 1) below the first point, the last slope beyond the last, never above the tokens
    assert s.sequence_draws(2) == pytest.approx(
        2 ** (torch.log(torch.tensor(3.0)) / torch.log(torch.tensor(8.0))).item()
    )
    assert s.sequence_draws(512) == pytest.approx(6 * 8 ** (1 / 3))
    values = [s.sequence_draws(t) for t in (1, 2, 4, 8, 16, 32, 64, 128, 1024)]
    assert values == sorted(values) and all(v <= t for v, t in zip(values, (1, 2, 4, 8, 16, 32, 64, 128, 1024)))


def test_alike_tokens_read_fewer_experts_in_one_prompt_not_across_prompts():
    s = replace(shape_from_hf(MOE), routing_draws=((8.0, 2.0),))
    # one 8-token prompt reads what 2 independent tokens read
    want = expected_distinct_experts(8, 2, 2.0)
    per_expert, acts = 3 * 64 * 32 * 2, 16 * (2 * 64 + 3 * 32) * 2
    assert _experts_bytes(s, StepShape(1, 8, 0)) == pytest.approx(2 * (want * per_expert + acts))
    # decode rows are one token each of different sequences: independent, as before
    assert _experts_bytes(s, StepShape(8, 1, 0)) == _experts_bytes(shape_from_hf(MOE), StepShape(8, 1, 0))


def test_a_mixed_step_sums_each_chunks_draws():
    s = replace(shape_from_hf(MOE), routing_draws=((8.0, 2.0),))
    spec = get_hardware_spec("h200-sxm")
    from tacit.perf_model.efficiency import load_profile

    p = Pricing(s, spec, load_profile(spec.efficiency_profile))

    def experts(step: MixedStep) -> float:
        return next(t.op.bytes for t in mixed_step_times(p, step)[1] if t.op.name == "experts")

    two_prompts = experts(MixedStep([Chunk(8, 0, True), Chunk(8, 0, True)]))  # 4 draws
    one_long = experts(MixedStep([Chunk(16, 0, True)]))  # 2 * 2 ** (1/3) = 2.5 draws (the last slope on), not 4
    pairs_acts = 2 * 32 * (2 * 64 + 3 * 32) * 2
    assert two_prompts == pytest.approx(2 * expected_distinct_experts(8, 2, 4.0) * 3 * 64 * 32 * 2 + pairs_acts)
    assert one_long < two_prompts
    # with decode rows: 2 draws for the chunk, one per decode row
    mixed = experts(MixedStep([Chunk(8, 0, True), Chunk(1, 20, True), Chunk(1, 30, True)]))
    acts = 2 * 20 * (2 * 64 + 3 * 32) * 2
    assert mixed == pytest.approx(2 * expected_distinct_experts(8, 2, 4.0) * 3 * 64 * 32 * 2 + acts)


def test_draws_from_distinct_inverts_the_expected_count():
    for draws in (1.0, 2.5, 7.0, 20.0):
        d = expected_distinct_experts(128, 8, draws)
        assert draws_from_distinct(d, 128, 8, 64) == pytest.approx(draws)
    assert draws_from_distinct(128, 128, 8, 64) == 64  # every expert read: as many draws as tokens
    assert draws_from_distinct(8, 128, 8, 64) == 1  # one token's experts: one draw
    assert draws_from_distinct(127.99, 128, 8, 64) == 64  # never more draws than tokens


def test_measured_draws_are_the_reference_routers_distinct_experts(tiny_model_factory):
    """The hook counts what the model's own routing picks: transformers' router on the same
    prompt picks the same experts (float32, no near ties on these seeds)."""
    from tacit import LLM
    from tacit.sampling_params import SamplingParams

    hf, _, path = tiny_model_factory("qwen3_moe_all")
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64)
    prompts = {t: torch.randint(3, 200, (t,), generator=torch.Generator().manual_seed(t)).tolist() for t in (2, 4)}

    def prefill(t: int) -> None:
        llm.generate([prompts[t]], SamplingParams(max_tokens=1, temperature=0.0))

    got = measure_routing_draws(llm.engine.model, prefill, (2, 4))
    cfg = hf.config
    for (t, draws), ids in zip(got, prompts.values()):
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_router_logits=True)
        distinct = [
            len(torch.topk(lg.float(), cfg.num_experts_per_tok, dim=-1).indices.unique()) for lg in out.router_logits
        ]
        want = draws_from_distinct(sum(distinct) / len(distinct), cfg.num_experts, cfg.num_experts_per_tok, t)
        assert t == len(ids) and draws == pytest.approx(want, abs=1e-3)


def test_a_model_without_moe_layers_is_refused(tiny_model_factory):
    from tacit import LLM

    llm = LLM(str(tiny_model_factory("llama")[2]), dtype="float32", num_kv_blocks=16)
    with pytest.raises(ValueError, match="no MoE layer"):
        measure_routing_draws(llm.engine.model, lambda t: None, (4,))
