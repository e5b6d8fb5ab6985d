"""tacit's text-to-image pipeline over diffusers' UNet/VAE and transformers' CLIP text encoders.

One generate() call denoises a batch of compatible requests (equal batch_key) together:
  text encoding   per request (prompt and negative prompt, batch 1 each, as diffusers does, so a
                  request's conditioning never depends on its batch-mates); SDXL concatenates both
                  encoders' penultimate hidden states and conditions on the second's pooled
                  projection plus add_time_ids (original size, crop, target size);
  latents         one CPU torch.Generator per image, seeded seed + i, so image i of a request is
                  the same alone or batched (and the same on any device);
  denoise loop    classifier-free guidance batched: [all negatives; all prompts] in one UNet call
                  per step, guidance applied per row (batch-mates may use different scales);
  VAE decode      per image (peak activation memory of one 1024x1024 decode, not B of them),
                  latents divided by the VAE's scaling factor, then to PIL.
The arithmetic matches diffusers' StableDiffusion(XL)Pipeline step for step (tests compare them).
"""

from __future__ import annotations

import inspect
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tacit.diffusion.loader import DiffusionComponents, load_components
from tacit.diffusion.request import MAX_SEED, ImageLimits, ImageRequest, ImageResult
from tacit.diffusion.schedulers import make_scheduler, max_train_timesteps
from tacit.diffusion.singlefile import vae_dtype

if TYPE_CHECKING:
    from tacit.diffusion.optimize import OptimizeOptions, OptimizeState

# A request's images are denoised together, so n sets its UNet batch (2n rows with CFG) and its
# activation memory; 8 bounds one request to 16 rows and to 8x a single image's time in the worker,
# after which more images are better sent as further requests that the engine queues and batches.
MAX_IMAGES_PER_REQUEST = 8


class ImagePipeline:
    def __init__(self, components: DiffusionComponents) -> None:
        self.components = components
        self.model_name = components.name
        self.optimization: OptimizeState | None = None  # set by from_pretrained(options=...)
        vae, unet = components.vae, components.unet
        # Each VAE level after the first halves the resolution: 8 for SD/SDXL's 4 levels.
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
        if vae_dtype(vae.dtype, dict(vae.config)) != vae.dtype:  # components not built by our loader
            vae.to(vae_dtype(vae.dtype, dict(vae.config)))
        # Sizes: a multiple of the VAE factor times the UNet's downsampling (2 per down block but the
        # last: SDXL 8 x 4 = 32, SD 1.5 8 x 8 = 64), so every UNet level has a whole latent size and
        # the up path never pads; up to twice the training resolution (SDXL 2048, SD 1.5 1024).
        multiple = self.vae_scale_factor * 2 ** (len(unet.config.down_block_types) - 1)
        self.limits = ImageLimits(
            min_size=multiple,
            max_size=2 * int(vae.config.sample_size),
            size_multiple=multiple,
            max_steps=max_train_timesteps(components.scheduler_config),
            max_n=MAX_IMAGES_PER_REQUEST,
        )
        # Guidance-distilled UNets (LCM) take the scale as an embedding, never a second pass.
        self._guidance_embedding_dim = unet.config.time_cond_proj_dim

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.float32,
        options: OptimizeOptions | None = None,
        tokenizer_dir: str | Path | None = None,
    ) -> ImagePipeline:
        """Load a diffusers directory or a single-file .safetensors (then tokenizer_dir is needed)."""
        pipe = cls(load_components(path, dtype=dtype, tokenizer_dir=tokenizer_dir))
        if options is not None:
            from tacit.diffusion.optimize import apply_optimizations

            pipe.optimization = apply_optimizations(pipe.components, options)
        return pipe

    def uses_cfg(self, req: ImageRequest) -> bool:
        return req.guidance_scale > 1.0 and self._guidance_embedding_dim is None

    def batch_key(self, req: ImageRequest) -> tuple:
        """Requests with equal keys share one UNet batch: same latent shape, same timesteps, and the
        same number of UNet rows per image (CFG on or off). Prompts, seeds and scales may differ."""
        return (req.width, req.height, req.steps, req.scheduler, self.uses_cfg(req))

    def generate(
        self, requests: list[ImageRequest], on_step: Callable[[int, int], None] | None = None
    ) -> list[ImageResult]:
        """Run the requests as one batch; on_step(done, total) after each denoising step."""
        from diffusers.utils import numpy_to_pil

        images, seeds, timings = self.generate_tensors(requests, on_step)
        return [
            ImageResult(req.request_id, numpy_to_pil(img.permute(0, 2, 3, 1).float().numpy()), seed, dict(timings))
            for req, img, seed in zip(requests, images, seeds)
        ]

    @torch.inference_mode()
    def generate_tensors(
        self, requests: list[ImageRequest], on_step: Callable[[int, int], None] | None = None
    ) -> tuple[list[torch.Tensor], list[int], dict[str, float]]:
        """As generate(), but each request's images as one float (n, 3, H, W) tensor in [0, 1]."""
        if not requests:
            raise ValueError("requests: at least one request is needed")
        for req in requests:
            self.limits.validate(req)
        keys = {self.batch_key(req) for req in requests}
        if len(keys) > 1:
            raise ValueError(
                f"requests: a batch must share one batch_key (width, height, steps, scheduler, cfg); got {keys}"
            )
        seeds = [
            req.seed if req.seed is not None else secrets.randbelow(MAX_SEED - self.limits.max_n) for req in requests
        ]
        unet = self.components.unet
        dtype, device = unet.dtype, unet.device
        try:
            return self._denoise_and_decode(requests, seeds, on_step, unet, dtype, device)
        finally:
            if self.optimization is not None:  # the prompt K/V and cached deep features are this batch's
                self.optimization.end_request()

    def _denoise_and_decode(
        self,
        requests: list[ImageRequest],
        seeds: list[int],
        on_step: Callable[[int, int], None] | None,
        unet: Any,
        dtype: torch.dtype,
        device: torch.device,
    ) -> tuple[list[torch.Tensor], list[int], dict[str, float]]:
        first = requests[0]
        cfg = self.uses_cfg(first)
        # The compiled module when OptimizeOptions.compile is on; the UNet's dtype and device stay the module's.
        unet_call = self.optimization.unet_call if self.optimization is not None else unet

        t0 = _now(device)
        prompt_embeds, added_cond, scales = self._condition(requests, cfg, dtype, device)
        batch = len(scales)
        t1 = _now(device)

        latents, generators = self._initial_latents(requests, seeds, first, dtype)
        latents = latents.to(device)
        scheduler = make_scheduler(first.scheduler, self.components.scheduler_config)
        scheduler.set_timesteps(first.steps, device=device)
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
        latents = latents * scheduler.init_noise_sigma
        step_kwargs = {"generator": generators} if "generator" in inspect.signature(scheduler.step).parameters else {}
        guidance = torch.tensor(scales, dtype=dtype, device=device).view(batch, 1, 1, 1)
        timestep_cond = None
        if self._guidance_embedding_dim is not None:
            embedding = _guidance_embedding(torch.tensor(scales) - 1, self._guidance_embedding_dim)
            timestep_cond = embedding.to(device=device, dtype=dtype)
        timesteps = scheduler.timesteps
        for i, t in enumerate(timesteps):
            model_in = torch.cat([latents, latents]) if cfg else latents
            model_in = scheduler.scale_model_input(model_in, t)
            noise = unet_call(
                model_in,
                t,
                encoder_hidden_states=prompt_embeds,
                timestep_cond=timestep_cond,
                added_cond_kwargs=added_cond,
                return_dict=False,
            )[0]
            if cfg:
                noise_uncond, noise_text = noise.chunk(2)
                noise = noise_uncond + guidance * (noise_text - noise_uncond)
            latents = scheduler.step(noise, t, latents, **step_kwargs, return_dict=False)[0]
            if on_step is not None:
                on_step(i + 1, len(timesteps))
        t2 = _now(device)

        decoded = torch.cat([self.decode_latents(latents[j : j + 1]).cpu() for j in range(batch)])
        t3 = _now(device)
        timings = {"text_encode_s": t1 - t0, "denoise_s": t2 - t1, "vae_decode_s": t3 - t2}
        images, start = [], 0
        for req in requests:
            images.append(decoded[start : start + req.n])
            start += req.n
        return images, seeds, timings

    def _condition(
        self, requests: list[ImageRequest], cfg: bool, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None, list[float]]:
        """The UNet's text conditioning for the batch, rows [negatives; prompts] under CFG, one per image;
        and each image's guidance scale."""
        cond, uncond, pooled, pooled_uncond, scales = [], [], [], [], []
        for req in requests:
            embeds, pool, neg_embeds, neg_pool = self._encode(req, cfg)
            cond.append(embeds.expand(req.n, -1, -1))
            uncond.append(neg_embeds.expand(req.n, -1, -1) if cfg else None)
            if pool is not None:
                pooled.append(pool.expand(req.n, -1))
                pooled_uncond.append(neg_pool.expand(req.n, -1) if cfg else None)
            scales += [float(req.guidance_scale)] * req.n
        prompt_embeds = torch.cat((uncond if cfg else []) + cond).to(device=device, dtype=dtype)
        if self.components.family != "sdxl":
            return prompt_embeds, None, scales
        text_embeds = torch.cat((pooled_uncond if cfg else []) + pooled).to(device=device, dtype=dtype)
        # add_time_ids: original (h, w), crop top-left (0, 0), target (h, w), as diffusers' defaults.
        h, w = requests[0].height, requests[0].width
        time_ids = torch.tensor([[h, w, 0, 0, h, w]], dtype=dtype, device=device).repeat(prompt_embeds.shape[0], 1)
        return prompt_embeds, {"text_embeds": text_embeds, "time_ids": time_ids}, scales

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, 4, h, w) -> images (B, 3, H, W) in [0, 1], float32."""
        vae = self.components.vae
        cfg = vae.config
        latents = latents.to(device=vae.device, dtype=vae.dtype)
        mean, std = getattr(cfg, "latents_mean", None), getattr(cfg, "latents_std", None)
        if mean is not None and std is not None:  # VAEs with per-channel statistics (Playground-style)
            shape = (1, latents.shape[1], 1, 1)
            mean_t = torch.tensor(mean, dtype=latents.dtype, device=latents.device).view(shape)
            std_t = torch.tensor(std, dtype=latents.dtype, device=latents.device).view(shape)
            latents = latents * std_t / cfg.scaling_factor + mean_t
        else:
            latents = latents / cfg.scaling_factor
        image = vae.decode(latents, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def _encode(self, req: ImageRequest, cfg: bool) -> tuple[torch.Tensor, Any, Any, Any]:
        """(prompt embeds, pooled, negative embeds, negative pooled); the negatives None without CFG."""
        embeds, pooled = self._encode_text(req.prompt)
        if not cfg:
            return embeds, pooled, None, None
        if req.negative_prompt == "" and self.components.force_zeros_for_empty_prompt:
            # SDXL was trained with zeroed conditioning for the unconditional branch (model_index.json's
            # force_zeros_for_empty_prompt): "no negative prompt" is zeros, not the embedding of "".
            return embeds, pooled, torch.zeros_like(embeds), torch.zeros_like(pooled)
        neg, neg_pooled = self._encode_text(req.negative_prompt)
        return embeds, pooled, neg, neg_pooled

    def _encode_text(self, text: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        c = self.components
        if c.family == "sd15":
            # SD 1.5 conditions on the last hidden state (after CLIP's final layer norm).
            return c.text_encoder(_tokens(c.tokenizer, text, c.text_encoder.device))[0], None
        hidden, pooled = [], None
        for tok, enc in ((c.tokenizer, c.text_encoder), (c.tokenizer_2, c.text_encoder_2)):
            out = enc(_tokens(tok, text, enc.device), output_hidden_states=True)
            if out[0].ndim == 2:  # CLIPTextModelWithProjection's text_embeds: the pooled projection
                pooled = out[0]
            hidden.append(out.hidden_states[-2])  # SDXL takes the penultimate layer of both encoders
        return torch.cat(hidden, dim=-1), pooled

    def _initial_latents(
        self, requests: list[ImageRequest], seeds: list[int], first: ImageRequest, dtype: torch.dtype
    ) -> tuple[torch.Tensor, list[torch.Generator]]:
        from diffusers.utils.torch_utils import randn_tensor

        generators = [
            torch.Generator("cpu").manual_seed(seed + i) for req, seed in zip(requests, seeds) for i in range(req.n)
        ]
        shape = (
            len(generators),
            self.components.unet.config.in_channels,
            first.height // self.vae_scale_factor,
            first.width // self.vae_scale_factor,
        )
        # randn_tensor with a list draws each row from its own generator, the way diffusers does, so
        # ancestral samplers (euler_a, lcm, tcd) also take each image's step noise from its own stream.
        # Drawn on the CPU (then moved): the same seed gives the same image on any device.
        return randn_tensor(shape, generator=generators, device=torch.device("cpu"), dtype=dtype), generators


def _tokens(tokenizer: Any, text: str, device: torch.device) -> torch.Tensor:
    # Padded to the encoder's context (77), longer prompts truncated, as diffusers does.
    return tokenizer(
        text, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    ).input_ids.to(device)


def _now(device: torch.device) -> float:
    """A timestamp after the device's queued work: CUDA runs asynchronously, so the phases' timings
    would otherwise all land on the final copy to the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _guidance_embedding(w: torch.Tensor, dim: int) -> torch.Tensor:
    """The sinusoidal embedding of (guidance - 1) that LCM-distilled UNets take (diffusers' formula)."""
    w = w.float() * 1000.0
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(torch.log(torch.tensor(10000.0)) / (half - 1)))
    emb = w[:, None] * freq[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
    return torch.nn.functional.pad(emb, (0, 1)) if dim % 2 else emb
