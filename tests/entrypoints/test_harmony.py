"""gpt-oss's harmony format read off token ids (tacit/entrypoints/openai/harmony.py): channels
split into reasoning and content, calls out of the commentary channel, the same whole or fed a
token at a time, and the choice of format from the model and vLLM's flags."""

from __future__ import annotations

import json
import logging

import pytest
from tiny_harmony import HARMONY_TEMPLATE, harmony_tokenizer

from tacit.entrypoints.openai.harmony import (
    HarmonyChatStream,
    HarmonyTokens,
    parse_header,
    select_harmony,
)
from tacit.tokenizer import Tokenizer

from tiny_models import build_tokenizer

CALL = (
    "<|channel|>analysis<|message|>The user wants Paris's weather; get_weather gives it.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
ANSWER = (
    "<|channel|>analysis<|message|>The tool says 22 °C.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Sunny in Paris: 22 °C, café weather.<|return|>"
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(harmony_tokenizer(), HARMONY_TEMPLATE, eos_token="<|return|>")


def ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def run(tok: Tokenizer, text: str, names=frozenset({"get_weather"}), one_by_one: bool = False):
    """(reasoning, content, calls) of a whole output, fed at once or a token at a time."""
    stream = HarmonyChatStream(HarmonyTokens.of(tok), tok, set(names))
    out = ids(tok, text)
    if not one_by_one:
        return stream.feed(out, final=True)
    reasoning, content, calls = "", "", []
    for k in range(1, len(out) + 1):
        r, c, new = stream.feed(out[:k], final=k == len(out))
        reasoning, content, calls = reasoning + r, content + c, calls + new
    return reasoning, content, calls


def test_markers_are_single_special_tokens(tok):
    t = HarmonyTokens.of(tok)
    assert ids(tok, "<|start|><|channel|><|message|><|end|><|return|><|call|><|constrain|>") == list(t.ids)
    assert t.stop_token_ids == [t.return_, t.call]


@pytest.mark.parametrize("one_by_one", [False, True])
def test_a_call_and_an_answer_split_into_reasoning_content_and_calls(tok, one_by_one):
    reasoning, content, calls = run(tok, CALL, one_by_one=one_by_one)
    assert reasoning == "The user wants Paris's weather; get_weather gives it." and content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    reasoning, content, calls = run(tok, ANSWER, one_by_one=one_by_one)
    assert (reasoning, content, calls) == ("The tool says 22 °C.", "Sunny in Paris: 22 °C, café weather.", [])


def test_a_streamed_call_arrives_whole_when_its_message_ends(tok):
    stream = HarmonyChatStream(HarmonyTokens.of(tok), tok, {"get_weather"})
    out = ids(tok, CALL)
    seen = [stream.feed(out[:k])[2] for k in range(1, len(out) + 1)]
    assert all(not calls for calls in seen[:-1]) and len(seen[-1]) == 1 and stream.num_calls == 1


@pytest.mark.parametrize(
    "header, role, channel, recipient, ctype",
    [
        ("<|channel|>analysis", "assistant", "analysis", None, None),
        (
            "assistant<|channel|>commentary to=functions.f <|constrain|>json",
            "assistant",
            "commentary",
            "functions.f",
            "json",
        ),
        ("assistant to=functions.f<|channel|>commentary json", "assistant", "commentary", "functions.f", "json"),
        (
            "assistant<|channel|>commentary to=functions.f<|constrain|>json",
            "assistant",
            "commentary",
            "functions.f",
            "json",
        ),
        ("functions.f to=assistant<|channel|>commentary", "functions.f", "commentary", "assistant", None),
    ],
)
def test_the_recipient_may_stand_before_or_after_the_channel(header, role, channel, recipient, ctype):
    m = parse_header(header)
    assert (m.role, m.channel, m.recipient, m.content_type) == (role, channel, recipient, ctype)


def test_recipient_before_the_channel_is_a_call(tok):
    text = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
    _, content, calls = run(tok, text)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]


def test_what_is_not_a_call_stays_content_never_dropped(tok):
    # An undeclared function, arguments that are not JSON, and a call cut off mid-JSON.
    undeclared = '<|channel|>commentary to=functions.launch <|constrain|>json<|message|>{"x": 1}<|call|>'
    assert run(tok, undeclared)[1:] == ('{"x": 1}', [])
    assert run(tok, "<|channel|>commentary to=functions.get_weather<|message|>Paris<|call|>")[1:] == ("Paris", [])
    assert run(tok, '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Pa')[1:] == ('{"city": "Pa', [])
    # Cut off (max_tokens) after its JSON closed: a call, as Hermes's rule has it.
    _, _, calls = run(tok, '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Rome"}')
    assert [c.name for c in calls] == ["get_weather"]
    # Output that never opens a message (a model not speaking harmony) is content as written.
    assert run(tok, "Paris is the capital")[:2] == ("", "Paris is the capital")
    assert run(tok, "Hello<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>")[:2] == ("", "HelloHi")
    # A commentary preamble without a recipient is for the user.
    assert run(tok, "<|channel|>commentary<|message|>Checking.<|end|>")[:2] == ("", "Checking.")


def test_marker_text_written_as_ordinary_tokens_does_not_end_a_message(tok):
    text = "<|channel|>final<|message|>a literal "
    out = ids(tok, text) + tok.encode("<", add_special_tokens=False) + ids(tok, "|end|> stays<|return|>")
    stream = HarmonyChatStream(HarmonyTokens.of(tok), tok, set())
    assert stream.feed(out, final=True)[1] == "a literal <|end|> stays"


def test_the_format_is_picked_from_the_model_or_vllms_flags(tok, caplog):
    gpt_oss = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    assert select_harmony(gpt_oss, tok, None, None) == HarmonyTokens.of(tok)
    assert select_harmony(llama, tok, None, None) is None
    assert select_harmony(llama, tok, "hermes", None) is None
    assert select_harmony(llama, tok, "openai", None) == HarmonyTokens.of(tok)
    assert select_harmony(llama, tok, None, "openai_gptoss") == HarmonyTokens.of(tok)
    with pytest.raises(ValueError, match="--tool-call-parser hermes: this model .GptOssForCausalLM"):
        select_harmony(gpt_oss, tok, "hermes", None)
    with pytest.raises(ValueError, match="only --tool-call-parser openai reads, not hermes"):
        select_harmony(llama, tok, "hermes", "openai_gptoss")
    plain = Tokenizer(build_tokenizer())
    with pytest.raises(ValueError, match="lacks <\\|start\\|>, <\\|channel\\|>"):
        select_harmony(llama, plain, "openai", None)
    with pytest.raises(ValueError, match="lacks <\\|start\\|>"):  # asked for by flag: refused
        select_harmony(gpt_oss, plain, None, "openai_gptoss")
    # A gpt-oss shape on another tokenizer (random:NAME) is served as text, with a warning.
    with caplog.at_level(logging.WARNING, logger="tacit.server"):
        assert select_harmony(gpt_oss, plain, None, None) is None
    assert "lacks harmony's special tokens" in caplog.text


def test_a_harmony_template_takes_tools_and_reasoning_effort(tok):
    assert tok.template_takes_tools and "reasoning_effort" in tok.template_variables
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tools=tools, template_kwargs={"reasoning_effort": "high"}
    )
    assert "Reasoning: high" in text and "type get_weather" in text and "<tool_call>" not in text
    assert "Reasoning: medium" in tok.apply_chat_template([{"role": "user", "content": "Hi"}])
