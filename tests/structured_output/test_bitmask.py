"""The manager's bitmask and the sampler's use of it, without a model."""

from __future__ import annotations

import numpy as np
import torch

from tacit.layers.sampler import Sampler, SamplingMetadata, apply_grammar_bitmask, unpack_bitmask
from tacit.sampling_params import SamplingParams, StructuredOutputsParams
from tacit.structured_output import StructuredOutputManager
from tacit.tokenizer import Tokenizer

from tiny_models import build_tokenizer

PAD = 45  # logits wider than the tokenizer, as when a checkpoint pads its vocabulary to a multiple of 64


def manager() -> tuple[StructuredOutputManager, Tokenizer]:
    tok = Tokenizer(build_tokenizer(), eos_token="<|im_end|>")
    return StructuredOutputManager(tok, tok.vocab_size + PAD, [tok.eos_token_id]), tok


def test_bitmask_allows_exactly_the_grammar_tokens_and_never_padding():
    m, tok = manager()
    m.add_request("a", StructuredOutputsParams(choice=["yes", "no"]))
    m.add_request("b", StructuredOutputsParams(regex="[0-9]+"))
    bitmask = m.grammar_bitmask(["a", "b"])
    assert bitmask.dtype == np.int32 and bitmask.shape == (2, -(-(tok.vocab_size + PAD) // 32))
    allowed = unpack_bitmask(torch.from_numpy(bitmask), tok.vocab_size + PAD)
    first = {tok.tokenizer.id_to_token(i) for i in allowed[0].nonzero().flatten().tolist()}
    assert first and all("yes".startswith(t) or "no".startswith(t) for t in first)
    digits = allowed[1].nonzero().flatten().tolist()
    assert digits and all(tok.decode([i]).isdigit() for i in digits)
    assert not allowed[:, tok.vocab_size :].any()  # padding ids are never allowed


def test_accept_token_reports_the_end_of_the_grammar():
    m, tok = manager()
    m.add_request("a", StructuredOutputsParams(choice=["yes"]))
    ids = tok.encode("yes")
    assert [m.accept_token("a", t) for t in ids] == [False] * (len(ids) - 1) + [True]
    assert not m.accept_token("unconstrained", 5)  # not one of the manager's requests
    m.remove_request("a")
    assert not m


def test_compiled_grammars_are_cached_by_spec():
    m, tok = manager()
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}
    a = m.compiler.compile(StructuredOutputsParams(json=schema))
    assert m.compiler.compile(StructuredOutputsParams(json=dict(schema))) is a
    # Property order is the schema's (llguidance writes them in that order): not one spec.
    flipped = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    assert m.compiler.compile(StructuredOutputsParams(json=flipped)) is not a
    m.add_request("r", StructuredOutputsParams(json=schema))
    assert all(not m.accept_token("r", t) for t in tok.encode('{"b": 1, "a": 2'))


def test_sampler_masks_only_the_constrained_rows():
    logits = torch.randn(3, 70)
    bitmask = torch.zeros(1, 3, dtype=torch.int32)
    bitmask[0, 1] = 1 << 9  # only token 41
    masked = apply_grammar_bitmask(logits, [1], bitmask)
    assert torch.equal(masked[[0, 2]], logits[[0, 2]])
    assert masked[1, 41] == logits[1, 41] and torch.isinf(masked[1]).sum() == 69
    params = [SamplingParams(temperature=0.0, logprobs=2)] * 3
    meta = SamplingMetadata(params, [[]] * 3, [None] * 3, grammar_bitmask=bitmask, grammar_rows=[1])
    out = Sampler()(logits, meta)
    assert out.token_ids[1] == 41 and out.token_ids[0] == int(logits[0].argmax())
    assert all(lp != float("-inf") for _, lp in out.logprobs[1][2])  # the model's logprobs, finite


def test_unpack_pads_and_in_place_masking_of_every_row():
    bits = unpack_bitmask(torch.full((2, 1), -1, dtype=torch.int32), 40)
    assert bits.shape == (2, 40) and bits[:, :32].all() and not bits[:, 32:].any()
    logits = torch.randn(2, 40)
    bitmask = torch.tensor([[1 << 3], [1 << 30]], dtype=torch.int32)
    out = apply_grammar_bitmask(logits, [0, 1], bitmask, inplace=True)
    assert out is logits and out.argmax(dim=-1).tolist() == [3, 30] and torch.isinf(out).sum() == 78
