"""What `tools` and `tool_choice` mean for one chat request: checked, turned into prompt and
sampling settings, and the generated text turned back into `message.tool_calls`."""

from __future__ import annotations

from typing import Any

from tacit.entrypoints.openai.errors import bad_request
from tacit.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatResponseMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCallOut,
)
from tacit.entrypoints.openai.tool_parser import END, StreamingToolParser, ToolCall, parse_tool_calls
from tacit.sampling_params import SamplingParams


class ChatTools:
    def __init__(self, req: ChatCompletionRequest) -> None:
        self.mode = req.tool_mode
        self.definitions: list[dict[str, Any]] | None = req.tool_definitions()
        self.names = {t.function.name for t in req.tools or []}
        self.parallel = req.parallel_tool_calls
        if req.tool_choice is not None and req.tool_choice != "none" and not req.tools:
            raise bad_request("tool_choice needs tools: there is no tool to call", "tool_choice")
        if self.mode in ("required", "named"):
            raise bad_request(
                f'tool_choice "{self.mode}" is not supported yet: it needs constrained decoding; use "auto"',
                "tool_choice",
            )
        if self.mode == "auto" and any(t.function.strict for t in req.tools or []):
            # "auto" lets the model answer in prose, so nothing forces its arguments to match
            # the schema; refusing beats a strictness promise the output may not keep.
            raise bad_request("strict tools are not supported with tool_choice auto", "tools")

    @property
    def active(self) -> bool:
        return self.definitions is not None

    def adjust(self, params: SamplingParams) -> None:
        """parallel_tool_calls=false: generation ends with the first call's closing tag."""
        if self.active and not self.parallel:
            params.stop.append(END)

    def message(self, text: str, finish_reason: str | None) -> tuple[ChatResponseMessage, str | None]:
        """A finished choice's message and finish_reason ("tool_calls" when it called)."""
        if not self.active:
            return ChatResponseMessage(content=text), finish_reason
        content, calls = parse_tool_calls(text, self.names)
        if not calls:
            return ChatResponseMessage(content=text), finish_reason
        return ChatResponseMessage(content=content, tool_calls=[_out(c) for c in calls]), _finish(finish_reason)

    def stream_parser(self) -> StreamingToolParser:
        return StreamingToolParser(self.names)


def _out(call: ToolCall) -> ToolCallOut:
    return ToolCallOut(function=FunctionCall(name=call.name, arguments=call.arguments))


def _finish(finish_reason: str | None) -> str | None:
    # A call ended by EOS (or by the stop tag parallel_tool_calls=false adds) is a tool call;
    # one cut off by max_tokens stays "length", as OpenAI reports it.
    return "tool_calls" if finish_reason == "stop" else finish_reason


def delta_tool_calls(calls: list[ToolCall], first_index: int) -> list[DeltaToolCall]:
    """Each completed call as one delta with its whole arguments (the protocol allows them in
    pieces; a call is sent once its JSON has parsed, so a client never sees half a call)."""
    return [
        DeltaToolCall(index=first_index + i, function=FunctionCall(name=c.name, arguments=c.arguments))
        for i, c in enumerate(calls)
    ]


def stream_finish_reason(finish_reason: str | None, num_calls: int) -> str | None:
    return _finish(finish_reason) if num_calls and finish_reason is not None else finish_reason
