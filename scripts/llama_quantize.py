"""Write a Hugging Face checkpoint as GGUF files of the types people download, quantized by
llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize, the `llama-quantize` tool):
the bf16 GGUF tacit's writer exports, then Q8_0 / Q4_0 / Q4_K_M from it, with llama.cpp's
per-tensor choices (Q4_K_M keeps some matrices in Q6_K, the output matrix in Q6_K).

    pip install -e '.[bench]'   # llama-cpp-python: builds from source, ~5 min
    python scripts/llama_quantize.py random:llama-1b Q8_0 Q4_0 Q4_K_M

prints each file's path (in tacit's cache, next to the random model), to pass as --model.
"""

from __future__ import annotations

import sys
from pathlib import Path

FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def quantize(model: str, types: list[str]) -> list[Path]:
    import llama_cpp

    from tacit.bench.random_model import resolve_bench_model
    from tacit.loader.gguf_writer import export_hf_to_gguf
    from tacit.paths import cache_dir

    hf_dir = Path(resolve_bench_model(model))
    bf16 = cache_dir() / f"{hf_dir.name}.bf16.gguf"
    if not bf16.exists():
        export_hf_to_gguf(hf_dir, bf16.with_suffix(".partial"), bf16=True).rename(bf16)
    out = []
    for t in types:
        if t not in FTYPES:
            raise SystemExit(f"type {t!r} is not one of {', '.join(FTYPES)}")
        dst = cache_dir() / f"{hf_dir.name}.{t}.gguf"
        if not dst.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = FTYPES[t]
            params.nthread = 2
            tmp = dst.with_suffix(".partial")
            if llama_cpp.llama_model_quantize(str(bf16).encode(), str(tmp).encode(), params) != 0:
                raise SystemExit(f"llama.cpp failed to quantize {bf16} to {t}")
            tmp.rename(dst)
        out.append(dst)
    return out


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    for path in quantize(sys.argv[1], sys.argv[2:]):
        print(path)
