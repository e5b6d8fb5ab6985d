"""Tool calls out of generated text, in the Hermes format every chat template tacit renders
tools for asks for (tacit/tokenizer.py): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Whole outputs are parsed at once; streams go through StreamingToolParser, which passes text on
as it comes but holds back anything that may be the start of a call, so no client sees the
tags of a call as content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# vLLM's --tool-call-parser names of the formats tacit reads: Hermes's, parsed here (the tools prompt
# tacit writes asks for it; Qwen2.5/Qwen3 and Hermes templates do too), and "openai", gpt-oss's
# harmony format, read off token ids in harmony.py.
TOOL_CALL_PARSERS = ("hermes", "openai")
START, END = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(START) + r"(.*?)(?:" + re.escape(END) + r"|$)", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it


def parse_call(body: str, tool_names: set[str]) -> ToolCall | None:
    """One call's JSON, or None when it is not a call to a declared tool (then it stays text)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in tool_names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str | None, list[ToolCall]]:
    """(content outside the calls, or None if nothing but whitespace; the calls). A call cut off
    by max_tokens or EOS before its closing tag counts if its JSON is complete."""
    calls, content, pos = [], [], 0
    for m in _CALL.finditer(text):
        call = parse_call(m.group(1).strip(), tool_names)
        if call is None:
            continue
        calls.append(call)
        content.append(text[pos : m.start()])
        pos = m.end()
    content.append(text[pos:])
    rest = "".join(content).strip() if calls else "".join(content)
    return (rest or None), calls


class StreamingToolParser:
    """Feed the text generated so far; get back content to send and calls completed since."""

    def __init__(self, tool_names: set[str]) -> None:
        self.tool_names = tool_names
        self.sent = 0  # characters of the text already handled (sent as content or parsed)
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        content, calls = [], []
        while True:
            rest = text[self.sent :]
            start = rest.find(START)
            if start < 0:
                # Hold back a tail that could be the start of "<tool_call>" until it is decided.
                hold = 0 if final else _partial_prefix(rest, START)
                content.append(rest[: len(rest) - hold])
                self.sent += len(rest) - hold
                break
            content.append(rest[:start])
            end = rest.find(END, start)
            if end < 0 and not final:
                self.sent += start  # inside a call: wait for its closing tag
                break
            stop = end + len(END) if end >= 0 else len(rest)
            call = parse_call(rest[start + len(START) : end if end >= 0 else len(rest)].strip(), self.tool_names)
            if call is None:
                content.append(rest[start:stop])  # not a call after all: it was text
            else:
                calls.append(call)
            self.sent += stop
        self.num_calls += len(calls)
        text_out = "".join(content)
        if self.num_calls and not text_out.strip():
            text_out = ""  # the newlines between calls are not content
        return text_out, calls


def _partial_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
