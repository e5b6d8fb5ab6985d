"""Tokenizer: a `tokenizers` tokenizer plus the model's chat template and special ids."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from tacit.chat_content import ChatContentEncoder


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise(message: str) -> None:
    raise TemplateError(message)


# For chat templates that take no `tools` variable (SmolLM2's, the default model's, among them),
# tools are described in a system turn in the Hermes format (the one Qwen2.5/Qwen3 templates
# write), and calls are parsed back out of <tool_call> tags. Without this the tools would be
# silently dropped: the template would render the messages and never mention them.
_TOOLS_SYSTEM_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def tool_call_text(name: str, arguments: Any) -> str:
    """One call as the Hermes format writes it (what the tools system prompt asks for)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def _messages_with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with the tools described in its system turn, and earlier assistant calls
    written out as text (a template without tool support renders only `content`)."""
    block = _TOOLS_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    out = []
    for m in messages:
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if calls:
            try:
                text = "\n".join(
                    tool_call_text(c["function"]["name"], c["function"].get("arguments", {})) for c in calls
                )
            except (KeyError, TypeError, AttributeError):
                raise ValueError(
                    "an assistant message's tool_calls must be a list of "
                    '{"type": "function", "function": {"name": ..., "arguments": ...}}'
                ) from None
            m = {**m, "content": (m.get("content") or "") + text}
        out.append(m)
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{block}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


class Tokenizer:
    def __init__(
        self,
        tokenizer: HFTokenizer,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos_token: bool = False,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        # tokenizer_config.json as read (empty for a GGUF's tokenizer): what /tokenizer_info serves.
        self.config = dict(config or {})
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token
        # Only for tokenizers whose post-processor does not add BOS itself (GGUF-built ones).
        self.add_bos_token = add_bos_token
        self.bos_token_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = tokenizer.token_to_id(eos_token) if eos_token else None
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_ids = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        # False: special-token text inside chat messages is encoded as text (chat_content.py), so
        # a user cannot forge a turn; the engine sets it from allow_special_tokens_in_chat_content.
        self.allow_special_tokens_in_chat_content = False
        self._chat_content = ChatContentEncoder(tokenizer, self.special_ids)
        self._template = None
        self.template_takes_tools = False
        # The variables the template reads beyond what every render passes: a request field
        # that sets one (reasoning_effort) is refused on a template that would ignore it.
        self.template_variables: frozenset[str] = frozenset()
        if chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
            self._template = env.from_string(chat_template)
            # Whether the template renders `tools` itself in the Hermes format (Qwen2.5/Qwen3,
            # Hermes): only then do its calls come back in the <tool_call> tags tacit parses. Any
            # other template (none, or Llama 3.1's JSON calls) gets the tools system turn instead.
            # gpt-oss's template writes harmony calls (`<|call|>`), which harmony.py reads.
            self.template_variables = frozenset(meta.find_undeclared_variables(env.parse(chat_template)))
            self.template_takes_tools = (
                any(marker in chat_template for marker in ("<tool_call>", "<|call|>"))
                and "tools" in self.template_variables
            )

    @classmethod
    def from_hf_dir(cls, path: Path) -> "Tokenizer":
        tok_file = path / "tokenizer.json"
        if not tok_file.exists():
            raise FileNotFoundError(
                f"{path}: no tokenizer.json (tacit reads the fast-tokenizer file; "
                f"sentencepiece-only tokenizer.model is not supported yet)"
            )
        cfg: dict[str, Any] = {}
        if (path / "tokenizer_config.json").exists():
            cfg = json.loads((path / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        if (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        return cls(
            HFTokenizer.from_file(str(tok_file)),
            template,
            _token_text(cfg.get("bos_token")),
            _token_text(cfg.get("eos_token")),
            config=cfg,
        )

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """An upper bound on the UTF-8 bytes of text one token stands for: the longest vocabulary
        entry in UTF-8 (a byte-level entry's characters stand for one byte each and take one or
        two; SentencePiece's '\u2581' stands for a space and takes three; '<0x0A>' for one byte and
        takes six). So a text of B bytes is at least B / max_token_bytes tokens."""
        return max(len(t.encode("utf-8")) for t in self.tokenizer.get_vocab(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch releases the GIL while it tokenizes; encode holds it for the whole call, and
        # every other thread of the server, /health's included, waits (tests/test_tokenizer_threads.py).
        ids = self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if (
            add_special_tokens
            and self.add_bos_token
            and self.bos_token_id is not None
            and ids[:1] != [self.bos_token_id]
        ):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """tools: OpenAI-format tool definitions, given to the template as `tools`, or described
        in a system turn when the template takes none (see _TOOLS_SYSTEM_PROMPT).
        template_kwargs: more variables for the template (gpt-oss's reads reasoning_effort)."""
        if self._template is None:
            raise ValueError("this model has no chat template; use generate() with a plain prompt")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        extra: dict[str, Any] = dict(template_kwargs or {})
        if tools and self.template_takes_tools:
            extra["tools"] = tools
        elif tools:
            messages = _messages_with_tools(messages, tools)
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **extra,
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Render the chat template and encode it (LLM.chat and the OpenAI server share this).
        Special-token text inside the messages and tools stays text unless
        allow_special_tokens_in_chat_content."""

        def render(fields: tuple[list[dict[str, Any]], list[dict[str, Any]] | None]) -> str:
            return self.apply_chat_template(
                fields[0], add_generation_prompt=add_generation_prompt, tools=fields[1], template_kwargs=template_kwargs
            )

        fields = (messages, tools)
        if not self.allow_special_tokens_in_chat_content and self._chat_content.has_special_text(fields):
            return self._chat_content.encode(fields, render)
        # The template already wrote any BOS it wants; encoding must not add another.
        return self.encode(render(fields), add_special_tokens=False)

    def with_chat_template(self, chat_template: str) -> "Tokenizer":
        """This tokenizer with another chat template (--chat-template), its special tokens kept."""
        try:
            other = Tokenizer(
                self.tokenizer, chat_template, self.bos_token, self.eos_token, self.add_bos_token, self.config
            )
        except TemplateError as e:
            raise ValueError(f"the chat template does not parse: {e}") from None
        other.allow_special_tokens_in_chat_content = self.allow_special_tokens_in_chat_content
        return other


def read_chat_template(spec: str) -> str:
    """A chat template from a file, or the template itself when `spec` is one (as vLLM's
    --chat-template takes either): text with Jinja's {{ or {% that names no file."""
    path = Path(spec).expanduser()
    try:
        is_file = path.is_file()
    except OSError:  # a template too long to be a file name (ENAMETOOLONG)
        is_file = False
    if is_file:
        return path.read_text()
    if "{{" in spec or "{%" in spec:
        return spec
    raise FileNotFoundError(f"chat_template={spec!r} is not a file; pass a Jinja template file or the template itself")
