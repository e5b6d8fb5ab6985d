"""The plain data of the operator model (operators.py): an operator's counts (Op), a step's shape
(StepShape), the parallel layout (Parallel), and the GEMM every weight product is priced as."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tacit.perf_model.dtypes import weight_bytes_per_value

ACT = 2  # bytes of a bf16 activation
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


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    ep: bool = False
    dp_attention: bool = False

    @property
    def devices(self) -> int:
        """Devices the layout occupies (what throughput per device and nodes divide by)."""
        return self.tp

    @property
    def attention_tp(self) -> int:
        """Ranks the attention heads split over: 1 under data-parallel attention."""
        return 1 if self.dp_attention else self.tp

    def sequences_per_device(self, batch: int) -> int:
        """The sequences one device attends over (and caches): a 1/tp share under data-parallel
        attention (the busiest device's, rounded up; one prompt stays on one device)."""
        return -(-batch // self.tp) if self.dp_attention else batch

    def attention_step(self, step: "StepShape") -> "StepShape":
        return replace(step, batch=self.sequences_per_device(step.batch))


def gemm_op(name: str, cls: str, rows: float, k: float, n: float, wdtype: str, group: int, times: int) -> Op:
    """`times` GEMMs of [rows, k] @ [k, n]: 2*rows*k*n FLOPs, the weight once, activations in and out."""
    weight = k * n * weight_bytes_per_value(wdtype, group)
    acts = rows * (k + n) * ACT
    return Op(name, cls, times * 2 * rows * k * n, times * (weight + acts), rows, wdtype, float(times), is_gemm=True)


def local_heads(count: int, tp: int) -> int:
    """Heads per rank; fewer heads than ranks are replicated (one each), as KV heads are."""
    return max(1, count // tp)
