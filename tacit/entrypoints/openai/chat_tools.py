"""What `tools` and `tool_choice` mean for one chat request: checked, turned into prompt and
sampling settings, and the generated text turned back into `message.tool_calls`."""

from __future__ import annotations

import json
from typing import Any

from tacit.entrypoints.openai.chat_protocol import (
    ChatCompletionRequest,
    ChatResponseMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCallOut,
)
from tacit.entrypoints.openai.errors import bad_request
from tacit.entrypoints.openai.harmony import HarmonyChatStream, HarmonyTokens
from tacit.entrypoints.openai.tool_parser import END, StreamingToolParser, ToolCall, parse_tool_calls
from tacit.outputs import CompletionOutput
from tacit.sampling_params import SamplingParams, StructuredOutputsParams
from tacit.tokenizer import Tokenizer


class ChatTools:
    def __init__(
        self, req: ChatCompletionRequest, harmony: HarmonyTokens | None = None, tokenizer: Tokenizer | None = None
    ) -> None:
        """harmony (with the tokenizer): the model writes gpt-oss's harmony format, read off the
        token ids (harmony.py): reasoning split out, calls from its commentary channel."""
        self.harmony, self.tokenizer = harmony, tokenizer
        self.mode = req.tool_mode
        self.definitions: list[dict[str, Any]] | None = req.tool_definitions()
        self.names = {t.function.name for t in req.tools or []}
        self.parallel = req.parallel_tool_calls
        self.schemas = {t.function.name: t.function.parameters or {"type": "object"} for t in req.tools or []}
        self.named = req.tool_choice.function.name if self.mode == "named" else None
        if req.tool_choice is not None and req.tool_choice != "none" and not req.tools:
            raise bad_request("tool_choice needs tools: there is no tool to call", "tool_choice")
        if self.named is not None and self.named not in self.names:
            raise bad_request(
                f"tool_choice names the function {self.named!r}, which is not among tools ({', '.join(sorted(self.names))})",
                "tool_choice",
            )
        if self.constrained and req.structured_outputs_spec() is not None:
            raise bad_request(
                f'tool_choice "{self.mode}" constrains the output to a tool call; it cannot also follow '
                f"{req.structured_param}",
                "tool_choice",
            )
        if harmony is not None and self.constrained:
            # The grammar would make the whole output one JSON value, where gpt-oss writes its
            # call inside a harmony message: refused by name, not answered with a broken call.
            raise bad_request(
                f'tool_choice "{self.mode}" is not supported on a model that writes the harmony format '
                f'(gpt-oss); use "auto" or "none"',
                "tool_choice",
            )
        if self.mode == "auto" and any(t.function.strict for t in req.tools or []):
            # "auto" lets the model answer in prose, so nothing forces its arguments to match
            # the schema; refusing beats a strictness promise the output may not keep.
            raise bad_request("strict tools are not supported with tool_choice auto", "tools")

    @property
    def active(self) -> bool:
        return self.definitions is not None

    @property
    def parses_output(self) -> bool:
        """Whether the output is read for more than its text: tool calls, or harmony's channels
        (a harmony output is parsed even with no tools: its reasoning is not content)."""
        return self.active or self.harmony is not None

    @property
    def constrained(self) -> bool:
        """ "required" or a named function: the grammar makes the whole output a call, as JSON
        (vLLM's shapes: the named function's arguments; for "required" a list of
        {"name", "parameters"} objects)."""
        return self.mode in ("required", "named")

    def output_schema(self) -> dict[str, Any]:
        if self.named is not None:
            return self.schemas[self.named]
        one_call = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for name, schema in self.schemas.items()
            ]
        }
        calls: dict[str, Any] = {"type": "array", "items": one_call, "minItems": 1}
        if not self.parallel:
            calls["maxItems"] = 1
        return calls

    def adjust(self, params: SamplingParams) -> str | None:
        """Fit params to the tool choice; returns the request field a grammar error should name.
        parallel_tool_calls=false under "auto": generation ends with the first call's closing
        tag; "required"/named: the output is constrained to the call's JSON."""
        if self.constrained:
            params.structured_outputs = StructuredOutputsParams(json=self.output_schema())
            return "tools"
        if self.harmony is not None:  # <|call|> ends the turn: one call per turn whatever parallel says
            params.stop_token_ids.extend(t for t in self.harmony.stop_token_ids if t not in params.stop_token_ids)
            return None
        if self.active and not self.parallel:
            params.stop.append(END)
        return None

    def constrained_calls(self, text: str) -> list[ToolCall]:
        """The calls in a constrained output (empty if it was cut off before its JSON closed)."""
        try:
            value = json.loads(text)
        except ValueError:
            return []
        if self.named is not None:
            return [ToolCall(self.named, json.dumps(value, ensure_ascii=False))] if isinstance(value, dict) else []
        if not isinstance(value, list):
            return []
        return [
            ToolCall(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False))
            for c in value
            if isinstance(c, dict) and c.get("name") in self.names
        ]

    def message(self, c: CompletionOutput) -> tuple[ChatResponseMessage, str | None]:
        """A finished choice's message and finish_reason ("tool_calls" when it called)."""
        text, finish_reason = c.text, c.finish_reason
        if self.harmony is not None:
            reasoning, content, calls = self.stream_parser().feed(c.token_ids, final=True)
            message = ChatResponseMessage(
                reasoning_content=reasoning or None,
                content=content or None,
                tool_calls=[_out(x) for x in calls] or None,
            )
            return message, (_finish(finish_reason) if calls else finish_reason)
        if not self.active:
            return ChatResponseMessage(content=text), finish_reason
        if self.constrained:
            calls = self.constrained_calls(text)
            if not calls:  # cut off by max_tokens: what was generated is all there is
                return ChatResponseMessage(content=text), finish_reason
            return ChatResponseMessage(content=None, tool_calls=[_out(c) for c in calls]), _finish(finish_reason)
        content, calls = parse_tool_calls(text, self.names)
        if not calls:
            return ChatResponseMessage(content=text), finish_reason
        return ChatResponseMessage(content=content, tool_calls=[_out(c) for c in calls]), _finish(finish_reason)

    def stream_parser(self) -> StreamingToolParser | ConstrainedToolStream | HarmonyChatStream:
        if self.harmony is not None:
            return HarmonyChatStream(self.harmony, self.tokenizer, self.names if self.active else set())
        return ConstrainedToolStream(self) if self.constrained else StreamingToolParser(self.names)


def stream_delta(
    parser: StreamingToolParser | ConstrainedToolStream | HarmonyChatStream, c: CompletionOutput
) -> tuple[str, str, list[ToolCall]]:
    """(new reasoning text, new content text, calls completed) of a streamed choice: a harmony
    output is read off its token ids, any other off its text (which has no reasoning)."""
    final = c.finish_reason is not None
    if isinstance(parser, HarmonyChatStream):
        return parser.feed(c.token_ids, final)
    content, calls = parser.feed(c.text, final)
    return "", content, calls


class ConstrainedToolStream:
    """A constrained output is one JSON value: its calls are sent when it is complete (a client
    never sees half a call), and no content before them."""

    def __init__(self, tools: ChatTools) -> None:
        self.tools = tools
        self.num_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        if not final:
            return "", []
        calls = self.tools.constrained_calls(text)
        self.num_calls += len(calls)
        return ("" if calls else text), calls


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
