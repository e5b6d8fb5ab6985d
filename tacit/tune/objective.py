"""What a tuning trial is worth: goodput under per-priority SLOs, and how sure a comparison is.

One request's bounds are its priority class's (SLO.for_priority); whether it met them is
`tacit bench serve`'s own test (bench.serve.meets), so a tuned number and a benchmarked one
mean the same thing. A failed request never meets. Outcomes may be measured (tune.measure) or
simulated (the serve simulator); score() does not care which.

The search compares configurations over repeated, alternated runs; bootstrap_ratio and spread
are the two numbers it reports its confidence with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tacit.bench.serve import SLO_KEYS, meets, parse_slo


def _check_bounds(bounds: dict[str, float], where: str) -> dict[str, float]:
    if not isinstance(bounds, dict):
        raise ValueError(f"{where}={bounds!r} is invalid: must be a dict of {', '.join(SLO_KEYS)} -> seconds")
    for key, s in bounds.items():
        if key not in SLO_KEYS:
            raise ValueError(f"{where} key {key!r} is not known; valid: {', '.join(SLO_KEYS)}")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < math.inf:
            raise ValueError(f"{where}[{key!r}]={s!r} is invalid: must be seconds > 0")
    return dict(bounds)


@dataclass(frozen=True)
class SLO:
    """Per priority class bounds in seconds (keys ttft, tpot, e2e, any subset); a priority
    that `classes` does not list is held to `default`. An empty dict bounds nothing."""

    classes: dict[int, dict[str, float]] = field(default_factory=dict)
    default: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Copies, so a caller's dict (a scenario file's) cannot change a built SLO.
        if not isinstance(self.classes, dict):
            raise ValueError(f"SLO classes={self.classes!r} is invalid: must be a dict priority -> bounds")
        classes = {}
        for prio, bounds in self.classes.items():
            if isinstance(prio, bool) or not isinstance(prio, int):
                raise ValueError(f"SLO classes key {prio!r} is invalid: must be an integer priority")
            classes[prio] = _check_bounds(bounds, f"SLO classes[{prio}]")
        object.__setattr__(self, "classes", classes)
        object.__setattr__(self, "default", _check_bounds(self.default, "SLO default"))

    def for_priority(self, priority: int) -> dict[str, float]:
        return self.classes.get(priority, self.default)

    @classmethod
    def parse(cls, text: str) -> "SLO":
        """'ttft=500,tpot=100' (milliseconds; ':' also accepted, as bench serve's --slo writes
        it) -> an SLO that holds every priority to those bounds."""
        return cls(default=parse_slo(text))


@dataclass(frozen=True)
class RequestOutcome:
    """One request, simulated or measured. ttft and e2e: seconds from its arrival to its first
    and last token (0 for a failed request, which never meets an SLO)."""

    priority: int
    ok: bool
    ttft: float
    e2e: float
    output_tokens: int

    @property
    def tpot(self) -> float | None:
        """bench serve's TPOT: (e2e - ttft) / (tokens - 1); None for one token or fewer."""
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def score(outcomes: list[RequestOutcome], slo: SLO, duration_s: float) -> dict[str, float]:
    """{'goodput_req_s', 'throughput_req_s', 'output_tok_s', 'p99_ttft_s', 'p50_ttft_s', 'p99_tpot_s',
    'completed', 'failed', 'slo_attainment'}. goodput: requests that met their own class's SLO
    per second of duration_s; slo_attainment: the share of all requests (failed ones included)
    that did. Latency percentiles are over completed requests (nan when none completed)."""
    if not outcomes:
        raise ValueError("score needs at least one request outcome; got none")
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not 0 < duration_s < math.inf:
        raise ValueError(f"duration_s={duration_s!r} is invalid: must be seconds > 0")
    ok = [o for o in outcomes if o.ok]
    good = sum(1 for o in ok if meets(o, slo.for_priority(o.priority)))
    tpots = [o.tpot for o in ok if o.tpot is not None]
    return {
        "goodput_req_s": good / duration_s,
        "throughput_req_s": len(ok) / duration_s,
        "output_tok_s": sum(o.output_tokens for o in ok) / duration_s,
        "p99_ttft_s": _pct([o.ttft for o in ok], 99),
        "p50_ttft_s": _pct([o.ttft for o in ok], 50),
        "p99_tpot_s": _pct(tpots, 99),
        "completed": float(len(ok)),
        "failed": float(len(outcomes) - len(ok)),
        "slo_attainment": good / len(outcomes),
    }


def _as_sample(values: list[float], name: str, at_least: int) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    if a.ndim != 1 or a.size < at_least or not np.isfinite(a).all():
        raise ValueError(f"{name} must be a list of at least {at_least} finite numbers; got {values!r}")
    return a


def bootstrap_ratio(a: list[float], b: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """mean(a) / mean(b) with its 95% interval: (median, 2.5th, 97.5th percentile) over n
    resamplings of each list's repeats, with replacement, a and b independently (their repeats
    are separate runs, not pairs). A resample of b whose mean is 0 gives inf (nan over a 0 of a)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is invalid: must be an integer >= 1")
    xa, xb = _as_sample(a, "a", 1), _as_sample(b, "b", 1)
    rng = np.random.default_rng(seed)
    ma = xa[rng.integers(0, xa.size, (n, xa.size))].mean(axis=1)
    mb = xb[rng.integers(0, xb.size, (n, xb.size))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = ma / mb
    # "nearest": a percentile between two inf resamples is inf, not the nan interpolation gives
    # (a default that met no SLO in most runs: chat-high-rate read 0, 0, 0.023 req/s)
    low, median, high = np.percentile(ratios, [2.5, 50, 97.5], method="nearest")
    return float(median), float(low), float(high)


def spread(values: list[float]) -> tuple[float, float]:
    """(sample standard deviation, interquartile range) of repeated measurements of one number."""
    x = _as_sample(values, "values", 2)
    q25, q75 = np.percentile(x, [25, 75])
    return float(x.std(ddof=1)), float(q75 - q25)


# --objective NAME -> (the score's key, the direction that is better)
OBJECTIVES = {
    "goodput": ("goodput_req_s", "maximize"),
    "throughput": ("throughput_req_s", "maximize"),
    "p99-ttft": ("p99_ttft_s", "minimize"),
}


def objective_value(scores: dict[str, float], objective: str) -> float:
    """The number the search optimizes, signed so that larger is always better."""
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective {objective!r} is not known; valid: {', '.join(OBJECTIVES)}")
    key, direction = OBJECTIVES[objective]
    value = scores[key]
    if math.isnan(value):  # nothing completed: the worst there is
        return -math.inf
    return value if direction == "maximize" else -value
