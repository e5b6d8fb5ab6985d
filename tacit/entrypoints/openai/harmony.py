"""gpt-oss's harmony format, read off the generated token ids.

A turn is a run of messages, each `<|start|>ROLE[ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT]
[<|constrain|>TYPE]<|message|>TEXT` ended by `<|end|>` (more follows), `<|return|>` (the turn's
final answer) or `<|call|>` (a tool call: the recipient `functions.NAME`, the text its JSON
arguments). The prompt ends with `<|start|>assistant`, so the output opens inside a header.

Parsed on token ids, not text: the markers are special tokens, which the engine's detokenizer
drops (skip_special_tokens), and a marker's text typed by the model as ordinary tokens must
not end a message. Only the text between markers is decoded, one IncrementalDetokenizer per
message, so a streamed message costs the same per token however long it grows.
The openai_harmony package is not used: it tokenizes with the o200k_harmony vocabulary, which it
downloads at run time, so it could not read a checkpoint's own (or a test's) token ids offline.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

from tacit.engine.detokenizer import IncrementalDetokenizer
from tacit.entrypoints.openai.tool_parser import ToolCall
from tacit.tokenizer import Tokenizer

# The harmony special tokens (gpt-oss's tokenizer: ids 200006, 200005, 200008, 200007, 200002,
# 200012, 200003): all of them must be special tokens of a tokenizer the parser reads.
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")
_RECIPIENT = re.compile(r"\bto=(\S+)")
logger = logging.getLogger("tacit.server")


@dataclass(frozen=True)
class HarmonyTokens:
    start: int
    channel: int
    message: int
    end: int
    return_: int
    call: int
    constrain: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> "HarmonyTokens":
        missing = [m for m in MARKERS if m not in tokenizer.special_ids]
        if missing:
            raise ValueError(
                f"the harmony format needs the special tokens {', '.join(MARKERS)}; this tokenizer lacks "
                f"{', '.join(missing)} (is this a gpt-oss checkpoint?)"
            )
        return cls(*(tokenizer.special_ids[m] for m in MARKERS))

    @property
    def stop_token_ids(self) -> list[int]:
        """<|return|> ends the turn with an answer, <|call|> with a tool call: generation stops at
        either (gpt-oss's generation_config lists both as EOS; a checkpoint that does not still stops)."""
        return [self.return_, self.call]

    @property
    def ids(self) -> tuple[int, ...]:
        return (self.start, self.channel, self.message, self.end, self.return_, self.call, self.constrain)


@dataclass
class HarmonyMessage:
    """One message of the output: its header's fields and its text so far."""

    role: str = "assistant"
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    text: str = ""
    ended_by: str | None = None  # "<|end|>", "<|return|>" or "<|call|>"; None while open


def parse_header(header: str, default_role: str = "assistant") -> HarmonyMessage:
    """A header's text (markers kept) as a message's fields. The recipient may stand in the role
    part (`assistant to=functions.f<|channel|>commentary`) or the channel part
    (`<|channel|>commentary to=functions.f`); the content type follows <|constrain|> or stands
    last in the channel part (`commentary json`)."""
    spaced = header.replace("<|constrain|>", " <|constrain|> ").replace("<|channel|>", " <|channel|> ")
    recipient = _RECIPIENT.search(spaced)
    role_part, _, channel_part = spaced.partition("<|channel|>")
    role_words = [w for w in role_part.split() if not w.startswith("to=")]
    channel_words = [w for w in channel_part.split() if not w.startswith("to=")]
    content_type = None
    if "<|constrain|>" in channel_words:
        i = channel_words.index("<|constrain|>")
        content_type = channel_words[i + 1] if i + 1 < len(channel_words) else None
        channel_words = channel_words[:i]
    elif len(channel_words) > 1:
        content_type = channel_words[-1]
    return HarmonyMessage(
        role=role_words[0] if role_words else default_role,
        channel=channel_words[0] if channel_words else None,
        recipient=recipient.group(1) if recipient else None,
        content_type=content_type,
    )


@dataclass
class HarmonyEvent:
    """What one feed added: text appended to `message`, and whether it ended."""

    message: HarmonyMessage
    text: str = ""
    ended: bool = False


@dataclass
class HarmonyParser:
    """Feed the generated token ids as they come; get back what each feed added to which message."""

    tokens: HarmonyTokens
    tokenizer: Tokenizer
    messages: list[HarmonyMessage] = field(default_factory=list)
    _header: list[int] = field(default_factory=list)  # the open header's ids (markers included)
    # The open message's text, or None in a header (where the output opens: the prompt ended
    # with `<|start|>assistant`, so a header without a role is the assistant's).
    _body: IncrementalDetokenizer | None = None

    def feed(self, token_ids: list[int], final: bool = False) -> list[HarmonyEvent]:
        t, events = self.tokens, []
        for tok in token_ids:
            if self._body is None:
                if tok == t.message:
                    self._open()
                elif tok in (t.start, t.end, t.return_, t.call):
                    events.extend(self._stray())  # a header that never opened a message ends here
                else:
                    self._header.append(tok)
                continue
            if tok in (t.end, t.return_, t.call):
                events.append(self._close(self.tokenizer.id_to_token(tok)))
            elif tok in (t.start, t.channel):  # a new header with no end marker first
                events.append(self._close(None))
                self._header = [tok] if tok == t.channel else []
            else:
                piece = self._body.step(tok)
                if piece:
                    self.messages[-1].text += piece
                    events.append(HarmonyEvent(self.messages[-1], piece))
        if final:
            if self._body is not None:
                events.append(self._close(None))
            events.extend(self._stray())
        return events

    def _stray(self) -> list[HarmonyEvent]:
        """The open header as a message of its own text, if it holds any: output that never
        opened a message (a model not speaking harmony) is kept as written, not dropped."""
        text, self._header = self._header_text(), []
        if not text:
            return []
        stray = HarmonyMessage(text=text, ended_by=None)
        self.messages.append(stray)
        return [HarmonyEvent(stray, text, ended=True)]

    def _open(self) -> None:
        self.messages.append(parse_header(self._header_text()))
        self._header = []
        self._body = IncrementalDetokenizer(self.tokenizer, [])

    def _close(self, marker: str | None) -> HarmonyEvent:
        assert self._body is not None
        message = self.messages[-1]
        rest = self._body.flush()
        message.text += rest
        message.ended_by = marker
        self._body = None
        return HarmonyEvent(message, rest, ended=True)

    def _header_text(self) -> str:
        """The header's ids as text, markers written out (the detokenizer would drop them)."""
        parts, run = [], []
        for tok in self._header:
            if tok in self.tokens.ids:
                parts.append(self.tokenizer.decode(run) + (self.tokenizer.id_to_token(tok) or ""))
                run = []
            else:
                run.append(tok)
        parts.append(self.tokenizer.decode(run))
        return "".join(parts)


class HarmonyChatStream:
    """The chat fields of a harmony output, as it grows: the analysis channel is
    `reasoning_content`; a message to `functions.NAME` (NAME a declared tool) is a tool call,
    sent whole once its message ends and its JSON parses (Hermes's rule in tool_parser.py: a
    call cut off by max_tokens counts if its JSON is complete); everything else (the final
    channel, commentary preambles, a call that does not parse, text outside any message) is
    `content`, never dropped."""

    def __init__(self, tokens: HarmonyTokens, tokenizer: Tokenizer, tool_names: set[str]) -> None:
        self.parser = HarmonyParser(tokens, tokenizer)
        self.tool_names = tool_names
        self.sent = 0  # token ids already fed
        self.num_calls = 0

    def feed(self, token_ids: list[int], final: bool = False) -> tuple[str, str, list[ToolCall]]:
        """token_ids: all generated so far. (new reasoning text, new content text, calls completed)."""
        events = self.parser.feed(token_ids[self.sent :], final)
        self.sent = len(token_ids)
        reasoning, content, calls = [], [], []
        for ev in events:
            m = ev.message
            if self._call_name(m) is None:
                (reasoning if m.channel == "analysis" else content).append(ev.text)
            elif ev.ended:
                call = self._call(m)
                if call is None:
                    content.append(m.text)
                else:
                    calls.append(call)
        self.num_calls += len(calls)
        return "".join(reasoning), "".join(content), calls

    def _call_name(self, m: HarmonyMessage) -> str | None:
        if m.channel == "analysis" or not m.recipient or not m.recipient.startswith("functions."):
            return None
        name = m.recipient[len("functions.") :]
        return name if name in self.tool_names else None

    def _call(self, m: HarmonyMessage) -> ToolCall | None:
        try:
            args = json.loads(m.text)
        except ValueError:
            return None
        if not isinstance(args, dict):
            return None
        return ToolCall(self._call_name(m) or "", json.dumps(args, ensure_ascii=False))


# vLLM's names: --reasoning-parser openai_gptoss and --tool-call-parser openai read harmony; a
# model of these architectures speaks it whatever the flags (vLLM keys on model_type gpt_oss).
REASONING_PARSERS = ("openai_gptoss",)
HARMONY_TOOL_CALL_PARSER = "openai"
HARMONY_ARCHITECTURES = ("GptOssForCausalLM",)
HARMONY_MODEL_TYPES = ("gpt_oss",)


def speaks_harmony(hf_config: dict) -> bool:
    return hf_config.get("model_type") in HARMONY_MODEL_TYPES or any(
        a in HARMONY_ARCHITECTURES for a in hf_config.get("architectures") or []
    )


def select_harmony(
    hf_config: dict, tokenizer: Tokenizer, tool_call_parser: str | None, reasoning_parser: str | None
) -> HarmonyTokens | None:
    """The harmony tokens when chat output is read as harmony (a gpt-oss model, or the flags ask
    for it), None for the Hermes text format. Flags that contradict the model or each other are
    refused by name rather than leaving calls unparsed."""
    wants = tool_call_parser == HARMONY_TOOL_CALL_PARSER or reasoning_parser in REASONING_PARSERS
    if speaks_harmony(hf_config):
        if tool_call_parser not in (None, HARMONY_TOOL_CALL_PARSER):
            raise ValueError(
                f"--tool-call-parser {tool_call_parser}: this model ({', '.join(hf_config.get('architectures') or [])}) "
                f"writes tool calls in the harmony format; use --tool-call-parser {HARMONY_TOOL_CALL_PARSER} or leave it out"
            )
        if not wants and any(m not in tokenizer.special_ids for m in MARKERS):
            # A gpt-oss shape with another tokenizer (random:NAME shapes, tiny test models) cannot
            # write harmony: its output is served as text, said once at startup, not refused.
            logger.warning(
                "a gpt-oss model whose tokenizer lacks harmony's special tokens: chat output is read as text"
            )
            return None
        return HarmonyTokens.of(tokenizer)
    if not wants:
        return None
    if tool_call_parser not in (None, HARMONY_TOOL_CALL_PARSER):
        raise ValueError(
            f"--reasoning-parser {reasoning_parser} reads the harmony format, whose tool calls only "
            f"--tool-call-parser {HARMONY_TOOL_CALL_PARSER} reads, not {tool_call_parser}"
        )
    return HarmonyTokens.of(tokenizer)
