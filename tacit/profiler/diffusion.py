"""`tacit profile --model DIFFUSERS_DIR`: a text-to-image model's UNet steps and VAE decode timed
per block on this machine, beside the blocks' counted FLOPs and bytes (the same rows `tacit
predict` prices: tacit.perf_model.diffusion_count), with each block's activation working set
set against this CPU's caches.

The question it answers (issue 39's seed): why the VAE decode loses cache locality. Its up
blocks run at the full image resolution with 128-512 channels, so one GroupNorm's input and
output at 1024x1024 x 256 channels in bf16 sweep 1 GB, far past any L2 (2 MB here) or L3: each
op of the block streams its tensors from DRAM and back, and the decode's achieved bandwidth,
not its FLOPs, sets its time. The per-block table shows where the working set leaves the
caches (tiling the decode to a cache-sized tile is what brings it back).

Forward hooks with perf_counter (profiler/timer.py's SpanTimer: exclusive time, a container's
own ops its own row), at a small size by default: the rows are the same at any size.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tacit.perf_model.diffusion_count import BlockCount, count_blocks, is_row_block
from tacit.perf_model.diffusion_models import LATENT_FACTOR, check_size, unet_inputs
from tacit.profiler.cpu_caches import cpu_caches, level_holding
from tacit.profiler.timer import SpanTimer


def _hook(module: torch.nn.Module, component: str, timer: SpanTimer) -> list[Any]:
    handles = []
    for name, mod in module.named_modules():
        if name and is_row_block(name):
            handles.append(mod.register_forward_pre_hook(lambda m, a, n=name: timer.push(n, component)))
            handles.append(mod.register_forward_hook(lambda m, a, o: timer.pop()))
    return handles


def _cast(tree: Any, dtype: torch.dtype) -> Any:
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, torch.Tensor) and tree.is_floating_point():
        return tree.to(dtype)
    return tree


def profile_diffusion(
    model_dir: str | Path,
    width: int = 256,
    height: int = 256,
    steps: int = 2,
    repeats: int = 2,
    guided: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    caches: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Time `repeats` passes of `steps` UNet calls and one VAE decode (after one warm-up call of
    each); the profile's JSON: per-block rows, the UNet step, the VAE decode and its share."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    check_size(width, height)
    for name, v in (("steps", steps), ("repeats", repeats)):
        if v < 1:
            raise ValueError(f"{name}={v}: must be >= 1")
    root = Path(model_dir)
    unet = UNet2DConditionModel.from_pretrained(root, subfolder="unet", torch_dtype=dtype).eval()
    vae = AutoencoderKL.from_pretrained(root, subfolder="vae", torch_dtype=dtype).eval()
    gen = torch.manual_seed(0)
    kwargs = _cast(unet_inputs(dict(unet.config), 2 if guided else 1, width, height), dtype)
    z = torch.randn(1, vae.config.latent_channels, height // LATENT_FACTOR, width // LATENT_FACTOR, generator=gen)
    z = z.to(dtype)
    eb = float(torch.finfo(dtype).bits // 8)
    counts = {
        "unet": count_blocks(unet, lambda: unet(**kwargs), "unet", eb, eb),
        "vae": count_blocks(vae, lambda: vae.decode(z), "vae", eb, eb),
    }
    timer, wall = SpanTimer(), {"unet": 0.0, "vae": 0.0}
    with torch.no_grad():
        unet(**kwargs), vae.decode(z)  # warm-up: oneDNN primitive creation, first-touch pages
        handles = _hook(unet, "unet", timer) + _hook(vae, "vae", timer)
        try:
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(steps):
                    unet(**kwargs)
                t1 = time.perf_counter()
                vae.decode(z)
                wall["unet"] += t1 - t0
                wall["vae"] += time.perf_counter() - t1
        finally:
            for h in handles:
                h.remove()
    times = timer.take()
    caches = cpu_caches() if caches is None else caches
    calls = {"unet": repeats * steps, "vae": repeats}
    blocks = [
        _row(b, times.get((comp, b.name), 0.0) / calls[comp], caches) for comp, rows in counts.items() for b in rows
    ]
    step_s, vae_s = wall["unet"] / calls["unet"], wall["vae"] / calls["vae"]
    vae_rows = counts["vae"]
    return {
        "kind": "diffusion",
        "model": root.name,
        "width": width,
        "height": height,
        "steps": steps,
        "repeats": repeats,
        "guided": guided,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "caches": caches,
        "blocks": blocks,
        "unet_step_s": step_s,
        "vae_decode_s": vae_s,
        # of an image of `steps` steps at this size (text encoding left out: it is not profiled)
        "vae_share": vae_s / (steps * step_s + vae_s),
        "vae_bytes": sum(b.bytes for b in vae_rows),
        "vae_flops": sum(b.flops for b in vae_rows),
        "vae_achieved_gb_s": sum(b.bytes for b in vae_rows) / vae_s / 1e9,
        "vae_achieved_tflop_s": sum(b.flops for b in vae_rows) / vae_s / 1e12,
    }


def _row(b: BlockCount, seconds: float, caches: dict[str, int]) -> dict[str, Any]:
    return {
        "component": b.component,
        "block": b.name,
        "measured_s": seconds,
        "flops": b.flops,
        "bytes": b.bytes,
        "working_set_bytes": b.working_set,
        "held_in": level_holding(b.working_set, caches),
        "achieved_gflop_s": b.flops / seconds / 1e9 if seconds > 0 else 0.0,
        "achieved_gb_s": b.bytes / seconds / 1e9 if seconds > 0 else 0.0,
    }


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def report_lines(p: dict[str, Any], read_bandwidth: float | None = None) -> list[str]:
    caches = ", ".join(f"{k} {_mib(v)}" for k, v in p["caches"].items()) or "none in sysfs"
    out = [
        f"{p['model']}: {p['width']}x{p['height']}, {p['dtype']}, {p['threads']} threads, "
        f"{'guided (UNet batch 2)' if p['guided'] else 'unguided'}; caches: {caches}",
        f"{'':<5} {'block':<36} {'ms':>8} {'GFLOP/s':>8} {'GB/s':>7} {'working set MB':>15} {'fits in':>7}",
    ]
    for r in p["blocks"]:
        out.append(
            f"{r['component']:<5} {r['block']:<36} {r['measured_s'] * 1e3:8.2f} {r['achieved_gflop_s']:8.1f} "
            f"{r['achieved_gb_s']:7.1f} {r['working_set_bytes'] / 1e6:15.2f} {r['held_in']:>7}"
        )
    vae = [r for r in p["blocks"] if r["component"] == "vae"]
    beyond = [r for r in vae if r["held_in"] in ("L3", "DRAM")]
    roof = f" of the {read_bandwidth / 1e9:.1f} GB/s read roof" if read_bandwidth else ""
    out += [
        f"UNet step {p['unet_step_s'] * 1e3:.1f} ms; VAE decode {p['vae_decode_s'] * 1e3:.1f} ms = "
        f"{100 * p['vae_share']:.0f}% of a {p['steps']}-step image at this size",
        f"VAE decode: {p['vae_flops'] / 1e9:.1f} GFLOP, {p['vae_bytes'] / 1e9:.2f} GB moved (unfused count): "
        f"{p['vae_achieved_tflop_s']:.2f} TFLOP/s, {p['vae_achieved_gb_s']:.1f} GB/s achieved{roof}",
        f"VAE cache locality: {len(beyond)} of {len(vae)} blocks sweep a working set beyond L2 "
        f"({', '.join(r['block'] + ' ' + r['held_in'] for r in beyond[:6]) or 'none'}); the working set grows with "
        "the image area (x4 per doubling of the side): tile the decode so a tile's fits L2",
    ]
    return out
