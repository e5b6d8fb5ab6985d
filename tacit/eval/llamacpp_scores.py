"""llama.cpp's teacher-forced log-probabilities on a GGUF (llama-cpp-python, the optional `bench`
extra), for `tacit eval kld --peer llama.cpp`.

llama.cpp is fed the token ids tacit tokenized (it never tokenizes anything itself), one chunk at
a time from an empty cache (`reset()` then `eval(chunk)` with logits kept for every position), and
rows 0..len-2 of its logits become float32 log-softmax rows, shaped as
`LLM.score_full_logprobs` returns them. Its K/V cache is llama.cpp's default f16 unless
kv_cache_f32 (on a tiny float32 model the f16 cache moves log-probabilities by up to 4e-3, an
f32 one leaves them within 4e-6 of tacit's).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

INSTALL_HINT = "pip install -e '.[bench]' (llama-cpp-python builds from source, about 5 minutes)"


def require_llama_cpp() -> Any:
    """The llama_cpp module, or a ValueError that says how to install it."""
    try:
        import llama_cpp
    except ImportError:
        raise ValueError(f"--peer llama.cpp needs llama-cpp-python: {INSTALL_HINT}") from None
    return llama_cpp


def iter_llamacpp_full_logprobs(
    gguf_path: str | Path,
    chunks: list[list[int]],
    context: int,
    threads: int,
    vocab_size: int | None = None,
    kv_cache_f32: bool = False,
) -> Iterator[torch.Tensor]:
    """One [len(chunk) - 1, vocab] float32 log-softmax tensor per chunk, computed when asked for
    (so a caller that reduces each one as it comes never holds them all).

    vocab_size: tacit's logits width; a different llama.cpp n_vocab is a ValueError, raised
    after loading and before scoring anything."""
    llama_cpp = require_llama_cpp()
    if any(len(c) > context for c in chunks):
        raise ValueError(f"a chunk is longer than the context {context}")
    extra = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if kv_cache_f32 else {}
    llm = llama_cpp.Llama(
        model_path=str(gguf_path),
        logits_all=True,
        n_ctx=context,
        n_batch=context,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
        **extra,
    )
    try:
        if vocab_size is not None and llm.n_vocab() != vocab_size:
            raise ValueError(
                f"llama.cpp reads a vocabulary of {llm.n_vocab()} tokens from {gguf_path}, tacit's logits "
                f"have {vocab_size}: their distributions cannot be compared"
            )
        for chunk in chunks:
            llm.reset()
            llm.eval(chunk)
            logits = np.array(llm.scores[: len(chunk) - 1], dtype=np.float32)  # a copy: the next eval overwrites
            yield torch.from_numpy(logits).log_softmax(-1)
    finally:
        llm.close()


def llamacpp_full_logprobs(
    gguf_path: str | Path, chunks: list[list[int]], context: int, threads: int, kv_cache_f32: bool = False
) -> list[torch.Tensor]:
    """Every chunk's [len(chunk) - 1, vocab] float32 log-softmax rows from llama.cpp."""
    return list(iter_llamacpp_full_logprobs(gguf_path, chunks, context, threads, kv_cache_f32=kv_cache_f32))
