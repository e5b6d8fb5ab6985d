"""`tacit predict --serve`: replay tacit's real scheduler on a simulated clock, as Vidur does for vLLM.

No model runs. Requests from a workload file arrive at their times; each step the real
`Scheduler.schedule()` (tacit/scheduling: the same budget, chunking, policy, KV block pool and
preemption as the engine) picks the step; a step-time function prices it (the roofline step
model by default, tacit/perf_model/step_model.py); the clock advances by that; then the real
`update_from_output()` gets one fake token per sampling row (ignore_eos, so each request ends
at exactly its output_len). Requests arriving while a step runs join at the next step, unless
they may cut in: as the online engine does between two decoder layers of the step in flight,
the simulator stops the step at the first layer boundary after an arrival (the step's time
split evenly over num_layers), asks the real `schedule_cut_in()`, prices and completes that
prefill there, and resumes the step, which ends that much later (tacit serve's path on every
backend; on this CPU the fused C++ decode of fewer than 8 rows runs as one call, with no
boundary, worker/paths/fused_decode.py CUT_IN_MIN_ROWS). With
a swap space (the scheduler's own SwapSpace, which holds no tensors), preemption may swap as the
engine's does, and each step's SwapOps add their blocks' bytes over the host copy bandwidth to
the step. A request's TTFT/TPOT targets come from its priority class (SchedulerConfig.
slo_classes), as the engine's InputProcessor sets them.

TTFT, TPOT and E2E follow `tacit bench serve`'s definitions (RequestResult), goodput its
`--slo` bounds (meets): the numbers are comparable with a measured run of the same file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tacit.bench.serve import RequestResult, _stats, meets
from tacit.bench.workload_file import WorkloadRequest
from tacit.config import SchedulerConfig
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.memory.swap import SwapSpace
from tacit.outputs import ModelRunnerOutput
from tacit.perf_model.memory import device_memory, kv_bytes_per_token
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_seconds
from tacit.sampling_params import SamplingParams
from tacit.scheduling.errors import SLOUnattainableError
from tacit.scheduling.policy import get_policy
from tacit.scheduling.request import Request, slo_targets
from tacit.scheduling.scheduler import Scheduler
from tacit.scheduling.scheduler_output import SchedulerOutput, samples_this_step

StepPricer = Callable[[MixedStep], float]
FAKE_TOKEN = 1  # what every row "samples": ignore_eos makes its value irrelevant


class SimClock:
    """The scheduler's clock: seconds since the first arrival, moved only by the simulator."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class KVPool:
    num_blocks: int
    block_size: int = 16  # tacit's CacheConfig default

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


def kv_pool_from_memory(
    p: Pricing,
    max_num_batched_tokens: int,
    utilization: float,
    block_size: int = 16,
    workload: list[WorkloadRequest] | None = None,
) -> KVPool:
    """Blocks of one device's memory left for KV, as vLLM sizes its pool: capacity * utilization,
    less the weight shard and the activations of the widest step (max_num_batched_tokens rows,
    or all of `workload`'s tokens where fewer: without chunked prefill the budget is the model's
    max_model_len, 131,072 for Llama-3.1, which no step of a small workload comes near)."""
    if workload:
        max_num_batched_tokens = min(max_num_batched_tokens, sum(w.input_len + w.output_len for w in workload))
    mem = device_memory(p.shape, p.parallel, p.weight_dtype, p.kv_dtype, 1, max_num_batched_tokens, 1, p.group_size)
    free = p.spec.memory_capacity.value * utilization - mem.weights - mem.activations
    per_block = block_size * kv_bytes_per_token(p.shape, p.parallel, p.kv_dtype)
    blocks = int(free // per_block)
    if blocks < 1:
        raise ValueError(
            f"no room for a KV cache: {mem.weights / 1e9:.1f} GB of weights + {mem.activations / 1e9:.1f} GB of "
            f"activations against {p.spec.memory_capacity.value * utilization / 1e9:.1f} GB usable per device; "
            "try more --tensor-parallel-size or a smaller --quantization"
        )
    return KVPool(blocks, block_size)


@dataclass
class SimResult:
    results: list[RequestResult]
    duration_s: float
    num_steps: int
    num_preemptions: int
    rejected: list[str]
    busy_s: float  # clock time spent in steps (the rest: idle, waiting for arrivals)
    tokens_per_step: float
    num_swapped_out: int = 0  # preemptions that swapped (the rest recomputed)
    swap_s: float = 0.0  # clock time of the swaps' copies
    num_cut_ins: int = 0  # requests prefilled inside another step (their forwards count as steps)


def _step_of(out: SchedulerOutput, reqs: dict[str, Request]) -> MixedStep:
    chunks = []
    for req_id, n in out.num_scheduled_tokens.items():
        r = reqs[req_id]
        chunks.append(
            Chunk(n, r.num_computed_tokens, samples_this_step(r.num_computed_tokens, n, r.num_tokens, r.params))
        )
    return MixedStep(chunks)


def simulate(
    workload: list[WorkloadRequest],
    price: StepPricer,
    pool: KVPool,
    config: SchedulerConfig | None = None,
    swap: SwapSpace | None = None,
    num_layers: int = 1,
) -> SimResult:
    """Run the workload to completion; every request that the policy (config.policy) admits
    finishes. Results come in arrival order (file order among equal arrival times). swap: the
    host swap space (its bytes_per_s is the copy bandwidth, and stays so); None: recompute.
    num_layers: the model's decoder layers, whose boundaries are where requests may cut in
    (config.cut_in_prefill_tokens; 1: no boundary, no cut-in)."""
    config = config or SchedulerConfig()
    for i, w in enumerate(workload, 1):
        if w.input_len + w.output_len > pool.capacity_tokens:  # the engine's InputProcessor refuses these
            raise ValueError(
                f"workload request {i}: input_len + output_len = {w.input_len + w.output_len} tokens exceeds the "
                f"KV pool's {pool.capacity_tokens} ({pool.num_blocks} blocks of {pool.block_size})"
            )
    clock = SimClock()
    sched = Scheduler(
        config,
        PagedKVCacheManager(pool.num_blocks, pool.block_size),
        get_policy(config.policy),
        clock=clock,
        swapper=swap,
    )
    order = sorted(range(len(workload)), key=lambda i: workload[i].arrival_s)  # stable: file order on ties
    reqs: dict[str, Request] = {}
    rejected: list[str] = []
    nxt, steps, busy, tokens, swap_s = 0, 0, 0.0, 0, 0.0

    def admit() -> None:
        """Hand the scheduler every request that has arrived by now."""
        nonlocal nxt
        while nxt < len(order) and workload[order[nxt]].arrival_s <= clock.now:
            i = order[nxt]
            w = workload[i]
            params = SamplingParams(max_tokens=w.output_len, ignore_eos=True)
            req = Request(f"req-{i + 1}", [0] * w.input_len, params, w.output_len, w.priority, arrival_time=w.arrival_s)
            req.ttft_slo, req.tpot_slo = slo_targets(config.slo_classes, w.priority)  # as the InputProcessor sets them
            try:
                sched.add_request(req)
                reqs[req.request_id] = req
            except SLOUnattainableError:
                rejected.append(req.request_id)
            nxt += 1

    def run(out: SchedulerOutput, step: MixedStep, dt: float, copied: int = 0, copy_s: float = 0.0) -> None:
        """The runner's answer to `out` (priced as `step` when it was scheduled), a forward of dt
        seconds that the clock has passed."""
        sampled = [rid for rid, c in zip(out.num_scheduled_tokens, step.chunks) if c.samples]
        runner = ModelRunnerOutput(
            req_ids=sampled,
            sampled_token_ids=[[FAKE_TOKEN] for _ in sampled],
            logprobs=[None] * len(sampled),
            execute_s=dt,
            swap_blocks=copied,
            swap_s=copy_s,
        )
        sched.update_from_output(out, runner)

    while nxt < len(order) or sched.has_unfinished_requests():
        admit()
        out = sched.schedule()
        copied = sum(len(op.block_ids) for op in out.swap_ops)  # drops carry no blocks
        copy_s = copied * swap.bytes_per_block / swap.bytes_per_s if copied else 0.0
        clock.now += copy_s  # before the forward, as the runners copy
        busy += copy_s
        swap_s += copy_s
        if not out.num_scheduled_tokens:
            if nxt < len(order):  # idle until the next arrival
                clock.now = max(clock.now, workload[order[nxt]].arrival_s)
                continue
            if sched.has_unfinished_requests():
                stuck = ", ".join(r.request_id for r in sched.waiting[:5])
                raise RuntimeError(f"the scheduler scheduled nothing with {stuck} waiting and nothing to wait for")
            break
        step = _step_of(out, reqs)
        dt = price(step)
        start = clock.now
        steps += 1
        tokens += step.tokens
        # Layer boundaries inside the step: the first one after an arrival takes it in, and the
        # requests schedule_cut_in() picks prefill there, pausing the step for their forward.
        paused = 0.0
        for layer in range(1, num_layers if config.cut_in_prefill_tokens else 1):
            boundary = start + paused + dt * layer / num_layers
            if nxt == len(order) or workload[order[nxt]].arrival_s > boundary:
                continue
            clock.now = boundary
            admit()
            cut_in = sched.schedule_cut_in()
            if not cut_in.num_scheduled_tokens:
                continue
            cut_step = _step_of(cut_in, reqs)
            cut_dt = price(cut_step)
            clock.now += cut_dt
            paused += cut_dt
            steps += 1
            tokens += cut_step.tokens
            run(cut_in, cut_step, cut_dt)
        clock.now = start + dt + paused
        busy += dt + paused
        run(out, step, dt, copied, copy_s)
    results = [_result(r) for r in reqs.values()]
    swapped = swap.num_swapped_out if swap is not None else 0
    return SimResult(
        results,
        clock.now,
        steps,
        sched.num_preemptions,
        rejected,
        busy,
        tokens / max(steps, 1),
        swapped,
        swap_s,
        sched.num_cut_ins,
    )


def _result(r: Request) -> RequestResult:
    if r.first_token_time is None or r.last_token_time is None:
        return RequestResult(ok=False, error="never finished")
    return RequestResult(
        ok=True,
        ttft=r.first_token_time - r.arrival_time,
        e2e=r.last_token_time - r.arrival_time,
        output_tokens=len(r.output_token_ids),
    )


def summarize(sim: SimResult, slo: dict[str, float]) -> dict:
    """`tacit bench serve`'s keys (milliseconds, p50/p90/p99), for the simulated run."""
    ok = [r for r in sim.results if r.ok]
    duration = sim.duration_s if sim.duration_s > 0 else math.nan
    good = [r for r in ok if meets(r, slo)]
    return {
        "completed": len(ok),
        "failed": len(sim.results) - len(ok) + len(sim.rejected),
        "duration_s": sim.duration_s,
        "request_throughput": len(ok) / duration,
        "output_tok_s": sum(r.output_tokens for r in ok) / duration,
        "goodput_req_s": len(good) / duration if slo else None,
        "slo": {k: v * 1000 for k, v in slo.items()},
        "ttft_ms": _stats([r.ttft for r in ok]),
        "tpot_ms": _stats([r.tpot for r in ok if r.tpot is not None]),
        "e2e_ms": _stats([r.e2e for r in ok]),
        "num_steps": sim.num_steps,
        "num_preemptions": sim.num_preemptions,
        "num_cut_ins": sim.num_cut_ins,
        "num_swapped_out": sim.num_swapped_out,
        "swap_s": sim.swap_s,
        "busy_fraction": sim.busy_s / duration,
        "mean_tokens_per_step": sim.tokens_per_step,
    }


def roofline_pricer(p: Pricing) -> StepPricer:
    return lambda step: mixed_step_seconds(p, step)
