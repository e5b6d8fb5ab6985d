"""An engine over a model with sliding-window layers (qwen3_sliding: layer 1 attends to its last
24 positions): one block table per KV cache group, swap preemption off (recompute instead), the
prefix cache's second tier refused by name."""

import pytest

from tacit import LLM


def test_a_sliding_window_model_runs_without_swap_and_refuses_the_second_tier(tiny_model_factory):
    _, _, path = tiny_model_factory("qwen3_sliding")
    llm = LLM(str(path), dtype="float32", swap_space=1)
    assert llm.engine.kv_cache_config.sliding_windows == (None, 24)
    assert llm.engine.scheduler.swapper is None  # asked for, but swap names one table's blocks
    with pytest.raises(ValueError, match="second prefix-cache tier keeps one KV cache group's blocks"):
        LLM(str(path), dtype="float32", kv_offloading_size=0.01)
