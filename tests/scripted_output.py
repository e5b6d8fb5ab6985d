"""A model whose output is written by the test: the runner's sampling step replaced by a script.

Server tests of an output format (gpt-oss's harmony) need the model to write that format; a
random tiny model never would. The forward pass still runs (batching, KV cache, streaming are
the real ones); only the token each request samples is taken from `script(prompt ids)`.
"""

from __future__ import annotations

from typing import Callable

import pytest

import tacit.worker.model_runner as model_runner
from tacit.worker.request_state import CachedRequestState


def script_sampling(monkeypatch: pytest.MonkeyPatch, script: Callable[[list[int]], list[int]]) -> list[list[int]]:
    """Every request's k-th generated token becomes script(its prompt)[k]; returns the prompts
    seen (one entry per request, so a test can check what the chat template rendered). A script
    shorter than the output the engine asks for is an IndexError: end it with a stop token."""
    prompts: list[list[int]] = []

    def sample_and_verify(sampler, logits, states: list[CachedRequestState], scheduler_output):
        tokens = []
        for r in states:
            assert not r.draft_token_ids, "a scripted output does not verify drafts"
            prompt = r.token_ids[: r.num_prompt_tokens]
            done = r.num_tokens - r.num_prompt_tokens
            if done == 0:
                prompts.append(prompt)
            tokens.append([script(prompt)[done]])
        return tokens, [None] * len(states)

    monkeypatch.setattr(model_runner, "sample_and_verify", sample_and_verify)
    return prompts
