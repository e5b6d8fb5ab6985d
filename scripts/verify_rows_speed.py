"""What a verify step's rows cost on the fused decoder: one request (a 500-token context, decoded
30 tokens in) run as 1, 2, 3, 4, 5 and 8 rows, the way a verify of 0-7 drafts runs, timed 50
times each with the decoder's per-phase timers, and the head's logits for those rows
(docs/benchmarks.md, "Speculative decoding on the fused decoder").

Run: python scripts/verify_rows_speed.py [--quantization none]   (default: the default model's Q4_1)
"""

import argparse
import time

from tacit.engine.llm_engine import LLMEngine
from tacit.sampling_params import SamplingParams
from tacit.worker.paths.base import finish
from tacit.worker.paths.fused_decode import fused_decode_hidden


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantization", default="auto")
    args = ap.parse_args()
    engine = LLMEngine(dtype="bfloat16", quantization=args.quantization)
    engine.add_request(list(range(1000, 1500)), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(30):
        engine.step()
    r = next(iter(engine.runner.requests.values()))
    ctx = engine.runner.paths_context
    fused = ctx.fused_decode
    fused.set_phase_timing(True)
    names = fused.phase_names
    for n in (1, 2, 3, 4, 5, 8):
        r.num_draft_tokens = n - 1  # the request's token and n - 1 drafts after it
        r.token_ids.extend([7] * (n - 1))
        rows = [(r, n)]
        for _ in range(5):
            finish(fused_decode_hidden(ctx, rows, False))
        before = list(fused.phase_seconds)
        t = time.perf_counter()
        for _ in range(50):
            hidden = finish(fused_decode_hidden(ctx, rows, False))
        layers = (time.perf_counter() - t) / 50
        phases: dict[str, float] = {}
        for i, (a, b) in enumerate(zip(fused.phase_seconds, before)):
            phases[names[i % len(names)]] = phases.get(names[i % len(names)], 0.0) + (a - b) / 50
        t = time.perf_counter()
        for _ in range(50):
            engine.runner.model.compute_logits(hidden)
        head = (time.perf_counter() - t) / 50
        shown = ", ".join(f"{k} {v * 1000:.2f}" for k, v in phases.items() if v > 0)
        print(f"{n} rows: layers {layers * 1000:.2f} ms ({shown}), logits {head * 1000:.2f} ms")
        if n > 1:
            del r.token_ids[-(n - 1) :]
        r.num_draft_tokens = 0


if __name__ == "__main__":
    main()
