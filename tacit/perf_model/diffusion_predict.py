"""A text-to-image request priced on a HardwareSpec, block by block (diffusion_models.py's counts):
each block's convolutions / linears at the GEMM curve of its rows, its fused attention at the
prefill-attention curve of its query length, its elementwise ops (GroupNorm, SiLU, adds,
resamples) at the elementwise bandwidth, and its kernel launches; the image is text encode +
steps x UNet + VAE decode.

Two devices (`devices=2`, e.g. a 310P pair): classifier-free guidance splits into its halves,
one device denoising the negative prompt's batch and the other the positive one's, the two
noise predictions exchanged every step (the guided combine needs both); the text encoders run
one prompt each, and one device decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tacit.perf_model.diffusion_configs import DiffusionConfigs
from tacit.perf_model.diffusion_count import BlockCount
from tacit.perf_model.diffusion_models import LATENT_FACTOR, count_request
from tacit.perf_model.efficiency import Profile
from tacit.perf_model.roofline import launch_seconds
from tacit.platforms.specs import HardwareSpec


@dataclass(frozen=True)
class BlockTime:
    block: BlockCount
    compute_s: float  # its GEMM and attention FLOPs at the fitted efficiency
    gemm_memory_s: float  # the bytes its FLOP-carrying ops move (weights, their inputs and outputs)
    elementwise_s: float  # the bytes its other ops move, at the elementwise bandwidth
    launch_s: float

    @property
    def seconds(self) -> float:
        # a GEMM overlaps its own loads; the norms and activations between them run alone
        return max(self.compute_s, self.gemm_memory_s) + self.elementwise_s + self.launch_s

    @property
    def bound(self) -> str:
        if self.launch_s > max(self.compute_s, self.gemm_memory_s + self.elementwise_s):
            return "launch-bound"
        return "compute-bound" if self.compute_s >= self.gemm_memory_s + self.elementwise_s else "memory-bound"


@dataclass(frozen=True)
class DiffusionPrediction:
    model: str
    hardware: str
    width: int
    height: int
    steps: int
    images: int
    guided: bool
    devices: int
    unet: list[BlockTime]  # one step's UNet call on one device
    vae: list[BlockTime]
    text: list[BlockTime]
    transfer_s: float  # the per-step exchange of noise predictions between the two devices
    peak_flops: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """FLOP/byte where the compute and memory roofs meet."""
        return self.peak_flops / self.bandwidth

    @property
    def step_s(self) -> float:
        return sum(t.seconds for t in self.unet) + self.transfer_s

    @property
    def vae_s(self) -> float:
        return sum(t.seconds for t in self.vae)

    @property
    def text_s(self) -> float:
        return sum(t.seconds for t in self.text)

    @property
    def image_s(self) -> float:
        """The request end to end: text encode, every denoising step, the VAE decode."""
        return self.text_s + self.steps * self.step_s + self.vae_s

    def steps_within(self, seconds: float) -> int:
        """The most denoising steps an image can take and still finish in `seconds` (0: none)."""
        return max(int((seconds - self.text_s - self.vae_s) // self.step_s), 0)


def price_block(b: BlockCount, spec: HardwareSpec, profile: Profile) -> BlockTime:
    peak, bw = spec.peak_flops("bf16"), spec.memory_bandwidth.value  # fp16 on parts without bf16 (310P)
    compute = 0.0
    gemm_eff = profile.gemm_efficiency("bf16", b.rows) if b.gemm_flops else 1.0
    if b.gemm_flops:
        compute += b.gemm_flops / (peak * gemm_eff)
    if b.attention_flops:
        compute += b.attention_flops / (peak * profile.attention_prefill(b.attention_len))
    gemm_mem = b.gemm_bytes / (bw * gemm_eff)
    elementwise = (b.bytes - b.gemm_bytes) / (bw * profile.elementwise(b.working_set))
    # diffusers runs eagerly unless compiled: CUDA/ACL graphs are the LLM decode's, not the UNet's
    launches = b.ops * launch_seconds(profile, graphs=False)
    return BlockTime(b, compute, gemm_mem, elementwise, launches)


def predict_image(
    cfgs: DiffusionConfigs,
    spec: HardwareSpec,
    width: int = 1024,
    height: int = 1024,
    steps: int = 30,
    images: int = 1,
    guided: bool = True,
    devices: int = 1,
    profile: Profile | None = None,
    weight_bytes: float = 2.0,
) -> DiffusionPrediction:
    """`images` images of one prompt, guided (classifier-free guidance) or not, on `devices`
    devices of `spec`; `weight_bytes`: 2 (bf16 / fp16), 1 (int8 weights, 16-bit compute)."""
    if steps < 1:
        raise ValueError(f"steps={steps}: must be >= 1")
    if devices not in (1, 2):
        raise ValueError(f"devices={devices}: 1, or 2 (classifier-free guidance's halves on two devices)")
    if devices == 2 and not guided:
        raise ValueError("devices=2 splits classifier-free guidance's two halves: it needs guidance (scale > 1)")
    if profile is None:
        from tacit.perf_model.calibration import profile_for

        profile = profile_for(spec)
    from tacit.perf_model.predict import fitted_roofs

    spec = fitted_roofs(spec, profile)
    # one device's share: with the CFG split each runs the unguided batch (and one prompt)
    counts = count_request(cfgs, width, height, images, guided and devices == 1, weight_bytes)
    transfer = 0.0
    if devices == 2:
        latent = images * cfgs.unet.get("out_channels", 4) * (width // LATENT_FACTOR) * (height // LATENT_FACTOR)
        transfer = spec.link_latency.value + 2 * latent / spec.link_bandwidth.value  # fp16 noise prediction
    price = lambda rows: [price_block(b, spec, profile) for b in rows]  # noqa: E731
    return DiffusionPrediction(
        model=cfgs.name,
        hardware=spec.name + (" x2" if devices == 2 else ""),
        width=width,
        height=height,
        steps=steps,
        images=images,
        guided=guided,
        devices=devices,
        unet=price(counts.unet),
        vae=price(counts.vae),
        text=price(counts.text),
        transfer_s=transfer,
        peak_flops=spec.peak_flops("bf16"),
        bandwidth=spec.memory_bandwidth.value,
    )


def component_totals(times: list[BlockTime]) -> dict[str, float]:
    blocks = [t.block for t in times]
    flops, nbytes = sum(b.flops for b in blocks), sum(b.bytes for b in blocks)
    return {
        "flops": flops,
        "bytes": nbytes,
        "weight_bytes": sum(b.weight_bytes for b in blocks),
        "intensity": flops / max(nbytes, 1.0),
        "seconds": sum(t.seconds for t in times),
        "launches": sum(b.ops for b in blocks),
    }
