"""TTFT of `tacit predict`'s batch: every request arrives at t=0 and tacit's real Scheduler
admits and chunks them (serve_sim.simulate on a simulated clock, each step priced by the mixed
step model), so a batch whose prompts exceed --max-num-batched-tokens prefills over several
steps, decodes of the prompts already done riding along, and --max-num-seqs below the batch
queues the rest behind the first requests' whole outputs. The decodes riding along are priced as
plain one-token decode rows, also under speculative decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tacit.bench.workload_file import WorkloadRequest
from tacit.config import SchedulerConfig
from tacit.perf_model.serve_sim import KVPool, simulate
from tacit.perf_model.speculative import prompt_drafting
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_seconds


@dataclass(frozen=True)
class BatchTTFT:
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    prefill_steps: int  # steps that computed prompt tokens
    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_token_threshold: int  # 0: no cap on one prompt's tokens a step

    def as_json(self) -> dict:
        ms = {k: 1e3 * getattr(self, f"{k}_s") for k in ("mean", "p50", "p90", "p99", "max")}
        return {
            **ms,
            "prefill_steps": self.prefill_steps,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
        }


def batch_ttft(
    p: Pricing,
    batch: int,
    input_len: int,
    output_len: int,
    config: SchedulerConfig,
    cached: int = 0,
    mtp_drafts: int = 0,
) -> BatchTTFT:
    """The batch's TTFTs. cached: prompt tokens each request finds in the prefix cache (the
    scheduler computes the rest; every chunk's context is priced that much further on).
    mtp_drafts: k of an MTP proposer, whose forwards over a prompt run in the step that
    completes it, before its first token is handed back (worker/model_runner.py)."""
    block = KVPool(1).block_size
    # Room for the whole batch: the prediction's batch runs together (memory is reported, not
    # enforced here), so no request waits for blocks.
    pool = KVPool(batch * math.ceil((input_len + output_len + mtp_drafts) / block), block)
    if config.max_num_seqs >= batch:
        # Every request is in from the first step, so the TTFTs depend on no step after the
        # last first token: simulate outputs only about as long as the prompts take (256
        # requests of 1,024 tokens x 1,024 steps took 3 s), and the whole output if a request
        # ended before the last first token (then its end could have moved one).
        per_step = config.max_num_batched_tokens
        if config.long_prefill_token_threshold and input_len - cached > config.long_prefill_token_threshold:
            per_step = min(per_step, config.max_long_partial_prefills * config.long_prefill_token_threshold)
        short = min(output_len, 2 * math.ceil(batch * (input_len - cached) / per_step) + 2)
        ttfts, steps = _simulate(p, batch, input_len, short, config, cached, mtp_drafts, pool)
        if short == output_len or steps[1] >= ttfts.max():
            return _summary(ttfts, steps[0], config)
    ttfts, steps = _simulate(p, batch, input_len, output_len, config, cached, mtp_drafts, pool)
    return _summary(ttfts, steps[0], config)


def _simulate(
    p: Pricing,
    batch: int,
    input_len: int,
    output_len: int,
    config: SchedulerConfig,
    cached: int,
    mtp_drafts: int,
    pool: KVPool,
) -> tuple[np.ndarray, tuple[int, float]]:
    """The requests' TTFTs, and (the steps that computed prompt tokens, the first request's end)."""
    workload = [WorkloadRequest(0.0, input_len - cached, output_len) for _ in range(batch)]
    prefill_steps, completed = 0, 0

    def price(step: MixedStep) -> float:
        nonlocal prefill_steps, completed
        if completed == batch:
            return 0.0  # every first token is out: no later step can move a TTFT, so none is priced
        shifted = MixedStep([Chunk(c.new_tokens, c.context + cached, c.samples) for c in step.chunks])
        prompts = [c for c in shifted.chunks if c.context < input_len]
        prefill_steps += bool(prompts)
        done = [Chunk(input_len - cached, cached, True) for c in prompts if c.context + c.new_tokens == input_len]
        completed += len(done)
        seconds = mixed_step_seconds(p, shifted)
        return seconds + (prompt_drafting(p, done, mtp_drafts) if mtp_drafts else 0.0)

    sim = simulate(workload, price, pool, config)
    ttfts = np.array([r.ttft for r in sim.results if r.ok])
    if len(ttfts) != batch:
        raise RuntimeError(f"the TTFT simulation finished {len(ttfts)} of {batch} requests")
    return ttfts, (prefill_steps, min(r.e2e for r in sim.results))


def _summary(ttfts: np.ndarray, prefill_steps: int, config: SchedulerConfig) -> BatchTTFT:
    q50, q90, q99 = np.percentile(ttfts, [50, 90, 99])
    return BatchTTFT(
        float(ttfts.mean()),
        float(q50),
        float(q90),
        float(q99),
        float(ttfts.max()),
        prefill_steps,
        config.max_num_batched_tokens,
        config.max_num_seqs,
        config.long_prefill_token_threshold,
    )
