"""Request: one sequence's tokens and progress as the scheduler sees them, in vLLM v1's model.

There is no prefill phase: num_computed_tokens catches up with num_tokens, a chunk per step,
and a request whose computed tokens reach num_tokens samples its next token. Text, logprobs
and detokenizer state are the output processor's; the sampler's generator is the runner's.
"""

from __future__ import annotations

import enum
import itertools
import time

from tacit.sampling_params import SamplingParams

_arrival_seq = itertools.count()


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_tokens: int,
        priority: int = 0,
        parent_id: str | None = None,
        index: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.parent_id = parent_id or request_id
        self.index = index
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.arrival_seq = next(_arrival_seq)  # breaks arrival-time ties in submission order
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        # Prefix cache: the tenant's salt (requests with different salts share no block), the
        # hashes of its full blocks so far (memory/block_hash.py), and how many prompt tokens its
        # first schedule found cached (vLLM's num_cached_tokens; -1 until then).
        self.cache_salt = cache_salt
        self.block_hashes: list[bytes] = []
        self.num_cached_tokens = -1
        # Draft tokens the runner's proposer offered after its last step (vLLM v1's name); the
        # next schedule() verifies as many as fit. Replaced every step, cleared on preemption.
        self.spec_token_ids: list[int] = []
        # Its drafts' acceptance so far (decayed counts: scheduling/spec_controller.py), and the
        # steps since its drafts were last all turned down.
        self.spec_accepted = 0.0
        self.spec_trials = 0.0
        self.spec_idle_steps = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        # When a schedule() first ran it (vLLM's first_scheduled_time; a resume after a preemption
        # keeps it): its queue time ends here.
        self.first_scheduled_time: float | None = None
        # Scheduling state: targets in seconds (None: no target), the predicted output length,
        # and whether it has waited past the aging bound (sticky: it keeps that standing).
        self.ttft_slo: float | None = None
        self.tpot_slo: float | None = None
        self.predicted_output_tokens: int | None = None  # Scheduler.add_request predicts it if unset
        self.aged = False
        self.slo_deferred = False  # admitted although its TTFT estimate misses (sla, "defer")

    @property
    def next_token_deadline(self) -> float:
        """When its next token is due under its targets: the first by arrival + TTFT target, a
        later one (after a preemption) by the last token's time + TPOT target; inf if none."""
        if self.first_token_time is None:
            return self.arrival_time + self.ttft_slo if self.ttft_slo is not None else float("inf")
        if self.tpot_slo is None or self.last_token_time is None:
            return float("inf")
        return self.last_token_time + self.tpot_slo

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason, self.stop_reason = reason, stop_reason


def slo_targets(
    slo_classes: dict[int, dict[str, float]], priority: int, ttft_ms: float | None = None, tpot_ms: float | None = None
) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) targets in seconds: the request's own (ttft_ms, tpot_ms), else its priority
    class's (SchedulerConfig.slo_classes); None where neither sets one."""
    cls = slo_classes.get(priority, {})
    ttft = ttft_ms if ttft_ms is not None else cls.get("ttft_ms")
    tpot = tpot_ms if tpot_ms is not None else cls.get("tpot_ms")
    return (None if ttft is None else ttft / 1000, None if tpot is None else tpot / 1000)
