"""StepCostModel: what a step costs, learned from the steps the engine actually ran.

    step_seconds ~= base + per_decode * (num_decodes + num_draft_tokens) + per_prefill_token * num_prefill_tokens

fitted by exponentially weighted least squares over measured steps (no speed is assumed
anywhere: before the first step every estimate is 0, which admits everything). The sla
policy turns it into TTFT estimates, the swap/recompute choice into a recompute cost, the draft
length controller (spec_controller.py) into what a draft token costs. A draft token is one more
decode row (the fused decoder runs a request's drafts as rows beside its last token): at batch 1
on the default model a row costs ~1.4 ms of a ~4.9 ms step, at batch 16 ~3 ms, the regime the
fit follows; a separate draft term, fitted at batch 1, let batch-16 steps verify drafts that cost
more than they saved (0.94x of no speculation, docs/benchmarks.md).

A forgetting factor of 0.98 remembers ~50 steps: long enough to average out this machine's
step-to-step noise (+-10% on 2 shared cores), short enough to follow a neighbour process
taking the cores or a batch growing from 4 to 64 sequences within a few seconds.
"""

from __future__ import annotations

import math

import numpy as np

_FORGET = 0.98
# Ridge toward 0 so the solve stays defined while the data is still collinear (every step so
# far had the same batch size). 1e-9 s^2 is far below one step's squared time (>= 1e-6 s^2).
_RIDGE = 1e-9


class StepCostModel:
    def __init__(self) -> None:
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._coef = np.zeros(3)
        self._stale = False
        self.num_observed = 0
        self.num_observed_with_drafts = 0  # before one, a draft's cost is unknown (not 0, not measured)
        # {decodes: seconds} of decode-only steps without drafts, a moving average per batch: the
        # linear fit's intercept misses them once most steps verify drafts, because a second row
        # costs more than a third (the default model drafting for itself at batch 1: plain steps
        # 3.8 ms, with 1 and 2 drafts 6.3 and 7.0 ms, so the fit put a plain step at ~5.6 ms).
        self._plain: dict[int, float] = {}

    def observe(self, num_prefill_tokens: int, num_decodes: int, seconds: float, num_draft_tokens: int = 0) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            return  # a broken clock reading must not poison every later estimate
        x = np.array([1.0, num_decodes + num_draft_tokens, num_prefill_tokens])
        self._xtx = _FORGET * self._xtx + np.outer(x, x)
        self._xty = _FORGET * self._xty + x * seconds
        self._stale = True
        self.num_observed += 1
        self.num_observed_with_drafts += num_draft_tokens > 0
        if num_decodes and not num_prefill_tokens and not num_draft_tokens:
            last = self._plain.get(num_decodes)
            self._plain[num_decodes] = seconds if last is None else 0.9 * last + 0.1 * seconds

    def _fit(self) -> np.ndarray:
        if self._stale:
            coef = np.linalg.solve(self._xtx + _RIDGE * np.eye(3), self._xty)
            self._coef = np.maximum(coef, 0.0)  # a negative cost is noise, never a speed-up
            self._stale = False
        return self._coef

    @property
    def prefill_s_per_token(self) -> float:
        return float(self._fit()[2])

    @property
    def draft_s_per_token(self) -> float:
        """A draft token's cost: one decode row's."""
        return float(self._fit()[1])

    def step_s(self, num_prefill_tokens: int = 0, num_decodes: int = 0) -> float:
        base, per_decode, per_token = self._fit()
        return float(base + per_decode * num_decodes + per_token * num_prefill_tokens)

    def decode_step_s(self, num_decodes: int) -> float:
        """A decode-only step without drafts: as measured at this batch when it was, else fitted."""
        measured = self._plain.get(num_decodes)
        return self.step_s(0, num_decodes) if measured is None else measured

    def prefill_s(self, num_tokens: int, tokens_per_step: int, num_decodes: int) -> float:
        """Seconds to prefill num_tokens at tokens_per_step a step, beside num_decodes decodes."""
        if num_tokens <= 0:
            return 0.0
        steps = -(-num_tokens // max(1, tokens_per_step))
        base, per_decode, per_token = self._fit()
        return float(steps * (base + per_decode * num_decodes) + per_token * num_tokens)
