"""What the engine thread records of one request's outputs for /metrics (AsyncLLMEngine._deliver).

As a step delivers tokens: TTFT and the inter-token gaps, tacit's histograms and vLLM's. Once the
request finishes: vLLM's per-sequence numbers (vllm_metrics.py), from times the stream already
keeps, so nothing is observed per token that vLLM does not observe per token.
"""

from __future__ import annotations

from tacit.engine.metrics import ServingMetrics
from tacit.engine.request_stream import RequestStream
from tacit.engine.vllm_metrics import FinishedSequence
from tacit.outputs import RequestOutput


def observe_step(metrics: ServingMetrics, stream: RequestStream, out: RequestOutput, now: float) -> int:
    """Record the tokens out brings; returns what they add to vLLM's iteration_tokens_total:
    the new tokens, plus the whole prompt of each sequence that got its first token (vLLM counts
    a prompt in the step its prefill completes)."""
    vllm = metrics.vllm
    step_tokens = 0
    for c in out.outputs:
        seen = stream.tokens_seen.get(c.index, 0)
        n = len(c.token_ids)
        if n <= seen:
            continue
        if not seen:
            stream.first_token_at[c.index] = now
            step_tokens += len(out.prompt_token_ids)
            if vllm is not None:  # vLLM: one TTFT per sequence (each of n samples is a request)
                vllm.ttft.observe(now - stream.arrival_time)
            if stream.first_token_time is None:
                stream.first_token_time = now
                metrics.ttft.observe(now - stream.arrival_time)
        else:
            gap = now - stream.last_token_time[c.index]
            metrics.itl.observe(gap / (n - seen), n - seen)  # tacit's: per token, a step's tokens share its gap
            if vllm is not None:  # vLLM's: one gap per step that brought tokens (stats.py update_from_output)
                vllm.itl.observe(gap)
        step_tokens += n - seen
        stream.tokens_seen[c.index] = n
        stream.last_token_time[c.index] = now
    return step_tokens


def observe_finished(metrics: ServingMetrics, stream: RequestStream, out: RequestOutput, now: float) -> None:
    """vLLM's per-request numbers for a request out finished, once per sequence."""
    vllm = metrics.vllm
    if vllm is None:
        return
    queued = out.metrics.get("arrival_time", stream.arrival_time)  # the engine's Request.arrival_time
    scheduled = out.metrics.get("first_scheduled_time")
    max_tokens = stream.params.max_tokens if stream.params is not None else None
    longest = 0
    for c in out.outputs:
        longest = max(longest, len(c.token_ids))
        vllm.observe_sequence(
            FinishedSequence(
                finish_reason=c.finish_reason or "unknown",
                arrival=stream.arrival_time,
                queued=queued,
                scheduled=scheduled,
                first_token=stream.first_token_at.get(c.index),
                last_token=stream.last_token_time.get(c.index),
                finished=stream.last_token_time.get(c.index, now),
                num_prompt_tokens=len(out.prompt_token_ids),
                num_generation_tokens=len(c.token_ids),
                max_tokens_param=max_tokens,
            )
        )
    vllm.observe_request(len(out.outputs), longest)
