"""OpenAI wire format: requests validated with pydantic, responses and stream chunks built from it.

Field names and defaults follow OpenAI's API reference (and vLLM where it extends it: top_k,
min_p, ignore_eos, priority, return_tokens_as_token_ids,
prompt_logprobs), so the official `openai` client and
existing tooling work unchanged. A field this server does not know is a 400 naming it, never
ignored: a client that sent `tools` and got prose back would fail far from the cause. Message
objects are the exception: their extra keys (name, tool_call_id, ...) reach the chat template.

This module holds what every endpoint shares: the strict base model, the error body, the
sampling fields of completions and chat (SamplingRequest), usage and the model list. Each
endpoint's own shapes are in completion_protocol.py, chat_protocol.py, tokenization_protocol.py
and responses_protocol.py.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from tacit.entrypoints.openai.structured_outputs import resolve_structured_outputs
from tacit.outputs import Logprob
from tacit.sampling_params import SamplingParams, StructuredOutputsParams


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- errors -------------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---- requests -----------------------------------------------------------------------------


class StreamOptions(OpenAIModel):
    include_usage: StrictBool = False


class JsonSchemaFormat(OpenAIModel):
    name: StrictStr | None = None
    # "schema" would shadow pydantic's BaseModel.schema(): the field takes it as an alias.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(OpenAIModel):
    """vLLM's newer `structured_outputs` object. Keys it does not know are refused, not dropped:
    a client asking for a structural tag or a whitespace pattern must not get unconstrained text."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | StrictStr | None = Field(default=None, alias="json")
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None


def sampling_fields(request: BaseModel, names: tuple[str, ...], defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request's values of these fields, else the model's defaults (--generation-config), else
    nothing: SamplingParams' own, OpenAI's (temperature 1, top_p 1; "unset" means that, not greedy).
    A field is unset when it is None: a request that sends temperature 1.0 gets 1.0, as vLLM."""
    out = {}
    for name in names:
        value = getattr(request, name)
        if value is None and defaults:
            value = defaults.get(name)
        if value is not None:
            out[name] = value
    return out


class SamplingRequest(OpenAIModel):
    """The fields completions and chat share. Ranges are checked by SamplingParams, whose
    ValueError names the field, so the limits live in one place."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    n: StrictInt = 1
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    seed: StrictInt | None = None
    presence_penalty: StrictFloat = 0.0
    frequency_penalty: StrictFloat = 0.0
    # vLLM's extension (unset: generation_config.json's, else 1.0, none).
    repetition_penalty: StrictFloat | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    priority: StrictInt = 0
    # tacit's scheduling extensions (docs in README): TTFT/TPOT targets for the sla policy and
    # goodput (unset: the priority class's default), and a guess at the answer's length that
    # the output-length predictor takes as a feature.
    ttft_slo_ms: StrictFloat | None = None
    tpot_slo_ms: StrictFloat | None = None
    expected_output_tokens: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extension: the prefix cache shares blocks only among requests with the same salt
    # (one per tenant: another tenant's prompts cannot be timed through cache hits).
    cache_salt: StrictStr | None = None
    # vLLM's extension: logprob tokens as "token_id:123", lossless where bytes split a character.
    return_tokens_as_token_ids: StrictBool = False
    # Structured output: OpenAI's response_format, vLLM's guided_* fields and its newer
    # structured_outputs object (README, "Structured output").
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    # vLLM fields tacit cannot honour: refused (400) if set, rather than silently ignored.
    guided_whitespace_pattern: StrictStr | None = None
    guided_decoding_backend: StrictStr | None = None

    def structured_outputs_spec(self) -> tuple[str, StructuredOutputsParams] | None:
        """(the wire field that asked, as a 400's `param` names it; the engine's spec), or None.
        Raises FieldError for two fields at once, an unsupported option or an empty spec."""
        return resolve_structured_outputs(self)

    @property
    def structured_param(self) -> str | None:
        """The wire field carrying this request's grammar (already checked by to_sampling_params)."""
        spec = self.structured_outputs_spec()
        return spec[0] if spec else None

    # vLLM's extension: every prompt token's logprob plus the top-N, returned as `prompt_logprobs`.
    prompt_logprobs: StrictInt | None = None

    @model_validator(mode="after")
    def _check_prompt_logprobs(self) -> "SamplingRequest":
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs is not available with stream=true (as in vLLM)")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def _sampling_params(
        self,
        max_tokens: int | None,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> SamplingParams:
        """Raises ValueError naming the field when a value is out of range. defaults: the model's
        generation_config.json values, for the fields this request leaves unset (None, not a value)."""
        kw: dict[str, Any] = dict(
            max_tokens=max_tokens,
            n=self.n,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
            ttft_slo_ms=self.ttft_slo_ms,
            tpot_slo_ms=self.tpot_slo_ms,
            expected_output_tokens=self.expected_output_tokens,
        )
        spec = self.structured_outputs_spec()
        if spec is not None:
            kw["structured_outputs"] = spec[1]
        kw.update(sampling_fields(self, ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"), defaults))
        return SamplingParams(**kw)


# ---- responses ----------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    # Prompt tokens whose KV came from the prefix cache instead of being computed.
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


# vLLM's prompt_logprobs: per prompt token None (the first) or {token_id: Logprob}.
PromptLogprobs = list[dict[int, Logprob] | None]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "tacit"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
