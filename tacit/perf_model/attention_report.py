"""The lines `tacit predict` prints about attention's two costs that grow with the context: the
KV cache a token and a sequence take, and the decode step's attention time, per layer and per
step (what a sliding window or DeepSeek-V3.2's sparse attention changes)."""

from __future__ import annotations

from tacit.perf_model.memory import kv_bytes_per_sequence, kv_row_bytes, sliding_held_tokens
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.op_types import Parallel
from tacit.perf_model.roofline import OpTime


def kv_lines(s: ModelShape, par: Parallel, kvdt: str, tokens: int) -> list[str]:
    """Bytes a token takes in every layer's cache (split into latent and index keys under DSA),
    and, with sliding layers, what one sequence of `tokens` holds against full attention's."""
    row, index = kv_row_bytes(s, par, kvdt)
    kind = "latent" if s.is_mla else "K+V"
    parts = f"{kind} {row:.0f} B" + (f" + index keys {index:.0f} B" if index else "")
    lines = [f"  KV cache    {s.num_layers * (row + index):.0f} B a token ({s.num_layers} layers x ({parts}))"]
    sliding = {w: n for w, n in s.layer_counts.items() if w}
    if sliding:
        held = kv_bytes_per_sequence(s, par, kvdt, tokens)
        full = s.num_layers * (row + index) * tokens
        kept = ", ".join(f"{n} layers of window {w} keep {sliding_held_tokens(w, tokens)}" for w, n in sliding.items())
        lines.append(
            f"              a sequence of {tokens} tokens holds {held / 1e9:.3f} GB, {100 * held / full:.1f}% of "
            f"full attention's {full / 1e9:.3f} GB ({kept} tokens)"
        )
    return lines


def attention_lines(times: list[OpTime], context: int) -> list[str]:
    """The decode step's attention-class operators: each one's time a layer and a step, and their
    sum a step (the projections, whose cost does not grow with the context, are in --ops)."""
    ops = [t for t in times if t.op.op_class == "attention"]
    total = sum(t.seconds for t in ops)
    lines = [f"  attention   decode at context {context}: {1e3 * total:.3f} ms a step"]
    for t in ops:
        layers = t.op.layers or 1
        lines.append(
            f"    {t.op.name:<20}{1e3 * t.seconds / layers:>9.4f} ms a layer x {layers} = {1e3 * t.seconds:.3f} ms"
            f" ({t.bound}, {t.op.bytes / layers / 1e6:.2f} MB a layer)"
        )
    return lines
