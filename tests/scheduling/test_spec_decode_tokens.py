"""The scheduler's half of the multi-token step: which drafts a step verifies, and how the
runner's answer (accepted drafts + one token) advances the request."""

from __future__ import annotations

from tacit.config import SchedulerConfig
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.outputs import ModelRunnerOutput
from tacit.scheduling.scheduler import Scheduler
from tests.scheduling.helpers import make_req, run_step


def _decoding(max_tokens: int = 20, budget: int = 64, blocks: int = 64):
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=budget), PagedKVCacheManager(blocks, block_size=4))
    req = make_req("a", 6, max_tokens=max_tokens)
    s.add_request(req)
    while not req.output_token_ids:  # the prefill (in chunks under a small budget), token 7 sampled
        run_step(s)
    return s, req


def _answer(s: Scheduler, out, tokens: list[int], drafts: list[int] | None = None):
    runner = ModelRunnerOutput(["a"], [tokens], [None], draft_token_ids={"a": drafts} if drafts else {})
    return s.update_from_output(out, runner)


def test_drafts_are_scheduled_as_tokens_and_rejected_ones_rewind():
    s, req = _decoding()
    req.spec_token_ids = [11, 12, 13]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 4} and out.scheduled_spec_decode_tokens == {"a": [11, 12, 13]}
    assert s.kv.num_blocks_of("a") == 3  # 6 + 1 + 3 = 10 slots
    (news,) = _answer(s, out, [11, 5], drafts=[21, 22])  # first draft accepted, then 5 sampled
    assert news.new_token_ids == [11, 5] and req.output_token_ids == [7, 11, 5]
    # The step computed 7, 11, 12, 13; 12 and 13 were wrong: computed is the 8 tokens before 5.
    assert req.num_computed_tokens == 8 == req.num_tokens - 1
    assert req.spec_token_ids == [21, 22]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 3} and out.scheduled_spec_decode_tokens == {"a": [21, 22]}
    (news,) = _answer(s, out, [21, 22, 9])  # all accepted, no new drafts
    assert req.num_computed_tokens == 11 and req.num_tokens == 12 and req.spec_token_ids == []
    assert s.schedule().num_scheduled_tokens == {"a": 1}


def test_drafts_are_capped_by_the_budget_and_by_max_tokens():
    s, req = _decoding(budget=3)
    req.spec_token_ids = [11, 12, 13, 14]
    assert s.schedule().scheduled_spec_decode_tokens == {"a": [11, 12]}  # 1 + 2 fills a budget of 3
    s, req = _decoding(max_tokens=3)
    req.spec_token_ids = [11, 12, 13, 14]
    out = s.schedule()
    # One token is out; the step can add 2 more: its token after one accepted draft.
    assert out.scheduled_spec_decode_tokens == {"a": [11]}
    (news,) = _answer(s, out, [11, 4])
    assert news.finish_reason == "length" and req.output_token_ids == [7, 11, 4]


def test_a_stop_token_among_accepted_drafts_drops_what_follows_it():
    s, req = _decoding()
    req.params.stop_token_ids = [12]
    req.spec_token_ids = [11, 12, 13]
    out = s.schedule()
    (news,) = _answer(s, out, [11, 12, 13, 14])
    assert news.new_token_ids == [11, 12] and news.finish_reason == "stop" and news.stop_reason == 12
    assert req.output_token_ids == [7, 11, 12] and s.kv.num_used_blocks == 0


def test_prefills_and_preempted_requests_get_no_drafts():
    s = Scheduler(SchedulerConfig(), PagedKVCacheManager(64, block_size=4))
    req = make_req("a", 6)
    req.spec_token_ids = [1, 2]  # mid-prefill: nothing to verify yet
    s.add_request(req)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 6} and not out.scheduled_spec_decode_tokens
    s.update_from_output(out, ModelRunnerOutput(["a"], [[7]], [None], draft_token_ids={"a": [3]}))
    assert req.spec_token_ids == [3]
    s._preempt(req, [])
    assert req.spec_token_ids == []
