"""Serving metrics: what the engine thread observes, in a shape /metrics can render.

The engine thread writes, HTTP handlers read. Histograms take a lock (prometheus.py); the gauges
are published as one immutable snapshot per loop iteration, so a scrape never sees half of a step.
tacit's own tacit_* names sit beside vLLM 0.11.0's vllm:* ones (vllm_metrics.py), which vLLM's
Grafana dashboard reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tacit.engine.adaptive_metrics import AdaptiveMetrics
from tacit.engine.prometheus import Histogram, escape, write_histogram, write_metric
from tacit.engine.vllm_metrics import ENGINE_LABEL, VllmRequestMetrics
from tacit.scheduling.scheduler_output import SchedulerStats

__all__ = ["EngineSnapshot", "Histogram", "ServingMetrics"]

# Seconds. TTFT spans a queue wait plus a prefill (ms to tens of s under load); inter-token
# latency is one decode step (sub-ms for a tiny model, ~10-100 ms for a 135M one on CPU).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class EngineSnapshot:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    num_swapped_out: int = 0
    num_swapped_in: int = 0
    swap_blocks_used: int = 0
    num_cut_ins: int = 0
    num_steps: int = 0
    length_predictor_mae: float = 0.0
    length_predictor_scored: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    kv_blocks_cached: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    kv_offload_blocks: int = 0
    kv_offload_stored: int = 0
    kv_offload_loaded: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    # Streamed MoE experts (--expert-cache-memory; memory/expert_cache.py ExpertCacheStats).
    expert_cache_hit_rate: float = 0.0
    expert_prefetch_hit_rate: float = 0.0
    expert_bytes_read_per_token: float = 0.0

    @classmethod
    def of(
        cls,
        s: SchedulerStats,
        prompt_tokens: int,
        generation_tokens: int,
        num_steps: int,
        expert_cache: dict[str, float] | None = None,
    ) -> "EngineSnapshot":
        """The scheduler's counters plus the engine's own (LLMEngine.get_stats)."""
        return cls(
            **(expert_cache or {}),
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_used=s.kv_blocks_used,
            kv_blocks_free=s.kv_blocks_free,
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
            num_preemptions=s.num_preemptions,
            num_swapped_out=s.num_swapped_out,
            num_swapped_in=s.num_swapped_in,
            swap_blocks_used=s.swap_blocks_used,
            num_cut_ins=s.num_cut_ins,
            num_steps=num_steps,
            length_predictor_mae=s.length_predictor_mae,
            length_predictor_scored=s.length_predictor_scored,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            kv_blocks_cached=s.kv_blocks_cached,
            external_prefix_cache_queries=s.external_prefix_cache_queries,
            external_prefix_cache_hits=s.external_prefix_cache_hits,
            kv_offload_blocks=s.kv_offload_blocks,
            kv_offload_stored=s.kv_offload_stored,
            kv_offload_loaded=s.kv_offload_loaded,
            spec_decode_num_drafts=s.spec_decode_num_drafts,
            spec_decode_num_draft_tokens=s.spec_decode_num_draft_tokens,
            spec_decode_num_accepted_tokens=s.spec_decode_num_accepted_tokens,
        )


@dataclass
class ServingMetrics:
    snapshot: EngineSnapshot = field(default_factory=EngineSnapshot)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    # finish_reason -> count; "error" for a request a failed step took down, "rejected" for 503s.
    requests: dict[str, int] = field(default_factory=dict)
    # vLLM's per-request histograms: their token buckets need max_model_len, so the engine thread
    # sets this once the engine is built (None: only the snapshot's vllm:* metrics are rendered).
    vllm: VllmRequestMetrics | None = None
    # The adaptive controller's decisions and knob values (None: --adaptive is off).
    adaptive: AdaptiveMetrics | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_request(self, outcome: str) -> None:
        with self._lock:
            self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def render_prometheus(self, model_name: str) -> str:
        """Prometheus text exposition format 0.0.4 (prometheus.py)."""
        s = self.snapshot
        label = f'model_name="{escape(model_name)}"'
        vllm_label = f"{label},{ENGINE_LABEL}"
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            write_metric(lines, name, kind, help_text, vllm_label if name.startswith("vllm:") else label, value)

        _vllm_engine_metrics(metric, s)

        metric("tacit_num_requests_running", "gauge", "Sequences in the running batch.", s.num_running)
        metric("tacit_num_requests_waiting", "gauge", "Sequences waiting to be scheduled.", s.num_waiting)
        metric("tacit_kv_blocks_used", "gauge", "KV cache blocks held by sequences.", s.kv_blocks_used)
        metric("tacit_kv_blocks_free", "gauge", "KV cache blocks free.", s.kv_blocks_free)
        metric("tacit_prompt_tokens_total", "counter", "Prompt tokens admitted.", s.prompt_tokens)
        metric("tacit_generation_tokens_total", "counter", "Tokens generated.", s.generation_tokens)
        metric(
            "tacit_num_preemptions_total",
            "counter",
            "Sequences preempted (for KV space or a batch slot), by swap or recompute.",
            s.num_preemptions,
        )
        metric(
            "tacit_num_swapped_out_total",
            "counter",
            "Preemptions whose KV was copied to host memory rather than recomputed later.",
            s.num_swapped_out,
        )
        metric("tacit_num_swapped_in_total", "counter", "Swapped-out KV copied back on resume.", s.num_swapped_in)
        metric("tacit_swap_blocks_used", "gauge", "KV blocks held in host swap space.", s.swap_blocks_used)
        metric(
            "tacit_num_cut_ins_total",
            "counter",
            "Requests prefilled between the layers of a step in flight rather than after it.",
            s.num_cut_ins,
        )
        metric("tacit_engine_steps_total", "counter", "Engine steps (forward passes) run.", s.num_steps)
        # vLLM's names (tokens, not requests) beside tacit's own, so existing dashboards read them.
        for name in ("vllm:prefix_cache_queries", "tacit_prefix_cache_queries_total"):
            metric(name, "counter", "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries)
        for name in ("vllm:prefix_cache_hits", "tacit_prefix_cache_hits_total"):
            metric(name, "counter", "Prompt tokens found in the prefix cache (not computed).", s.prefix_cache_hits)
        metric(
            "tacit_prefix_cache_hit_rate",
            "gauge",
            "Prefix cache hits over queries, in tokens, since start (0 before any query).",
            s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0,
        )
        metric("tacit_kv_blocks_cached", "gauge", "KV blocks the prefix cache can hand out.", s.kv_blocks_cached)
        # The second tier (--kv-offloading-size): vLLM's names for a KV connector's hits.
        for name in ("vllm:external_prefix_cache_queries", "tacit_kv_offload_queries_total"):
            metric(
                name,
                "counter",
                "Prompt tokens looked up in the KV offloading tier (past the pool's hit).",
                s.external_prefix_cache_queries,
            )
        for name in ("vllm:external_prefix_cache_hits", "tacit_kv_offload_hits_total"):
            metric(
                name,
                "counter",
                "Prompt tokens loaded from the KV offloading tier (not computed).",
                s.external_prefix_cache_hits,
            )
        metric(
            "tacit_kv_offload_hit_rate",
            "gauge",
            "KV offloading tier hits over its queries, in tokens, since start (0 before any query).",
            s.external_prefix_cache_hits / s.external_prefix_cache_queries if s.external_prefix_cache_queries else 0.0,
        )
        metric("tacit_kv_offload_blocks", "gauge", "KV blocks the offloading tier holds.", s.kv_offload_blocks)
        metric(
            "tacit_kv_offload_stored_total", "counter", "KV blocks stored in the offloading tier.", s.kv_offload_stored
        )
        metric(
            "tacit_kv_offload_loaded_total",
            "counter",
            "KV blocks loaded from the offloading tier.",
            s.kv_offload_loaded,
        )
        metric(
            "vllm:spec_decode_num_drafts",
            "counter",
            "Verifies: a request's step that verified draft tokens (speculative decoding).",
            s.spec_decode_num_drafts,
        )
        metric(
            "tacit_spec_decode_acceptance_rate",
            "gauge",
            "Draft tokens accepted over draft tokens verified, since start (0 before any).",
            s.spec_decode_num_accepted_tokens / s.spec_decode_num_draft_tokens
            if s.spec_decode_num_draft_tokens
            else 0.0,
        )
        metric(
            "tacit_spec_decode_mean_accepted_length",
            "gauge",
            "Tokens a verify yields on average: 1 + its accepted drafts (0 before any verify).",
            1 + s.spec_decode_num_accepted_tokens / s.spec_decode_num_drafts if s.spec_decode_num_drafts else 0.0,
        )
        metric(
            "vllm:spec_decode_num_draft_tokens",
            "counter",
            "Draft tokens verified (speculative decoding).",
            s.spec_decode_num_draft_tokens,
        )
        metric(
            "vllm:spec_decode_num_accepted_tokens",
            "counter",
            "Draft tokens accepted: each one a token that cost no step of its own.",
            s.spec_decode_num_accepted_tokens,
        )
        metric(
            "tacit_expert_cache_hit_rate",
            "gauge",
            "Streamed MoE experts a layer needed that were already in memory (0 without --expert-cache-memory).",
            s.expert_cache_hit_rate,
        )
        metric(
            "tacit_expert_prefetch_hit_rate",
            "gauge",
            "Experts a layer needed that the previous layer's prediction named for prefetch.",
            s.expert_prefetch_hit_rate,
        )
        metric(
            "tacit_expert_bytes_read_per_token",
            "gauge",
            "Expert bytes read from the checkpoint per token run.",
            s.expert_bytes_read_per_token,
        )
        metric(
            "tacit_output_length_predictor_mae",
            "gauge",
            "Mean absolute error (tokens) of the output-length predictor over finished requests.",
            s.length_predictor_mae,
        )
        metric(
            "tacit_output_length_predictor_scored_total",
            "counter",
            "Finished requests the output-length predictor was scored on.",
            s.length_predictor_scored,
        )

        with self._lock:
            requests = dict(self.requests)
        lines += [
            "# HELP tacit_requests_total Requests ended, by finish reason.",
            "# TYPE tacit_requests_total counter",
        ]
        for reason, n in sorted(requests.items()):
            lines.append(f'tacit_requests_total{{{label},finish_reason="{escape(reason)}"}} {n}')

        write_histogram(
            lines,
            "tacit_time_to_first_token_seconds",
            "Time from request arrival to its first token.",
            label,
            self.ttft,
        )
        write_histogram(
            lines, "tacit_inter_token_latency_seconds", "Time between two tokens of one sequence.", label, self.itl
        )
        if self.vllm is not None:
            self.vllm.render(lines, vllm_label)
        if self.adaptive is not None:
            self.adaptive.render(lines, label)
        return "\n".join(lines) + "\n"


def _vllm_engine_metrics(metric: Callable[[str, str, str, float], None], s: EngineSnapshot) -> None:
    """vLLM 0.11.0's engine-wide gauges and counters (vllm/v1/metrics/loggers.py), its help texts."""
    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", s.num_running)
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", s.num_waiting)
    # vLLM's BlockPool.get_usage(): blocks held over all blocks, cached-but-free ones counting as free.
    total = s.kv_blocks_used + s.kv_blocks_free
    usage = s.kv_blocks_used / total if total else 0.0
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
    # Deprecated (hidden by default) in vLLM 0.11, but the 0.11.0 dashboard still plots it.
    metric(
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
        usage,
    )
    metric("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.", s.num_preemptions)
    metric("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", s.prompt_tokens)
    metric("vllm:generation_tokens", "counter", "Number of generation tokens processed.", s.generation_tokens)
