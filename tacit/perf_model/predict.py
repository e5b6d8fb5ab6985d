"""A whole request batch: TTFT (the prefill step), TPOT (the mean decode step), throughput,
memory per device and the binding roof per operator class."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tacit.perf_model.efficiency import Profile
from tacit.perf_model.memory import Memory, device_memory
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.operators import Parallel, StepShape, step_ops
from tacit.perf_model.roofline import OpTime, bottlenecks, op_time, step_seconds
from tacit.platforms.specs import HardwareSpec, Sourced

# What drafting one token costs, as (decoder layers, lm_head passes) of a decode step: nothing for
# the lookups; an MTP module is one decoder layer and the shared head. The head is no detail: on
# random:deepseek-v3-1b it was half of a measured 5 ms MTP draft (docs/speculative_decoding.md),
# and V3's (129280 x 7168) reads about what one of its MoE layers does per token.
SPECULATIVE_COSTS = {"ngram": (0, 0), "suffix": (0, 0), "mtp": (1, 1)}


@dataclass(frozen=True)
class Workload:
    batch: int
    input_len: int
    output_len: int
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    group_size: int = 32
    parallel: Parallel = Parallel()
    # Share of each prompt the prefix cache already holds: those tokens are attended over, not
    # computed (the last prompt token always is).
    prefix_hit_rate: float = 0.0
    # Speculative decoding: drafts verified a step, each accepted with this probability given the
    # ones before it were (the acceptance rate vLLM and the DeepSeek-V3 report give), and whether
    # drafting costs a model pass ("mtp": one decoder layer's worth a draft) or nothing (ngram,
    # suffix: a lookup).
    speculative_tokens: int = 0
    acceptance: float = 0.0
    speculative_method: str = "ngram"

    def __post_init__(self) -> None:
        for name in ("batch", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.prefix_hit_rate < 1.0:
            raise ValueError(f"prefix_hit_rate={self.prefix_hit_rate} is invalid: must be in [0, 1)")
        if not isinstance(self.speculative_tokens, int) or self.speculative_tokens < 0:
            raise ValueError(f"speculative_tokens={self.speculative_tokens!r} is invalid: must be an integer >= 0")
        if not 0.0 <= self.acceptance < 1.0:
            raise ValueError(f"acceptance={self.acceptance} is invalid: must be in [0, 1)")
        if self.speculative_method not in SPECULATIVE_COSTS:
            raise ValueError(
                f"speculative_method={self.speculative_method!r} is not known; valid: {', '.join(SPECULATIVE_COSTS)}"
            )

    @property
    def tokens_per_verify(self) -> float:
        """Tokens a verify step yields a sequence on average: 1 + a + a^2 + ... + a^k."""
        a, k = self.acceptance, self.speculative_tokens
        return (1 - a ** (k + 1)) / (1 - a)

    @property
    def cached_tokens(self) -> int:
        return min(int(self.input_len * self.prefix_hit_rate), self.input_len - 1)


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    tpot_s: float
    throughput_tok_s: float
    memory: Memory
    capacity_bytes: float
    bottlenecks: dict[str, str]
    prefill_ops: list[OpTime]
    decode_ops: list[OpTime]
    # The step decode_ops make up: tpot_s, or with speculative decoding the verify step (tpot_s is
    # that step plus drafting, over the tokens it yields).
    decode_step_s: float
    # The context decode_ops attend over (each sequence's tokens already cached)
    decode_context: int = 0

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes

    def as_json(self) -> dict:
        return {
            "ttft_ms": 1e3 * self.ttft_s,
            "tpot_ms": 1e3 * self.tpot_s,
            "throughput_tok_s": self.throughput_tok_s,
            "memory_per_device_gb": self.memory.total / 1e9,
            "fits": self.fits,
            "bottlenecks": self.bottlenecks,
        }


def step_time(
    s: ModelShape, spec: HardwareSpec, profile: Profile, w: Workload, step: StepShape
) -> tuple[float, list[OpTime]]:
    """Seconds of one engine step and its operators' times."""
    decode = step.new_tokens == 1
    ops = step_ops(s, step, w.parallel, w.weight_dtype, w.kv_dtype, w.group_size, profile.reduce_bytes)
    path = profile.decode_path(s.architecture) if decode else "torch"
    times = [op_time(op, spec, profile, decode, path) for op in ops]
    return step_seconds(times, profile, path, s.num_layers), times


def fitted_roofs(spec: HardwareSpec, profile: Profile) -> HardwareSpec:
    """`this-cpu` re-measures its roofs in every process; its efficiencies are fractions of the
    roofs measured when they were fitted, so predict against those (stored with the profile).
    Otherwise a process that happens to measure 8% less bandwidth (41.0 -> 37.7 GB/s seen here)
    would predict every memory-bound operator 8% slower while the kernels run at the same speed."""
    if spec.name != "this-cpu" or not profile.roofs:
        return spec
    peak, bw = profile.roofs["bf16_flops"], profile.roofs["read_bandwidth"]
    src = f"the roofs {profile.name}'s efficiencies were fitted against ({profile.source})"
    flops = {k: Sourced(peak, src) for k in spec.flops}  # int8 stands in with bf16's (specs.py)
    return replace(spec, flops=flops, memory_bandwidth=Sourced(bw, src))


def predict(s: ModelShape, spec: HardwareSpec, w: Workload, profile: Profile | None = None) -> Prediction:
    if profile is None:
        from tacit.perf_model.calibration import profile_for

        profile = profile_for(spec)  # this-cpu: this machine's own fit (made now if none matches)
    spec = fitted_roofs(spec, profile)
    if s.is_moe and w.parallel.ep and s.num_experts % w.parallel.tp:
        raise ValueError(f"expert parallel over {w.parallel.tp} devices needs the {s.num_experts} experts to divide")
    cached = w.cached_tokens
    ttft, prefill = step_time(s, spec, profile, w, StepShape(w.batch, w.input_len - cached, cached))
    # Decode steps read a context growing from input_len to input_len + output_len - 2; attention
    # is linear in it, so the step at the mean context has the mean time.
    mean_context = w.input_len + max(w.output_len - 2, 0) / 2
    tpot, decode = step_time(s, spec, profile, w, StepShape(w.batch, 1, round(mean_context)))
    decode_step = tpot
    if w.speculative_tokens:
        # A verify step runs each sequence's token and its k drafts as k + 1 decode rows over the
        # same context (how the fused decoder runs them); it yields tokens_per_verify of them.
        k = w.speculative_tokens
        plain_decode = decode
        verify, decode = step_time(s, spec, profile, w, StepShape(w.batch * (k + 1), 1, round(mean_context)))
        decode_step = verify
        layers, heads = SPECULATIVE_COSTS[w.speculative_method]
        head = sum(t.seconds for t in plain_decode if t.op.op_class == "lm_head")
        drafting = k * (layers * (tpot - head) / s.num_layers + heads * head)
        tpot = (verify + drafting) / w.tokens_per_verify
    total = ttft + (w.output_len - 1) * tpot
    mem = device_memory(s, w.parallel, w.weight_dtype, w.kv_dtype, w.batch, w.input_len, w.output_len, w.group_size)
    return Prediction(
        ttft_s=ttft,
        tpot_s=tpot,
        throughput_tok_s=w.batch * w.output_len / total,
        memory=mem,
        capacity_bytes=spec.memory_capacity.value,
        bottlenecks={**bottlenecks(prefill, spec, "prefill"), **bottlenecks(decode, spec, "decode")},
        prefill_ops=prefill,
        decode_ops=decode,
        decode_step_s=decode_step,
        decode_context=round(mean_context),
    )
