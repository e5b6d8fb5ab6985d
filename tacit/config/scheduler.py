"""SchedulerConfig: what a step may hold and in which order requests are served."""

from __future__ import annotations

from dataclasses import dataclass, field

# 512 tokens: on the default model (bf16, 2 cores) a 2,000-token prompt prefilled in one step
# took 1.5 s beside 32 decodes, so each of them waited 1.5 s for that token. Capped at 512, four
# steps of 0.28-0.38 s, 1.3 s in all; at 256, steps of 0.19-0.25 s but 1.7 s in all (each step
# pays the weights again). 512 cuts the stall 4x for no loss. Command: docs/benchmarks.md.
DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 512


# 256 tokens: the cut-in's prefill delays every request of the step it cuts into. An interactive
# turn's prompt (~30-200 tokens) prefills in ~40-150 ms on the default model (bf16, 2 cores);
# a longer prompt is not interactive-sized and waits for the step to end like everyone else.
DEFAULT_CUT_IN_PREFILL_TOKENS = 256


PREEMPTION_MODES = ("auto", "recompute", "swap")
SLO_ADMISSION = ("reject", "defer")
SLO_KEYS = ("ttft_ms", "tpot_ms")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    # vLLM's knob: one request prefills at most this many tokens a step, so a long prompt
    # cannot fill the whole budget and stall everyone else's decode. 0 turns the cap off. See
    # DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD for the measured reason behind the default.
    long_prefill_token_threshold: int = DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
    # vLLM's knob and default: how many prompts longer than the threshold prefill in one step.
    # The cap above bounds each; this bounds their sum. Without it four 1,500-token prompts
    # filled a 2,048-token step (~1 s) and put the interactive p99 TTFT at ~2 s in the
    # mixed-priority benchmark (docs/benchmarks.md).
    max_long_partial_prefills: int = 1
    # A request that has waited this long since arrival is served before every request that
    # has not (FCFS among such requests), and no newer request preempts it: the bound that
    # keeps priority, sjf and sla from starving anyone. None: strict order, as vLLM's priority.
    aging_s: float | None = 60.0
    # Default TTFT/TPOT targets per priority class, {priority: {"ttft_ms": .., "tpot_ms": ..}};
    # a request's own ttft_slo_ms / tpot_slo_ms win over its class's.
    slo_classes: dict[int, dict[str, float]] = field(default_factory=dict)
    # What the sla policy does with a request whose estimated TTFT already misses its target.
    slo_admission: str = "reject"
    preemption_mode: str = "auto"
    # A waiting request that outranks someone in the step in flight, with at most this many
    # prompt tokens, is prefilled between two of that step's layers rather than after it (the
    # online engine only; fcfs never lets anyone cut in). 0: never. See DEFAULT_CUT_IN_PREFILL_TOKENS.
    cut_in_prefill_tokens: int = DEFAULT_CUT_IN_PREFILL_TOKENS
    # With the prefix cache on: among waiting requests the policy ranks equal up to arrival (fcfs;
    # priority within a priority), those with a longer cached prefix go first (SGLang's lpm, bounded
    # against starving cache-cold requests; tacit/scheduling/prefix_order.py). False: arrival order.
    enable_cache_aware_scheduling: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_long_partial_prefills"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} is invalid: must be an integer >= 1")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(
                f"enable_chunked_prefill={self.enable_chunked_prefill!r} is invalid: must be true or false"
            )
        if not isinstance(self.enable_cache_aware_scheduling, bool):
            raise ValueError(
                f"enable_cache_aware_scheduling={self.enable_cache_aware_scheduling!r} is invalid: must be true or false"
            )
        t = self.long_prefill_token_threshold
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"long_prefill_token_threshold={t!r} is invalid: must be an integer >= 0 (0: no cap)")
        t = self.cut_in_prefill_tokens
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"cut_in_prefill_tokens={t!r} is invalid: must be an integer >= 0 (0: never cut in)")
        if self.aging_s is not None and (not isinstance(self.aging_s, (int, float)) or self.aging_s <= 0):
            raise ValueError(f"aging_s={self.aging_s!r} is invalid: must be seconds > 0, or None for no aging")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode={self.preemption_mode!r} is not known; valid: {', '.join(PREEMPTION_MODES)}"
            )
        if self.slo_admission not in SLO_ADMISSION:
            raise ValueError(f"slo_admission={self.slo_admission!r} is not known; valid: {', '.join(SLO_ADMISSION)}")
        # A copy, so the caller's dict (a recipe's, a CLI's) cannot change a built config.
        object.__setattr__(self, "slo_classes", {k: dict(v) for k, v in (self.slo_classes or {}).items()})
        for prio, targets in self.slo_classes.items():
            if not isinstance(prio, int) or isinstance(prio, bool):
                raise ValueError(f"slo_classes key {prio!r} is invalid: must be an integer priority")
            for key, ms in targets.items():
                if key not in SLO_KEYS:
                    raise ValueError(f"slo_classes[{prio}] key {key!r} is not known; valid: {', '.join(SLO_KEYS)}")
                if not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms <= 0:
                    raise ValueError(f"slo_classes[{prio}][{key!r}]={ms!r} is invalid: must be milliseconds > 0")


def parse_slo_class(spec: str) -> tuple[int, dict[str, float]]:
    """'0:ttft=500,tpot=100' -> (0, {'ttft_ms': 500.0, 'tpot_ms': 100.0}) (the CLI's --slo-class)."""
    prio, sep, rest = spec.partition(":")
    try:
        targets = {f"{k.strip()}_ms": float(v) for k, v in (p.split("=") for p in rest.split(","))}
        if not sep:
            raise ValueError
        return int(prio), targets
    except ValueError:
        raise ValueError(
            f"--slo-class {spec!r} is invalid; write PRIORITY:ttft=MS,tpot=MS, e.g. 0:ttft=500,tpot=100"
        ) from None
