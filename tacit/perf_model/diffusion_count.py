"""FLOPs and bytes per block of a diffusion UNet step, a VAE decode and a text encoder, counted
by running diffusers' / transformers' own modules on the meta device (shapes only: SDXL's 2.6 B
UNet parameters cost no memory, and a 1024x1024 step counts in ~2 s).

Each aten op is attributed to the innermost block running it (forward hooks keep a stack):
a resnet, an attention (transformer) block, a down/upsampler, the mid block's parts, the
stem and head convs; a container's own ops (the up blocks' skip concatenations) are its row.
Per op:
  - FLOPs: torch.utils.flop_counter's formulas (FlopCounterMode's registry: conv, mm, addmm,
    bmm); scaled_dot_product_attention counted as ONE fused op (sdpa_flop_count: QK^T and PV),
    since the math path's score matrices (2 x 10 x 4096 x 4096 x 2 bytes = 671 MB in SDXL's
    64x64 self-attention) are never written by the flash kernels every engine uses.
  - bytes: the weights it reads (a parameter, or a view of one, at `weight_bytes` a value),
    plus its other inputs and its output at `act_bytes` a value: each op reads and writes
    memory, as an unfused eager run does (a fused GroupNorm+SiLU halves its share: an upper
    bound on the traffic).
  - its working set: its activation inputs and output, the memory it sweeps; against the
    caches it says which blocks stream from DRAM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

_BLOCK = re.compile(
    r"(^|\.)((down_blocks|up_blocks)\.\d+\.(resnets|attentions|downsamplers|upsamplers)\.\d+"
    r"|mid_block\.(resnets|attentions)\.\d+|(down_blocks|up_blocks)\.\d+|mid_block"
    r"|encoder\.layers\.\d+)$"
)


# ops that move no data although the schema does not call them views (_unsafe_view: reshape's
# result of a contiguous tensor)
_NO_TRAFFIC = (torch.ops.aten.detach, torch.ops.aten.lift_fresh, torch.ops.aten._unsafe_view)


@dataclass
class BlockCount:
    name: str  # the module's qualified name in its component
    component: str  # unet | vae | text
    gemm_flops: float = 0.0  # convolutions and linears
    attention_flops: float = 0.0  # fused SDPA
    weight_bytes: float = 0.0
    activation_bytes: float = 0.0
    gemm_bytes: float = 0.0  # the share of the bytes the FLOP-carrying ops move (the rest: elementwise ops)
    ops: int = 0  # kernel launches in an eager run (views excluded)
    rows: int = 0  # largest GEMM M (batch x spatial positions or tokens): the efficiency curves' x
    attention_len: int = 0  # longest query sequence of its attention
    working_set: float = 0.0  # largest single op's activation bytes (inputs + output)

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.activation_bytes

    @property
    def intensity(self) -> float:
        return self.flops / max(self.bytes, 1.0)


@dataclass
class _State:
    stack: list[str] = field(default_factory=list)
    in_sdpa: int = 0


def _gemm_rows(func: Any, args: tuple, out: Any) -> int:
    pkt = func.overloadpacket
    if pkt in (torch.ops.aten.convolution, torch.ops.aten._convolution):
        return int(out.numel() // out.shape[1])  # N x H x W output positions
    if pkt in (torch.ops.aten.mm, torch.ops.aten.addmm):
        return int(out.shape[0])
    if pkt in (torch.ops.aten.bmm, torch.ops.aten.baddbmm):
        return int(out.shape[0] * out.shape[1])
    return 0


class _Counter(TorchDispatchMode):
    def __init__(
        self, state: _State, blocks: dict[str, BlockCount], component: str, weights: set[int], wb: float, ab: float
    ) -> None:
        super().__init__()
        self.state, self.blocks, self.component = state, blocks, component
        self.weights, self.wb, self.ab = weights, wb, ab
        self._alive: list[torch.Tensor] = []  # views of weights, kept so their ids are not reused

    def block(self) -> BlockCount:
        name = self.state.stack[-1] if self.state.stack else "(top)"
        if name not in self.blocks:
            self.blocks[name] = BlockCount(name, self.component)
        return self.blocks[name]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func.is_view or func.overloadpacket in _NO_TRAFFIC:
            if ins and id(ins[0]) in self.weights and isinstance(out, torch.Tensor):
                self.weights.add(id(out))  # w.t() feeding addmm is still the weight
                self._alive.append(out)
            return out
        if self.state.in_sdpa:
            return out  # inside a fused attention: counted once at its entry
        b = self.block()
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        w = sum(t.numel() for t in ins if id(t) in self.weights)
        act = sum(t.numel() for t in ins if id(t) not in self.weights) + sum(t.numel() for t in outs)
        if func.overloadpacket in flop_registry:
            b.gemm_flops += flop_registry[func.overloadpacket](*args, **kwargs, out_val=out)
            b.rows = max(b.rows, _gemm_rows(func, args, out))
            b.gemm_bytes += w * self.wb + act * self.ab
        b.weight_bytes += w * self.wb
        b.activation_bytes += act * self.ab
        b.working_set = max(b.working_set, act * self.ab)
        b.ops += 1
        return out


class _Sdpa(TorchFunctionMode):
    """scaled_dot_product_attention as one fused op: its FLOPs and q, k, v and output bytes."""

    def __init__(self, counter: _Counter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v = args[:3]
        b = self.counter.block()
        shape = lambda t: (t.shape[0], t.shape[1], t.shape[2], t.shape[3])  # noqa: E731 (batch, heads, len, dim)
        b.attention_flops += sdpa_flop_count(shape(q), shape(k), shape(v))
        act = (2 * q.numel() + k.numel() + v.numel()) * self.counter.ab  # q, k, v read; out (q's size) written
        b.activation_bytes += act
        b.gemm_bytes += act
        b.working_set = max(b.working_set, act)
        b.attention_len = max(b.attention_len, int(q.shape[2]))
        b.ops += 1
        self.counter.state.in_sdpa += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.counter.state.in_sdpa -= 1


def count_blocks(
    module: torch.nn.Module,
    run: Callable[[], Any],
    component: str,
    weight_bytes: float = 2.0,
    act_bytes: float = 2.0,
    is_block: Callable[[str], bool] | None = None,
) -> list[BlockCount]:
    """Run `run()` (a forward of `module`, meta or real tensors) and count it per block; rows
    in the order the blocks first ran. `is_block`: which qualified names are rows (default:
    resnets, attentions, samplers, containers, and the component's top-level modules)."""
    state, blocks = _State(), {}
    weights = {id(p) for p in module.parameters()}
    counter = _Counter(state, blocks, component, weights, weight_bytes, act_bytes)
    picked = is_block or is_row_block
    handles = []
    for name, mod in module.named_modules():
        if name and picked(name):
            # (a forward hook's return value would replace the module's output: these return None)
            handles.append(mod.register_forward_pre_hook(lambda m, a, n=name: state.stack.append(n)))
            handles.append(mod.register_forward_hook(lambda m, a, o: None if state.stack.pop() else None))
    try:
        with _Sdpa(counter), counter, torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return list(blocks.values())


def is_row_block(name: str) -> bool:
    """Whether the module `name` is a row of the per-block counts (and of the profile's timings)."""
    # top-level modules (conv_in, time_embedding, conv_out; a VAE's decoder's own stem and head)
    return bool(_BLOCK.search(name)) or name.count(".") == 0 or (name.startswith("decoder.") and name.count(".") == 1)
