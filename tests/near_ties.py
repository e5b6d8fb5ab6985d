"""Token-by-token comparison of two greedy runs whose arithmetic differs by rounding (bf16 sums
in another order, another weight or activation rounding): logprobs within a tolerance while the
tokens agree, and a parting allowed only at a near tie.

For two bf16 runs of one model the tolerance is derived, not chosen: `bf16_noise_floor` measures
how far the reference run's logprobs sit from exact (float32) arithmetic on the same bf16-valued
weights, teacher-forced along the reference's own tokens. A second bf16 run rounds the same
tensors to bf16 at the same places (only the order of its float32 sums differs: the all-reduce's
split, AMX tiles against AVX512 dot products), so it sits about as far from exact arithmetic, and
the two runs within twice that of each other. A constant does not hold across hosts: with logits
in bf16 a one-ulp flip of a logit in [8, 16) is 0.0625, which a 0.06 tolerance refused on a host
whose oneDNN picks AMX for the prefill GEMMs (0.034 with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16).
"""

from __future__ import annotations

from pathlib import Path


def assert_same_up_to_near_ties(ref, got, tol: float = 0.06):
    """Tokens must agree until a step where the reference's top two were within 2 * tol (a near
    tie either rounding may break); until then each logprob both runs report agrees within tol."""
    for a, b in zip(ref, got):
        ta, tb = a.outputs[0].token_ids, b.outputs[0].token_ids
        for i, (lp_a, lp_b) in enumerate(zip(a.outputs[0].logprobs, b.outputs[0].logprobs)):
            for token, lp in lp_a.items():
                if token in lp_b:
                    assert abs(lp.logprob - lp_b[token].logprob) < tol, (
                        f"step {i}, token {token}: {lp.logprob} vs {lp_b[token].logprob}, bound {tol}"
                    )
            if ta[i] != tb[i]:
                top = sorted((lp.logprob for lp in lp_a.values()), reverse=True)
                assert top[0] - top[1] < 2 * tol, f"step {i}: {ta[i]} vs {tb[i]} with a gap of {top[0] - top[1]}"
                break


def save_bf16_valued(model, path: Path) -> Path:
    """The HF model saved with every weight rounded to bf16 (kept in float32): a float32 engine on
    it computes exactly what a bf16 engine's weights hold, so the two differ by arithmetic only,
    not by the weights' own rounding (which moved DeepSeek's router past near-ties: 0.96 off)."""
    import torch

    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                t.copy_(t.to(torch.bfloat16).float())
    model.save_pretrained(path)
    return path


def bf16_noise_floor(exact, prompts: list[list[int]], outs) -> float:
    """The largest distance of any logprob a bf16 run reported from the float32 engine `exact`'s,
    teacher-forced along that run's own tokens (prompt + generated, one prefill of each)."""
    chunks = [p + o.outputs[0].token_ids for p, o in zip(prompts, outs)]
    worst = 0.0
    for p, o, rows in zip(prompts, outs, exact.score_full_logprobs(chunks)):
        for i, logprobs in enumerate(o.outputs[0].logprobs):
            row = rows[len(p) - 1 + i]
            worst = max([worst] + [abs(lp.logprob - row[t].item()) for t, lp in logprobs.items()])
    return worst


def assert_bf16_runs_agree(exact, prompts: list[list[int]], ref, got) -> None:
    """ref and got, two bf16 runs of the model `exact` (float32, bf16-valued weights) holds, agree
    within twice the reference's distance from exact arithmetic (see the module docstring). A
    wrong shard or a missing all-reduce moves logprobs by whole units, far past that bound."""
    floor = bf16_noise_floor(exact, prompts, ref)
    assert floor > 0.0, "the bf16 run matched float32 exactly: is it running in bf16 at all?"
    assert_same_up_to_near_ties(ref, got, tol=2 * floor)
