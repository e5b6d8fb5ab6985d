"""The plain data of the operator model (operators.py): an operator's counts (Op), a step's shape
(StepShape), the parallel layout (Parallel), and the GEMM every weight product is priced as."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tacit.perf_model.dtypes import activation_bytes, gemm_compute_dtype, weight_bytes_per_value
from tacit.perf_model.ggml_mixes import GEMM_ROLES

ACT = 2  # bytes of a bf16 activation (a GEMM's 8-bit input: dtypes.activation_bytes)
OP_CLASSES = (
    "attn_proj",
    "attention",
    "moe_routing",
    "experts",
    "dense_mlp",
    "norm_elementwise",
    "lm_head",
    "sampling",
    "communication",
)


@dataclass(frozen=True)
class Op:
    name: str
    op_class: str  # one of OP_CLASSES
    flops: float
    bytes: float
    rows: float = 1.0  # GEMM: activation rows per weight pass (the efficiency curve's x)
    weight_dtype: str = "bf16"  # GEMM: the stored weights' dtype (which efficiency curve)
    launches: float = 1.0  # kernel calls per step (each pays the per-op overhead)
    collective: str = ""  # communication: all_reduce | all_to_all | all_gather
    participants: int = 1  # communication: ranks in the collective
    # a matrix product over stored weights (the GEMM efficiency curve), whatever its class: the
    # MoE router is one (a bf16 F.linear), though its time counts as routing
    is_gemm: bool = False
    # the micro-benchmarked kernel whose efficiency applies: GEMM "" = the linear method of
    # weight_dtype; "bmm": torch's batched bf16 matmul, MLA's absorbed per-head projections
    # (0.25-0.28 of bandwidth at 1-16 rows where the C++ GEMV reaches 0.7); "moe": the C++
    # experts kernel (0.36 at 16 rows per expert where the GEMM curve says 0.29-0.63).
    # Attention: "mla" for MLA's prefill (up-projection then SDPA at qk 192 / v 128).
    kernel: str = ""
    # elementwise: the bytes one layer's call moves, the elementwise curve's x. Its efficiency
    # depends on whether that fits the caches: tacit's layer ops reached 0.27 of bandwidth at
    # 14 MB (256 rows of the benchmark layer) and 0.05-0.07 at 230 MB (4096 rows), where every
    # fresh output tensor is page-faulted in
    working_set: float = 0.0
    # attention-class ops: the decoder layers the counts sum over (a per-layer time is the op's
    # over this); 0 where an op is not one per layer
    layers: int = 0
    # communication: the algorithm asked for (all_reduce: parallel.ALL_REDUCE; all_to_all_v:
    # DeepEP's "low_latency" or "normal"), and the part of `bytes` that crosses nodes where the
    # op says so itself (dispatch, pipeline sends); collectives derive it from participants
    algorithm: str = ""
    inter_bytes: float = 0.0
    # GEMM: the dtype it multiplies in (dtypes.gemm_compute_dtype; "auto": the weight format's
    # usual one), whose peak bounds it
    act_dtype: str = "auto"
    # GQA attention: query heads per KV head (0: another kind). torch's SDPA on the CPU's torch
    # path expands K and V to every query head, so its decode efficiency depends on it
    gqa_group: float = 0.0


@dataclass(frozen=True)
class StepShape:
    batch: int
    new_tokens: int  # per sequence
    context: int  # tokens already cached per sequence

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def key_positions(self) -> float:
        """Sum over the step's query tokens of the keys each attends to (causal):
        per sequence T*C + T*(T+1)/2."""
        t, c = self.new_tokens, self.context
        return self.batch * (t * c + t * (t + 1) / 2)


A2A_BACKENDS = ("allgather", "deepep")
DEEPEP_MODES = ("auto", "low_latency", "normal")
ALL_REDUCE_ALGORITHMS = ("auto", "ring", "tree", "one_shot", "two_shot")


def _ceil(a: float, b: float) -> int:
    return int(-(-a // b))


@dataclass(frozen=True)
class Parallel:
    """One replica's layout, per part (perf_model/layout.py validates it against the model and
    moves dense data-parallel ranks into `replicas`). A pipeline stage holds tp * dp devices:
    dp attention groups (data-parallel ranks) of tp devices each, or under tacit's
    --data-parallel-attention tp groups of one device. The defaults are one group of tp devices
    splitting every part, today's meaning."""

    tp: int = 1  # --tensor-parallel-size: devices of one attention group
    ep: bool = False  # experts split whole (--enable-expert-parallel / --expert-parallel)
    dp_attention: bool = False  # tacit's --data-parallel-attention: attention TP 1 over the tp devices
    dp: int = 1  # --data-parallel-size: attention groups sharing one stage's experts
    ep_size: int = 0  # --expert-parallel-size; 0: every device of a stage under ep
    dense_tp: int = 0  # --moe-dense-tp-size; 0: the attention group, every device under dp_attention
    dp_lm_head: bool = False  # --enable-dp-lm-head: the head vocab-parallel inside the attention group
    pp: int = 1  # --pipeline-parallel-size
    replicas: int = 1  # independent copies of the model, the batch split over them
    redundant_experts: int = 0  # --num-redundant-experts (EPLB)
    expert_load_imbalance: float = 0.0  # the busiest EP rank's routed pairs over the mean; 0: derived
    a2a_backend: str = ""  # --moe-a2a-backend; "": deepep when experts span attention groups
    deepep_mode: str = "auto"  # auto: low_latency for decode, normal for prefill
    two_batch_overlap: bool = False
    all_reduce_algorithm: str = "auto"
    devices_per_node: int = 0  # 0: the hardware's (predict fills it in)

    @property
    def stage_devices(self) -> int:
        return self.tp * self.dp

    @property
    def devices(self) -> int:
        return self.stage_devices * self.pp * self.replicas

    @property
    def attention_tp(self) -> int:
        """Ranks the attention heads split over: 1 under data-parallel attention."""
        return 1 if self.dp_attention else self.tp

    @property
    def attention_ranks(self) -> int:
        """Attention groups of a stage, each over its own sequences."""
        return self.stage_devices // self.attention_tp

    @property
    def expert_ranks(self) -> int:
        """Ranks the experts are split over whole (1: every device holds a slice of each)."""
        return (self.ep_size or self.stage_devices) if self.ep else 1

    @property
    def expert_tp(self) -> int:
        return self.stage_devices // self.expert_ranks

    @property
    def dense_group(self) -> int:
        return self.dense_tp or (self.stage_devices if self.dp_attention else self.tp)

    @property
    def head_group(self) -> int:
        """Devices the head's vocabulary splits over (embedding too)."""
        return self.attention_tp if self.dp_lm_head else self.dense_group

    @property
    def backend(self) -> str:
        if self.a2a_backend:
            return self.a2a_backend
        return "deepep" if self.ep and self.attention_ranks > 1 else "allgather"

    def sequences_per_device(self, batch: int) -> int:
        """The sequences one device attends over (and caches): its attention group's share (the
        busiest group's, rounded up; one prompt stays on one group)."""
        return _ceil(batch, self.attention_ranks)

    def group_sequences(self, batch: int, group: int) -> int:
        """Sequences a group of `group` devices of a stage computes together: the attention groups
        it spans (at least the device's own), never more than the batch."""
        return min(batch, self.sequences_per_device(batch) * max(1, group // self.attention_tp))

    def own_tokens(self, step: "StepShape") -> float:
        """Tokens a device dispatches itself under DeepEP: its attention group's split over the
        group's devices (SGLang scatters them after attention's reduction)."""
        return self.sequences_per_device(step.batch) * step.new_tokens / self.attention_tp

    def attention_step(self, step: "StepShape") -> "StepShape":
        return replace(step, batch=self.sequences_per_device(step.batch))


def gemm_op(
    name: str, cls: str, rows: float, k: float, n: float, wdtype: str, group: int, times: int, act: str = "auto"
) -> Op:
    """`times` GEMMs of [rows, k] @ [k, n]: 2*rows*k*n FLOPs, the weight once (a GGML mix's
    bytes for this GEMM's role over the `times` layers), activations in (at `act`'s bytes where
    the kernel reads them quantized) and out (bf16)."""
    weight = k * n * weight_bytes_per_value(wdtype, group, GEMM_ROLES.get(name, ""), times, int(k))
    acts = rows * (k * activation_bytes(wdtype, act) + n * ACT)
    compute = gemm_compute_dtype(wdtype, act)
    flops = times * 2 * rows * k * n
    return Op(name, cls, flops, times * (weight + acts), rows, wdtype, float(times), is_gemm=True, act_dtype=compute)


def local_heads(count: int, tp: int) -> int:
    """Heads per rank; fewer heads than ranks are replicated (one each), as KV heads are."""
    return max(1, count // tp)
