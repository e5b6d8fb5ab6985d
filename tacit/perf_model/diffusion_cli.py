"""`tacit predict --model sdxl-base|sd15|DIFFUSERS_DIR --size WxH --steps N`: the per-block table
of a text-to-image request (FLOPs, bytes, intensity, the roof that binds, predicted ms) and its
totals; `--json FILE` writes the same rows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tacit.perf_model.diffusion_predict import BlockTime, DiffusionPrediction, component_totals

# weight formats a diffusion model is priced in -> bytes a weight (activations stay 16-bit)
WEIGHT_BYTES = {"auto": 2.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0}


def add_diffusion_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("text-to-image (--model sdxl-base | sd15 | a diffusers directory)")
    g.add_argument("--size", default=None, help="WIDTHxHEIGHT of the image, multiples of 64 (default 1024x1024)")
    g.add_argument("--steps", type=int, default=None, help="denoising steps, UNet calls (default 30)")
    g.add_argument(
        "--guidance-scale",
        type=float,
        default=None,
        help="default 5; <= 1: no classifier-free guidance (one UNet batch a step)",
    )
    g.add_argument(
        "--devices",
        type=int,
        default=None,
        help="1 (default), or 2: classifier-free guidance's negative and positive halves on two devices (a 310P pair)",
    )


DEFAULTS = {"size": "1024x1024", "steps": 30, "guidance_scale": 5.0, "devices": 1}


def refuse_diffusion_args(args: argparse.Namespace) -> None:
    """An LLM prediction given a text-to-image flag: say so rather than ignore it."""
    given = [k for k in DEFAULTS if getattr(args, k, None) is not None]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"{flags}: text-to-image flags, for --model sdxl-base | sd15 | a diffusers directory")


def parse_size(size: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size {size!r}: expected WIDTHxHEIGHT, e.g. 1024x1024") from None
    return w, h


def cmd_predict_diffusion(args: argparse.Namespace) -> int:
    from tacit.perf_model.diffusion_configs import load_diffusion_configs
    from tacit.perf_model.diffusion_predict import predict_image
    from tacit.perf_model.hardware_file import resolve_hardware

    if args.quantization not in WEIGHT_BYTES:
        raise ValueError(
            f"--quantization {args.quantization!r} for a diffusion model; valid: {', '.join(WEIGHT_BYTES)}"
        )
    for k, v in DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    width, height = parse_size(args.size)
    spec = resolve_hardware(
        args.hardware, args.hardware_file, efficiency_profile=args.efficiency_profile, threads=args.threads
    )
    cfgs = load_diffusion_configs(args.model)
    pred = predict_image(
        cfgs,
        spec,
        width,
        height,
        args.steps,
        args.batch_size,
        args.guidance_scale > 1.0,
        args.devices,
        weight_bytes=WEIGHT_BYTES[args.quantization],
    )
    for line in prediction_lines(pred):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(prediction_json(pred), indent=2))
    return 0


def _row(comp: str, t: BlockTime) -> str:
    b = t.block
    return (
        f"{comp:<5} {b.name:<36} {b.flops / 1e9:>9.1f} {b.weight_bytes / 1e6:>8.1f} {b.activation_bytes / 1e6:>9.1f} "
        f"{b.intensity:>7.1f} {t.bound:<14} {t.seconds * 1e3:>9.2f}"
    )


def prediction_lines(p: DiffusionPrediction) -> list[str]:
    guide = "classifier-free guidance" if p.guided else "no guidance"
    if p.devices == 2:
        guide += ": its two halves on two devices, noise predictions exchanged each step"
    out = [
        f"{p.model} on {p.hardware}: {p.width}x{p.height}, {p.steps} steps, {p.images} image(s), {guide}",
        f"roofs: {p.peak_flops / 1e12:.1f} TFLOP/s, {p.bandwidth / 1e9:.1f} GB/s: ridge point "
        f"{p.ridge:.0f} FLOP/byte (a block below it cannot reach peak compute)",
        f"{'':<5} {'block':<36} {'GFLOP':>9} {'weight MB':>8} {'act MB':>9} {'FLOP/B':>7} {'bound':<14} {'ms':>9}",
    ]
    for comp, rows in (("text", p.text), ("unet", p.unet), ("vae", p.vae)):
        out += [_row(comp, t) for t in rows]
    out.append("totals:")
    for label, rows, times in (
        ("text encode (once)", p.text, 1),
        ("UNet step", p.unet, p.steps),
        ("VAE decode", p.vae, 1),
    ):
        tot = component_totals(rows)
        bound = sum(t.seconds for t in rows if t.bound == "compute-bound") / max(tot["seconds"], 1e-12)
        out.append(
            f"  {label:<19} {tot['seconds'] * 1e3:9.1f} ms  x{times:<3} {tot['flops'] / 1e12:7.2f} TFLOP "
            f"{tot['bytes'] / 1e9:7.2f} GB  {tot['intensity']:6.0f} FLOP/B  {tot['launches']:5d} launches  "
            f"{100 * bound:3.0f}% of its time compute-bound"
        )
    if p.devices == 2:
        out.append(
            f"  {'noise exchange':<19} {p.transfer_s * 1e3:9.3f} ms  x{p.steps} (one link latency + 2 B a latent value)"
        )
    out.append(
        f"  image: {p.image_s:.2f} s = {p.text_s * 1e3:.0f} ms text + {p.steps} x {p.step_s * 1e3:.1f} ms "
        f"+ {p.vae_s * 1e3:.0f} ms VAE decode; steps within 1.8 s: {p.steps_within(1.8)}"
    )
    return out


def _block_json(comp: str, t: BlockTime) -> dict[str, Any]:
    b = t.block
    return {
        "component": comp,
        "block": b.name,
        "flops": b.flops,
        "attention_flops": b.attention_flops,
        "weight_bytes": b.weight_bytes,
        "activation_bytes": b.activation_bytes,
        "intensity": b.intensity,
        "working_set_bytes": b.working_set,
        "launches": b.ops,
        "bound": t.bound,
        "seconds": t.seconds,
    }


def prediction_json(p: DiffusionPrediction) -> dict[str, Any]:
    blocks = [_block_json(c, t) for c, rows in (("text", p.text), ("unet", p.unet), ("vae", p.vae)) for t in rows]
    return {
        "model": p.model,
        "hardware": p.hardware,
        "width": p.width,
        "height": p.height,
        "steps": p.steps,
        "images": p.images,
        "guided": p.guided,
        "devices": p.devices,
        "peak_flops": p.peak_flops,
        "bandwidth": p.bandwidth,
        "ridge_flop_per_byte": p.ridge,
        "blocks": blocks,
        "totals": {
            "text_encode": component_totals(p.text),
            "unet_step": component_totals(p.unet),
            "vae_decode": component_totals(p.vae),
            "transfer_s_per_step": p.transfer_s,
            "step_s": p.step_s,
            "image_s": p.image_s,
        },
    }
