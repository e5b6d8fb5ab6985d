"""One measured trial: the real engine, as `tacit serve` runs it, replaying a workload on the wall clock.

The engine is `tacit serve`'s own, an AsyncLLMEngine over LLMEngine(engine_args=...), built in this
process (no HTTP: what a trial compares is the engine's scheduling, and a client and server on the
same cores would add noise of their own). Each request is a task that sleeps until its arrival_s
after the start, then hands the engine seeded random token ids (bench.workloads.random_prompts)
to decode greedily for exactly output_len tokens (ignore_eos), at the file's priority.

A configuration that cannot be built, cannot hold the workload's longest request, or fails a
request comes back as TrialResult(ok=False, error=...) rather than an exception: the search
records it as infeasible and goes on. KeyboardInterrupt still stops everything. The engine is
always shut down and its memory handed back before measure() returns, so the next trial in the
same process starts from the same footing.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from tacit.bench.workload_file import WorkloadRequest
from tacit.bench.workloads import random_prompts
from tacit.config.engine_args import EngineArgs
from tacit.engine.async_engine import AsyncLLMEngine
from tacit.engine.llm_engine import LLMEngine
from tacit.platforms import get_platform
from tacit.sampling_params import SamplingParams
from tacit.scheduling.adaptive import AdaptiveBounds
from tacit.tune.objective import SLO, RequestOutcome, score

# What a configuration that cannot run raises while it is built or stepped: a bad or clashing
# knob (ValueError), a device out of memory (torch.OutOfMemoryError is a RuntimeError) or an
# engine error (RuntimeError), the host out of memory (MemoryError). Anything else is a bug here.
TRIAL_ERRORS = (ValueError, RuntimeError, MemoryError)


@dataclass
class TrialResult:
    ok: bool  # False: the configuration failed (engine build error, OOM, a request failed)
    error: str
    outcomes: list[RequestOutcome] = field(default_factory=list)  # in workload order
    duration_s: float = 0.0  # the first arrival to the last completion

    def score(self, slo: SLO) -> dict[str, float]:
        """objective.score of this trial; a failed trial is infeasible and has none."""
        if not self.ok:
            raise ValueError(f"this trial failed ({self.error}); it is infeasible and has no score")
        return score(self.outcomes, slo, self.duration_s)


def _failed(error: str, outcomes: list[RequestOutcome] | None = None, duration_s: float = 0.0) -> TrialResult:
    return TrialResult(ok=False, error=error, outcomes=outcomes or [], duration_s=duration_s)


def _check_workload(workload: list[WorkloadRequest]) -> None:
    if not workload:
        raise ValueError("measure needs a workload of at least one request; got none")
    for i, w in enumerate(workload):
        if not isinstance(w, WorkloadRequest):
            raise ValueError(f"workload[{i}] is {type(w).__name__}; must be a WorkloadRequest (bench.workload_file)")


def _too_long(workload: list[WorkloadRequest], max_model_len: int) -> str | None:
    """Why this engine cannot serve the workload as written, or None. The engine itself would
    silently cut max_tokens to what max_model_len leaves, and the trial would then measure fewer
    tokens than the workload asks for."""
    i, w = max(enumerate(workload), key=lambda iw: iw[1].input_len + iw[1].output_len)
    if w.input_len + w.output_len > max_model_len:
        return (
            f"workload request {i} needs {w.input_len + w.output_len} tokens (input_len {w.input_len} + "
            f"output_len {w.output_len}), more than this configuration's max_model_len {max_model_len} "
            f"(set by max_model_len, or capped by what num_kv_blocks / kv_cache_memory hold)"
        )
    return None


async def _one(
    engine: AsyncLLMEngine, w: WorkloadRequest, prompt: list[int], start: float
) -> tuple[RequestOutcome, float, str]:
    """Replay one request: (outcome, its completion time on perf_counter, error text or '')."""
    await asyncio.sleep(max(0.0, start + w.arrival_s - time.perf_counter()))
    params = SamplingParams(temperature=0.0, max_tokens=w.output_len, ignore_eos=True)
    handed = time.perf_counter()  # TTFT and e2e count from here, as a client's do from its send
    first = last = None
    tokens = 0
    try:
        stream = await engine.add_request(prompt, params, priority=w.priority)
        try:
            async for out in stream:
                n = len(out.outputs[0].token_ids)
                now = time.perf_counter()
                if n and first is None:
                    first = now
                if n > tokens:
                    last, tokens = now, n
        finally:
            if not stream.finished:  # cancelled (an interrupted trial): free its KV blocks now
                engine.abort(stream.request_id)
    except TRIAL_ERRORS as e:
        now = time.perf_counter()
        return RequestOutcome(w.priority, False, 0.0, 0.0, tokens), now, f"{type(e).__name__}: {e}"
    if first is None:
        return RequestOutcome(w.priority, False, 0.0, 0.0, 0), time.perf_counter(), "it produced no token"
    return RequestOutcome(w.priority, True, first - handed, last - handed, tokens), last, ""


async def _replay(
    engine: AsyncLLMEngine,
    workload: list[WorkloadRequest],
    prompts: list[list[int]],
    progress: Callable[[int, int], None] | None,
) -> tuple[list[tuple[RequestOutcome, float, str]], float]:
    start = time.perf_counter()
    done = 0

    async def tracked(w: WorkloadRequest, p: list[int]) -> tuple[RequestOutcome, float, str]:
        nonlocal done
        r = await _one(engine, w, p, start)
        done += 1
        if progress is not None:
            progress(done, len(workload))
        return r

    results = await asyncio.gather(*(tracked(w, p) for w, p in zip(workload, prompts)))
    return list(results), start


async def _warm_up(engine: AsyncLLMEngine) -> None:
    """One short request first: the first step pays one-off costs (kernel builds, allocator
    growth) that would otherwise land on the workload's first request's TTFT."""
    stream = await engine.add_request([11, 12, 13, 14], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    async for _ in stream:
        pass


def _release_memory(device: str) -> None:
    """Hand the dropped engine's memory back before the next trial builds. The KV pool is sized
    from the free memory the platform reports at build time; on CUDA, blocks left in torch's
    caching allocator do not count as free, so without empty_cache every later trial in the
    process would get a smaller pool than the first and alternated comparisons would favour
    whichever configuration ran first (eval.kld's _release does the same between models)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        get_platform(device).release_host_memory()
    except ValueError:  # an unknown device: the build already said so, and nothing was allocated
        pass


def measure(
    engine_args: EngineArgs,
    workload: list[WorkloadRequest],
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    adaptive: AdaptiveBounds | None = None,
) -> TrialResult:
    """Build the engine of engine_args, warm it up, replay workload on the wall clock, shut it
    down. progress(done, total) is called as each request completes. adaptive: run the engine
    as `tacit serve --adaptive` does, within these bounds."""
    _check_workload(workload)
    # The frontend's bound counts waiting sequences; a workload request is one sequence, so it
    # can never find len(workload) already waiting (the warm-up is done before the first
    # arrives). A rejection would be the harness's doing, not the configuration's.
    max_waiting = len(workload) + 1
    engine = AsyncLLMEngine(lambda: LLMEngine(engine_args=engine_args), max_waiting=max_waiting, adaptive=adaptive)
    try:
        try:
            engine.start()
        except TRIAL_ERRORS as e:
            return _failed(f"the engine could not be built: {type(e).__name__}: {e}")
        why = _too_long(workload, engine.max_model_len)
        if why is not None:
            return _failed(why)
        prompts = random_prompts([w.input_len for w in workload], engine.vocab_size, seed=seed)
        try:
            asyncio.run(_warm_up(engine))
        except TRIAL_ERRORS as e:
            return _failed(f"the warm-up request failed: {type(e).__name__}: {e}")
        results, start = asyncio.run(_replay(engine, workload, prompts, progress))
    finally:
        engine.shutdown()
        del engine
        _release_memory(engine_args.device)
    outcomes = [o for o, _, _ in results]
    first_arrival = start + min(w.arrival_s for w in workload)
    duration = max(t for _, t, _ in results) - first_arrival
    errors = [(i, e) for i, (_, _, e) in enumerate(results) if e]
    if errors:
        i, e = errors[0]
        return _failed(f"{len(errors)} of {len(workload)} requests failed; request {i}: {e}", outcomes, duration)
    return TrialResult(ok=True, error="", outcomes=outcomes, duration_s=duration)
