from __future__ import annotations

import time

from tacit.bench.peers.base import BenchEngine, throughput_result
from tacit.sampling_params import SamplingParams


class TacitBench(BenchEngine):
    name = "tacit"

    def __init__(self, engine) -> None:
        self.engine = engine

    def _run(self, requests: list[tuple[list[int], int]]) -> tuple[float, float, tuple[float, float] | None]:
        """(seconds to the last request's first token, total seconds, _torch_comm_seconds() at that
        first token: the prefill's share, before decode steps add their embedding all-reduces)."""
        e = self.engine
        t0 = time.perf_counter()
        for prompt, n in requests:
            e.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        seen: set[str] = set()
        t_first, comm_at_first = None, None
        while e.has_unfinished_requests():
            for out in e.step():
                if out.request_id not in seen:
                    seen.add(out.request_id)
                    if len(seen) == len(requests):
                        t_first = time.perf_counter()
                        comm_at_first = self._torch_comm_seconds()
        return t_first - t0, time.perf_counter() - t0, comm_at_first

    def _all_reduce_seconds(self) -> float | None:
        """Rank 0's seconds inside the fused decode step's all-reduce so far (tensor parallel), or None."""
        return getattr(self.engine.runner.fused_decode, "all_reduce_seconds", None)

    def _torch_comm_seconds(self) -> tuple[float, float] | None:
        """Rank 0's torch-path collective seconds so far, (exposed: blocked, hidden: in flight
        behind the other micro-batch's compute), or None in one process."""
        runner = self.engine.runner
        if runner.paths_context.comm is None:
            return None
        exposed = sum(s for name, s in runner.communication_seconds().items() if not name.startswith("fused."))
        return exposed, sum(runner.hidden_communication_seconds().values())

    def latency(self, prompts: list[list[int]], output_len: int) -> dict[str, float]:
        comm_before, torch_before = self._all_reduce_seconds(), self._torch_comm_seconds()
        spec_before = self.engine.get_stats()
        ttft, total, comm_at_first = self._run([(p, output_len) for p in prompts])
        out = {"ttft_s": ttft, "decode_tok_s": len(prompts) * (output_len - 1) / (total - ttft)}
        spec = self.engine.get_stats()
        drafts = spec.spec_decode_num_draft_tokens - spec_before.spec_decode_num_draft_tokens
        if drafts:  # speculative decoding: how often a draft was right, and tokens a verify yielded
            accepted = spec.spec_decode_num_accepted_tokens - spec_before.spec_decode_num_accepted_tokens
            verifies = spec.spec_decode_num_drafts - spec_before.spec_decode_num_drafts
            out["spec_acceptance"] = accepted / drafts
            out["spec_mean_accepted_length"] = 1 + accepted / verifies
        if comm_before is not None:
            # Prefill runs the torch path: the C++ all-reduce time is all decode-phase time, and
            # so is the torch path's after the first token (a split vocabulary's embedding lookup).
            decode_torch = 0.0 if comm_at_first is None else self._torch_comm_seconds()[0] - comm_at_first[0]
            out["comm_share"] = (self._all_reduce_seconds() - comm_before + decode_torch) / (total - ttft)
        if torch_before is not None:
            # With a fused decode step the torch path runs the prefill (and, under a split
            # vocabulary, each decode's embedding lookup): the share counts up to the first token.
            # Without one (float32, data-parallel attention) every step is the torch path's and
            # the shares cover the whole run.
            end = comm_at_first if comm_before is not None else self._torch_comm_seconds()
            exposed, hidden = (after - before for after, before in zip(end, torch_before))
            phase = ttft if comm_before is not None else total
            out["prefill_comm_share"] = exposed / phase
            out["prefill_comm_hidden"] = hidden / (hidden + exposed) if hidden + exposed else 0.0
        return out

    def throughput(self, requests: list[tuple[list[int], int]]) -> dict[str, float]:
        _, total, _ = self._run(requests)
        return throughput_result(total, requests)
