"""vLLM's per-request Prometheus metrics, as vLLM 0.11.0 defines them.

Names, types, buckets and labels follow PrometheusStatLogger in vLLM 0.11.0's
vllm/v1/metrics/loggers.py, so vLLM's Grafana dashboard (deploy/grafana/, copied from that
release) reads `tacit serve`'s /metrics unchanged. The engine-wide gauges and counters under vLLM's
names come from the EngineSnapshot (metrics.py); this file holds what is observed per request.

The values follow vLLM's definitions (vllm/v1/metrics/stats.py), per sequence as vLLM's
parallel sampling makes each of n samples a request of its own: queue time = first scheduled -
queued, prefill = first token - first scheduled, decode = last token - first token, inference =
last token - first scheduled, e2e = finish - arrival at the server. Everything is observed once
per sequence when its request finishes, except TTFT and the inter-token gaps, which vLLM also
observes as tokens arrive.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tacit.engine.prometheus import Histogram, escape, write_histogram

VLLM_VERSION = "0.11.0"
# vLLM labels every series with model_name and its engine core's index; tacit runs one engine.
ENGINE_LABEL = 'engine="0"'

# loggers.py's buckets, verbatim (seconds).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
# inter_token_latency_seconds, time_per_output_token_seconds, request_time_per_output_token_seconds.
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# vLLM's FinishReason values: each request_success series exists (at 0) from the start.
FINISH_REASONS = ("stop", "length", "abort")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (max_model_len).
    >>> build_1_2_5_buckets(100)
    (1, 2, 5, 10, 20, 50, 100)"""
    if max_value < 1:
        raise ValueError(f"max_value={max_value} is invalid: token-count buckets need a max_model_len >= 1")
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(buckets)
            buckets.append(m * scale)
        scale *= 10


@dataclass(frozen=True)
class FinishedSequence:
    """One finished sequence's numbers (vLLM's FinishedRequestStats). Times are time.monotonic();
    scheduled and first/last token are None when the sequence never got that far."""

    finish_reason: str
    arrival: float  # the server took the request
    queued: float  # the engine queued it
    scheduled: float | None
    first_token: float | None
    last_token: float | None
    finished: float
    num_prompt_tokens: int
    num_generation_tokens: int
    max_tokens_param: int | None


class VllmRequestMetrics:
    """The per-request histograms and request_success, with vLLM's buckets for max_model_len."""

    def __init__(self, max_model_len: int) -> None:
        tokens = build_1_2_5_buckets(max_model_len)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS)
        self.time_per_output_token = Histogram(ITL_BUCKETS)
        self.prompt_tokens = Histogram(tokens)
        self.generation_tokens = Histogram(tokens)
        self.max_tokens_param = Histogram(tokens)
        self.max_num_generation_tokens = Histogram(tokens)
        self.params_n = Histogram(PARAMS_N_BUCKETS)
        self.iteration_tokens = Histogram(ITERATION_TOKENS_BUCKETS)  # once per engine step
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self._lock = threading.Lock()

    def observe_sequence(self, s: FinishedSequence) -> None:
        with self._lock:
            self.success[s.finish_reason] = self.success.get(s.finish_reason, 0) + 1
        self.e2e.observe(s.finished - s.arrival)
        self.prompt_tokens.observe(s.num_prompt_tokens)
        self.generation_tokens.observe(s.num_generation_tokens)
        if s.max_tokens_param:  # vLLM skips an unset (or 0) max_tokens too
            self.max_tokens_param.observe(s.max_tokens_param)
        if s.scheduled is None:
            return
        self.queue.observe(s.scheduled - s.queued)
        if s.first_token is None or s.last_token is None:
            return  # no token (max_tokens=0): no prefill, decode or inference interval to report
        self.prefill.observe(s.first_token - s.scheduled)
        self.inference.observe(s.last_token - s.scheduled)
        decode = s.last_token - s.first_token
        self.decode.observe(decode)
        # vLLM leaves the prefill's token out of the mean, and reports 0 for a one-token answer.
        after_first = s.num_generation_tokens - 1
        self.time_per_output_token.observe(decode / after_first if after_first > 0 else 0.0)

    def observe_request(self, n: int, max_num_generation_tokens: int) -> None:
        """Once per client request: its n, and the longest of its n sequences (vLLM v0's
        definitions; 0.11's v1 engine declares both histograms but never fills them)."""
        self.params_n.observe(n)
        self.max_num_generation_tokens.observe(max_num_generation_tokens)

    def render(self, lines: list[str], labels: str) -> None:
        """Append the exposition; labels hold model_name and ENGINE_LABEL."""
        with self._lock:
            success = dict(self.success)
        lines += [
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        lines += [
            f'vllm:request_success_total{{{labels},finished_reason="{escape(r)}"}} {n}' for r, n in success.items()
        ]
        for name, help_text, hist in (
            ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", self.iteration_tokens),
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.", self.generation_tokens),
            (
                "vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                self.max_num_generation_tokens,
            ),
            ("vllm:request_params_n", "Histogram of the n request parameter.", self.params_n),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", self.max_tokens_param),
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            (
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds."
                "DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
                self.itl,  # vLLM 0.11 observes the same gaps into both
            ),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                self.time_per_output_token,
            ),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", self.queue),
            (
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                self.inference,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                self.prefill,
            ),
            ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", self.decode),
        ):
            write_histogram(lines, name, help_text, labels, hist)
