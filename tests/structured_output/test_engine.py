"""Constrained decoding end to end through LLM.generate, greedy on a tiny random model: the
model's own preferences are noise, so only the grammar can make the output valid."""

from __future__ import annotations

import json
import re

import pytest

from tacit import LLM, SamplingParams, StructuredOutputsParams
from tacit.structured_output.grammar import closed_objects
from tacit.worker.paths.base import finish

PROMPT = "Paris is the capital of"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}


def constrained(max_tokens: int = 200, **spec) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**spec))


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama[2]), dtype="float32")


def check_schema(obj: dict) -> None:
    assert set(obj) == {"name", "age", "ok", "tags"}
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 8
    assert isinstance(obj["age"], int) and not isinstance(obj["age"], bool) and 0 <= obj["age"] <= 150
    assert isinstance(obj["ok"], bool)
    assert isinstance(obj["tags"], list) and len(obj["tags"]) <= 3 and set(obj["tags"]) <= {"a", "b"}


def test_json_schema_output_parses_and_validates(llm):
    for schema in (SCHEMA, json.dumps(SCHEMA)):  # a dict or its JSON text
        out = llm.generate([PROMPT], constrained(json=schema))[0].outputs[0]
        assert out.finish_reason == "stop"  # the grammar ended it, well before max_tokens
        check_schema(json.loads(out.text))
    unconstrained = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=30))[0].outputs[0].text
    with pytest.raises(ValueError):
        json.loads(unconstrained)  # the model alone does not write JSON: the grammar did


def test_objects_are_closed_unless_the_schema_opens_them(llm):
    """A schema that does not say additionalProperties gets only its listed keys (xgrammar's
    strict default in vLLM); `additionalProperties: true` still allows more."""
    open_schema = {k: v for k, v in SCHEMA.items() if k != "additionalProperties"}
    out = llm.generate([PROMPT], constrained(json=open_schema))[0].outputs[0]
    check_schema(json.loads(out.text))
    closed = closed_objects(
        {"type": "object", "properties": {"a": {"type": "object"}}, "$defs": {"b": {"properties": {}}}}
    )
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["b"]["additionalProperties"] is False
    assert closed_objects({"type": "object", "additionalProperties": True})["additionalProperties"] is True


def test_json_object(llm):
    out = llm.generate(["Hello"], constrained(json_object=True))[0].outputs[0]
    assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict)


def test_regex_choice_and_grammar(llm):
    cases = [
        (dict(regex=r"[a-z]{3}-[0-9]{2}"), lambda t: re.fullmatch(r"[a-z]{3}-[0-9]{2}", t)),
        (dict(choice=["yes", "no", "maybe"]), lambda t: t in ("yes", "no", "maybe")),
        (
            dict(grammar='root ::= "x" digit digit? digit? "y"\ndigit ::= [0-9]'),
            lambda t: re.fullmatch(r"x\d{1,3}y", t),
        ),
        (dict(grammar='start: "a" ("b" | "cd")+ "!"'), lambda t: re.fullmatch(r"a(b|cd)+!", t)),  # Lark
    ]
    for spec, ok in cases:
        out = llm.generate([PROMPT], constrained(**spec))[0].outputs[0]
        assert ok(out.text), (spec, out.text)
        assert out.finish_reason == "stop"


def test_sampled_n_sequences_each_follow_the_grammar(llm):
    spec = StructuredOutputsParams(choice=["red", "green", "blue"])
    params = SamplingParams(temperature=1.5, seed=3, n=6, max_tokens=10, structured_outputs=spec)
    texts = [c.text for c in llm.generate([PROMPT], params)[0].outputs]
    assert set(texts) <= {"red", "green", "blue"} and len(texts) == 6


def test_unconstrained_request_is_unchanged_by_a_constrained_neighbour(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    sampled = SamplingParams(temperature=0.9, seed=7, max_tokens=20, ignore_eos=True)
    alone = [llm.generate([p], s)[0].outputs[0].token_ids for p, s in (("Once upon", greedy), ("The quick", sampled))]
    outs = llm.generate(["Once upon", PROMPT, "The quick"], [greedy, constrained(json=SCHEMA), sampled])
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == alone
    check_schema(json.loads(outs[1].outputs[0].text))


def test_out_of_tokens_ends_with_length_and_a_valid_prefix(llm):
    full = llm.generate([PROMPT], constrained(json=SCHEMA))[0].outputs[0]
    cut = llm.generate([PROMPT], constrained(max_tokens=5, json=SCHEMA))[0].outputs[0]
    assert cut.finish_reason == "length" and cut.token_ids == full.token_ids[:5]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_constrained_requests_resume_valid(tiny_llama, mode):
    """Low-priority constrained requests are pushed out by urgent ones mid-generation; when they
    resume their matchers carry on from the tokens they kept, token-identical to an undisturbed run."""
    path = str(tiny_llama[2])
    prompts = [[5 + i] * (40 + 10 * i) for i in range(6)]
    params = constrained(json=SCHEMA)
    ref = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(prompts, params)]
    e = LLM(path, dtype="float32", scheduling_policy="priority", max_num_seqs=2, preemption_mode=mode).engine
    ids = [e.add_request(p, params, priority=9) for p in prompts[:3]]
    for _ in range(4):
        e.step()
    ids += [e.add_request(p, params, priority=0) for p in prompts[3:]]
    results = {}
    while e.has_unfinished_requests():
        for out in e.step():
            if out.finished:
                results[out.request_id] = out.outputs[0]
    assert e.scheduler.num_preemptions > 0
    assert [results[i].token_ids for i in ids] == ref
    for i in ids:
        assert results[i].finish_reason == "stop"
        check_schema(json.loads(results[i].text))
    assert not e.scheduler.structured_output.matchers  # every matcher dropped with its request


@pytest.mark.parametrize(
    "spec, message",
    [
        (dict(regex="(ab"), r"(?s)structured_outputs\.regex is invalid: .*unclosed group"),
        (dict(json={"type": "nonsense"}), r"structured_outputs\.json is invalid: .*nonsense"),
        (dict(json="{not json"), r"structured_outputs\.json is invalid"),
        (dict(grammar="root ::= ("), r"structured_outputs\.grammar is invalid"),
    ],
)
def test_invalid_grammar_is_refused_when_added(llm, spec, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([PROMPT], constrained(**spec))
    assert not llm.engine.has_unfinished_requests()
    assert not llm.engine.scheduler.structured_output.matchers
    assert llm.generate([PROMPT], constrained(choice=["ok"]))[0].outputs[0].text == "ok"  # still serving


@pytest.mark.parametrize("kwargs", [{}, dict(regex="a", choice=["a"]), dict(json={}, json_object=True)])
def test_exactly_one_structured_field(kwargs):
    with pytest.raises(ValueError, match="exactly one of json, json_object, regex, choice, grammar"):
        StructuredOutputsParams(**kwargs)


def test_constrained_request_cutting_in_mid_step(tiny_llama):
    """A constrained urgent request prefilled between the layers of a step whose rows are
    constrained too: each gets its own mask from its own matcher, tokens as in a plain run."""
    path = str(tiny_llama[2])
    batch = [[5 + i] * (20 + 3 * i) for i in range(3)]
    urgent = [9, 8, 7, 6, 5, 4, 3]
    params = [constrained(json=SCHEMA), constrained(regex="[a-z]{2,40}"), SamplingParams(temperature=0.0)]
    urgent_params = constrained(choice=["first", "second"])
    ref = [
        o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(batch + [urgent], params + [urgent_params])
    ]
    e = LLM(path, dtype="float32", scheduling_policy="priority").engine
    ids = [e.add_request(p, sp, priority=1) for p, sp in zip(batch, params)]
    for _ in range(2):
        e.step()
    arrived = []

    def between_layers():
        if not arrived:
            arrived.append(e.add_request(urgent, urgent_params, priority=0))
        e.cut_in_step()

    finish(e.step_in_layers(), between_layers)
    done = {}
    while e.has_unfinished_requests():
        for out in e.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    assert e.get_stats().num_cut_ins == 1
    assert [done[i].token_ids for i in ids + arrived] == ref
    check_schema(json.loads(done[ids[0]].text))
    assert done[arrived[0]].text in ("first", "second")


def test_a_constrained_prompt_only_scored_beside_a_sampling_request(llm):
    """max_tokens=0 samples nothing, so its grammar gets no mask row even in a step where another
    request samples (the scheduler and the runner agree on which rows sample)."""
    eng = llm.engine
    eng.add_request(PROMPT, SamplingParams(max_tokens=0, structured_outputs=StructuredOutputsParams(regex="[a-z]+")))
    eng.add_request("Hello", SamplingParams(temperature=0.0, max_tokens=3))
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    reasons = sorted((len(c.token_ids), c.finish_reason) for c in done.values())
    assert reasons == [(0, "length"), (3, "length")]
