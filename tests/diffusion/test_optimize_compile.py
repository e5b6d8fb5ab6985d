"""torch.compile (inductor CPU, freezing) of the optimized tiny UNet equals eager."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from optimize_tiny import components, tiny_unet, unet_inputs

from tacit.diffusion.optimize import OptimizeOptions, apply_optimizations


# Out of the default run: compiling even this tiny UNet took 160 s cold on this shared 2-vCPU VM
# (61 s with inductor's on-disk cache warm) -- over the 60 s a default test may take. Run it with
# TACIT_TEST_COMPILE=1 after touching attention.py or optimize.py's compile path.
@pytest.mark.skipif(os.environ.get("TACIT_TEST_COMPILE") != "1", reason="slow (>60 s cold): set TACIT_TEST_COMPILE=1")
def test_compiled_unet_with_freezing_equals_eager_float32():
    eager = tiny_unet()
    comps = components(unet=copy.deepcopy(eager))
    state = apply_optimizations(comps, OptimizeOptions(dtype=torch.float32, compile=True))
    inputs = unet_inputs()
    with torch.inference_mode():  # freezing folds weights only under inference/no_grad
        got = state.unet_call(**inputs).sample
        again = state.unet_call(**{**inputs, "sample": inputs["sample"] * 0.5}).sample
        want = eager(**inputs).sample
        want_again = eager(**{**inputs, "sample": inputs["sample"] * 0.5}).sample
    # inductor fuses and reorders float32 reductions (GroupNorm, LayerNorm, softmax): measured max
    # difference 1.1e-6 of the output's scale; bound 1e-4 of it, far below any real defect.
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-4 * scale
    assert (again - want_again).abs().max().item() <= 1e-4 * scale  # same shape, new data: weights not stale
