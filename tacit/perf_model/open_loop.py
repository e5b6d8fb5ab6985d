"""Serving at a request rate: requests arriving as a Poisson process (vLLM's and TensorRT-LLM's
`benchmark_serving --request-rate R`, an open loop), prefill on the same devices as decode.

Where served_tpot.py keeps N requests in flight (a closed loop), here the rate is given and the
concurrency follows. In steady state every request's prompt is prefilled once, so one attention
group of D spends u_g = R * P / D of the time prefilling (P: one prompt's TTFT alone) and some
group u = 1 - (1 - u_g)^D of it; the decodes advance the rest of the time, so a token takes
X = TPOT(n) / (1 - u), with n the sequences decoding: by Little's law n = R * (output - 1) * X.
X rises with n and n with X; from n = 1 the iteration climbs to the least fixed point, and where
it passes `max_sequences` (or u_g reaches 1) the rate is more than the deployment serves: the
queue grows without bound and no mean exists.

A new request's TTFT is its wait, then its prompt's step. Its group serves prompts one at a time
at rate R / D, each taking P: an M/D/1 queue, whose mean wait is u_g * P / (2 (1 - u_g))
(Pollaczek-Khinchine). A request arriving while the group decodes waits out the step in flight,
on average half a step: the device is decoding a share (1 - u) * (1 - e^-n) of the time (with n
sequences decoding, Poisson, none are with probability e^-n). So TTFT = that wait + P; the
decode rows riding in the prompt's step are not priced (at the concurrencies an open loop runs,
a prompt's step is bound by its own tokens)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tacit.perf_model.served_tpot import some_group_share

# The iteration's stopping rule and its bound: a fixed point n of a function rising more slowly
# than n is reached geometrically; 200 steps at a relative 1e-9 is far past any concurrency a
# deployment runs, and one that has not converged by then is climbing without bound.
_STEPS = 200
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class OpenLoop:
    request_rate: float  # requests a second into this replica
    decoding: float  # mean sequences decoding (Little's law over the decode phase)
    served_tpot_s: float  # a token's time, the others' prefills included
    prefill_share: float  # u: the share of the time some group prefills
    wait_s: float  # the mean wait before a new prompt's step
    prefill_one_s: float  # P: one prompt's TTFT alone

    @property
    def served_ttft_s(self) -> float:
        return self.wait_s + self.prefill_one_s

    @property
    def decode_batch(self) -> int:
        """The sequences a replica's decode step is priced at: the decoding ones, rounded up."""
        return max(1, math.ceil(self.decoding))

    @property
    def in_flight(self) -> float:
        """Mean requests in the system: decoding, or waiting for or in their prompt's step."""
        return self.decoding + self.request_rate * self.served_ttft_s


class SaturatedError(ValueError):
    """The rate is more than the deployment serves: the queue grows without bound."""


def solve_open_loop(
    rate: float,
    prefill_one_s: float,
    output_len: int,
    tpot_at: Callable[[int], float],
    groups: int = 1,
    max_sequences: int = 1 << 20,
) -> OpenLoop:
    """The open loop's steady state at `rate` requests a second (tpot_at(n): the decode step's
    TPOT with n sequences, interpolated between whole n). Raises SaturatedError past what the
    deployment serves, ValueError on a rate that is not a positive finite number."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--request-rate must be a positive finite number of requests a second, got {rate}")
    if groups < 1 or prefill_one_s < 0:
        raise ValueError(f"groups {groups} and prefill_one_s {prefill_one_s} must be positive")
    per_group = rate * prefill_one_s / groups
    if per_group >= 1.0:
        raise SaturatedError(
            f"--request-rate {rate:g}: each prompt takes {1e3 * prefill_one_s:.2f} ms, so prefill alone needs "
            f"{per_group:.2f} of each of the {groups} attention group(s)' time; under {groups / prefill_one_s:.3g} "
            "requests a second can be served"
        )
    u = some_group_share(per_group, groups)
    cache: dict[int, float] = {}

    def tpot(n: float) -> float:
        lo = max(1, math.floor(n))
        for k in (lo, lo + 1):
            if k not in cache:
                cache[k] = tpot_at(k)
        return cache[lo] + (cache[lo + 1] - cache[lo]) * (max(n, 1.0) - lo)

    decoding = 1.0
    for _ in range(_STEPS):  # runs at least once: x is always set
        x = tpot(decoding) / (1.0 - u)
        nxt = rate * (output_len - 1) * x
        settled = abs(nxt - decoding) <= _TOLERANCE * max(nxt, 1.0)
        decoding = nxt
        if settled or decoding > max_sequences:
            break
    else:
        decoding = math.inf
    if not decoding <= max_sequences:
        raise SaturatedError(
            f"--request-rate {rate:g}: the requests in flight grow past {max_sequences} (each token takes longer "
            "the more sequences decode, and more decode the longer each takes): more than the deployment serves"
        )
    busy_decoding = (1.0 - u) * (1.0 - math.exp(-decoding))
    wait = per_group * prefill_one_s / (2.0 * (1.0 - per_group)) + busy_decoding * tpot(decoding) / 2.0
    return OpenLoop(rate, decoding, x, u, wait, prefill_one_s)
