"""A whole request batch: TTFT (the batch's prompts admitted and chunked by the engine's scheduler,
batch_ttft.py), TPOT (the decode step at the mean context, or at --context), throughput, memory
per device and the binding roof per operator class."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tacit.config import SchedulerConfig
from tacit.perf_model.attention_ops import attention_ops
from tacit.perf_model.batch_ttft import BatchTTFT, batch_ttft
from tacit.perf_model.dtypes import activation_dtype
from tacit.perf_model.efficiency import Profile, fitted_roofs
from tacit.perf_model.layout import place, resolve_layout
from tacit.perf_model.memory import Memory, device_memory
from tacit.perf_model.micro_batch_overlap import deepgemm_sm_share, two_batch_seconds
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.open_loop import OpenLoop, solve_open_loop
from tacit.perf_model.operators import Parallel, StepShape, step_ops
from tacit.perf_model.roofline import OpTime, bottlenecks, op_time, step_seconds
from tacit.perf_model.served_tpot import served_throughput, served_tpot
from tacit.perf_model.speculative import SPECULATIVE_METHODS, decode_drafting, tokens_per_verify
from tacit.perf_model.step_model import Pricing, runs_tacit_engine
from tacit.platforms.specs import HardwareSpec


@dataclass(frozen=True)
class Workload:
    batch: int
    input_len: int  # 0: no prefill, the sequences decode from `context` cached tokens
    output_len: int
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    group_size: int = 32
    parallel: Parallel = Parallel()
    # Share of each prompt the prefix cache already holds: those tokens are attended over, not
    # computed (the last prompt token always is).
    prefix_hit_rate: float = 0.0
    # Speculative decoding: drafts verified a step, each accepted with this probability given the
    # ones before it were (the acceptance rate vLLM and the DeepSeek-V3 report give), and how they
    # are drafted (speculative.py: "mtp" a forward of the MTP layer, ngram/suffix a lookup).
    speculative_tokens: int = 0
    acceptance: float = 0.0
    speculative_method: str = "ngram"
    # The quantized linears' activation dtype (dtypes.activation_dtype; auto: the weight format's
    # usual one, bf16 for block fp8 on a part without fp8 units: W8A16)
    activation_dtype: str = "auto"
    # The decode step priced: each sequence with `context` tokens cached. None: the step at the
    # mean context over the output (input_len + (output_len - 2) / 2).
    context: int | None = None
    # The engine's scheduler the batch's TTFT is simulated under (its max_num_batched_tokens
    # chunks the prompts); None: the engine's defaults with max_num_seqs raised to the batch.
    scheduler: SchedulerConfig | None = None
    # Requests a second arriving as a Poisson process (an open loop, open_loop.py): the batch is
    # then the concurrency that rate reaches, not given. None: `batch` requests (a closed loop).
    request_rate: float | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.input_len < 0:
            raise ValueError(f"input_len must be >= 0 (0: no prefill, decode from context), got {self.input_len}")
        if self.context is not None and self.context < 0:
            raise ValueError(f"context must be >= 0 tokens cached per sequence, got {self.context}")
        if self.input_len == 0 and not self.context:
            raise ValueError(
                "input_len=0 (no prefill) needs context >= 1: the tokens each sequence has cached when it decodes"
            )
        if self.context is not None and self.context < self.input_len:
            raise ValueError(
                f"context={self.context} is shorter than input_len={self.input_len}: a decode step after the "
                f"prefill attends over at least the prompt (valid: {self.input_len} or more)"
            )
        if not 0.0 <= self.prefix_hit_rate < 1.0:
            raise ValueError(f"prefix_hit_rate={self.prefix_hit_rate} is invalid: must be in [0, 1)")
        if not isinstance(self.speculative_tokens, int) or self.speculative_tokens < 0:
            raise ValueError(f"speculative_tokens={self.speculative_tokens!r} is invalid: must be an integer >= 0")
        if not 0.0 <= self.acceptance < 1.0:
            raise ValueError(f"acceptance={self.acceptance} is invalid: must be in [0, 1)")
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_method={self.speculative_method!r} is not known; valid: {', '.join(SPECULATIVE_METHODS)}"
            )
        if self.request_rate is not None:
            if not (self.request_rate > 0 and self.request_rate < float("inf")):
                raise ValueError(f"request_rate={self.request_rate} is invalid: requests a second, > 0 and finite")
            if self.input_len == 0 or self.context is not None:
                raise ValueError(
                    "request_rate prices requests arriving with a prompt and decoding their output: it needs "
                    "input_len >= 1 and no fixed context"
                )

    @property
    def tokens_per_verify(self) -> float:
        """Tokens a verify step yields a sequence on average: 1 + a + a^2 + ... + a^k."""
        return tokens_per_verify(self.acceptance, self.speculative_tokens)

    @property
    def cached_tokens(self) -> int:
        return max(min(int(self.input_len * self.prefix_hit_rate), self.input_len - 1), 0)

    @property
    def decode_context(self) -> int:
        """Tokens each sequence has cached in the decode step priced: `context`, else the mean
        over the output. Decode steps read a context growing from input_len to input_len +
        output_len - 2; attention is linear in it, so the step at the mean has the mean time."""
        if self.context is not None:
            return self.context
        return round(self.input_len + max(self.output_len - 2, 0) / 2)

    @property
    def kv_tokens(self) -> int:
        """Tokens a sequence holds at its longest: the prompt and the output, or the context
        decoding starts from (input 0) and the output, or the context a later step reaches."""
        start = self.input_len or (self.context or 0)
        return max(start + self.output_len, (self.context or 0) + 1)

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self.scheduler or replace(SchedulerConfig(), max_num_seqs=max(SchedulerConfig.max_num_seqs, self.batch))


@dataclass(frozen=True)
class Prediction:
    ttft_s: float  # the batch's mean TTFT (batch_ttft); 0.0 without a prefill (input_len 0)
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
    # The layout priced: one replica's Parallel, resolved and placed (layout.py)
    layout: Parallel = Parallel()
    # The whole batch's prompts prefilled in one step, prefill_ops' step (0.0 without a prefill)
    prefill_step_s: float = 0.0
    # The batch's TTFT distribution under the engine's scheduler; None without a prefill
    ttft: BatchTTFT | None = None
    # MTP: one verify step's draft forwards (draft_ops: the first one's operators)
    draft_s: float = 0.0
    draft_ops: list[OpTime] = field(default_factory=list)
    # --context: throughput is the decode step's at that context, not the request batch's
    at_context: bool = False
    # The batch served as a closed loop, prefill on the same devices (served_tpot.py): the TPOT a
    # client measures and the share of the time the others' prompts take; tpot_s and 0.0 without
    # a prefill or with one request. Under a request rate, the open loop's (open_loop.py).
    served_tpot_s: float = 0.0
    served_prefill_share: float = 0.0
    served_throughput_tok_s: float = 0.0  # the loop's output tokens a second (Little's law)
    # At a request rate: the open loop's steady state, one replica's (its batch is the decoding
    # sequences rounded up, what the decode step was priced at); None in a closed loop
    open_loop: OpenLoop | None = None

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes

    def as_json(self) -> dict:
        """The headline figures (prediction_json.py adds the inputs, operators and memory)."""
        return {
            "ttft_ms": 1e3 * self.ttft_s if self.ttft is not None else None,
            "tpot_ms": 1e3 * self.tpot_s,
            "decode_step_ms": 1e3 * self.decode_step_s,
            "prefill_step_ms": 1e3 * self.prefill_step_s if self.ttft is not None else None,
            "served_tpot_ms": 1e3 * self.served_tpot_s if self.ttft is not None else None,
            "served_prefill_share": self.served_prefill_share if self.ttft is not None else None,
            "served_throughput_tok_s": self.served_throughput_tok_s if self.ttft is not None else None,
            "served_ttft_ms": 1e3 * self.open_loop.served_ttft_s if self.open_loop else None,
            "open_loop": _open_loop_json(self.open_loop) if self.open_loop else None,
            "throughput_tok_s": self.throughput_tok_s,
            "memory_per_device_gb": self.memory.total / 1e9,
            "fits": self.fits,
            "bottlenecks": self.bottlenecks,
        }


def _open_loop_json(o: OpenLoop) -> dict:
    return {
        "request_rate": o.request_rate,
        "decoding_sequences": o.decoding,
        "requests_in_flight": o.in_flight,
        "wait_ms": 1e3 * o.wait_s,
        "prompt_alone_ms": 1e3 * o.prefill_one_s,
        "prefill_share": o.prefill_share,
    }


def step_time(
    s: ModelShape, spec: HardwareSpec, profile: Profile, w: Workload, step: StepShape, verify_rows: int = 1
) -> tuple[float, list[OpTime]]:
    """Seconds of one engine step and its operators' times. Under --two-batch-overlap the step
    runs as two micro-batches of half the sequences, one's communication in flight while the
    other computes; every weight is read once per micro-batch, so a memory-bound decode pays its
    weight reads twice. A transfer hides only behind the compute that runs between its send and
    its wait (micro_batch_overlap.py): with DeepEP the MoE layers run SGLang's stage plans and the
    rest of the step serially; otherwise the micro-batches take turns between each layer's
    partial sums, as tacit's engine does. The times returned are the half's operators doubled
    (both micro-batches run them).

    verify_rows: a speculative verify step's rows a sequence (k + 1), `step` holding every row as
    a decode row. The serving engines' attention reads each sequence's KV once for all its rows
    (FlashMLA, FlashInfer and Ascend's kernels take q_len k + 1), so the attention-class ops are
    priced on step.batch / verify_rows sequences of verify_rows new tokens each."""
    decode = step.new_tokens == 1
    act = activation_dtype(w.weight_dtype, w.activation_dtype, fp8_units="fp8" in spec.flops)
    path = profile.decode_path(s.architecture, s.layer_kind) if decode else "torch"
    graphs = spec.graphs and decode  # engines capture decode steps only (--enforce-eager: spec.graphs off)
    # tacit's fused C++ decoder takes a decode step whole, ahead of its two-batch path
    fused = decode and runs_tacit_engine(spec) and path == "decode_fused"
    tbo = w.parallel.two_batch_overlap and step.batch >= 2 and not fused
    run = replace(step, batch=-(-step.batch // 2)) if tbo else step
    ops = step_ops(s, run, w.parallel, w.weight_dtype, w.kv_dtype, w.group_size, profile.reduce_bytes, act)
    if verify_rows > 1:
        seqs = replace(run, batch=max(1, run.batch // verify_rows), new_tokens=verify_rows)
        shared_kv = attention_ops(s, seqs, w.parallel, w.weight_dtype, w.kv_dtype, w.group_size, act)
        ops = [op for op in ops if op.op_class != "attention"] + [op for op in shared_kv if op.op_class == "attention"]
    times = [op_time(op, spec, profile, decode, path, graphs) for op in ops]
    fixed_path = path if decode else "prefill"
    # the host's per-sequence work: a verify step's sequences, not its k + 1 rows each
    rows = w.parallel.sequences_per_device(max(1, step.batch // verify_rows))
    if not tbo:
        return step_seconds(times, profile, fixed_path, s.num_layers, graphs, rows), times
    fixed = step_seconds([], profile, fixed_path, s.num_layers, graphs, rows)
    times = deepgemm_sm_share(times, spec, decode)
    overlapped = two_batch_seconds((times, times), s.num_layers, s.num_moe_layers, decode) + fixed
    doubled = [replace(t, seconds=2 * t.seconds, compute_s=2 * t.compute_s, memory_s=2 * t.memory_s) for t in times]
    return overlapped, doubled


def _per_rank_scheduler(w: Workload, par: Parallel) -> SchedulerConfig:
    """The scheduler the batch's TTFT is simulated under. Data-parallel attention ranks each run
    their own scheduler over their own requests (vLLM's DP engines, SGLang's DP attention), so
    one simulated step of the whole batch holds every rank's budget: the step model deals its
    chunks over the ranks (step_model.py) and prices the busiest one's."""
    cfg, ranks = w.scheduler_config, par.attention_ranks
    if ranks == 1:
        return cfg
    return replace(
        cfg,
        max_num_batched_tokens=cfg.max_num_batched_tokens * ranks,
        max_num_seqs=cfg.max_num_seqs * ranks,
        max_long_partial_prefills=cfg.max_long_partial_prefills * ranks,
    )


def predict(s: ModelShape, spec: HardwareSpec, w: Workload, profile: Profile | None = None) -> Prediction:
    """One replica priced (the batch split over --data-parallel-size replicas, their throughput
    summed). Pipeline parallel: the replica's sequences run as P micro-batches, each step of one
    a pass through every stage (the sum of the stages plus the P-1 sends), so TPOT is that pass
    at batch / P and the replica yields its batch every TPOT."""
    if profile is None:
        from tacit.perf_model.calibration import profile_for

        profile = profile_for(spec)  # this-cpu: this machine's own fit (made now if none matches)
    if "fp32" in (w.weight_dtype, w.kv_dtype) and "fp32" not in spec.flops:
        # pricing it at the part's 16-bit tensor peak would be 2-16x optimistic
        raise ValueError(
            f"float32 is priced on hardware that states an fp32 peak (this-cpu, or a --hardware-file "
            f"with flops_tflops.fp32); {spec.name} has only: {', '.join(spec.flops)}"
        )
    spec = fitted_roofs(spec, profile)
    par, spec = place(resolve_layout(w.parallel, s), spec)
    pricing = Pricing(
        s, spec, profile, w.weight_dtype, w.kv_dtype, w.group_size, par, activation_dtype=w.activation_dtype
    )
    mtp = w.speculative_tokens if w.speculative_method == "mtp" else 0
    cached = w.cached_tokens
    loop = None
    if w.request_rate is not None:
        loop = _open_loop(s, spec, profile, replace(w, parallel=par), pricing, mtp)
        w = replace(w, batch=loop.decode_batch * par.replicas)
    sequences = w.batch
    batch = -(-sequences // par.replicas)  # the busiest replica's sequences
    w = replace(w, batch=batch, parallel=par)
    ttft, prefill_step, prefill = None, 0.0, []
    per_rank = _per_rank_scheduler(w, par)
    if w.input_len:
        prefill_step, prefill = step_time(s, spec, profile, w, StepShape(batch, w.input_len - cached, cached))
        ttft = batch_ttft(pricing, batch, w.input_len, w.output_len, per_rank, cached, mtp)
    ctx = w.decode_context
    tpot, decode_step, decode, draft, draft_ops = _decode(s, spec, profile, w, pricing, mtp, batch)
    ttft_s = ttft.mean_s if ttft else 0.0
    served, share, served_tput = tpot, 0.0, 0.0
    if loop is not None:
        # the rate's steady state: what a client measures, and every request's output a second
        served, share, ttft_s = loop.served_tpot_s, loop.prefill_share, loop.served_ttft_s
        served_tput = w.request_rate * w.output_len
    elif ttft is not None:
        # one prompt alone, as a replacement request arrives in the closed loop
        one = ttft if batch == 1 else batch_ttft(pricing, 1, w.input_len, w.output_len, per_rank, cached, mtp)
        served, share = served_tpot(tpot, one.mean_s, batch, w.output_len, par.attention_ranks)
        # every replica's requests living as long as the busiest replica's
        served_tput = served_throughput(sequences, w.output_len, one.mean_s, served)
    if loop is not None:  # every request's output, the rate's
        throughput = served_tput
    elif w.context is not None:  # the steady decode at that context
        throughput = sequences / tpot
    else:
        throughput = sequences * w.output_len / (ttft_s + (w.output_len - 1) * tpot)
    # device_memory sizes the KV for input_len + output_len tokens: give it kv_tokens in all
    mem = device_memory(s, par, w.weight_dtype, w.kv_dtype, batch, w.input_len, w.kv_tokens - w.input_len, w.group_size)
    return Prediction(
        ttft_s=ttft_s,
        tpot_s=tpot,
        throughput_tok_s=throughput,
        memory=mem,
        capacity_bytes=spec.memory_capacity.value,
        bottlenecks={**bottlenecks(prefill, spec, "prefill"), **bottlenecks(decode, spec, "decode")},
        prefill_ops=prefill,
        decode_ops=decode,
        decode_step_s=decode_step,
        decode_context=ctx,
        layout=par,
        prefill_step_s=prefill_step,
        ttft=ttft,
        draft_s=draft,
        draft_ops=draft_ops,
        at_context=w.context is not None,
        served_tpot_s=served,
        served_prefill_share=share,
        served_throughput_tok_s=served_tput,
        open_loop=loop,
    )


def _decode(
    s: ModelShape, spec: HardwareSpec, profile: Profile, w: Workload, pricing: Pricing, mtp: int, batch: int
) -> tuple[float, float, list[OpTime], float, list[OpTime]]:
    """(TPOT, the decode step, its operators, MTP's drafts, their operators) with `batch` of a
    replica's sequences decoding at the workload's context."""
    ctx, micro = w.decode_context, -(-batch // w.parallel.pp)  # sequences a pipeline micro-batch holds
    tpot, decode = step_time(s, spec, profile, w, StepShape(micro, 1, ctx))
    decode_step, draft, draft_ops = tpot, 0.0, []
    if w.speculative_tokens:
        # A verify step runs each sequence's token and its k drafts as k + 1 decode rows over the
        # same context; it yields tokens_per_verify of them. tacit's fused decoder (this-cpu)
        # attends each row on its own; the serving engines read a sequence's KV once (step_time).
        k = w.speculative_tokens
        rows = 1 if runs_tacit_engine(spec) else k + 1
        decode_step, decode = step_time(s, spec, profile, w, StepShape(micro * (k + 1), 1, ctx), rows)
        if mtp:
            draft, draft_ops = decode_drafting(pricing, micro, ctx, k, w.acceptance)
        tpot = (decode_step + draft) / w.tokens_per_verify
    return tpot, decode_step, decode, draft, draft_ops


def _open_loop(
    s: ModelShape, spec: HardwareSpec, profile: Profile, w: Workload, pricing: Pricing, mtp: int
) -> OpenLoop:
    """One replica's steady state at its share of the request rate (open_loop.py): one prompt's
    TTFT alone, and the decode step at each concurrency the solver asks for, bounded by the
    sequences whose KV fits beside the weights."""
    par, cached = w.parallel, w.cached_tokens
    one = batch_ttft(pricing, 1, w.input_len, w.output_len, _per_rank_scheduler(replace(w, batch=1), par), cached, mtp)
    alone = device_memory(s, par, w.weight_dtype, w.kv_dtype, 1, w.input_len, w.output_len, w.group_size)
    room = spec.memory_capacity.value - alone.weights - alone.activations
    fits = max(1, int(room // max(alone.kv_cache, 1.0)))
    return solve_open_loop(
        w.request_rate / par.replicas,
        one.mean_s,
        w.output_len,
        lambda n: _decode(s, spec, profile, w, pricing, mtp, n)[0],
        par.attention_ranks,
        fits,
    )
