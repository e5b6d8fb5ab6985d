"""Copy named checkpoint tensors into a model's parameters, and say exactly what is missing."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from tacit.kernels.ggml_quant import GGMLTensor
from tacit.layers.linear import weight_data

# A hook gets (name, tensor) and, when it consumed the tensor itself, returns the name of the
# parameter it filled (checkpoints split some parameters, e.g. one tensor per expert).
WeightHook = Callable[[str, torch.Tensor], "str | None"]


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor | GGMLTensor]],
    hook: WeightHook | None = None,
    ignore: Callable[[str], bool] | None = None,
    derived: Iterable[str] = (),
) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for name, tensor in weights:
        if ignore is not None and ignore(name):
            continue
        filled = hook(name, tensor) if hook is not None else None
        if filled is not None:
            loaded.add(filled)
            continue
        param = params.get(name)
        if param is None:
            continue  # extra tensors (rotary caches, MTP heads, ...) are not ours to use
        data = weight_data(param, tensor, name)
        if tuple(param.shape) != tuple(data.shape):
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(param.shape)}: config and weights disagree"
            )
        with torch.no_grad():
            param.copy_(data)
        loaded.add(name)
    missing = [n for n in params if n not in loaded and n not in set(derived)]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} weight(s) the model needs: {shown}")
