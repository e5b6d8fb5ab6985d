"""One engine of `tacit bench image`, built and measured inside its own process (ProcessPeer):
the same seeded random UNet and VAE, the same inputs, the same denoising loop; only the way the
UNet and VAE are run differs.

  diffusers  diffusers' best plain-PyTorch CPU configuration: bf16 weights (float32 where the CPU
             has no bf16 matmul), the SDPA attention
             processor (AttnProcessor2_0), channels_last, torch.inference_mode.
  openvino   the same modules through openvino.convert_model, static shapes, compiled with
             INFERENCE_PRECISION_HINT at the bench's dtype -- what optimum-intel does underneath (optimum-intel
             itself pulls torch 2.14 and torchvision, which break this environment).
  tacit      tacit.diffusion.optimize.apply_optimizations on the modules (tacit/bench/image_tacit.py).

Every engine gets the modules in the bench's dtype (ImageShape.dtype) and NCHW, as
load_components(dtype=...) gives them.

A step is one UNet call on the classifier-free-guidance batch, the guidance combine and an Euler
update (diffusers' EulerDiscreteScheduler with SDXL's schedule), so steps feed each other as in a
pipeline (step caching depends on that).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from tacit.bench.image_models import (
    ADDED_COND,
    ImageShape,
    MissingEngine,
    added_cond,
    build_unet_vae,
    model_configs,
    unet_inputs,
)

# SDXL base's scheduler_config.json: Euler over the scaled-linear betas, "leading" spacing.
EULER_CONFIG = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
                "timestep_spacing": "leading", "steps_offset": 1}  # fmt: skip

UnetFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (latent batch, timestep) -> noise prediction
DecodeFn = Callable[[torch.Tensor], torch.Tensor]  # latents -> image


def diffusers_modules(unet: torch.nn.Module, vae: torch.nn.Module) -> None:
    """diffusers' CPU recipe on the modules in place: SDPA processor, channels_last."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    unet.set_attn_processor(AttnProcessor2_0())
    vae.set_attn_processor(AttnProcessor2_0())
    unet.to(memory_format=torch.channels_last)
    vae.to(memory_format=torch.channels_last)


def torch_fns(unet: torch.nn.Module, vae: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[UnetFn, DecodeFn]:
    cond = added_cond(inputs)
    ehs = inputs["encoder_hidden_states"]

    def unet_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return unet(x, t, encoder_hidden_states=ehs, added_cond_kwargs=cond, return_dict=False)[0]

    def decode_fn(z: torch.Tensor) -> torch.Tensor:
        return vae.decode(z, return_dict=False)[0]

    return unet_fn, decode_fn


class _UnetGraph(torch.nn.Module):
    """The UNet with flat tensor inputs (OpenVINO converts positional tensors, not the nested
    added_cond_kwargs dict), fp32 in and out (numpy has no bf16), the bench's dtype inside."""

    def __init__(self, unet: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.unet, self.dtype = unet, dtype

    def forward(self, x, t, ehs, *added):  # noqa: ANN001, ANN201 (traced)
        d = self.dtype
        cond = {k: v.to(d) for k, v in zip(ADDED_COND, added)} or None
        out = self.unet(x.to(d), t, encoder_hidden_states=ehs.to(d), added_cond_kwargs=cond, return_dict=False)
        return out[0].float()


class _DecodeGraph(torch.nn.Module):
    def __init__(self, vae: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.vae, self.dtype = vae, dtype

    def forward(self, z):  # noqa: ANN001, ANN201 (traced)
        return self.vae.decode(z.to(self.dtype), return_dict=False)[0].float()


def openvino_fns(unet: torch.nn.Module, vae: torch.nn.Module, inputs: dict[str, torch.Tensor],
                 batch: int, dtype: torch.dtype) -> tuple[UnetFn, DecodeFn]:  # fmt: skip
    try:
        import openvino as ov
    except ImportError as e:
        raise MissingEngine("openvino is not installed (pip install openvino, or the bench extra)") from e

    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "bf16" if dtype == torch.bfloat16 else "f32", "PERFORMANCE_HINT": "LATENCY"}

    def compile_static(module: torch.nn.Module, example: tuple[torch.Tensor, ...]):
        import warnings

        with torch.no_grad(), warnings.catch_warnings():
            # diffusers' shape checks, constant for the static shapes compiled here
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            model = ov.convert_model(module, example_input=example)
        model.reshape({i: ov.PartialShape(list(x.shape)) for i, x in enumerate(example)})  # static shapes
        return core.compile_model(model, "CPU", config).create_infer_request()

    lat = inputs["latents"].float()
    flat = [inputs[k].float() for k in ("encoder_hidden_states", *ADDED_COND) if k in inputs]
    t0 = torch.tensor(999.0)
    unet_req = compile_static(_UnetGraph(unet, dtype), (torch.cat([lat] * batch), t0, *flat))
    vae_req = compile_static(_DecodeGraph(vae, dtype), (lat,))
    fixed = [x.numpy() for x in flat]

    def unet_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = unet_req.infer([x.float().numpy(), t.float().reshape(()).numpy(), *fixed])
        return torch.from_numpy(out[0].copy()).to(x.dtype)

    def decode_fn(z: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(vae_req.infer([z.float().numpy()])[0].copy())

    return unet_fn, decode_fn


class ImageEngineRunner:
    """Built in the engine's process: the weights, the engine's preparation, one warm-up step and
    decode. Then `run_round()` times `steps` steps from the same initial latents and one decode."""

    def __init__(self, engine: str, shape: ImageShape, seed: int = 0, variant: str = "",
                 tacit_options: dict[str, Any] | None = None) -> None:  # fmt: skip
        t0 = time.perf_counter()
        self.shape = shape
        unet_cfg, vae_cfg = model_configs(shape.model)
        unet, vae = build_unet_vae(shape.model, shape.torch_dtype, seed)
        self.inputs = unet_inputs(shape, unet_cfg, vae_cfg, shape.torch_dtype, seed + 2)
        self.scaling_factor = float(vae_cfg["scaling_factor"])
        self.init_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.note = ""
        self.reset: Callable[[], None] = lambda: None
        if engine == "diffusers":
            diffusers_modules(unet, vae)
            self.unet_fn, self.decode_fn = torch_fns(unet, vae, self.inputs)
        elif engine == "openvino":
            self.unet_fn, self.decode_fn = openvino_fns(unet, vae, self.inputs, shape.batch, shape.torch_dtype)
            self.note = (
                f"openvino.convert_model + {shape.dtype} hint, static shapes (optimum-intel's path, not optimum-intel)"
            )
            del unet, vae  # compiled: OpenVINO holds its own copy of the weights
        elif engine == "tacit":
            from tacit.bench.image_tacit import tacit_modules

            options = {"dtype": shape.torch_dtype, **(tacit_options or {})}
            unet, vae, self.note, self.reset = tacit_modules(unet, vae, variant, options)
            self.unet_fn, self.decode_fn = torch_fns(unet, vae, self.inputs)
        else:
            raise ValueError(f"engine {engine!r}: one of diffusers, openvino, tacit")
        self.prepare_s = time.perf_counter() - t0
        self.image: torch.Tensor | None = None
        self._denoise(1)  # warm-up: first touch of pages, kernel selection, OpenVINO's first infer
        self._decode()

    def _denoise(self, steps: int) -> tuple[torch.Tensor, list[float]]:
        from diffusers import EulerDiscreteScheduler

        self.reset()  # each round is a new request from the same latents
        sched = EulerDiscreteScheduler(**EULER_CONFIG)
        sched.set_timesteps(steps)
        latents = self.inputs["latents"] * sched.init_noise_sigma
        g, seconds = self.shape.guidance_scale, []
        with torch.inference_mode():
            for t in sched.timesteps:
                t0 = time.perf_counter()
                x = sched.scale_model_input(torch.cat([latents] * self.shape.batch), t)
                eps = self.unet_fn(x, t)
                if self.shape.batch == 2:
                    uncond, cond = eps.chunk(2)
                    eps = uncond + g * (cond - uncond)
                latents = sched.step(eps, t, latents, return_dict=False)[0]
                seconds.append(time.perf_counter() - t0)
        return latents, seconds

    def _decode(self, latents: torch.Tensor | None = None) -> float:
        z = (self.inputs["latents"] if latents is None else latents) / self.scaling_factor
        with torch.inference_mode():
            t0 = time.perf_counter()
            image = self.decode_fn(z)
            seconds = time.perf_counter() - t0
        self.image = image.float()
        return seconds

    def run_round(self) -> dict[str, Any]:
        latents, step_s = self._denoise(self.shape.steps)
        return {"unet_step_s": step_s, "vae_decode_s": self._decode(latents)}

    def info(self) -> dict[str, Any]:
        return {"init_s": self.init_s, "prepare_s": self.prepare_s, "note": self.note,
                "threads": torch.get_num_threads()}  # fmt: skip

    def output(self) -> torch.Tensor | None:
        """The last round's decoded image (fp32), for PSNR between engines."""
        return self.image
