"""SpeculativeConfig: vLLM's --speculative-config, which draft proposer runs and how many tokens
it proposes a step (the runner verifies them all in one forward: worker/sample_step.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields

from tacit.config.quantization import check_quantization

# The proposers tacit ships (worker/drafter.py registers one class per name; a test keeps the
# two lists equal, since this module sits below the worker and cannot read its registry).
SPECULATIVE_METHODS = ("ngram", "suffix", "draft_model", "mtp")
# Methods that draft from the target's final hidden states of every token (the runner keeps them).
HIDDEN_STATE_METHODS = ("mtp",)
# vLLM's older spellings of a method.
METHOD_ALIASES = {"deepseek_mtp": "mtp"}
# Keys only one method reads: given with another method they are refused (a likely mistake).
METHOD_KEYS = {
    "ngram": ("prompt_lookup_max", "prompt_lookup_min"),
    "suffix": (
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
    ),
    "draft_model": ("model", "quantization", "draft_tensor_parallel_size"),
}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    # ngram (prompt lookup, vLLM's names): the longest and shortest suffix of a request's tokens
    # looked for earlier in them; the tokens after the latest match are the drafts.
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    # The draft length controller's lower bound (scheduling/spec_controller.py): it verifies
    # between this many and num_speculative_tokens of a request's drafts a step, as measured
    # acceptance and step costs say; equal to num_speculative_tokens, every draft is verified.
    min_speculative_tokens: int = 0
    # suffix (vLLM's names, worker/suffix_proposer.py): the longest match looked for, the finished
    # requests whose outputs are searched too, drafts per matched token, and the share of the
    # earlier occurrences a draft token must be the majority continuation of.
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 1000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # draft_model (vLLM's names, worker/draft_model_proposer.py): a smaller checkpoint with the
    # target's tokenizer (an HF directory or a GGUF file), its weight quantization (as
    # --quantization: auto, int8, int4, ...), and its tensor-parallel size (1: it runs unsplit in
    # the process that samples).
    model: str | None = None
    quantization: str | None = None
    draft_tensor_parallel_size: int = 1

    @property
    def uses_target_hidden_states(self) -> bool:
        return self.method in HIDDEN_STATE_METHODS

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_config method={self.method!r} is not known; valid: {', '.join(SPECULATIVE_METHODS)}"
            )
        for name in (
            "num_speculative_tokens",
            "prompt_lookup_max",
            "prompt_lookup_min",
            "suffix_decoding_max_tree_depth",
            "suffix_decoding_max_cached_requests",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config {name}={v!r} is invalid: must be an integer >= 1")
        for name, low, high in (
            ("suffix_decoding_max_spec_factor", 0.0, math.inf),
            ("suffix_decoding_min_token_prob", 0.0, 1.0),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (low < v <= high) or math.isnan(v):
                raise ValueError(f"speculative_config {name}={v!r} is invalid: must be a number in ({low}, {high}]")
        m = self.min_speculative_tokens
        if not isinstance(m, int) or isinstance(m, bool) or not 0 <= m <= self.num_speculative_tokens:
            raise ValueError(
                f"speculative_config min_speculative_tokens={m!r} is invalid: must be an integer from 0 to "
                f"num_speculative_tokens ({self.num_speculative_tokens})"
            )
        if self.method == "draft_model":
            if not isinstance(self.model, str) or not self.model:
                raise ValueError(
                    'speculative_config method="draft_model" needs "model": the draft checkpoint (a Hugging Face '
                    "directory or a GGUF file) with the target's tokenizer"
                )
            if self.quantization is not None:
                try:
                    check_quantization(self.quantization)
                except ValueError as e:
                    raise ValueError(f"speculative_config {e}") from None
            if self.draft_tensor_parallel_size != 1:
                raise ValueError(
                    f"speculative_config draft_tensor_parallel_size={self.draft_tensor_parallel_size!r} is not "
                    "supported: the draft model runs unsplit (1) in the process that samples"
                )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config prompt_lookup_min={self.prompt_lookup_min} is above "
                f"prompt_lookup_max={self.prompt_lookup_max}"
            )

    @classmethod
    def from_dict(cls, value: dict | None) -> SpeculativeConfig | None:
        """The config from vLLM's dict (None: no speculative decoding); unknown keys are refused."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config={value!r} is invalid: must be a dict such as {EXAMPLE}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config keys {unknown} are not known; valid: {', '.join(sorted(known))}")
        if "method" not in value and "model" in value:  # vLLM's reading of a config naming only a model
            value = {**value, "method": "draft_model"}
        if value.get("method") in METHOD_ALIASES:
            value = {**value, "method": METHOD_ALIASES[value["method"]]}
        missing = [k for k in ("method", "num_speculative_tokens") if k not in value]
        if missing:
            raise ValueError(f"speculative_config needs {', '.join(missing)}, e.g. {EXAMPLE}")
        other = sorted(
            key for method, keys in METHOD_KEYS.items() if method != value["method"] for key in keys if key in value
        )
        if other:
            raise ValueError(
                f"speculative_config keys {other} belong to another method than {value['method']!r}; "
                f"{value['method']!r} reads {', '.join(METHOD_KEYS.get(value['method'], ())) or 'none of its own'}"
            )
        return cls(**value)


EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'


def parse_speculative_config(text: str) -> dict:
    """--speculative-config's JSON text -> the dict the knob holds."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config {text!r} is not JSON ({e}); e.g. {EXAMPLE}") from None
    SpeculativeConfig.from_dict(value)  # refuses a bad one now, naming what is wrong
    return value
