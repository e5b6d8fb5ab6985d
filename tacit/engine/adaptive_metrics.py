"""The adaptive controller's counters and gauges for /metrics (`tacit serve --adaptive`;
engine/adaptation.py applies its decisions)."""

from __future__ import annotations

import threading

from tacit.engine.prometheus import write_metric
from tacit.scheduling.adaptive import KNOBS, Decision


class AdaptiveMetrics:
    """Decisions per (knob, direction) and the knobs' current values: written by the engine
    thread, rendered by /metrics (ServingMetrics.render_prometheus)."""

    def __init__(self, values: dict[str, int]) -> None:
        self._lock = threading.Lock()
        self.decisions = {(k, d): 0 for k in KNOBS for d in ("up", "down")}
        self.values = dict(values)

    def count(self, decision: Decision) -> None:
        with self._lock:
            for move in decision.moves:
                self.decisions[move] += 1
            self.values = {k: getattr(decision, k) for k in KNOBS}

    def render(self, lines: list[str], label: str) -> None:
        with self._lock:
            decisions, values = dict(self.decisions), dict(self.values)
        name = "tacit_adaptive_decisions_total"
        lines += [
            f"# HELP {name} Moves of a scheduler knob by the adaptive controller (--adaptive), by knob and direction.",
            f"# TYPE {name} counter",
        ]
        for (knob, direction), n in sorted(decisions.items()):
            lines.append(f'{name}{{{label},knob="{knob}",direction="{direction}"}} {n}')
        write_metric(
            lines,
            "tacit_adaptive_max_num_batched_tokens",
            "gauge",
            "The step token budget the adaptive controller set (the configured one until its first move).",
            label,
            values["max_num_batched_tokens"],
        )
        write_metric(
            lines,
            "tacit_adaptive_long_prefill_token_threshold",
            "gauge",
            "The long-prefill cap the adaptive controller set (the configured one until its first move).",
            label,
            values["long_prefill_token_threshold"],
        )
