"""`tacit bench image`: tacit's UNet step and VAE decode against diffusers' best plain-PyTorch CPU
configuration and OpenVINO, on the same SDXL-shaped random weights and seeded inputs, each engine
in its own process (a peer that is missing, crashes or hangs loses only its own rows), alternated
in rounds so a noisy minute is shared by all. Achieved TFLOP/s are printed beside `tacit bench
hw`'s bf16 matmul peak, so a ratio the hardware forbids is visible. The int8 and step-caching
variants run after the engines (so at most three SDXL-sized processes are resident: 3 x 5.1 GB
of bf16 UNet in 24 GiB), with their PSNR against tacit's unvaried output of the same inputs."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from tacit.bench.cli_output import log
from tacit.bench.image_models import ImageShape, MissingEngine, count_flops, psnr
from tacit.bench.peers.process_peer import ProcessPeer

ENGINES = ["diffusers", "openvino", "tacit"]
RUNNER = "tacit.bench.image_engines:ImageEngineRunner"


def check_engines(names: list[str]) -> None:
    unknown = [n for n in names if n not in ENGINES]
    if unknown or not names:
        raise ValueError(f"--engines {','.join(names)!r}: a comma list of {', '.join(ENGINES)}")


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def start_engines(names: list[tuple[str, str]], shape: ImageShape, seed: int, timeout_s: float,
                  tacit_options: dict[str, Any], skipped: dict[str, str]) -> dict[str, ProcessPeer]:  # fmt: skip
    """(row name, variant) -> a started ProcessPeer; a missing package goes to `skipped`, a load
    that raises or dies is printed as failed, and the bench goes on with the others."""
    peers: dict[str, ProcessPeer] = {}
    for row, variant in names:
        engine = "tacit" if variant else row
        log(f"building {row} ({shape.model}, {shape.size}x{shape.size}) in its own process ...")
        try:
            peers[row] = ProcessPeer(row, RUNNER, (engine, shape, seed, variant, tacit_options), timeout_s)
        except MissingEngine as e:
            skipped[row] = str(e)
            print(f"engine {row} skipped: {e}", flush=True)
        except Exception as e:  # a crash while loading (RuntimeError) or an error the engine raised
            skipped[row] = f"failed while loading: {type(e).__name__}: {e}"
            print(f"engine {row} failed while loading: {type(e).__name__}: {e}; the others stand", flush=True)
    return peers


def run_rounds(peers: dict[str, ProcessPeer], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Each round runs every engine once; the order rotates so none always follows another."""
    times: dict[str, dict[str, list[float]]] = {n: {"unet_step_s": [], "vae_decode_s": []} for n in peers}
    order = list(peers)
    for r in range(rounds if order else 0):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            log(f"round {r + 1}/{rounds}: {name} ...")
            out = peers[name].ask("run_round")
            if out is None:
                continue  # failed: ProcessPeer holds why; printed by report_failed_peers
            times[name]["unet_step_s"] += out["unet_step_s"]
            times[name]["vae_decode_s"].append(out["vae_decode_s"])
    return times


def engine_row(name: str, t: dict[str, list[float]], info: dict[str, Any], flops: dict[str, float],
               peak: float) -> dict[str, Any]:  # fmt: skip
    unet_s, vae_s = statistics.median(t["unet_step_s"]), statistics.median(t["vae_decode_s"])
    unet_tf, vae_tf = flops["unet_flops"] / unet_s / 1e12, flops["vae_flops"] / vae_s / 1e12
    return {
        "engine": name,
        "unet_step_s": unet_s,
        "unet_step_mean_s": statistics.fmean(t["unet_step_s"]),
        "vae_decode_s": vae_s,
        "unet_TFLOPs": unet_tf,
        "vae_TFLOPs": vae_tf,
        "unet_pct_peak": 100 * unet_tf * 1e12 / peak,  # TFLOP/s against a peak in FLOP/s
        "vae_pct_peak": 100 * vae_tf * 1e12 / peak,
        "init_s": info["init_s"],
        "prepare_s": info["prepare_s"],
    }


def measure_phase(names: list[tuple[str, str]], shape: ImageShape, args: Any, flops: dict[str, float], peak: float,
                  skipped: dict[str, str]) -> tuple[list[dict], dict[str, torch.Tensor], dict[str, str]]:  # fmt: skip
    """Start the engines, alternate them in rounds, fetch each one's image; close them all."""
    from tacit.bench.cli_peers import report_failed_peers
    from tacit.bench.image_tacit import parse_tacit_options

    peers = start_engines(names, shape, args.seed, args.peer_timeout, parse_tacit_options(args.tacit_options), skipped)
    times = run_rounds(peers, args.rounds)
    rows, images, notes = [], {}, {}
    for name, peer in peers.items():
        info, image = peer.ask("info"), peer.ask("output")
        if info is None or image is None or not times[name]["vae_decode_s"]:
            continue
        rows.append(engine_row(name, times[name], info, flops, peak))
        images[name] = image
        if info["note"]:
            notes[name] = info["note"]
    failed = report_failed_peers(list(peers.values())).get("failed_peers", {})
    skipped.update({n: f"failed: {why}" for n, why in failed.items()})
    if any("SIGKILL" in why for why in failed.values()):
        print("  SIGKILL is most often the kernel's out-of-memory killer: --size 512 or fewer --engines", flush=True)
    return rows, images, notes


def ratio_lines(rows: list[dict], peak: float) -> list[str]:
    """tacit / each peer (peer seconds over tacit's), each engine's TFLOP/s and the peak beside
    them; an engine above the peak is flagged (its FLOPs were skipped or its clock is wrong)."""
    by = {r["engine"]: r for r in rows}
    lines = [f"peak: {peak / 1e12:.2f} TFLOP/s (the bench dtype's matmul, as `tacit bench hw` measures it)"]
    for r in rows:
        for part in ("unet", "vae"):
            if r[f"{part}_TFLOPs"] * 1e12 > peak:
                lines.append(
                    f"  IMPOSSIBLE: {r['engine']} {part} at {r[f'{part}_TFLOPs']:.2f} TFLOP/s is above the peak "
                    "(it skips FLOPs, e.g. step caching, or the timing is wrong)"
                )
    if "tacit" not in by:
        return lines
    t = by["tacit"]
    for peer in (n for n in by if n in ENGINES and n != "tacit"):
        p = by[peer]
        lines.append(
            f"tacit/{peer}: UNet step {p['unet_step_s'] / t['unet_step_s']:.2f}x "
            f"({t['unet_TFLOPs']:.2f} vs {p['unet_TFLOPs']:.2f} TFLOP/s), VAE decode "
            f"{p['vae_decode_s'] / t['vae_decode_s']:.2f}x ({t['vae_TFLOPs']:.2f} vs {p['vae_TFLOPs']:.2f} TFLOP/s); "
            f"peak {peak / 1e12:.2f}"
        )
    return lines


def run_image_bench(args: Any) -> dict[str, Any]:
    """The whole benchmark from parsed arguments (cli_image.py): rows, ratios, skipped engines."""
    from tacit.bench.image_tacit import check_variants, parse_tacit_options

    parse_tacit_options(args.tacit_options)  # a bad --tacit-options is refused before anything is built
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    check_engines(engines)
    check_variants(variants)
    dtype = args.dtype
    if dtype == "auto":
        from tacit.platforms.cpu import bf16_matmul_is_native

        dtype = "bfloat16" if bf16_matmul_is_native() else "float32"
    shape = ImageShape(args.model, args.size, args.steps, args.guidance_scale, dtype)
    flops = count_flops(shape, args.seed)
    if args.peak_tflops:
        peak = args.peak_tflops * 1e12
    else:
        from tacit.platforms.hw_probe import matmul_flops

        peak = matmul_flops(shape.torch_dtype)  # measured again after the engines: the higher stands
    # Resident at once: each engine's weights (2 bytes a parameter in bf16), OpenVINO's twice while it
    # converts (the torch modules and its compiled copy), and ~10% for activations.
    copies = len(engines) + ("openvino" in engines)
    need = 1.1 * copies * shape.torch_dtype.itemsize * (flops["unet_params"] + flops["vae_params"])
    if available_bytes() and need > available_bytes():
        log(f"warning: about {need / 2**30:.0f} GiB may be needed and {available_bytes() / 2**30:.0f} GiB is "
            "available; --size 512 or fewer --engines if an engine is killed")  # fmt: skip
    skipped: dict[str, str] = {}
    # OpenVINO first: its conversion holds two copies of the weights, best done before the others load.
    engines.sort(key=lambda e: e != "openvino")
    rows, images, notes = measure_phase([(e, "") for e in engines], shape, args, flops, peak, skipped)
    if variants and "tacit" not in images:
        for v in variants:
            skipped[f"tacit+{v}"] = "no tacit output to compare with (the tacit engine did not run)"
        variants = []
    vrows, vimages, vnotes = measure_phase([(f"tacit+{v}", v) for v in variants], shape, args, flops, peak, skipped)
    if not args.peak_tflops:
        # The shared cores drift: one probe read 0.13 TFLOP/s float32 where `tacit bench hw` read
        # 0.18 a minute before, and flagged engines at 0.16 as impossible. The best of two stands.
        from tacit.platforms.hw_probe import matmul_flops

        best = max(peak, matmul_flops(shape.torch_dtype))
        if best > peak:
            for r in rows + vrows:
                for part in ("unet", "vae"):
                    r[f"{part}_pct_peak"] = 100 * r[f"{part}_TFLOPs"] * 1e12 / best
            peak = best
    for r in rows + vrows:
        image = images.get(r["engine"], vimages.get(r["engine"]))
        if "diffusers" in images and r["engine"] != "diffusers":
            r["psnr_vs_diffusers_db"] = psnr(image, images["diffusers"])
        if r["engine"] not in ENGINES and "tacit" in images:
            r["psnr_vs_tacit_db"] = psnr(image, images["tacit"])
    return {
        "model": shape.model,
        "size": shape.size,
        "steps": shape.steps,
        "rounds": args.rounds,
        "cfg_batch": shape.batch,
        "flops": flops,
        "dtype": shape.dtype,
        "peak_TFLOPs": peak / 1e12,
        "engines": rows,
        "variants": vrows,
        "ratios": ratio_lines(rows, peak),
        "variant_flags": ratio_lines(vrows, peak)[1:],
        "tacit_options": args.tacit_options,
        "notes": {**notes, **vnotes},
        "skipped": skipped,
    }
