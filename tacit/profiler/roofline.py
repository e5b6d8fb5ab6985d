"""FLOPs and bytes per operator class of one step, from the model's shapes, and this machine's roofs.

The counts are the work the step must do, whatever path runs it: each weight read once per step
(its bytes as stored: bf16, or GGML blocks), activations read and written once, each row's KV
context read once. Under tensor parallelism they are this rank's shard (the modules hold it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from tacit.layers.kv_cache import KVCacheLayer
from tacit.layers.linear import LinearBase
from tacit.layers.moe import FusedMoE
from tacit.layers.norm import RMSNorm
from tacit.profiler.categories import HEAD, layer_of, module_category

ACT_BYTES = 2  # bf16 activations


def _nbytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))


@dataclass
class LayerShapes:
    linears: list[tuple[int, int, int]] = field(default_factory=list)  # (in, out, weight bytes)
    norms: list[int] = field(default_factory=list)  # widths normed once per token (q/k norms: per head, all heads)
    # (query heads, qk head dim, v head dim, KV cache bytes per token)
    attention: tuple[int, int, int, int] | None = None
    router: tuple[int, int, int] | None = None  # (experts, hidden, weight bytes)
    # (experts held, top_k, hidden, intermediate, bytes of all stacks)
    experts: tuple[int, int, int, int, int] | None = None


@dataclass
class ModelShapes:
    layers: dict[str, LayerShapes]
    hidden: int
    head_bytes: int  # lm_head weight bytes (the embedding table when tied)
    head_out: int  # lm_head output features on this rank

    @property
    def bits_per_weight(self) -> float:
        """Mean bits a weight of the matrix products (linear layers, experts, lm_head) takes as
        held, scales and block headers included: 16 for bf16, 8.5 for int8 (Q8_0's blocks: 34
        bytes per 32 values), 5 for int4 and Q4_1 (20 bytes per 32). Norms, routers and the embedding's lookup
        are left out: they stay bf16 whatever the quantization."""
        nbytes = values = 0
        for s in self.layers.values():
            nbytes += sum(b for _, _, b in s.linears)
            values += sum(i * o for i, o, _ in s.linears)
            if s.experts:
                e, _, h, inter, stacks = s.experts
                nbytes, values = nbytes + stacks, values + 3 * e * h * inter  # gate, up and down
        nbytes, values = nbytes + self.head_bytes, values + self.hidden * self.head_out
        if not values:
            raise ValueError("the model has no linear layers or experts to count bits per weight of")
        return 8.0 * nbytes / values


def model_shapes(model: nn.Module) -> ModelShapes:
    layers: dict[str, LayerShapes] = {}
    head_bytes = head_out = hidden = 0
    for name, m in model.named_modules():
        layer = layer_of(name)
        if layer == HEAD:
            if isinstance(m, LinearBase):
                head_bytes, head_out, hidden = _nbytes(m), m.out_features, m.in_features
            continue
        shapes = layers.setdefault(layer, LayerShapes())
        if isinstance(m, LinearBase):
            if name.endswith(".mlp.gate"):  # Qwen3-MoE's router
                shapes.router = (m.out_features, m.in_features, _nbytes(m))
            else:
                shapes.linears.append((m.in_features, m.out_features, _nbytes(m)))
        elif isinstance(m, RMSNorm):
            width = m.weight.shape[0]
            heads = 1
            if name.endswith(("q_norm", "k_norm")):  # per-head norms over every q (or k) head
                attn = model.get_submodule(name.rsplit(".", 1)[0])
                heads = attn.num_heads if name.endswith("q_norm") else attn.num_kv_heads
            shapes.norms.append(width * heads)
        elif isinstance(m, FusedMoE):
            stacks = m.w13.numel() * m.w13.element_size() + m.w2.numel() * m.w2.element_size()
            shapes.experts = (m.num_local_experts, m.routing.top_k, m.hidden_size, m.intermediate_size, stacks)
        elif isinstance(m, KVCacheLayer) and m.kv_cache_spec is not None:
            qk = getattr(m, "qk_head_dim", None) or m.head_dim
            v = getattr(m, "v_dim", None) or qk
            shapes.attention = (m.num_heads, qk, v, m.kv_cache_spec.bytes_per_token)
            shapes.window = getattr(m, "sliding_window", None)
        elif module_category(name, m) == "moe_routing" and hasattr(m, "gate") and not isinstance(m.gate, LinearBase):
            w = m.gate.weight  # DeepSeek-V3's router, read in float32
            shapes.router = (w.shape[0], w.shape[1], w.numel() * w.element_size())
    return ModelShapes(layers, hidden, head_bytes, head_out)


Work = dict[str, dict[str, tuple[float, float]]]  # layer -> category -> (FLOPs, bytes)


def attended_pairs(n: int, c: int, window: int | None) -> float:
    """(query, key) pairs of n new tokens after c computed: query j (position c + j) sees its
    c + j + 1 positions, at most `window` of them."""
    if window is None:
        return n * c + n * (n + 1) / 2
    full = max(0, min(n, window - c))  # queries still short of the window: c + j + 1 <= window
    return full * c + full * (full + 1) / 2 + (n - full) * window


def step_work(shapes: ModelShapes, rows: list[tuple[int, int]], num_samples: int) -> Work:
    """FLOPs and bytes per layer and category of a step whose rows compute (new tokens, after
    this many computed) and of which num_samples rows sample."""
    t = sum(n for n, _ in rows)
    out: Work = {}
    for layer, s in shapes.layers.items():
        w: dict[str, tuple[float, float]] = {}
        if s.linears:
            w["gemm"] = (
                sum(2.0 * t * i * o for i, o, _ in s.linears),
                sum(b + t * (i + o) * ACT_BYTES for i, o, b in s.linears),
            )
        if s.norms:  # square, sum, scale, times the weight: 4 FLOPs a value; read and write x
            w["norm"] = (sum(4.0 * t * n for n in s.norms), sum(2.0 * t * n * ACT_BYTES for n in s.norms))
        if s.attention:
            heads, qk, v, kv_token = s.attention
            # Query j of a row attends to all positions up to itself (a sliding layer: its last
            # `window`): QK^T and PV over them; each row's keys read once, its new KV written.
            pairs = sum(attended_pairs(n, c, s.window) for n, c in rows)
            kv = sum((n + (c if s.window is None else min(c, s.window - 1))) * kv_token for n, c in rows)
            w["attention"] = (2.0 * heads * (qk + v) * pairs, kv + t * heads * (qk + v) * ACT_BYTES)
        if s.router:
            e, h, b = s.router
            w["moe_routing"] = (2.0 * t * h * e, b + t * (h * ACT_BYTES + e * 4))
        if s.experts:
            e, k, h, inter, stacks = s.experts
            # b tokens read E * (1 - (1 - k/E)^b) distinct experts when routing is uniform
            # (bench/latency.active_weight_bytes); gate, up and down: 3 GEMMs of h x inter.
            used = e * (1 - (1 - min(k, e) / e) ** t)
            w["experts"] = (6.0 * t * min(k, e) * h * inter, stacks * used / e + 2.0 * t * h * ACT_BYTES)
        out[layer] = w
    s_rows = num_samples
    head: dict[str, tuple[float, float]] = {}
    if shapes.head_bytes:
        head["gemm"] = (
            2.0 * s_rows * shapes.hidden * shapes.head_out,
            shapes.head_bytes + s_rows * (shapes.hidden * ACT_BYTES + shapes.head_out * 4),
        )
        head["norm"] = (4.0 * t * shapes.hidden, 2.0 * t * shapes.hidden * ACT_BYTES)
        # one pass over the fp32 logits (softmax / argmax): a FLOP and 4 bytes a logit
        head["sampling"] = (1.0 * s_rows * shapes.head_out, 4.0 * s_rows * shapes.head_out)
    out[HEAD] = head
    return out


@dataclass
class Roofs:
    read_Bps: float  # peak streaming read, bytes/s
    flops: float  # matmul FLOP/s: the faster of bf16 and float32 (bf16 where oneDNN has it)
    source: str

    @property
    def ridge(self) -> float:
        """FLOP per byte where the two roofs cross: below it a kernel is bound by memory."""
        return self.flops / self.read_Bps

    def to_json(self) -> dict[str, float | str]:
        return {
            "read_GBps": self.read_Bps / 1e9,
            "bf16_TFLOPs": self.flops / 1e12,
            "ridge": self.ridge,
            "source": self.source,
        }


def measure_roofs() -> Roofs:
    from tacit.platforms.hw_probe import peak_matmul_flops, peak_read_bandwidth

    return Roofs(peak_read_bandwidth(), peak_matmul_flops(), "measured now (tacit/platforms/hw_probe.py)")


def roofs_from_file(path: Path) -> Roofs:
    """Roofs from `tacit bench hw --json FILE`: the faster of the fp32 sum and tacit's GEMV reads."""
    try:
        hw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"--hw-json {path}: no such file (write one with `tacit bench hw --json {path}`)"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--hw-json {path}: not JSON ({e}); expected `tacit bench hw --json` output") from None
    reads = [hw.get(k) for k in ("read_GBps", "tacit_gemv_GBps")]
    reads = [r for r in reads if isinstance(r, (int, float)) and r == r and r > 0]
    flops = hw.get("bf16_matmul_TFLOPs")
    fp32 = hw.get("fp32_matmul_TFLOPs")
    if isinstance(flops, (int, float)) and isinstance(fp32, (int, float)) and fp32 > flops:
        flops = fp32  # a CPU without a native bf16 matmul computes in float32: that is its roof
    if not reads or not isinstance(flops, (int, float)) or not flops > 0:
        raise ValueError(
            f"--hw-json {path}: needs read_GBps (or tacit_gemv_GBps) and bf16_matmul_TFLOPs > 0, "
            f"as `tacit bench hw --json` writes; found keys {sorted(hw)}"
        )
    return Roofs(max(reads) * 1e9, flops * 1e12, f"read from {path}")
