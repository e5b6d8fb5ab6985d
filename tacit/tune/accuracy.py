"""`tacit tune --accuracy-budget KLD`: the knobs that change outputs, searched under a budget.

Weight quantization and an int8 KV cache are marked changes_output in EngineArgs (TuneSpec):
without a budget the search leaves them out. With one, every measured trial whose point sets
them away from the base configuration is first checked with `tacit eval kld`'s measurement
(eval/kld.run_kld: the base configuration as the reference, teacher-forced over the same token
ids, KL(ref || model) over the whole vocabulary): a mean KL divergence per token above the budget
makes the trial infeasible, with the figure in its error, before any time is spent measuring its
speed. One check per distinct combination of output-changing values, kept in OUT/accuracy.json
so a resumed study does not redo them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tacit.config.engine_args import EngineArgs
from tacit.tune.space import base_value, output_changing_knobs, validate_point

# Scored tokens and chunk length of a check: half of `tacit eval kld`'s defaults (2048, 1024);
# on the default model a check is then two loads and ~1k tokens scored twice, seconds here.
KLD_TOKENS, KLD_CONTEXT = 1024, 512

Measure = Callable[[dict[str, Any]], tuple[float | None, dict | None, str]]
KLDFn = Callable[[EngineArgs, EngineArgs], float]


def check_budget(budget: float | None) -> float | None:
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"--accuracy-budget must be a mean KL divergence > 0 (nats per token), got {budget}")
    return budget


def kld_mean(model: EngineArgs, reference: EngineArgs) -> float:
    """`tacit eval kld`'s mean KL divergence of `model` against `reference` on its default text."""
    from tacit.eval.kld import default_text, run_kld
    from tacit.platforms.compute_thread import run_on_own_thread

    # Off this (the trials') thread: the check's engines would leave it an OpenMP pool that slows
    # every trial's engine thread after it (platforms/compute_thread.py)
    result = run_on_own_thread(run_kld, model, reference, default_text(), KLD_TOKENS, KLD_CONTEXT, name="tacit-kld")
    return result.kld_mean


class AccuracyGate:
    """Wraps a trial's measurement: output-changing points pay a KLD check first (cached)."""

    def __init__(self, base: EngineArgs, budget: float, path: Path, kld: KLDFn = kld_mean) -> None:
        self.base, self.budget, self.path, self.kld = base, budget, path, kld
        # the checks hold for this reference only: a study resumed on another model starts afresh
        self.reference = {k: getattr(base, k) for k in ("model", "dtype", *output_changing_knobs())}
        saved = json.loads(path.read_text()) if path.exists() else {}
        self.checks: dict[str, float] = saved.get("checks", {}) if saved.get("reference") == self.reference else {}

    def changes(self, point: dict[str, Any]) -> dict[str, Any]:
        """The point's output-changing knobs that differ from the base configuration."""
        knobs = output_changing_knobs()
        return {k: v for k, v in sorted(point.items()) if k in knobs and base_value(self.base, k) != v}

    def check(self, changes: dict[str, Any]) -> float:
        key = json.dumps(changes, sort_keys=True)
        if key not in self.checks:
            self.checks[key] = self.kld(validate_point(changes, self.base), self.base)
            self.path.write_text(json.dumps({"reference": self.reference, "checks": self.checks}, indent=1) + "\n")
        return self.checks[key]

    def __call__(self, measure: Measure) -> Measure:
        def gated(point: dict[str, Any]) -> tuple[float | None, dict | None, str]:
            changes = self.changes(point)
            if changes:
                try:
                    kld = self.check(changes)
                except (ValueError, RuntimeError, OSError) as e:  # refused, or the model does not load so
                    return None, None, f"accuracy check: {e}"
                if kld > self.budget:
                    said = ", ".join(f"{k}={v}" for k, v in changes.items())
                    return None, None, f"{said}: mean KLD {kld:.4g} over the accuracy budget {self.budget:g}"
            return measure(point)

        return gated

    def report(self) -> list[dict[str, Any]]:
        """Each check: the output-changing values, the mean KLD, whether it is within budget."""
        return [
            {"changes": json.loads(k), "kld_mean": v, "within_budget": v <= self.budget} for k, v in self.checks.items()
        ]
