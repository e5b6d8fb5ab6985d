"""llama.cpp (llama-cpp-python, an optional extra) as a peer, on a GGUF of the same weights.

Its Python API runs one sequence at a time, so batch sizes above 1 are not measured and the
throughput run serves requests one after another, as a llama-cpp-python server would.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tacit.bench.peers.base import BenchEngine, throughput_result


class LlamaCppBench(BenchEngine):
    name = "llama.cpp"

    def __init__(self, gguf_path: Path, n_ctx: int, num_pred_tokens: int | None = None) -> None:
        """num_pred_tokens: llama.cpp's prompt-lookup decoding (LlamaPromptLookupDecoding) with
        that many draft tokens a step; None, one token a step."""
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError:
            raise ValueError(
                "--peer llama.cpp needs llama-cpp-python: pip install -e '.[bench]' "
                "(it builds from source, about 5 minutes)"
            ) from None
        threads = len(os.sched_getaffinity(0))
        self.llm = Llama(
            model_path=str(gguf_path),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
            # Prompt-lookup verification reads the logits of every drafted position.
            logits_all=num_pred_tokens is not None,
            draft_model=None if num_pred_tokens is None else LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens),
        )

    def _one(self, prompt: list[int], n: int) -> tuple[float, float]:
        self.llm.reset()
        t0 = time.perf_counter()
        t_first = None
        for i, _ in enumerate(self.llm.generate(prompt, top_k=1, temp=0.0, reset=True)):
            if i == 0:
                t_first = time.perf_counter()
            if i + 1 >= n:
                break
        return t_first - t0, time.perf_counter() - t0

    def latency(self, prompts: list[list[int]], output_len: int) -> dict[str, float] | None:
        if len(prompts) != 1:
            return None
        ttft, total = self._one(prompts[0], output_len)
        return {"ttft_s": ttft, "decode_tok_s": (output_len - 1) / (total - ttft)}

    def throughput(self, requests: list[tuple[list[int], int]]) -> dict[str, float]:
        t0 = time.perf_counter()
        for p, n in requests:
            self._one(p, n)
        return throughput_result(time.perf_counter() - t0, requests)
