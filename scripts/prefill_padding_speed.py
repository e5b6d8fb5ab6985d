"""Time-to-first-token of the default model with prefill GEMM rows padded to their bucket
(layers/linear_method.py: prefill_rows_bucket) against unpadded, alternating in one process,
best of --repeats each, at several prompt lengths.

    python scripts/prefill_padding_speed.py [--lengths 100,129,300,700,1000,1500] [--repeats 4]
"""

from __future__ import annotations

import argparse
import time

import torch

from tacit import LLM, SamplingParams
from tacit.layers import linear_method


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="100,129,300,700,1000,1500")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    llm = LLM(args.model, dtype="bfloat16", num_kv_blocks=256)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    bucket = linear_method.prefill_rows_bucket
    g = torch.Generator().manual_seed(0)
    vocab = llm.engine.tokenizer.vocab_size
    for n in [int(x) for x in args.lengths.split(",")]:
        best = {"padded": float("inf"), "unpadded": float("inf")}
        for _ in range(args.repeats):
            for mode in ("padded", "unpadded"):
                linear_method.prefill_rows_bucket = bucket if mode == "padded" else (lambda rows: rows)
                ids = torch.randint(100, vocab - 1, (n,), generator=g).tolist()
                t0 = time.perf_counter()
                llm.generate([ids], params)
                best[mode] = min(best[mode], time.perf_counter() - t0)
        linear_method.prefill_rows_bucket = bucket
        print(
            f"{n} tokens (GEMM rows {bucket(n)}): padded {best['padded'] * 1e3:.1f} ms, "
            f"unpadded {best['unpadded'] * 1e3:.1f} ms, ratio {best['padded'] / best['unpadded']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
