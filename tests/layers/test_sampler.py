import math

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.layers.sampler import Sampler, SamplingMetadata


def metadata(*params: SamplingParams, output_token_ids: list[list[int]] | None = None) -> SamplingMetadata:
    gens = [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in params]
    return SamplingMetadata(list(params), output_token_ids or [[] for _ in params], gens)


def draw(logits: torch.Tensor, n: int, **kw) -> list[int]:
    sampler = Sampler()
    return sampler(logits.expand(n, -1).clone(), metadata(*[SamplingParams(**kw) for _ in range(n)])).token_ids


LOGITS = torch.tensor([[4.0, 3.0, 2.5, 2.0, 1.0, 0.0, -1.0, -3.0]])


def test_greedy_is_argmax():
    assert draw(LOGITS, 4, temperature=0.0) == [0, 0, 0, 0]


def test_top_k_never_emits_excluded():
    assert set(draw(LOGITS, 4000, temperature=5.0, top_k=3)) <= {0, 1, 2}


def test_top_p_never_emits_excluded():
    probs = LOGITS.softmax(-1)[0]
    # Smallest prefix of sorted tokens whose mass reaches 0.8.
    cum = probs.cumsum(0)
    keep = int((cum < 0.8).sum()) + 1
    got = set(draw(LOGITS, 4000, temperature=1.0, top_p=0.8))
    assert got <= set(range(keep)) and len(got) == keep


def test_min_p_never_emits_excluded():
    probs = LOGITS.softmax(-1)[0]
    allowed = {i for i, p in enumerate(probs.tolist()) if p >= 0.2 * probs.max()}
    assert set(draw(LOGITS, 4000, temperature=1.0, min_p=0.2)) <= allowed


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_statistics(temperature):
    n = 20000
    counts = torch.bincount(torch.tensor(draw(LOGITS, n, temperature=temperature)), minlength=8).float()
    expected = (LOGITS[0] / temperature).softmax(-1) * n
    # Chi-square against softmax(logits / T); 7 dof, p=0.001 critical value 24.3.
    mask = expected > 5
    chi2 = float((((counts - expected) ** 2) / expected)[mask].sum())
    assert chi2 < 24.3, (counts, expected)


def test_seeded_rows_independent_of_batch():
    sampler = Sampler()
    logits = torch.randn(1, 50)
    alone = sampler(logits.clone(), metadata(SamplingParams(temperature=1.0, seed=7))).token_ids
    for _ in range(3):
        rows = metadata(
            SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=0.0)
        )
        batch = torch.cat([torch.randn(1, 50), logits, torch.randn(1, 50)])
        assert sampler(batch, rows).token_ids[1] == alone[0]


def test_penalties_lower_repeated_tokens():
    r = metadata(SamplingParams(temperature=0.0, frequency_penalty=2.0), output_token_ids=[[0, 0]])
    assert Sampler()(LOGITS.clone(), r).token_ids == [1]  # 4 - 2*2 = 0 < 3


def test_logprobs_of_chosen_and_top_n():
    out = Sampler()(LOGITS.clone(), metadata(SamplingParams(temperature=0.0, logprobs=3)))
    chosen_lp, rank, top = out.logprobs[0]
    ref = LOGITS[0].log_softmax(-1)
    assert rank == 1 and math.isclose(chosen_lp, float(ref[0]), rel_tol=1e-5)
    assert [t for t, _ in top] == [0, 1, 2]


def test_seed_reproduces_across_batch_compositions(tiny_llama):
    _, _, path = tiny_llama
    llm = LLM(str(path), dtype="float32")
    seeded = SamplingParams(temperature=1.0, seed=42, max_tokens=12, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["hello there"], seeded)[0].outputs[0].token_ids
    mixed = llm.generate(["a longer prompt about Paris", "hello there", "x"], [other, seeded, other])
    assert mixed[1].outputs[0].token_ids == alone
    unseeded = [llm.generate(["hello there"], other)[0].outputs[0].token_ids for _ in range(3)]
    assert len({tuple(u) for u in unseeded}) > 1  # no seed: draws differ run to run
