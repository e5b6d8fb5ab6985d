"""SamplingParams: how one request turns logits into tokens, validated where the user sets it."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from tacit.pooling_params import PoolingParams

# Below this a temperature is treated as greedy: dividing logits by ~0 overflows.
_GREEDY_EPS = 1e-5
# One request may ask for at most this many sequences: n=100000 once queued 99,297 sequences
# and starved every other client for 30 s. vLLM's server sets no bound; OpenAI's caps n at 128.
MAX_N = 128
# Seeds feed torch.Generator.manual_seed (64-bit); an n>1 request seeds its sequences seed + i.
_SEED_MAX = 2**63 - 1
# A length hint beyond any context is a mistake, and 10**400 overflowed the length predictor.
_MAX_EXPECTED_OUTPUT_TOKENS = 2**31 - 1


def _is_number(v: object) -> bool:
    """A real, finite int or float (a bool is not a number here, nor NaN or infinity)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A grammar the output must follow (vLLM's name and fields): exactly one of them set.

    json: a JSON schema (dict or its JSON text); json_object: any JSON object; regex: a regular
    expression (Rust regex syntax); choice: one of these strings exactly; grammar: EBNF (GBNF,
    llama.cpp's) or Lark. Whether the grammar itself is valid is checked when the request is
    added (the engine compiles it then), so a bad one fails before anything is queued.
    """

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        chosen = self.chosen_fields()
        if len(chosen) != 1:
            names = ", ".join(f.name for f in fields(self))
            got = ", ".join(chosen) or "none"
            raise ValueError(f"StructuredOutputsParams needs exactly one of {names} set; got {got}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(
                f"StructuredOutputsParams.json must be a dict or a JSON string, got {type(self.json).__name__}"
            )
        if self.json_object is not False and self.json_object is not True:
            raise ValueError(f"StructuredOutputsParams.json_object must be a bool, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"StructuredOutputsParams.{name} must be a non-empty string, got {v!r}")
        c = self.choice
        if c is not None and (not isinstance(c, list) or not c or not all(isinstance(x, str) and x for x in c)):
            raise ValueError(f"StructuredOutputsParams.choice must be a non-empty list of non-empty strings, got {c!r}")

    def chosen_fields(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    # vLLM's meaning: per prompt token (the first has none), its logprob, rank and the top-N.
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's (CTRL's) multiplicative penalty over every token in the prompt or the output so far:
    # a positive logit is divided by it, a negative one multiplied. 1.0 is off.
    repetition_penalty: float = 1.0
    n: int = 1
    skip_special_tokens: bool = True
    # Scheduling hints ride here because every entry point already carries SamplingParams per
    # request. Targets (ms) feed the sla policy and goodput; None falls back to the request's
    # priority class (SchedulerConfig.slo_classes). expected_output_tokens is the client's
    # guess at its answer's length, one feature of the output-length predictor.
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    expected_output_tokens: int | None = None
    # Constrained decoding: the sampler may only pick tokens this grammar allows.
    structured_outputs: StructuredOutputsParams | None = None
    # An embedding request (LLM.embed, /v1/embeddings): the prompt's hidden states pooled into one
    # vector once its prefill ends; it generates nothing (max_tokens 0).
    pooling: PoolingParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        def bad(name: str, value: object, valid: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}={value!r} is invalid: {valid}")

        if not _is_number(self.temperature) or self.temperature < 0:
            raise bad("temperature", self.temperature, "must be a finite number >= 0 (0 means greedy)")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", self.top_p, "must be in (0, 1]")
        if (
            not isinstance(self.top_k, int)
            or isinstance(self.top_k, bool)
            or (self.top_k < 1 and self.top_k not in (-1, 0))
        ):
            raise bad("top_k", self.top_k, "must be -1 or 0 (disabled) or an integer >= 1")
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", self.min_p, "must be in [0, 1]")
        # 0 scores a prompt without generating (prompt_logprobs): it finishes after its prefill.
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 0):
            raise bad("max_tokens", self.max_tokens, "must be an integer >= 0 or None")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise bad("min_tokens", self.min_tokens, "must be an integer >= 0")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20):
            raise bad("logprobs", self.logprobs, "must be an integer in [0, 20] or None")
        if self.prompt_logprobs is not None and (
            not _is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= 20
        ):
            raise bad("prompt_logprobs", self.prompt_logprobs, "must be an integer in [0, 20] or None")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise bad("n", self.n, f"must be an integer in [1, {MAX_N}]")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2.0 <= v <= 2.0:
                raise bad(name, v, "must be in [-2, 2]")
        if not _is_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise bad("repetition_penalty", self.repetition_penalty, "must be a finite number > 0 (1 means none)")
        top_seed = _SEED_MAX - (self.n - 1)
        if self.seed is not None and (not _is_int(self.seed) or not -_SEED_MAX - 1 <= self.seed <= top_seed):
            raise bad("seed", self.seed, f"must be an integer in [{-_SEED_MAX - 1}, {top_seed}] or None")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", self.stop, "must be a non-empty string or a list of non-empty strings")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", self.stop_token_ids, "must be a list of token ids >= 0")
        for name in ("ttft_slo_ms", "tpot_slo_ms"):
            v = getattr(self, name)
            if v is not None and (not _is_number(v) or not v > 0):
                raise bad(name, v, "must be milliseconds > 0, finite, or None")
        e = self.expected_output_tokens
        if e is not None and (not _is_int(e) or not 1 <= e <= _MAX_EXPECTED_OUTPUT_TOKENS):
            raise bad("expected_output_tokens", e, f"must be an integer in [1, {_MAX_EXPECTED_OUTPUT_TOKENS}] or None")
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise bad("structured_outputs", so, "must be a StructuredOutputsParams or None")
        if self.pooling is not None:
            if not isinstance(self.pooling, PoolingParams):
                raise bad("pooling", self.pooling, "must be a PoolingParams or None")
            if self.max_tokens != 0 or self.n != 1 or so is not None:
                raise bad(
                    "pooling",
                    self.pooling,
                    "an embedding request generates nothing: it needs max_tokens=0, n=1 and no structured_outputs",
                )
        if self.top_k == 0:
            self.top_k = -1

    @classmethod
    def from_model_defaults(cls, defaults: dict[str, float | int]) -> "SamplingParams":
        """The parameters a checkpoint's generation_config.json values make (temperature, top_p,
        top_k, min_p, repetition_penalty: tacit.loader.hf.GENERATION_CONFIG_SAMPLING_KEYS)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in defaults.items() if k in names})

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def computes_every_prompt_token(self) -> bool:
        """Whether no prompt token may come from a prefix-cache hit: prompt_logprobs scores each,
        a MEAN or CLS pool reads each (a LAST pool reads the last, which a hit never covers)."""
        return self.prompt_logprobs is not None or (self.pooling is not None and self.pooling.reads_every_token)

    @property
    def needs_penalties(self) -> bool:
        """Whether the sampler must look at this request's tokens at all (most requests: no)."""
        return self.needs_additive_penalties or self.repetition_penalty != 1.0

    @property
    def needs_additive_penalties(self) -> bool:
        """presence / frequency: they count the output tokens."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
