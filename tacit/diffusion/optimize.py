"""OptimizeOptions and apply_optimizations: the UNet/VAE recipes, each an option with its reason.

The numbers quoted are micro-timings on this 2-vCPU Sapphire Rapids VM (AMX-BF16, AVX512-BF16),
disturbed by other tenants; docs/recipes-image-notes.md has the table and how each was taken.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tacit.diffusion.attention import PromptKVCache, install_attention
from tacit.diffusion.deepcache import DeepCache
from tacit.diffusion.fused_resnet import install_fused_resnets
from tacit.diffusion.vae_tiling import enable_cache_tiling

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class OptimizeOptions:
    # bf16 weights and activations: oneDNN runs bf16 convs/GEMMs on AMX tiles. Measured: a 1280x5120
    # GEMM over 8192 rows at 0.73 TFLOP/s bf16 vs 0.10 float32 (7x); the UNet as a whole gains less
    # because ~35% of its eager time is elementwise (add, copy, GroupNorm, SiLU, GELU) that only halves.
    dtype: torch.dtype = torch.bfloat16
    # NHWC weights and activations: oneDNN's convs are NHWC-native; in NCHW each conv reorders its
    # input and output (aten::copy_ was 7% of a bf16 step before).
    channels_last: bool = True
    # TacitAttnProcessor: SDPA with fused QKV for self-attention (one [3C, C] GEMM, input read once).
    fused_attention: bool = True
    fuse_qkv: bool = True
    # The prompt's cross-attention K/V computed once per request and reused by every step: per
    # cross-attention layer 2*77*2048*C MACs a step saved (6-12% of that layer's Q projection).
    cache_prompt_kv: bool = True
    # diffusers' ResnetBlock2D with the residual add fused into conv2 (oneDNN post-op) and the
    # divide by output_scale_factor 1.0 dropped (fused_resnet.py): on the VAE, and on the UNet
    # when not compiled (inductor fuses these itself).
    fused_resnet: bool = True
    # torch.compile (inductor, CPU C++/OpenMP codegen). With freezing: weights become constants,
    # oneDNN convs/linears are prepacked once and GroupNorm/SiLU/bias/residual adds are fused into
    # generated loops -- the eager step's elementwise third. Cost: compile time on the first call of
    # each new shape (measured in the notes; minutes for SDXL on 2 cores), hence off by default.
    compile: bool = False
    freezing: bool = True
    # VAE decode in overlapping tiles sized from the caches (vae_tiling.py explains the locality
    # problem). None: no tiling; 0: tile side from /sys cache sizes; > 0: that tile side in latents.
    vae_tile_latent: int | None = None
    # int8 weights for the UNet's nn.Linear (torch.ao dynamic quantization, oneDNN backend: weights
    # int8 per channel, activations quantized per call). Measured no faster than bf16 AMX here
    # (0.64 vs 0.73 TFLOP/s on the GEMM above) because activations stay float32 around it; it
    # halves the linears' weight bytes. Opt-in, reported on its own (it changes the output).
    int8_linears: bool = False
    # DeepCache: a full UNet call every `deepcache_interval` calls, the others reuse the deep
    # features. 0 = off. Changes the image; its PSNR is measured; opt-in, reported on its own.
    deepcache_interval: int = 0
    # Threads for intra-op work; None leaves torch's choice (all visible cores).
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES.values():
            raise ValueError(f"OptimizeOptions.dtype={self.dtype}: must be one of {list(DTYPES.values())}")
        if self.fuse_qkv and not self.fused_attention:
            raise ValueError("OptimizeOptions.fuse_qkv=True needs fused_attention=True (the processor uses to_qkv)")
        if self.cache_prompt_kv and not self.fused_attention:
            raise ValueError("OptimizeOptions.cache_prompt_kv=True needs fused_attention=True")
        if self.vae_tile_latent is not None and self.vae_tile_latent < 0:
            raise ValueError(f"OptimizeOptions.vae_tile_latent={self.vae_tile_latent}: None, 0 (auto) or > 0")
        if self.deepcache_interval < 0 or self.deepcache_interval == 1:
            raise ValueError(f"OptimizeOptions.deepcache_interval={self.deepcache_interval}: 0 (off) or >= 2")
        if self.deepcache_interval and self.compile:
            # DeepCache swaps block forwards per call; dynamo would guard on them and recompile at
            # each switch between full and cached calls -- untested, so refused rather than slow.
            raise ValueError("OptimizeOptions: deepcache_interval with compile is not supported; pick one")
        if self.int8_linears and self.compile:
            raise ValueError(
                "OptimizeOptions: int8_linears with compile is not supported "
                "(dynamic-quantized linears do not freeze); pick one"
            )

    @classmethod
    def plain(cls) -> OptimizeOptions:
        """float32, NCHW, diffusers' own attention and resnet forward: the unoptimised reference."""
        return cls(
            dtype=torch.float32,
            channels_last=False,
            fused_attention=False,
            fuse_qkv=False,
            cache_prompt_kv=False,
            fused_resnet=False,
        )


def serving_options(dtype: str, compile: bool = False) -> OptimizeOptions:
    """What `tacit image` and `tacit serve` run: every option that keeps the output (in float32 the
    fused paths move pixels by ~1e-6, tests/diffusion/test_diffusion_pipeline_optimized.py), in the
    dtype asked for; compile only when asked (minutes of compiling on the first image of a size)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: one of {', '.join(DTYPES)}")
    return OptimizeOptions(dtype=DTYPES[dtype], compile=compile)


@dataclass
class OptimizeState:
    """What apply_optimizations installed and the pipeline may need to see or reset."""

    options: OptimizeOptions
    prompt_kv: PromptKVCache | None = None
    deepcache: DeepCache | None = None
    vae_tile_latent: int | None = None
    unet_call: Any = None  # the callable to run the UNet with (the compiled module when compile=True)

    def end_request(self) -> None:
        """Drop per-request state (the prompt K/V and deep features) when a request finishes."""
        if self.prompt_kv is not None:
            self.prompt_kv.clear()
        if self.deepcache is not None:
            self.deepcache.reset()


class Int8Linear(nn.Module):
    """A dynamic-int8 nn.Linear inside a bf16 model: oneDNN's qlinear_dynamic takes only float32
    input, so the activation is cast up on the way in and back to the model's dtype on the way out."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.out_dtype = linear.weight.dtype
        fp32 = nn.Sequential(nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None))
        fp32[0].load_state_dict({k: v.float() for k, v in linear.state_dict().items()})
        with warnings.catch_warnings():
            # torch.ao.quantization is marked deprecated in favour of torchao (not installed here); it
            # is still the one int8 GEMM with oneDNN/AMX in this torch (2.13).
            warnings.simplefilter("ignore")
            qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
            self.qlinear = torch.ao.quantization.quantize_dynamic(fp32, {nn.Linear: qconfig}, dtype=torch.qint8)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qlinear(x.float()).to(self.out_dtype)


def quantize_linears_int8(module: nn.Module) -> int:
    """Replace every nn.Linear in `module` by an Int8Linear (weights int8 per channel, oneDNN); returns the count."""
    if "onednn" not in torch.backends.quantized.supported_engines:
        raise ValueError(
            f"int8_linears needs torch's onednn quantized engine; this torch has "
            f"{torch.backends.quantized.supported_engines}"
        )
    # onednn (AMX/VNNI) measured 0.64 TFLOP/s vs 0.36 for the default x86/fbgemm engine on the GEMM above.
    torch.backends.quantized.engine = "onednn"
    targets = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)


def _optimize_module(module: nn.Module, options: OptimizeOptions) -> None:
    module.eval().requires_grad_(False)
    module.to(options.dtype)
    if options.channels_last:
        module.to(memory_format=torch.channels_last)


def apply_optimizations(components: Any, options: OptimizeOptions) -> OptimizeState:
    """Apply `options` in place to `components.unet` and `components.vae` (diffusers modules).

    Order matters: dtype and layout first (fuse_projections copies weights in the module's dtype),
    then the attention processor, then int8 (it replaces the fused linears too), DeepCache hooks,
    and torch.compile last so it traces the final modules.
    """
    for name in ("unet", "vae"):
        if not hasattr(components, name):
            raise ValueError(f"apply_optimizations: components has no '{name}' (got {type(components).__name__})")
    if options.num_threads is not None:
        torch.set_num_threads(options.num_threads)
    unet, vae = components.unet, components.vae
    state = OptimizeState(options=options)
    _optimize_module(unet, options)
    _optimize_module(vae, options)
    if options.fused_attention:
        state.prompt_kv = install_attention(unet, options.fuse_qkv, options.cache_prompt_kv)
    if options.int8_linears:
        quantize_linears_int8(unet)
    if options.fused_resnet:
        install_fused_resnets(vae)
        if not options.compile:
            install_fused_resnets(unet)
    if options.vae_tile_latent is not None:
        state.vae_tile_latent = enable_cache_tiling(vae, options.vae_tile_latent or None)
    if options.deepcache_interval:
        state.deepcache = DeepCache.attach(unet, options.deepcache_interval)
    state.unet_call = unet
    if options.compile:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = options.freezing
        state.unet_call = torch.compile(unet, dynamic=False)
    return state
