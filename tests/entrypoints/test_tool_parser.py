"""Tool calls parsed out of generated text, whole and streamed, and tools rendered into prompts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from tacit.entrypoints.openai.tool_parser import StreamingToolParser, parse_tool_calls  # noqa: E402
from tacit.tokenizer import Tokenizer  # noqa: E402

from tiny_models import CHAT_TEMPLATE, build_tokenizer  # noqa: E402

NAMES = {"get_weather", "add"}
TEXT = (
    "Let me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)


def test_whole_output_calls_and_content():
    content, calls = parse_tool_calls(TEXT, NAMES)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1, "b": 2}),
    ]
    # Prose stays prose; a call to an undeclared tool or broken JSON stays text, never dropped.
    assert parse_tool_calls("Just prose.", NAMES) == ("Just prose.", [])
    bad = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse_tool_calls(bad, NAMES) == (bad, [])
    assert parse_tool_calls("<tool_call>{not json</tool_call>", NAMES)[1] == []
    # A call cut off before its closing tag (EOS or the parallel_tool_calls=false stop) counts.
    _, calls = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n', NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1})]


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streamed_output_matches_whole(step):
    parser = StreamingToolParser(NAMES)
    content, calls = [], []
    for end in range(step, len(TEXT) + step, step):
        text, new = parser.feed(TEXT[:end], final=end >= len(TEXT))
        assert "<" not in text, "no tag of a call may leak into content"
        content.append(text)
        calls += new
    whole_content, whole_calls = parse_tool_calls(TEXT, NAMES)
    assert "".join(content).strip() == whole_content
    assert calls == whole_calls


def test_streamed_prose_with_a_lone_angle_bracket_is_sent():
    parser = StreamingToolParser(NAMES)
    assert parser.feed("a < b <tool") == ("a < b ", [])  # the tail might open a call: held
    assert parser.feed("a < b <tools are nice", final=True) == ("<tools are nice", [])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_a_template_without_tools_gets_them_in_a_system_turn():
    tok = Tokenizer(build_tokenizer(), CHAT_TEMPLATE, eos_token="<|im_end|>")
    assert not tok.template_takes_tools
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text
    # Without tools the prompt is what it always was.
    assert tok.apply_chat_template(messages[:2]) == tok.apply_chat_template(messages[:2], tools=None)
    assert "# Tools" not in tok.apply_chat_template(messages[:2])


def test_a_hermes_template_renders_tools_itself():
    template = (
        "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t['function']['name'] }}{% endfor %}"
        "<tool_call><|im_end|>\n{% endif %}" + CHAT_TEMPLATE
    )
    tok = Tokenizer(build_tokenizer(), template, eos_token="<|im_end|>")
    assert tok.template_takes_tools
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=TOOLS)
    assert "TOOLS:get_weather" in text and "# Tools" not in text


def test_parallel_tool_calls_false_stops_after_the_first_call():
    from tacit.entrypoints.openai.chat_protocol import ChatCompletionRequest
    from tacit.entrypoints.openai.chat_tools import ChatTools
    from tacit.sampling_params import SamplingParams

    base = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    params = SamplingParams()
    ChatTools(ChatCompletionRequest(**base, parallel_tool_calls=False)).adjust(params)
    assert params.stop == ["</tool_call>"]
    params = SamplingParams()
    ChatTools(ChatCompletionRequest(**base)).adjust(params)
    assert params.stop == [] and params.structured_outputs is None
    named = ChatCompletionRequest(**base, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    params = SamplingParams()
    assert ChatTools(named).adjust(params) == "tools"
    assert params.structured_outputs.json == TOOLS[0]["function"]["parameters"]


def test_malformed_tool_calls_in_history_are_a_value_error():
    tok = Tokenizer(build_tokenizer(), CHAT_TEMPLATE, eos_token="<|im_end|>")
    bad = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}]
    with pytest.raises(ValueError, match="tool_calls must be a list"):
        tok.apply_chat_template(bad, tools=TOOLS)
