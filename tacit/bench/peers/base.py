"""A benchmark participant: tacit itself or a peer engine, measured the same way."""

from __future__ import annotations

from abc import ABC, abstractmethod


class BenchEngine(ABC):
    name: str

    @abstractmethod
    def latency(self, prompts: list[list[int]], output_len: int) -> dict[str, float] | None:
        """Greedy, EOS ignored: {'ttft_s', 'decode_tok_s'} for this batch, or None if unsupported."""

    @abstractmethod
    def throughput(self, requests: list[tuple[list[int], int]]) -> dict[str, float]:
        """All requests offline, EOS ignored: {'elapsed_s', 'output_tok_s', 'req_s'}."""


def throughput_result(elapsed: float, requests: list[tuple[list[int], int]]) -> dict[str, float]:
    tokens = sum(n for _, n in requests)
    return {"elapsed_s": elapsed, "output_tok_s": tokens / elapsed, "req_s": len(requests) / elapsed}
