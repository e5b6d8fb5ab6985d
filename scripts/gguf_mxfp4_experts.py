"""Write a Hugging Face MoE checkpoint as a GGUF whose expert stacks are MXFP4 (the gguf package's
quantizer) and every other matrix bf16: gpt-oss's release keeps exactly its experts in MXFP4.

    python scripts/gguf_mxfp4_experts.py random:gpt-oss-1b

prints the file's path (in tacit's cache, next to the random model), to pass as --model, e.g.
`tacit bench latency --model PATH --peer llama.cpp` (docs/performance/index.md).
"""

from __future__ import annotations

import sys
from pathlib import Path


def export(model: str) -> Path:
    from tacit.bench.random_model import resolve_bench_model
    from tacit.loader.gguf_writer import export_hf_to_gguf
    from tacit.paths import cache_dir

    hf_dir = Path(resolve_bench_model(model))
    out = cache_dir() / f"{hf_dir.name}.mxfp4-experts.gguf"
    if not out.exists():
        export_hf_to_gguf(hf_dir, out.with_suffix(".partial"), bf16=True, ggml_types={"_exps.weight": "MXFP4"}).rename(
            out
        )
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(export(sys.argv[1]))
