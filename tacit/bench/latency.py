"""`tacit bench latency`: TTFT and decode tok/s per batch size, against the bandwidth roofline."""

from __future__ import annotations

import time

import torch

from tacit.sampling_params import SamplingParams


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # shared params counted once


def measure_batch(engine, batch_size: int, input_len: int, output_len: int, seed: int = 0) -> dict[str, float]:
    vocab = engine.config.model.hf["vocab_size"]
    g = torch.Generator().manual_seed(seed + batch_size)
    prompts = [torch.randint(10, vocab - 10, (input_len,), generator=g).tolist() for _ in range(batch_size)]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    steps_before = engine.num_steps
    t0 = time.perf_counter()
    for p in prompts:
        engine.add_request(p, params)
    t_first = None
    pending = batch_size
    first_seen: set[str] = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id not in first_seen:
                first_seen.add(out.request_id)
                if len(first_seen) == batch_size:
                    t_first = time.perf_counter()
            if out.finished:
                pending -= 1
    t_end = time.perf_counter()
    decode_s = t_end - t_first
    decode_steps = engine.num_steps - steps_before
    return {"batch_size": batch_size, "ttft_s": t_first - t0, "decode_tok_s": batch_size * (output_len - 1) / decode_s,
            "decode_step_ms": 1000 * decode_s / max(output_len - 1, 1), "steps": decode_steps}


def run(engine, batch_sizes: list[int], input_len: int, output_len: int, read_GBps: float | None) -> list[dict]:
    wbytes = weight_bytes(engine.model)
    measure_batch(engine, 1, min(input_len, 16), 4)  # warm-up
    rows = []
    for bs in batch_sizes:
        row = measure_batch(engine, bs, input_len, output_len)
        # Each decode step streams all weights once; KV reads are small next to them at these lengths.
        row["GBps"] = wbytes / (row["decode_step_ms"] / 1000) / 1e9
        if read_GBps:
            row["roofline_frac"] = row["GBps"] / read_GBps
        rows.append(row)
    return rows
