"""LLM: the offline API, shaped like vLLM's so its users feel at home."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from tacit.config.engine_args import EngineArgs
from tacit.engine.llm_engine import LLMEngine
from tacit.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from tacit.pooling_params import PoolingParams
from tacit.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(
        self,
        model: str | None = None,
        recipe: str | None = None,
        *,
        engine_args: EngineArgs | None = None,
        **kwargs: Any,
    ) -> None:
        # The docstring is generated below, from EngineArgs' fields.
        if engine_args is None:
            if model is not None:
                kwargs["model"] = model
            engine_args = EngineArgs.from_kwargs(recipe=recipe, **kwargs)
        elif model is not None or recipe is not None or kwargs:
            raise ValueError("pass LLM either engine_args or a model, recipe and keywords, not both")
        self.engine = LLMEngine(engine_args=engine_args)

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers and leave the process group, so another
        tensor-parallel LLM can be built in this process (dropping the last reference does too)."""
        self.engine.shutdown()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() samples with when given no SamplingParams, as vLLM's: the model's
        generation_config.json temperature / top_p / top_k / min_p / repetition_penalty
        (generation_config=auto), the rest SamplingParams' defaults."""
        return SamplingParams.from_model_defaults(self.engine.sampling_defaults)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, SamplingParams) or sampling_params is None:
            params = [sampling_params or self.get_default_sampling_params()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"got {len(prompts)} prompts but {len(params)} SamplingParams; pass one or one per prompt"
                )
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        if len(priorities) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(priorities)} priorities")
        ids = []
        try:
            for p, sp, prio in zip(prompts, params, priorities):
                ids.append(self.engine.add_request(p, sp, priority=prio))
        except Exception:
            for rid in ids:  # an invalid prompt leaves nothing half-queued behind it
                self.engine.abort_request(rid)
            raise
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def embed(
        self, prompts: Prompt | Sequence[Prompt], pooling_params: PoolingParams | None = None
    ) -> list[EmbeddingRequestOutput]:
        """One vector per prompt (vLLM's LLM.embed): the prompt's final hidden states pooled as
        pooling_params says (default: the last token's, L2-normalised: decoder embedding models
        such as Qwen3-Embedding). Embedding requests go through the scheduler like any other."""
        params = SamplingParams(max_tokens=0, pooling=pooling_params or PoolingParams())
        return [
            EmbeddingRequestOutput(o.request_id, o.prompt_token_ids, EmbeddingOutput(o.embedding))
            for o in self.generate(prompts, params)
        ]

    def score_full_logprobs(self, chunks: list[list[int]]) -> list[torch.Tensor]:
        """Teacher-forced float32 log-softmax over the vocabulary per chunk of token ids
        ([len - 1, vocab] each; see LLMEngine.score_full_logprobs)."""
        return self.engine.score_full_logprobs(chunks)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """tools: OpenAI-format definitions rendered into the prompt as the server renders them
        (the text comes back as generated; the server is what parses it into tool calls)."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = [self.chat_prompt_ids(c, add_generation_prompt, tools) for c in conversations]
        return self.generate(prompts, sampling_params)

    def chat_prompt_ids(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        return self.engine.tokenizer.encode_chat(messages, add_generation_prompt, tools)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text as it is generated, for one prompt (the CLI's chat and generate)."""
        rid = self.engine.add_request(prompt, sampling_params or self.get_default_sampling_params())
        sent = 0
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id != rid:
                        continue
                    text = out.outputs[0].text
                    if len(text) > sent:
                        yield text[sent:]
                        sent = len(text)
                    if out.finished:
                        return
                if not self.engine.has_unfinished_requests():
                    return
        finally:
            self.engine.abort_request(rid)


LLM.__init__.__doc__ = f"""Load a model and build the engine.

recipe: a recipe YAML (or its folder) whose settings apply wherever a keyword does not say otherwise.
engine_args: an EngineArgs built already (e.g. from the command line), instead of the keywords.
Keywords (EngineArgs' fields):
{EngineArgs.keyword_doc()}
"""
