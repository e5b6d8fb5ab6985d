"""Sparse MoE layer: expert weights stacked per projection, the routing rule, and a MoEKernel.

The kernel is the reference torch one until the model runner hands every layer the kernel
chosen for the platform and dtype (use_moe_kernel).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

import tacit.kernels.cpu_fused_moe  # noqa: F401  registers "cpu_fused"
from tacit.distributed.communicator import exposed
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.kernels.cpu_kernels import cpu_kernels_default
from tacit.kernels.ggml_quant import GGML_TYPES, GGMLExpertStack, GGMLTensor, row_bytes
from tacit.kernels.moe_kernel import MOE_KERNELS, SILU, ExpertActivation, ExpertWeights, MoEKernel
from tacit.kernels.moe_routing import MoERouting
from tacit.kernels.torch_moe import TorchMoEKernel
from tacit.memory.expert_cache import ExpertCache

_PROJ_ROWS = {"gate_proj": 0, "up_proj": 1}  # halves of w13


class FusedMoE(nn.Module):
    """Expert weights as [E, 2I, H] (gate and up fused) and [E, H, I], loaded from HF's
    per-expert `experts.{e}.{gate,up,down}_proj.weight` names by load_expert_weight, or kept in
    a GGUF's GGML blocks (load_expert_stack).

    Over N tensor-parallel ranks the experts split one of two ways, and either way every rank
    routes every token (the router is whole everywhere) and one all-reduce sums the ranks'
    partial outputs, as after a row-parallel linear:
    - by feature (default): each rank holds every expert's 1/N of the intermediate features;
    - by expert (tp.expert_parallel): each rank holds E/N whole experts, [start, start + E/N);
      tokens routed elsewhere contribute nothing here (ExpertWeights.slots marks them -1). The
      tokens need no dispatch: after tensor-parallel attention every rank already holds all of
      them, so an all-to-all would move rows every rank has."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        routing: MoERouting,
        kernel: MoEKernel | None = None,
        tp: TensorParallel = SINGLE,
        activation: ExpertActivation = SILU,
        has_bias: bool = False,
    ) -> None:
        """activation, has_bias: gpt-oss's clamped SwiGLU and per-expert biases (w13_bias, w2_bias),
        which only the torch kernel runs (use_moe_kernel)."""
        super().__init__()
        self.tp, self.comm = tp, None
        self.comm_seconds = 0.0
        self.expert_parallel = tp.expert_parallel and tp.size > 1
        self.full_intermediate_size = intermediate_size
        if self.expert_parallel:
            self.expert_start, local_experts = tp.part(num_experts, "num_experts")
        else:
            self.expert_start, local_experts = 0, num_experts
            intermediate_size = tp.split(intermediate_size, "moe_intermediate_size")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.num_local_experts = local_experts
        self.routing = routing
        self.w13 = nn.Parameter(torch.empty(local_experts, 2 * intermediate_size, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(local_experts, hidden_size, intermediate_size), requires_grad=False)
        self.activation = activation
        self.w13_bias = self.w2_bias = None
        if has_bias:
            self.w13_bias = nn.Parameter(torch.empty(local_experts, 2 * intermediate_size), requires_grad=False)
            self.w2_bias = nn.Parameter(torch.empty(local_experts, hidden_size), requires_grad=False)
        self._loaded_biases: set[str] = set()
        # GGML type ids when w13 / w2 hold blocks (use_ggml_stacks), None for float weights.
        self.w13_type: int | None = None
        self.w2_type: int | None = None
        self.kernel = kernel or TorchMoEKernel()
        # Another rank's experts count as loaded: this rank never reads them.
        self._loaded: set[tuple[int, str]] = {
            (e, p) for e in range(num_experts) if not self.is_local(e) for p in ("gate_proj", "up_proj", "down_proj")
        }
        self._expert_slots: torch.Tensor | None = None
        # Set when the experts stay in the checkpoint: (cache, this layer's index among the
        # streamed ones, a callback that prefetches the next layer's predicted experts).
        self.stream: ExpertStream | None = None
        self.streamed = False

    def is_local(self, expert: int) -> bool:
        return self.expert_start <= expert < self.expert_start + self.num_local_experts

    def checkpoint_shards(self, name: str) -> dict[str, tuple[int, int, int] | None]:
        """By feature: each expert's slice of gate/up rows and down columns; by expert: the other
        ranks' experts, never read (None)."""
        if self.expert_parallel:
            return {n: None for n in expert_weight_names(name, self.num_experts) if not self.is_local(_expert_of(n))}
        start, n = self.tp.part(self.full_intermediate_size, "moe_intermediate_size")
        return {
            f"{name}.{e}.{p}.weight": (1 if p == "down_proj" else 0, start, n)
            for e in range(self.num_experts)
            for p in ("gate_proj", "up_proj", "down_proj")
        }

    def expert_slots(self) -> torch.Tensor | None:
        """Expert parallelism: global expert id -> row of this rank's stacks, -1 for another
        rank's (the kernels skip those); None otherwise."""
        if not self.expert_parallel:
            return None
        if self._expert_slots is None:
            slots = torch.full((self.num_experts,), -1, dtype=torch.int64)
            slots[self.expert_start : self.expert_start + self.num_local_experts] = torch.arange(self.num_local_experts)
            self._expert_slots = slots
        return self._expert_slots

    def stream_from_checkpoint(self) -> None:
        """Hold no expert weights: they are read from the checkpoint as steps need them."""
        if self.w13_bias is not None:
            raise ValueError("expert_cache_memory: experts with biases (gpt-oss) are not streamed; hold them resident")
        e, inter, hidden = self.num_experts, self.intermediate_size, self.hidden_size
        self.w13 = nn.Parameter(torch.empty(0, 2 * inter, hidden, device=self.w13.device), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(0, hidden, inter, device=self.w2.device), requires_grad=False)
        self.streamed = True
        self._loaded.update((i, p) for i in range(e) for p in ("gate_proj", "up_proj", "down_proj"))

    def use_ggml_weights(self, ggml_type: int) -> None:
        """Hold every expert as `ggml_type` blocks (before loading: each checkpoint tensor then
        arrives quantized, as a GGMLTensor, through load_expert_weight)."""
        self.use_ggml_stacks(ggml_type, ggml_type)

    def _feature_part(self) -> tuple[int, int]:
        """This rank's [start, start + n) of every expert's intermediate features (all of them
        unless the experts split by feature)."""
        if self.tp.size > 1 and not self.expert_parallel:
            return self.tp.part(self.full_intermediate_size, "moe_intermediate_size")
        return 0, self.intermediate_size

    def _cuts_blocks(self, ggml_type: int) -> bool:
        """Whether this rank's columns of down_proj (its intermediate features) cut through a
        `ggml_type` block: such a rank holds down in floats (Q4_K's 256-value blocks need
        moe_intermediate_size / N to be a multiple of 256)."""
        start, n = self._feature_part()
        values = GGML_TYPES[ggml_type].block_values
        return bool(start % values or n % values)

    def use_ggml_stacks(self, w13_type: int | None, w2_type: int | None) -> None:
        """Hold w13 (gate and up) and w2 (down) as blocks of each one's GGML type, None: float
        (before loading). A GGUF's stacks may differ: Q4_K_M files keep ffn_down_exps in Q6_K."""
        if w2_type is not None and self._cuts_blocks(w2_type):
            w2_type = None
        e, inter, hidden = self.num_local_experts, self.intermediate_size, self.hidden_size
        device = self.w13.device
        if w13_type is not None:
            self.w13 = nn.Parameter(
                torch.empty(e, 2 * inter, row_bytes(w13_type, hidden), dtype=torch.uint8, device=device),
                requires_grad=False,
            )
            self.w13_type = w13_type
        if w2_type is not None:
            self.w2 = nn.Parameter(
                torch.empty(e, hidden, row_bytes(w2_type, inter), dtype=torch.uint8, device=device),
                requires_grad=False,
            )
            self.w2_type = w2_type

    def load_expert_weight(self, expert: int, proj: str, weight: torch.Tensor | GGMLTensor) -> None:
        """expert: its global id (HF's name); under expert parallelism only this rank's come."""
        if not self.is_local(expert):
            raise ValueError(f"expert {expert} belongs to another rank; this one holds {self.expert_start}..")
        self._loaded.add((expert, proj))
        expert -= self.expert_start
        inter = self.intermediate_size
        stack_type = self.w2_type if proj == "down_proj" else self.w13_type
        if stack_type is not None:
            if not isinstance(weight, GGMLTensor) or weight.ggml_type != stack_type:
                got = weight.type_name if isinstance(weight, GGMLTensor) else f"a {weight.dtype} tensor"
                raise ValueError(
                    f"{proj} of expert {expert}: the experts are {GGML_TYPES[stack_type].name} blocks; got {got}"
                )
            weight = weight.data
        elif isinstance(weight, GGMLTensor):
            weight = weight.dequantize((self.w2 if proj == "down_proj" else self.w13).dtype)
        with torch.no_grad():
            if proj == "gate_proj":
                self.w13[expert, :inter].copy_(weight)
            elif proj == "up_proj":
                self.w13[expert, inter:].copy_(weight)
            elif proj == "down_proj":
                self.w2[expert].copy_(weight)
            else:
                raise KeyError(proj)

    def load_expert_stack(self, proj: str, stack: GGMLExpertStack) -> None:
        """A GGUF's stack of every expert's `proj` ("gate_proj", "up_proj", "down_proj"); this
        rank keeps its part: its experts (by expert), or every expert's rows of gate/up and
        columns of down (by feature). Kept as blocks where the stack holds blocks
        (use_ggml_stacks), else dequantized expert by expert."""
        if proj not in ("gate_proj", "up_proj", "down_proj"):
            raise KeyError(proj)
        if stack.ggml_type not in GGML_TYPES:
            raise ValueError(f"{proj} experts: GGML type {stack.ggml_type} has no kernel; valid: {sorted(GGML_TYPES)}")
        e, inter, hidden = self.num_experts, self.full_intermediate_size, self.hidden_size
        want = (e, hidden, inter) if proj == "down_proj" else (e, inter, hidden)
        if tuple(stack.shape) != want:
            raise ValueError(f"{proj} experts: the config says {want}, the checkpoint's stack is {tuple(stack.shape)}")
        start, n = self._feature_part()
        local = range(self.expert_start, self.expert_start + self.num_local_experts)
        if (self.w2_type if proj == "down_proj" else self.w13_type) is None:
            for expert in local:
                w = stack.dequantize_expert(expert)
                w = w[:, start : start + n] if proj == "down_proj" else w[start : start + n]
                self.load_expert_weight(expert, proj, w)
            return
        blocks = stack.data[local.start : local.stop]
        if proj == "down_proj":
            t = GGML_TYPES[stack.ggml_type]
            blocks = blocks[
                :, :, start // t.block_values * t.block_bytes : (start + n) // t.block_values * t.block_bytes
            ]
        else:
            blocks = blocks[:, start : start + n]
        self._load_ggml_blocks(proj, blocks.contiguous(), stack.ggml_type)
        self._loaded.update((i, proj) for i in local)

    def _load_ggml_blocks(self, proj: str, blocks: torch.Tensor, ggml_type: int) -> None:
        """This rank's part of every local expert's `proj` as GGML blocks, uint8
        [local experts, rows, row_bytes], into the stacks."""
        if ggml_type != (self.w2_type if proj == "down_proj" else self.w13_type):
            held = GGML_TYPES[self.w2_type if proj == "down_proj" else self.w13_type].name
            raise ValueError(
                f"{proj} experts are {GGML_TYPES[ggml_type].name}; tacit holds them as {held} blocks "
                "(gate and up share one matrix and need one type)"
            )
        if proj == "down_proj":
            self.w2.data.copy_(blocks)
        else:
            half, inter = _PROJ_ROWS[proj], self.intermediate_size
            self.w13.data[:, half * inter : (half + 1) * inter].copy_(blocks)

    def load_stacked(self, param: str, tensor: torch.Tensor) -> None:
        """Every local expert's `param` at once, this rank's part already in tacit's layout:
        "w13" [E, 2I, H], "w2" [E, H, I], "w13_bias" [E, 2I], "w2_bias" [E, H] (E: this rank's
        experts, I: its features) — for checkpoints that store each projection as one stack
        (gpt-oss). Split by feature, every rank holds the whole w2_bias but only rank 0 adds it:
        the all-reduce sums the ranks' partial outputs, so it would count once per rank."""
        if param not in ("w13", "w2", "w13_bias", "w2_bias") or getattr(self, param) is None:
            have = [p for p in ("w13", "w2", "w13_bias", "w2_bias") if getattr(self, p) is not None]
            raise ValueError(f"expert stack {param!r} is not one of this layer's: {', '.join(have)}")
        target = getattr(self, param)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"expert stack {param}: the config says {tuple(target.shape)}, the checkpoint gives {tuple(tensor.shape)}"
            )
        with torch.no_grad():
            target.copy_(tensor)
            if param == "w2_bias" and self.tp.size > 1 and not self.expert_parallel and self.tp.rank:
                target.zero_()
        if param.endswith("_bias"):
            self._loaded_biases.add(param)
            return
        local = range(self.expert_start, self.expert_start + self.num_local_experts)
        projs = ("down_proj",) if param == "w2" else ("gate_proj", "up_proj")
        self._loaded.update((e, p) for e in local for p in projs)

    def check_fully_loaded(self, name: str) -> None:
        missing = self.num_experts * 3 - len(self._loaded)
        if missing:
            raise ValueError(f"checkpoint is missing {missing} expert projection(s) of {name}")
        biases = {p for p in ("w13_bias", "w2_bias") if getattr(self, p) is not None} - self._loaded_biases
        if biases:
            raise ValueError(f"checkpoint is missing the expert biases {', '.join(sorted(biases))} of {name}")

    def expert_weights(self) -> ExpertWeights:
        bias = (self.w13_bias.data, self.w2_bias.data) if self.w13_bias is not None else (None, None)
        return ExpertWeights(
            self.w13.data, self.w2.data, self.w13_type, self.w2_type, self.expert_slots(), *bias, self.activation
        )

    def forward(
        self,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        correction_bias: torch.Tensor | None = None,
        shared: ExpertWeights | None = None,
        reduce: bool = True,
    ) -> torch.Tensor:
        """x [T, H], router logits [T, E] -> the routed experts' weighted sum (+ the shared expert).
        reduce=False: under tensor parallelism, this rank's partial sum (the caller all-reduces)."""
        weights, ids = self.kernel.route(router_logits.float(), self.routing, correction_bias)
        if not self.streamed:
            out = self.kernel.experts(x, weights, ids, self.expert_weights(), shared)
            if self.tp.size > 1 and reduce:
                exposed(self, lambda: self.comm.all_reduce(out))
            return out
        routed = self.streamed_weights()
        routed.slots = self.acquire_streamed(ids, x)
        return self.kernel.experts(x, weights, ids, routed, shared)

    def streamed_weights(self) -> ExpertWeights:
        """The expert cache's slot stacks (streamed experts; the slot table comes per step)."""
        if self.stream is None:
            raise RuntimeError("streamed experts have no cache bound (models/expert_streaming.py)")
        return ExpertWeights(self.stream.cache.w13, self.stream.cache.w2)

    def acquire_streamed(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Make this step's experts resident (ids [T, top_k]; x [T, H], the layer's input) and
        start the next layer's predicted ones; -> the expert -> slot table."""
        slots = self.stream.cache.acquire(self.stream.layer, torch.unique(ids).tolist(), x.shape[0])
        if self.stream.prefetch_next is not None:
            self.stream.prefetch_next(x)
        return slots


@dataclass
class ExpertStream:
    cache: ExpertCache
    layer: int
    prefetch_next: Callable[[torch.Tensor], None] | None = None


_EXPERT_WEIGHT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.weight$")


def _expert_of(name: str) -> int:
    return int(name.rsplit(".", 3)[1])


def is_expert_weight(name: str) -> bool:
    """Whether a checkpoint name is a routed expert's weight (HF's per-expert layout)."""
    return _EXPERT_WEIGHT.search(name) is not None


def expert_weight_names(module: str, num_experts: int) -> list[str]:
    """The checkpoint (HF) names of a FusedMoE's expert weights."""
    return [f"{module}.{e}.{p}.weight" for e in range(num_experts) for p in ("gate_proj", "up_proj", "down_proj")]


def use_ggml_experts(name: str, m: FusedMoE, types: dict[str, int]) -> None:
    """Hold a FusedMoE's experts as GGML blocks when `types` ({HF weight name: GGML type}) gives
    all its expert weights one type (they are quantized as they load)."""
    found = {types.get(n) for n in expert_weight_names(name, m.num_experts)}
    if len(found) == 1 and None not in found:
        m.use_ggml_weights(found.pop())


def use_ggml_expert_stacks(name: str, m: FusedMoE, types: dict[str, int]) -> None:
    """Hold a FusedMoE's stacks as the GGML blocks its checkpoint gives them (before loading).
    types: {`{module}.{proj}.weight` (a GGUF's whole stack) or `{module}.{expert}.{proj}.weight`
    (a Hugging Face checkpoint's quantized experts, FP8 or GPTQ): GGML type}. A projection whose
    experts differ in type, and gate and up unless of one type (they share w13), stay float."""
    gate, up, down = (_experts_type(types, name, m.num_experts, p) for p in ("gate_proj", "up_proj", "down_proj"))
    m.use_ggml_stacks(gate if gate == up else None, down)


def _experts_type(types: dict[str, int], module: str, num_experts: int, proj: str) -> int | None:
    stack = types.get(f"{module}.{proj}.weight")
    if stack is not None:
        return stack
    found = {types.get(f"{module}.{e}.{proj}.weight") for e in range(num_experts)}
    return found.pop() if len(found) == 1 else None


def select_moe_kernel(
    platform: str, dtype: torch.dtype, cpu_kernels: bool | None = None, ggml_int8_activations: bool = True
) -> MoEKernel:
    """The lowest-priority registered kernel that runs on `platform` in `dtype` (the torch
    reference always does). cpu_kernels: the engine's (ModelConfig.cpu_kernels; None: the
    environment's default); ggml_int8_activations: how the kernel multiplies GGML stacks."""
    allowed = cpu_kernels_default() if cpu_kernels is None else cpu_kernels
    fits = [
        cls for cls in MOE_KERNELS.values() if (allowed or not cls.uses_cpu_kernels) and cls.supports(platform, dtype)
    ]
    kernel = min(fits, key=lambda cls: cls.priority)()
    kernel.ggml_int8_activations = ggml_int8_activations
    return kernel


def use_moe_kernel(model: nn.Module, kernel: MoEKernel) -> None:
    """Every MoE layer runs `kernel`, except one whose experts it declines (supports_experts:
    gpt-oss's biases and clamped SwiGLU), which runs the torch reference."""
    for m in model.modules():
        if isinstance(m, FusedMoE):
            m.kernel = kernel if kernel.supports_experts(m.expert_weights()) else TorchMoEKernel()
