"""Request-length distributions for throughput runs, seeded so every engine sees the same list."""

from __future__ import annotations

import numpy as np

DISTRIBUTIONS = ("fixed", "uniform", "longtail")


def sample_lengths(
    dist: str, n: int, input_len: int, output_len: int, seed: int = 0, max_total: int | None = None
) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    if dist == "fixed":
        ins, outs = np.full(n, input_len), np.full(n, output_len)
    elif dist == "uniform":
        ins = rng.integers(max(1, input_len // 2), input_len * 3 // 2 + 1, n)
        outs = rng.integers(max(1, output_len // 2), output_len * 3 // 2 + 1, n)
    elif dist == "longtail":
        # Chat traffic: lognormal lengths, most requests short, a few 5-10x the median
        # (ShareGPT-like; sigma 1 puts the p99 near 10x the median).
        ins = np.clip(rng.lognormal(np.log(input_len), 1.0, n), 4, input_len * 10)
        outs = np.clip(rng.lognormal(np.log(output_len), 0.8, n), 2, output_len * 8)
    else:
        raise ValueError(f"length distribution {dist!r} is not known; valid: {', '.join(DISTRIBUTIONS)}")
    pairs = [(int(i), int(o)) for i, o in zip(ins, outs)]
    if max_total:
        pairs = [(min(i, max_total // 2), min(o, max_total - min(i, max_total // 2))) for i, o in pairs]
    return pairs


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed + 1)
    return [rng.integers(10, vocab - 10, n).tolist() for n in lengths]
