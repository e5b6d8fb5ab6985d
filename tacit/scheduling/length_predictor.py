"""OutputLengthPredictor: how many tokens a request will generate, learned online.

Recursive least squares on log lengths, updated from every request that finishes by itself
("stop" or "length"; an abort says nothing about how long the answer would have been):

    log1p(output_tokens) ~ w . [1, log1p(prompt_tokens), log1p(max_tokens), temperature,
                                has_hint, log1p(hint)]

Logs because lengths are long-tailed (lognormal-ish, a p99 ~10x the median): a squared error
on raw lengths would let the few 500-token answers drag every prediction up. Before anything
has finished it predicts max_tokens, the only bound it knows. The error against what requests
really produced is kept (mean absolute error, in tokens) so benchmarks can report it.
"""

from __future__ import annotations

import math

import numpy as np

_DIM = 6
# A prior of w = 0 with variance 100 per weight: weak enough that ~10 finished requests
# dominate it, strong enough to keep the first few updates stable.
_PRIOR_VAR = 100.0
# The temperature feature is clipped here: OpenAI's range ends at 2, and a finite but huge value
# (temperature=1e308 was once accepted) made w.x infinite and every later prediction NaN.
_MAX_TEMPERATURE_FEATURE = 2.0


class OutputLengthPredictor:
    def __init__(self) -> None:
        self._p = np.eye(_DIM) * _PRIOR_VAR
        self._w = np.zeros(_DIM)
        self.num_observed = 0
        self._abs_error_sum = 0.0
        self._num_scored = 0

    @staticmethod
    def _features(prompt_tokens: int, max_tokens: int, temperature: float, hint: int | None) -> np.ndarray:
        return np.array(
            [
                1.0,
                math.log1p(prompt_tokens),
                math.log1p(max_tokens),
                min(float(temperature), _MAX_TEMPERATURE_FEATURE),
                0.0 if hint is None else 1.0,
                0.0 if hint is None else math.log1p(hint),
            ]
        )

    def predict(self, prompt_tokens: int, max_tokens: int, temperature: float, hint: int | None = None) -> int:
        if self.num_observed == 0:
            return max_tokens if hint is None else min(hint, max_tokens)
        y = float(self._w @ self._features(prompt_tokens, max_tokens, temperature, hint))
        if not math.isfinite(y):
            return max_tokens
        return int(min(max(round(math.expm1(min(y, 30.0))), 1), max_tokens))

    def observe(
        self, prompt_tokens: int, max_tokens: int, temperature: float, hint: int | None, predicted: int, actual: int
    ) -> None:
        """Learn one finished request; a sample that is not finite is ignored (one bad request
        must not change how every later one is predicted)."""
        x = self._features(prompt_tokens, max_tokens, temperature, hint)
        if not (np.isfinite(x).all() and math.isfinite(predicted) and math.isfinite(actual)):
            return
        self._abs_error_sum += abs(predicted - actual)
        self._num_scored += 1
        px = self._p @ x
        gain = px / (1.0 + x @ px)
        self._w += gain * (math.log1p(actual) - self._w @ x)
        self._p -= np.outer(gain, px)
        self.num_observed += 1

    @property
    def mean_abs_error(self) -> float | None:
        """Tokens, over every request scored so far (its prediction was made when it arrived)."""
        return self._abs_error_sum / self._num_scored if self._num_scored else None

    @property
    def num_scored(self) -> int:
        return self._num_scored
