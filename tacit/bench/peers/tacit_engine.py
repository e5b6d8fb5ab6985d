from __future__ import annotations

import time

from tacit.bench.peers.base import BenchEngine, throughput_result
from tacit.sampling_params import SamplingParams


class TacitBench(BenchEngine):
    name = "tacit"

    def __init__(self, engine) -> None:
        self.engine = engine

    def _run(self, requests: list[tuple[list[int], int]]) -> tuple[float, float]:
        """(seconds to the last request's first token, total seconds)."""
        e = self.engine
        t0 = time.perf_counter()
        for prompt, n in requests:
            e.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        seen: set[str] = set()
        t_first = None
        while e.has_unfinished_requests():
            for out in e.step():
                if out.request_id not in seen:
                    seen.add(out.request_id)
                    if len(seen) == len(requests):
                        t_first = time.perf_counter()
        return t_first - t0, time.perf_counter() - t0

    def _all_reduce_seconds(self) -> float | None:
        """Rank 0's seconds inside the fused decode step's all-reduce so far (tensor parallel), or None."""
        return getattr(self.engine.runner.fused_decode, "all_reduce_seconds", None)

    def _torch_comm_seconds(self) -> tuple[float, float] | None:
        """Rank 0's torch-path collective seconds so far, (exposed: blocked, hidden: in flight
        behind the other micro-batch's compute), or None in one process."""
        runner = self.engine.runner
        if runner.comm is None:
            return None
        exposed = sum(s for name, s in runner.communication_seconds().items() if not name.startswith("fused."))
        return exposed, sum(runner.hidden_communication_seconds().values())

    def latency(self, prompts: list[list[int]], output_len: int) -> dict[str, float]:
        comm_before, torch_before = self._all_reduce_seconds(), self._torch_comm_seconds()
        ttft, total = self._run([(p, output_len) for p in prompts])
        out = {"ttft_s": ttft, "decode_tok_s": len(prompts) * (output_len - 1) / (total - ttft)}
        if comm_before is not None:
            # Prefill runs the torch path: the C++ all-reduce time is all decode-phase time.
            out["comm_share"] = (self._all_reduce_seconds() - comm_before) / (total - ttft)
        if torch_before is not None:
            # The torch path's steps are the prefill (bf16 decodes run in C++); under fp32 the
            # decodes join them and the shares cover the whole run.
            exposed, hidden = (after - before for after, before in zip(self._torch_comm_seconds(), torch_before))
            phase = ttft if comm_before is not None else total
            out["prefill_comm_share"] = exposed / phase
            out["prefill_comm_hidden"] = hidden / (hidden + exposed) if hidden + exposed else 0.0
        return out

    def throughput(self, requests: list[tuple[list[int], int]]) -> dict[str, float]:
        _, total = self._run(requests)
        return throughput_result(total, requests)
