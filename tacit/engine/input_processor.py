"""InputProcessor: a prompt and its sampling parameters in, the scheduler's Requests out.

It tokenizes, checks everything a client can get wrong before anything is queued or allocated
(token ids in range, the prompt shorter than the context, prompt + max_tokens within the whole
KV pool, the priority an integer, a structured-output grammar that compiles), resolves the
request's latency targets from its priority class, and fans an n>1 request out into n
sequences with their own seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tacit.sampling_params import SamplingParams
from tacit.scheduling.request import Request, slo_targets
from tacit.structured_output import StructuredOutputManager
from tacit.tokenizer import Tokenizer


def check_token_ids(ids: list[int], vocab_size: int, what: str) -> None:
    """Raise a ValueError naming the first bad ids when any falls outside the vocabulary."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{what} {bad[:5]} are out of range; valid ids are 0..{vocab_size - 1}")


@dataclass(frozen=True)
class ProcessedRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]  # one per output sequence (n of them)


class InputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        max_model_len: int,
        kv_capacity_tokens: int,
        slo_classes: dict[int, dict[str, float]],
        structured_output: StructuredOutputManager | None = None,
        hidden_size: int = 0,
        pooling_refused: str | None = None,
    ) -> None:
        """hidden_size: an embedding's length (what PoolingParams.dimensions may not exceed);
        pooling_refused: why this engine serves no embedding request (None: it does)."""
        self.hidden_size = hidden_size
        self.pooling_refused = pooling_refused
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = kv_capacity_tokens
        self.slo_classes = slo_classes
        self.structured_output = structured_output

    def tokenize_prompt(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            check_token_ids(prompt, self.vocab_size, "prompt token ids")
            return None, list(prompt)
        raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def process(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> ProcessedRequest:
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        text, ids = self.tokenize_prompt(prompt)
        if not ids:
            raise ValueError("prompt is empty: it must hold at least one token")
        scoring_only = params.max_tokens == 0  # a prompt to score may fill the whole context
        if len(ids) > self.max_model_len or (len(ids) == self.max_model_len and not scoring_only):
            rule = (
                "it may be at most that long"
                if scoring_only
                else "it must be shorter, leaving room for at least one generated token "
                "(as long only with max_tokens=0, which scores the prompt without generating)"
            )
            raise ValueError(f"prompt is {len(ids)} tokens, but max_model_len is {self.max_model_len}: {rule}")
        room = self.max_model_len - len(ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        need = len(ids) + max_tokens
        if need > self.kv_capacity_tokens:
            raise ValueError(
                f"prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) needs {need} KV slots, "
                f"more than the whole KV pool holds ({self.kv_capacity_tokens}); "
                f"lower max_tokens or raise num_kv_blocks / kv_cache_memory"
            )
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError(f"cache_salt={cache_salt!r} is invalid: must be a non-empty string or None")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority={priority!r} is invalid: must be an integer (lower runs first)")
        if params.pooling is not None:
            if self.pooling_refused is not None:
                raise ValueError(f"embedding requests are not served here: {self.pooling_refused}")
            d = params.pooling.dimensions
            if d is not None and d > self.hidden_size:
                raise ValueError(f"dimensions={d} is invalid: this model's embeddings have {self.hidden_size} values")
        if params.structured_outputs is not None:
            if self.structured_output is None:
                raise ValueError("structured_outputs is not supported by this engine")
            self.structured_output.validate(params.structured_outputs)  # compiles; a bad grammar raises here
        ttft, tpot = self._slo_targets(params, priority)
        children = []
        for i in range(params.n):
            child_params = params if params.n == 1 or params.seed is None else replace(params, seed=params.seed + i)
            if i and params.prompt_logprobs is not None:  # the n sequences share one prompt: score it once
                child_params = replace(child_params, prompt_logprobs=None)
            child_id = request_id if params.n == 1 else f"{request_id}#{i}"
            req = Request(
                child_id,
                ids,
                child_params,
                max_tokens,
                priority=priority,
                parent_id=request_id,
                index=i,
                cache_salt=cache_salt,
            )
            req.ttft_slo, req.tpot_slo = ttft, tpot
            children.append(req)
        return ProcessedRequest(request_id, text, ids, children)

    def _slo_targets(self, params: SamplingParams, priority: int) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) targets in seconds: the request's own, else its priority class's."""
        return slo_targets(self.slo_classes, priority, params.ttft_slo_ms, params.tpot_slo_ms)
