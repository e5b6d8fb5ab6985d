"""Linear layers; how each stores and multiplies its weight is its LinearMethod's job.

MergedLinear stacks several projections that read the same input (q/k/v, gate/up) into one
weight: one GEMM launch instead of three, and a longer, more bandwidth-friendly row stream.
Checkpoint tensors keep their HF names and land in their slice through load_shard.

Layers are built with the reference method (the weights are created on the meta device before
the model runner knows the platform); the runner then picks the method once for the model
(select_linear_method) and hands it to every linear layer (use_linear_method).
"""

from __future__ import annotations

import torch
from torch import nn

import tacit.layers.cpu_linear_method  # noqa: F401  registers "cpu_bf16_gemv"
from tacit.distributed.communicator import Communicator, exposed
from tacit.distributed.parallel_state import SINGLE, TensorParallel
from tacit.kernels.cpu_kernels import cpu_kernels_default
from tacit.kernels.ggml_quant import GGML_TYPES, GGMLTensor
from tacit.layers.ggml_linear_method import GGMLLinearMethod, MixedGGMLLinearMethod
from tacit.layers.linear_method import LinearMethod, UnquantizedLinearMethod, registered_linear_methods


class LinearBase(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_sizes: list[int],
        bias: bool,
        linear_method: LinearMethod | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, sum(out_sizes)
        self._out_sizes, self._dtype = list(out_sizes), dtype or torch.get_default_dtype()
        self.linear_method = linear_method or UnquantizedLinearMethod()
        self.linear_method.create_weights(self, in_features, self._out_sizes, bias, self._dtype)

    def rebuild_weights(self, method: LinearMethod) -> None:
        """Re-create the (not yet loaded) parameters for `method`: a GGML layer's weight has another shape."""
        self.linear_method = method
        method.create_weights(self, self.in_features, self._out_sizes, self.bias is not None, self._dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(self, x, self.bias)


class Linear(LinearBase):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        linear_method: LinearMethod | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, [out_features], bias, linear_method, dtype)


class MergedLinear(LinearBase):
    def __init__(
        self,
        in_features: int,
        out_sizes: list[int],
        shard_names: list[str],
        bias: bool = False,
        linear_method: LinearMethod | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_sizes, bias, linear_method, dtype)
        self.out_sizes, self.shard_names = list(out_sizes), list(shard_names)
        self._offsets = dict(zip(shard_names, [sum(out_sizes[:i]) for i in range(len(out_sizes))]))
        self._sizes = dict(zip(shard_names, out_sizes))
        self._loaded: set[tuple[str, str]] = set()

    def load_shard(self, shard: str, kind: str, tensor: torch.Tensor | GGMLTensor) -> None:
        param = self.weight if kind == "weight" else self.bias
        if param is None:
            raise ValueError(f"checkpoint has a {shard}.bias but the config says this layer has no bias")
        tensor = weight_data(param, tensor, shard, self.linear_method, self.shard_names.index(shard))
        start, size = self._offsets[shard], self._sizes[shard]
        dest = self.linear_method.weight_rows(self, start, size) if kind == "weight" else param[start : start + size]
        if tensor.shape != dest.shape:
            raise ValueError(
                f"checkpoint tensor {shard}.{kind} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(dest.shape)}: config and weights disagree"
            )
        with torch.no_grad():
            dest.copy_(tensor)
        self._loaded.add((shard, kind))

    def check_fully_loaded(self, name: str) -> None:
        kinds = ["weight"] + (["bias"] if self.bias is not None else [])
        missing = [f"{s}.{k}" for s in self.shard_names for k in kinds if (s, k) not in self._loaded]
        if missing:
            raise ValueError(f"checkpoint is missing {', '.join(missing)} for {name}")


# A checkpoint tensor's slice one tensor-parallel rank holds: (dim, start, length), or None for
# a tensor it does not hold at all (loader/shards.py).
Shard = tuple[int, int, int] | None


class ColumnParallelLinear(Linear):
    """Output features split over the tensor-parallel ranks: rank r holds rows
    [r * out / N, (r + 1) * out / N) of the weight (and bias). gather_output concatenates the
    ranks' outputs (a vocab-parallel lm_head); otherwise each rank keeps its slice, which feeds a
    RowParallelLinear with no communication in between."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        tp: TensorParallel = SINGLE,
        gather_output: bool = False,
        what: str = "output features",
    ) -> None:
        self.tp, self.gather_output = tp, gather_output
        self.full_out_features = out_features
        super().__init__(in_features, tp.split(out_features, what), bias)
        self.comm: Communicator | None = None
        self.comm_seconds = 0.0

    def checkpoint_shards(self, name: str) -> dict[str, Shard]:
        start, n = self.tp.part(self.full_out_features, "output features")
        kinds = ["weight"] + (["bias"] if self.bias is not None else [])
        return {f"{name}.{k}": (0, start, n) for k in kinds}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.gather_output and self.tp.size > 1:
            out = exposed(self, lambda: self.comm.all_gather(out, dim=-1))
        return out


class RowParallelLinear(Linear):
    """Input features split over the ranks: rank r holds columns [r * in / N, (r + 1) * in / N)
    and multiplies its slice of the input; the partial outputs are summed by one all-reduce, and
    the bias (whole on every rank) added once after it."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, tp: TensorParallel = SINGLE, what: str = ""
    ) -> None:
        self.tp = tp
        self.full_in_features = in_features
        super().__init__(tp.split(in_features, what or "input features"), out_features, bias)
        self.comm: Communicator | None = None
        self.comm_seconds = 0.0

    def checkpoint_shards(self, name: str) -> dict[str, Shard]:
        start, n = self.tp.part(self.full_in_features, "input features")
        return {f"{name}.weight": (1, start, n)}

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """reduce=False: this rank's partial sum, for a caller that all-reduces it itself (two
        micro-batches overlapping, models/two_batch_overlap.py); rank 0's carries the bias, so
        the sum over ranks is the whole output."""
        if self.tp.size == 1:
            return super().forward(x)
        out = self.linear_method.apply(self, x, None)
        if not reduce:
            return out + self.bias if self.bias is not None and self.tp.rank == 0 else out
        exposed(self, lambda: self.comm.all_reduce(out))
        return out + self.bias if self.bias is not None else out


class MergedColumnParallelLinear(MergedLinear):
    """MergedLinear (q/k/v, gate/up) with each projection's outputs split over the ranks: rank r
    holds its slice of every shard, side by side (vLLM's MergedColumnParallelLinear and
    QKVParallelLinear)."""

    def __init__(
        self,
        in_features: int,
        out_sizes: list[int],
        shard_names: list[str],
        bias: bool = False,
        tp: TensorParallel = SINGLE,
        what: list[str] | None = None,
    ) -> None:
        self.tp = tp
        self.full_out_sizes = list(out_sizes)
        what = what or [f"{s} output features" for s in shard_names]
        local = [tp.split(n, w) for n, w in zip(out_sizes, what)]
        super().__init__(in_features, local, shard_names, bias)

    def checkpoint_shards(self, name: str) -> dict[str, Shard]:
        parent = name.rsplit(".", 1)[0]
        kinds = ["weight"] + (["bias"] if self.bias is not None else [])
        out = {}
        for shard, full in zip(self.shard_names, self.full_out_sizes):
            start, n = self.tp.part(full, shard)
            out.update({f"{parent}.{shard}.{k}": (0, start, n) for k in kinds})
        return out


def checkpoint_shards(model: nn.Module) -> dict[str, Shard]:
    """{HF tensor name: the slice this rank loads} over every tensor-parallel module of a model."""
    out: dict[str, Shard] = {}
    for name, module in model.named_modules():
        shards = getattr(module, "checkpoint_shards", None)
        if shards is not None and getattr(module, "tp", SINGLE).size > 1:
            out.update(shards(name))
    return out


def communication_seconds(model: nn.Module) -> dict[str, float]:
    """{module name: seconds its collectives blocked} over the model's tensor-parallel modules
    and the decoder layers whose two-micro-batch all-reduces blocked (the torch path; the fused
    decode step counts its own: ShardedDecoder)."""
    return {
        name: m.comm_seconds
        for name, m in model.named_modules()
        if hasattr(m, "comm_seconds") and (getattr(m, "tp", SINGLE).size > 1 or m.comm_seconds)
    }


def hidden_communication_seconds(model: nn.Module) -> dict[str, float]:
    """{decoder layer name: seconds its all-reduces travelled while the other micro-batch
    computed}: the communication two-micro-batch overlap hid (none without it)."""
    return {name: m.comm_hidden_seconds for name, m in model.named_modules() if getattr(m, "comm_hidden_seconds", 0)}


def use_communicator(model: nn.Module, comm: Communicator) -> None:
    """Hand the tensor-parallel group's communicator to every module that joins shards."""
    for module in model.modules():
        if hasattr(module, "comm") and getattr(module, "tp", SINGLE).size > 1:
            module.comm = comm


def select_linear_method(platform: str, dtype: torch.dtype, cpu_kernels: bool | None = None) -> LinearMethod:
    """The lowest-priority registered method that runs on `platform` in `dtype` (the reference
    always does). cpu_kernels: the engine's (ModelConfig.cpu_kernels; None: the environment's
    default); off, the methods built on tacit's CPU kernels are passed over."""
    allowed = cpu_kernels_default() if cpu_kernels is None else cpu_kernels
    for cls in sorted(registered_linear_methods().values(), key=lambda c: c.priority):
        if cls.uses_cpu_kernels and not allowed:
            continue
        method = cls.create(platform, dtype)
        if method is not None:
            return method
    raise ValueError(f"no linear method runs on platform={platform!r} with dtype={dtype}")


def use_linear_method(model: nn.Module, method: LinearMethod) -> None:
    """Hand `method` to every linear layer of a built, loaded model.

    Only a method that stores weights as the one that created them can take over (a subclass,
    such as the bf16 GEMV over the unquantized matrix); a quantized method has to be chosen
    when the layers are built."""
    for name, layer in model.named_modules():
        if not isinstance(layer, LinearBase) or layer.linear_method is method or layer.linear_method.per_layer:
            continue
        if not isinstance(method, type(layer.linear_method)):
            raise ValueError(f"{name}: {method.name} cannot take over weights created by {layer.linear_method.name}")
        method.process_weights_after_loading(layer)
        layer.linear_method = method


def weight_data(
    param: torch.Tensor,
    tensor: torch.Tensor | GGMLTensor,
    name: str,
    method: LinearMethod | None = None,
    shard_index: int = 0,
) -> torch.Tensor:
    """What to copy into `param` from a checkpoint tensor: a GGML tensor's blocks as they are
    for a GGML layer (shard) of its type, dequantized for any other parameter."""
    if not isinstance(tensor, GGMLTensor):
        return tensor
    if param.dtype != torch.uint8:
        return tensor.dequantize(param.dtype)
    if isinstance(method, GGMLLinearMethod) and method.type_of_shard(shard_index) != tensor.ggml_type:
        raise ValueError(f"checkpoint tensor {name} is {tensor.type_name}; the layer was built for {method.type_name}")
    return tensor.data


def checkpoint_weight_names(name: str, layer: LinearBase) -> list[str]:
    """The HF names of the checkpoint tensors a linear layer's weight is loaded from: its own,
    or one per shard of a merged layer (q/k/v_proj beside qkv_proj)."""
    if isinstance(layer, MergedLinear):
        parent = name.rsplit(".", 1)[0]
        return [f"{parent}.{s}.weight" for s in layer.shard_names]
    return [f"{name}.weight"]


def ggml_linear_method(
    name: str,
    layer: LinearBase,
    types: dict[str, int],
    platform: str,
    dtype: torch.dtype,
    cpu_kernels: bool | None = None,
    int8_activations: bool = True,
) -> GGMLLinearMethod | None:
    """The GGML method of a linear layer whose checkpoint weights are all GGML blocks, or None
    (it stays float). `types`: {HF weight name: GGML type id}. A merged layer whose shards differ
    in type keeps each shard in its own (MixedGGMLLinearMethod). cpu_kernels, int8_activations:
    the engine's (GGMLLinearMethod.for_type)."""
    shard_types = [types.get(n) for n in checkpoint_weight_names(name, layer)]
    if None in shard_types:
        return None
    if any(layer.in_features % GGML_TYPES[t].block_values for t in shard_types):
        # A row-parallel rank's columns cut through blocks: its slice arrives dequantized
        # (loader/shards.narrow_tensor), so the layer stays float.
        return None
    if len(set(shard_types)) > 1:
        return MixedGGMLLinearMethod.for_types(shard_types, platform, dtype, cpu_kernels, int8_activations)
    return GGMLLinearMethod.for_type(shard_types[0], platform, dtype, cpu_kernels, int8_activations)
