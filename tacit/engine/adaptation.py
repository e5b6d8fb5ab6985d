"""The online engine's runtime adaptation (`tacit serve --adaptive`): each step's numbers go to the
AdaptiveController (tacit/scheduling/adaptive.py, where the rule is explained), and its decisions
are applied to the scheduler between two steps, on the engine thread, counted for /metrics and
logged. The controller sees numbers only; reading the engine and writing the scheduler's config
is this module's job.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tacit.engine.adaptive_metrics import AdaptiveMetrics
from tacit.scheduling.adaptive import KNOBS, AdaptiveBounds, AdaptiveController, Decision

if TYPE_CHECKING:
    from tacit.engine.llm_engine import LLMEngine
    from tacit.engine.metrics import ServingMetrics

logger = logging.getLogger("tacit.engine.adaptive")


class EngineAdaptation:
    def __init__(self, bounds: AdaptiveBounds, engine: "LLMEngine", metrics: "ServingMetrics") -> None:
        """bounds as given (None fields derived from the engine's scheduler config); raises
        ValueError for bounds the engine cannot run with. Its counters join metrics' /metrics."""
        config = engine.scheduler.config
        # Streamed MoE experts: the expert cache was sized for steps of the configured budget
        # (models/expert_streaming.py min_expert_cache_bytes), so steps may not grow past it.
        ceiling = config.max_num_batched_tokens if engine.config.model.expert_cache_memory is not None else None
        self.bounds = bounds.resolve(config, ceiling)
        self.controller = AdaptiveController(
            self.bounds, config.max_num_batched_tokens, config.long_prefill_token_threshold
        )
        self.metrics = metrics.adaptive = AdaptiveMetrics({k: getattr(config, k) for k in KNOBS})
        self._num_steps = engine.num_steps
        logger.info("adaptive scheduling on: %s", self.bounds)

    def after_step(self, engine: "LLMEngine", started: float, now: float) -> Decision | None:
        """Feed the step that ran from started to now (wall clock: what its decodes waited for
        their tokens, cut-ins and delivery included), then apply whatever the controller decides
        (the next schedule() runs with it). A call in which no step ran does nothing."""
        if engine.num_steps == self._num_steps:
            return None
        self._num_steps = engine.num_steps
        scheduler = engine.scheduler
        prefill, decodes, drafts = scheduler.last_step_shape  # step_update's, computed once a step
        self.controller.observe(
            now - started,
            prefill,
            decodes + drafts,  # a draft token is one more decode row (cost_model.py)
            len(scheduler.waiting),
            len(scheduler.running),
            now,
            num_long_prefills=sum(map(scheduler.is_long, scheduler.running)),
        )
        decision = self.controller.decide(now)
        if decision is None:
            return None
        scheduler.replace_config(**decision.changes())
        self.metrics.count(decision)
        logger.info(
            "adaptive: %s -> max_num_batched_tokens=%d long_prefill_token_threshold=%d: %s",
            ", ".join(f"{knob} {direction}" for knob, direction in decision.moves),
            decision.max_num_batched_tokens,
            decision.long_prefill_token_threshold,
            decision.reason,
        )
        return decision
