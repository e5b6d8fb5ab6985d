"""SpeculativeConfig: vLLM's --speculative-config, which draft proposer runs and how many tokens
it proposes a step (the runner verifies them all in one forward: worker/sample_step.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

# The proposers tacit ships (worker/drafter.py registers one class per name; a test keeps the
# two lists equal, since this module sits below the worker and cannot read its registry).
SPECULATIVE_METHODS = ("ngram",)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    # ngram (prompt lookup, vLLM's names): the longest and shortest suffix of a request's tokens
    # looked for earlier in them; the tokens after the latest match are the drafts.
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_config method={self.method!r} is not known; valid: {', '.join(SPECULATIVE_METHODS)}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config {name}={v!r} is invalid: must be an integer >= 1")
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
        missing = [k for k in ("method", "num_speculative_tokens") if k not in value]
        if missing:
            raise ValueError(f"speculative_config needs {', '.join(missing)}, e.g. {EXAMPLE}")
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
