"""The execution-path seam: every registered path is checked against the torch path, the
reference, on the same rows: the one-process paths here, the multi-rank ones (whose rows only
exist under tensor parallelism) by the distributed tests named in MULTI_RANK. A path registered
without either fails test_every_registered_path_has_a_conformance_test."""

import os

import pytest

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.worker.paths import EXECUTION_PATHS
from tacit.worker.paths.torch_path import TorchPath

ONE_PROCESS = {"torch", "fused_decode", "split"}
MULTI_RANK = {
    "two_batch": "tests/engine/test_two_batch_overlap.py",
    "data_parallel": "tests/distributed/test_data_parallel_attention.py",
}
# bf16 through two layers on another summation order: ~1 ulp per op, at most ~1.1% of the largest
# logit on these tiny models (tests/kernels/test_fused_decode.py measures it); 2% is the bound.
LOGIT_TOLERANCE = 0.02


def test_every_registered_path_has_a_conformance_test():
    assert set(EXECUTION_PATHS) == ONE_PROCESS | set(MULTI_RANK)
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    assert all(os.path.exists(os.path.join(root, f)) for f in MULTI_RANK.values())


@pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="without the CPU kernels only the torch path exists in one process",
)
def test_every_one_process_path_matches_the_torch_path(tiny_model_factory):
    _, _, path = tiny_model_factory("llama")
    engine = LLM(str(path), dtype="bfloat16", block_size=4).engine
    runner = engine.runner
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    for p in ([5, 6, 7], list(range(10, 31)), [40] * 9):
        engine.add_request(p, params)
    for _ in range(3):
        engine.step()
    engine.add_request(list(range(50, 63)), params)  # the next step mixes three decodes and a prefill
    torch_path = next(p for p in runner.paths if isinstance(p, TorchPath))
    real, checked, steps = runner.forward_steps, set(), 0

    def checking(rows, pausable):
        """Every other path that accepts this step's rows against the torch path, then the step
        itself on the path the runner picks (each run rewrites the step's KV slots alike)."""
        nonlocal steps
        want = torch_path.run(rows)
        ref_samples, ref = want.samples, want.values
        for p in runner.paths:
            if p is torch_path or not p.accepts(rows, False):
                continue
            out = p.run(rows)
            samples, got = out.samples, out.values
            assert samples == ref_samples, p.name
            scale = ref.float().abs().max().item()
            assert (got.float() - ref.float()).abs().max().item() < LOGIT_TOLERANCE * scale, (p.name, steps)
            checked.add(p.name)
        steps += 1
        return (yield from real(rows, pausable))

    runner.forward_steps = checking
    try:
        for _ in range(3):  # the mixed step (three decodes, one prefill), then decode-only ones
            engine.step()
    finally:
        del runner.forward_steps
    assert checked == ONE_PROCESS - {"torch"}


class _RepeatLast:
    """Drafts for every other request: its last token twice (right or wrong, rows to verify)."""

    def propose(self, requests):
        return {r.req_id: [r.token_ids[-1]] * 2 for r in requests if int(r.req_id.rsplit("-", 1)[-1]) % 2 == 0}


@pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="without the CPU kernels only the torch path exists in one process",
)
def test_paths_give_one_logits_row_per_verified_draft_as_the_torch_path_does(tiny_model_factory):
    """Verify rows (a request's token and its drafts) beside one-token decodes: the fused decoder
    runs each verify row as its tokens' rows, alone and inside a split step beside a prefill, and
    every path must put every row back in place."""
    _, _, path = tiny_model_factory("llama")
    engine = LLM(str(path), dtype="bfloat16", block_size=4).engine
    engine.scheduler.spec.min_tokens = 1 << 30  # every draft verified, whatever the controller would say
    runner = engine.runner
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    for p in ([5, 6, 7], list(range(10, 31)), [40] * 9, [3, 1, 4, 1, 5]):
        engine.add_request(p, params)
    engine.step()
    runner.drafter = _RepeatLast()
    torch_path = next(p for p in runner.paths if isinstance(p, TorchPath))
    real, checked = runner.forward_steps, set()

    def checking(rows, pausable):
        want = torch_path.run(rows)
        for p in runner.paths:
            if p is torch_path or not p.accepts(rows, False):
                continue
            out = p.run(rows)
            assert out.samples == want.samples and out.values.shape == want.values.shape, p.name
            scale = want.values.float().abs().max().item()
            assert (out.values.float() - want.values.float()).abs().max().item() < LOGIT_TOLERANCE * scale, p.name
            checked.add(p.name)
        return (yield from real(rows, pausable))

    runner.forward_steps = checking
    try:
        for _ in range(2):
            engine.step()
        engine.add_request(list(range(50, 63)), params)  # a prefill beside the verifies: a split step
        engine.step()
    finally:
        del runner.forward_steps
    assert {"split", "fused_decode"} <= checked
