"""The model-only stage simulates the scheduler the engine itself builds: the same budget where
the engine raises it (no chunked prefill: to the model's max_model_len, not to the workload's
longest request), and a configuration the engine would refuse is infeasible."""

from __future__ import annotations

import json

import pytest

from tacit.config.engine_args import EngineArgs
from tacit.engine.llm_engine import LLMEngine
from tacit.tune.model_stage import ModelStage
from tacit.tune.scenario import workload_scenario
from tacit.tune.space import validate_point


@pytest.fixture
def stage_for(tiny_llama, tmp_path):
    _, _, model_dir = tiny_llama

    def make(lengths: list[tuple[int, int]], **base: object) -> ModelStage:
        workload = tmp_path / "w.jsonl"
        rows = [{"arrival_s": 0.1 * i, "input_len": n, "output_len": m} for i, (n, m) in enumerate(lengths)]
        workload.write_text("".join(json.dumps(r) + "\n" for r in rows))
        scenario = workload_scenario(str(workload), "ttft=1000,tpot=100")
        # h100-sxm: a part with a shipped profile, so no this-cpu fit runs (the scheduler is the same)
        args = EngineArgs(model=str(model_dir), dtype="float32", **base)
        return ModelStage(args, str(model_dir), scenario, "goodput", "h100-sxm")

    return make


@pytest.mark.parametrize(
    "point, base",
    [
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 48}, {}),  # raised to the model's length
        ({"enable_chunked_prefill": True, "max_num_batched_tokens": 48}, {}),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 48}, {"max_model_len": 200}),
    ],
)
def test_the_stage_schedules_with_the_engines_own_budget(stage_for, point, base):
    stage = stage_for([(40, 8), (120, 16)], **base)
    args = validate_point(point, stage.base)
    engine = LLMEngine(engine_args=args)
    try:
        built = engine.config.scheduler
    finally:
        engine.shutdown()
    priced = stage.scheduler_config(args)
    assert priced == built
    if point["enable_chunked_prefill"] is False:
        # the longest request is 136 tokens; the budget is the model's length, not that
        assert priced.max_num_batched_tokens == base.get("max_model_len", stage.hf["max_position_embeddings"]) > 136


def test_a_max_model_len_shorter_than_the_workload_is_infeasible(stage_for):
    bad = stage_for([(40, 8), (120, 16)], max_model_len=100).predict({})
    assert bad.scores is None and "needs 136 tokens, more than this configuration's max_model_len 100" in bad.error
    assert stage_for([(40, 8), (120, 16)], max_model_len=136).predict({}).scores["completed"] == 2
