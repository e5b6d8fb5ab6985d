"""Verify steps across ranks: the driver samples and accepts, every worker settles the same
tokens before the next step (tensor parallel), and data-parallel attention gathers each
request's verify rows from the rank that ran them. Float32: greedy tokens as one process gives."""

import pytest
from scripted_drafts import ScriptedProposer

from tacit import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9, 3, 2, 8, 1, 4, 4, 6, 10, 11], [12] * 20]


@pytest.mark.parametrize("layout", [{}, {"data_parallel_attention": True}], ids=["tp2", "dp-attention"])
def test_verify_steps_across_ranks_give_one_process_tokens(tiny_model_factory, layout):
    _, _, path = tiny_model_factory("qwen3")
    ref = [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32").generate(PROMPTS, PARAMS)]
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2, **layout)
    try:
        proposer = ScriptedProposer(
            {tuple(p): r for p, r in zip(PROMPTS, ref)}, k=3, wrong=lambda done, j: (done + j) % 4 == 2
        )
        llm.engine.runner.drafter = proposer
        steps = llm.engine.num_steps
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
        assert got == ref and proposer.proposed > 0
        assert llm.engine.num_steps - steps < 12  # verify steps did yield several tokens
        llm.engine.runner.drafter = None
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == ref
    finally:
        llm.engine.shutdown()


def test_a_draft_model_on_the_driver_drafts_for_a_tensor_parallel_target(tiny_model_factory):
    """The draft model runs unsplit in the driver's process; the target's ranks verify."""
    _, _, path = tiny_model_factory("qwen3")
    draft = tiny_model_factory("llama_draft")[2]
    ref = [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32").generate(PROMPTS, PARAMS)]
    config = {"model": str(draft), "num_speculative_tokens": 3, "min_speculative_tokens": 3}
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2, speculative_config=config)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == ref
        assert llm.engine.get_stats().spec_decode_num_draft_tokens > 0
    finally:
        llm.engine.shutdown()
