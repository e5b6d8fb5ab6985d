"""AdaptiveController: the step token budget (max_num_batched_tokens) and the long-prefill cap
(long_prefill_token_threshold) moved at run time, within bounds, from the live queue and the
measured step times (`tacit serve --adaptive`; off by default).

The rule is model-predictive. Every step's measured time is fitted by the same exponentially
weighted least squares the scheduler's cost model uses (StepCostModel: ~50 steps of memory):

    step_seconds ~= a + c * decode_rows + b * prefill_tokens

Every request decoding in a step waits that whole step for its next token, so a step's time is
the inter-token latency (TPOT) of all of them. With D requests running and a TPOT target T, the
most prefill one step can carry and still meet T is

    P* = (0.9 * T - a - c * D) / b       (0.9: headroom for the +-10% step-to-step noise of 2
                                          shared cores, cost_model.py)

and the budget the rule wants is B* = D + P*, rounded down to 16 tokens and held within the
bounds. A worked example, the default model (SmolLM2-135M bf16, 2 cores: a + c * D ~= 50 ms at
D = 32, b ~= 0.6 ms a prompt token; config/scheduler.py's measurements) under a recipe's TPOT of
400 ms: P* = (360 - 50) / 0.6 = 516, B* = 548 -> 544. The configured 2,048 would let one step
run ~1.3 s, every one of the 32 decodes 3x past its target; at 100 ms P* = 66 and B* = 98, held
at the bounds' floor (256). Where the fit says the target is missed by the decodes alone
(a + c * D >= 0.9 T) no budget helps, and the budget is left alone (as the sla policy does).

When each knob moves:
- budget, queue long: to B*, up when steps are fast (more prompt tokens a step: fewer steps pay
  the weights again, TTFT falls), down when the fit says a full step at the current budget would
  miss T;
- budget, queue drained: back to the configured (tuned) value, or B* if that is lower;
- cap, queue long and a prompt longer than the cap prefilling: down to half of what the step has
  for prefill, (B - D) / 2, so the short prompts queued behind it (which may pass it: the
  scheduler's short_only admission) get the other half of each step instead of what a 512-token
  chunk leaves;
- cap, queue drained: back to the configured value.

Hysteresis, so noise and alternating load do not make it flap:
- the queue is judged on its moving average over ~5 steps (weight 0.2 a step), with two
  thresholds: long above 1.0 waiting, drained below 0.25, and in between it stays as it was
  (a queue alternating 0, 8, 0, 8 averages ~4: long, every time);
- a knob moves only when its target differs from its value by at least 20%: twice the step
  time's noise, so noise alone does not move it;
- a budget brought down goes up again only REVERSAL_HOLD_S (5 s) later: the fit that just said
  "too slow" must see ~100 steps of the smaller size (two of its memories) before it says "fast
  enough". Without it, `tacit serve --adaptive` on a tiny model on 2 shared cores took the budget
  240, 160, 224, 128, 240 in five seconds as new prefill shapes made single steps slow;
- at least MIN_INTERVAL_S (1 s) between two decisions: ~20 steps of the default model at 32
  running (~50 ms each), so a decision is judged on steps run under it (20 new steps are a third
  of the fit's weight: 1 - 0.98^20) rather than on the one step after it, and the log gets at
  most one line a second;
- no decision before MIN_OBSERVED (8) steps: three unknowns need a few steps of different shapes.

The arrival rate enters through the queue: requests wait exactly when they arrive faster than
the steps serve them. The speculative length keeps its own controller (spec_controller.py),
and this one does not touch its bounds. This module is fed numbers (observe) and answers with
numbers (decide); the engine applies them between steps (tacit/engine/adaptation.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tacit.config import SchedulerConfig
from tacit.scheduling.cost_model import StepCostModel

KNOBS = ("max_num_batched_tokens", "long_prefill_token_threshold")
# Each of these is explained, with the number behind it, in the module docstring.
MIN_INTERVAL_S = 1.0
REVERSAL_HOLD_S = 5.0
MIN_OBSERVED = 8
DEAD_BAND = 0.2
HEADROOM = 0.9
QUEUE_WEIGHT = 0.2
QUEUE_LONG = 1.0
QUEUE_DRAINED = 0.25
GRANULE = 16
# The default floors: 256 tokens a step (below it each step pays the weights for little prefill:
# config/scheduler.py measured 256-token chunks 1.3x slower in all than 512) and a 128-token cap.
DEFAULT_MIN_BATCHED_TOKENS = 256
DEFAULT_MIN_LONG_PREFILL = 128
DEFAULT_GROWTH = 4


@dataclass(frozen=True)
class AdaptiveBounds:
    """The range each knob may move in and the TPOT target; None: derived from the engine's
    scheduler config by resolve() (budget in [256, 4 x configured], cap in [128, configured
    budget], TPOT the tightest tpot_ms of its slo_classes)."""

    min_batched_tokens: int | None = None
    max_batched_tokens: int | None = None
    min_long_prefill: int | None = None
    max_long_prefill: int | None = None
    tpot_ms: float | None = None

    def resolve(self, config: SchedulerConfig, budget_ceiling: int | None = None) -> "AdaptiveBounds":
        """Every bound filled in and checked against config. budget_ceiling: the most tokens a
        step may hold because the engine sized something for it at build (streamed experts)."""
        if not config.enable_chunked_prefill:
            raise ValueError(
                "--adaptive needs chunked prefill (enable_chunked_prefill): without it a budget below a "
                "prompt's length would never schedule that prompt"
            )
        tpot = self.tpot_ms
        if tpot is None:
            tpot = min((c["tpot_ms"] for c in config.slo_classes.values() if "tpot_ms" in c), default=None)
        if tpot is None:
            raise ValueError(
                "--adaptive needs a TPOT target: give --adaptive-tpot-ms MS, or slo_classes with a tpot_ms "
                "(a recipe's scheduler section, or --slo-class PRIORITY:tpot=MS)"
            )
        b0, c0 = config.max_num_batched_tokens, config.long_prefill_token_threshold
        # The cap bounds every request's chunk; the KV manager sized a sliding window's blocks
        # for chunks of at most the configured budget (max_chunk_tokens), so the cap stays
        # within it. With no cap (0) a chunk is the whole budget, so the budget may not grow.
        grow = DEFAULT_GROWTH * b0 if c0 else b0
        hi_b = self.max_batched_tokens or (min(grow, budget_ceiling) if budget_ceiling else grow)
        lo_b = self.min_batched_tokens or min(DEFAULT_MIN_BATCHED_TOKENS, b0, hi_b)
        if c0:
            hi_c = self.max_long_prefill or b0
            lo_c = self.min_long_prefill or min(DEFAULT_MIN_LONG_PREFILL, c0, hi_c)
        else:
            lo_c = hi_c = 0
            if self.min_long_prefill or self.max_long_prefill:
                raise ValueError(
                    "--adaptive-min/max-long-prefill need a long-prefill cap to move: "
                    "long_prefill_token_threshold is 0 (no cap)"
                )
        out = AdaptiveBounds(lo_b, hi_b, lo_c, hi_c, float(tpot))
        out._check(budget_ceiling, b0)
        return out

    def _check(self, budget_ceiling: int | None, b0: int) -> None:
        for flag, v in (
            ("--adaptive-min-batched-tokens", self.min_batched_tokens),
            ("--adaptive-max-batched-tokens", self.max_batched_tokens),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{flag}={v!r} is invalid: must be an integer >= 1")
        if self.min_batched_tokens > self.max_batched_tokens:
            raise ValueError(
                f"--adaptive-min-batched-tokens={self.min_batched_tokens} is above "
                f"--adaptive-max-batched-tokens={self.max_batched_tokens}"
            )
        if budget_ceiling is not None and self.max_batched_tokens > budget_ceiling:
            raise ValueError(
                f"--adaptive-max-batched-tokens={self.max_batched_tokens} is above {budget_ceiling}, the step size "
                f"the engine sized its streamed-expert cache for (max_num_batched_tokens)"
            )
        if self.max_long_prefill:
            for flag, v in (
                ("--adaptive-min-long-prefill", self.min_long_prefill),
                ("--adaptive-max-long-prefill", self.max_long_prefill),
            ):
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"{flag}={v!r} is invalid: must be an integer >= 1")
            if self.min_long_prefill > self.max_long_prefill:
                raise ValueError(
                    f"--adaptive-min-long-prefill={self.min_long_prefill} is above "
                    f"--adaptive-max-long-prefill={self.max_long_prefill}"
                )
            if self.max_long_prefill > b0:
                raise ValueError(
                    f"--adaptive-max-long-prefill={self.max_long_prefill} is above max_num_batched_tokens={b0}: "
                    f"the KV cache was sized for chunks of at most the configured budget"
                )
        if not isinstance(self.tpot_ms, (int, float)) or isinstance(self.tpot_ms, bool) or not self.tpot_ms > 0:
            raise ValueError(f"--adaptive-tpot-ms={self.tpot_ms!r} is invalid: must be milliseconds > 0")


@dataclass(frozen=True)
class Decision:
    """The knobs' new values (both, changed or not), which moved and how, and why."""

    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    moves: tuple[tuple[str, str], ...]  # (knob, "up" | "down"): the knobs that changed
    reason: str

    def changes(self) -> dict[str, int]:
        return {k: getattr(self, k) for k, _ in self.moves}


class AdaptiveController:
    def __init__(self, bounds: AdaptiveBounds, max_num_batched_tokens: int, long_prefill_token_threshold: int) -> None:
        """bounds: resolved (AdaptiveBounds.resolve); the other two: the configured values, where
        the knobs start and what they return to when the queue drains."""
        if bounds.tpot_ms is None or bounds.min_batched_tokens is None or bounds.min_long_prefill is None:
            raise ValueError("AdaptiveController needs resolved bounds: call AdaptiveBounds.resolve(config) first")
        self.bounds = bounds
        self.target_s = bounds.tpot_ms / 1000
        self.configured = (max_num_batched_tokens, long_prefill_token_threshold)
        self.budget, self.cap = max_num_batched_tokens, long_prefill_token_threshold
        self.cost = StepCostModel()
        self.queue = 0.0  # the moving average of the waiting queue
        self.queue_long = False
        self.num_running = 0
        self.num_long_prefills = 0
        self.last_decision: float | None = None
        self.last_budget_down = float("-inf")

    def observe(
        self,
        step_seconds: float,
        num_prefill_tokens: int,
        num_decode_rows: int,
        num_waiting: int,
        num_running: int,
        now: float,
        num_long_prefills: int = 0,
    ) -> None:
        """One step as run: its wall time and shape, and the queue after it. num_long_prefills:
        running prompts still longer than the cap (prefilling a cap-sized chunk a step)."""
        self.cost.observe(num_prefill_tokens, num_decode_rows, step_seconds)
        self.queue += QUEUE_WEIGHT * (num_waiting - self.queue)
        if self.queue > QUEUE_LONG:
            self.queue_long = True
        elif self.queue < QUEUE_DRAINED:
            self.queue_long = False
        self.num_running = num_running
        self.num_long_prefills = num_long_prefills
        if self.last_decision is None:
            self.last_decision = now  # the first decision waits one interval from the first step

    def best_budget(self) -> int | None:
        """B* = D + P* (module docstring), rounded down to GRANULE and held within the bounds;
        None when the fit cannot say: no prompt token measured yet, or the decodes alone miss T."""
        b = self.cost.prefill_s_per_token
        decodes = self.cost.step_s(0, self.num_running)
        if b <= 0 or decodes >= HEADROOM * self.target_s:
            return None
        room = int((HEADROOM * self.target_s - decodes) / b)
        best = (self.num_running + room) // GRANULE * GRANULE
        return max(self.bounds.min_batched_tokens, min(self.bounds.max_batched_tokens, best))

    def decide(self, now: float) -> Decision | None:
        """New values for the knobs, or None: too soon, too few steps, or nothing worth moving."""
        if self.last_decision is None or now - self.last_decision < MIN_INTERVAL_S:
            return None
        if self.cost.num_observed < MIN_OBSERVED:
            return None
        budget, cap, why = self.budget, self.cap, []
        best = self.best_budget()
        predicted = self.cost.step_s(max(0, self.budget - self.num_running), self.num_running)
        if best is not None:
            fit = (
                f"fit {self.cost.step_s() * 1000:.1f} ms + {self.cost.draft_s_per_token * 1000:.2f} ms/row x "
                f"{self.num_running} + {self.cost.prefill_s_per_token * 1000:.3f} ms/token"
            )
            if self.queue_long or predicted > HEADROOM * self.target_s:
                target, reason = (
                    best,
                    (
                        f"queue {self.queue:.1f} waiting, a {self.budget}-token step predicted {predicted * 1000:.0f} ms "
                        f"against TPOT {self.bounds.tpot_ms:.0f} ms ({fit}): best budget {best}"
                    ),
                )
            else:
                lo, hi = self.bounds.min_batched_tokens, self.bounds.max_batched_tokens
                target = min(best, max(lo, min(hi, self.configured[0])))
                reason = f"queue drained ({self.queue:.2f} waiting): budget back to {target} ({fit})"
            held = target > self.budget and now - self.last_budget_down < REVERSAL_HOLD_S
            if _moves(self.budget, target) and not held:
                budget = target
                why.append(reason)
        if self.cap:
            lo, hi = self.bounds.min_long_prefill, self.bounds.max_long_prefill
            if self.queue_long and self.num_long_prefills:
                target = max(lo, min(hi, (budget - self.num_running) // 2 // GRANULE * GRANULE))
                if target < self.cap and _moves(self.cap, target):
                    cap = target
                    why.append(
                        f"{self.num_long_prefills} prompt(s) over the {self.cap}-token cap prefilling while "
                        f"{self.queue:.1f} wait: cap to half the step's prefill room, {target}"
                    )
            elif not self.queue_long:
                target = max(lo, min(hi, self.configured[1]))
                if target > self.cap and _moves(self.cap, target):
                    cap = target
                    why.append(f"queue drained: cap back to {target}")
            if cap > hi and budget > self.configured[0]:
                # A configured cap above the configured budget bounded nothing while the budget
                # did; a grown budget would let one request's chunk pass what the KV cache was
                # sized for (AdaptiveBounds.resolve), so the cap comes down with it.
                cap = hi
                why.append(f"cap held at {hi}, the most one request's chunk may be")
        moves = tuple(
            (knob, "up" if new > old else "down")
            for knob, old, new in zip(KNOBS, (self.budget, self.cap), (budget, cap))
            if new != old
        )
        if not moves:
            return None
        if budget < self.budget:
            self.last_budget_down = now
        self.budget, self.cap, self.last_decision = budget, cap, now
        return Decision(budget, cap, moves, "; ".join(why))


def _moves(value: int, target: int) -> bool:
    """Outside the dead band: the target differs from the value by at least DEAD_BAND of it."""
    return abs(target - value) >= DEAD_BAND * value
