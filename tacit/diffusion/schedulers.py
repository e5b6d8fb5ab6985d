"""Scheduler (sampler) selection: a user-facing name -> a diffusers scheduler built from the checkpoint's config.

The checkpoint's scheduler/scheduler_config.json carries the noise schedule the model was trained
with (betas, prediction_type, timestep_spacing: SDXL-Lightning ships "trailing"); a name here only
picks the sampling algorithm, so every scheduler starts from that config and overrides the few
keys its algorithm needs. A fresh scheduler is built per generate() call because diffusers
schedulers keep per-run state (step index, DPM++'s previous model outputs).
"""

from __future__ import annotations

import inspect
from typing import Any

# name -> (diffusers class name, config overrides). Names follow the A1111/ComfyUI habit users know.
SCHEDULERS: dict[str, tuple[str, dict[str, Any]]] = {
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "ddim": ("DDIMScheduler", {}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "dpmpp_2m_karras": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True},
    ),
    # Few-step distilled models: LCM (LCM-LoRA / lcm-sdxl) and TCD (Hyper-SD style) samplers.
    "lcm": ("LCMScheduler", {}),
    "tcd": ("TCDScheduler", {}),
}

SCHEDULER_NAMES: tuple[str, ...] = tuple(SCHEDULERS)


def check_scheduler_name(name: str) -> None:
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r}: must be one of {', '.join(SCHEDULER_NAMES)}")


def make_scheduler(name: str, base_config: dict[str, Any]) -> Any:
    """A new diffusers scheduler `name` over the checkpoint's schedule `base_config`."""
    import diffusers  # deferred: importing diffusers costs ~1 s and request validation must not pay it

    check_scheduler_name(name)
    class_name, overrides = SCHEDULERS[name]
    cls = getattr(diffusers, class_name)
    # Keep only the keys this class takes: a checkpoint's config names its own class's options
    # (PNDM's skip_prk_steps), which from_config would ignore anyway, with a warning per call.
    accepted = inspect.signature(cls.__init__).parameters
    config = {k: v for k, v in base_config.items() if k in accepted}
    config.update(overrides)
    return cls.from_config(config)


def max_train_timesteps(base_config: dict[str, Any]) -> int:
    """The schedule's length: no sampler can take more inference steps than training timesteps."""
    return int(base_config.get("num_train_timesteps", 1000))
