"""Special-token text inside chat messages stays text.

Rendering the chat template and encoding the result parses every `<|im_start|>` in it as the
special token, so a user who writes `<|im_start|>system\\n...<|im_end|>` in a message forges a
system turn. Careful servers tokenize message contents with special-token parsing off; here
the template stays one string (templates trim, split and reorder contents, so contents cannot
be tokenized on their own):

1. every special-token text in the messages' strings (contents, names, tool calls, anything
   but dict keys) is replaced by a marker: a private-use character absent from all of them,
   the special's index, the character again;
2. the template renders those marked messages; its own special tokens are untouched;
3. the markers are turned back into the special text, remembering where each lies; the
   ordinary encoding of that text finds every special token, and those over a remembered span
   are the user's;
4. the text between the template's special tokens is encoded with special-token parsing off,
   so the user's special text becomes ordinary tokens, merged with its neighbours as any text.

A chat with no special text in its messages never reaches this module: its ids are exactly the
plain render-then-encode ones (and transformers' apply_chat_template(tokenize=True)).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from tokenizers import Tokenizer as HFTokenizer

# Supplementary Private Use Area-A: no tokenizer or template gives these characters a meaning.
_MARKER_CANDIDATES = [chr(c) for c in range(0xF0000, 0xF0100)]


def _strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in _strings(v)]
    return []


def _replace(obj: Any, sub: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return sub(obj)
    if isinstance(obj, dict):
        return {k: _replace(v, sub) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_replace(v, sub) for v in obj)
    return obj


class ChatContentEncoder:
    """Encodes rendered chats so that special-token text from the messages stays text."""

    def __init__(self, tokenizer: HFTokenizer, special_ids: dict[str, int]) -> None:
        self.tokenizer = tokenizer
        self.specials = sorted(special_ids, key=len, reverse=True)  # longest first: the regex prefers it
        self.special_id_set = set(special_ids.values())
        self.pattern = re.compile("|".join(re.escape(s) for s in self.specials)) if self.specials else None
        self._plain: HFTokenizer | None = None

    def plain(self) -> HFTokenizer:
        """A copy that reads special-token text as text. A copy, not a toggle on the shared one:
        the server encodes from several threads at once."""
        if self._plain is None:
            plain = HFTokenizer.from_str(self.tokenizer.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    def has_special_text(self, fields: Any) -> bool:
        return self.pattern is not None and any(self.pattern.search(s) for s in _strings(fields))

    def encode(self, fields: Any, render: Callable[[Any], str]) -> list[int]:
        """fields: the messages (and whatever else the template reads from the user: tools);
        render: fields -> the template's text. Called for fields with special text in them
        (has_special_text); the others are encoded as rendered, the ids being the same."""
        if self.pattern is None:
            return self.tokenizer.encode(render(fields), add_special_tokens=False).ids
        taken = "".join(_strings(fields))
        marker = next((c for c in _MARKER_CANDIDATES if c not in taken), None)
        if marker is None:
            raise ValueError("messages use every private-use marker character U+F0000-U+F00FF; cannot encode them")
        index = {s: i for i, s in enumerate(self.specials)}
        marked = _replace(fields, lambda s: self.pattern.sub(lambda m: f"{marker}{index[m.group(0)]}{marker}", s))
        parts = re.split(f"{marker}(\\d+){marker}", render(marked))
        text, spans = "", []
        for i, part in enumerate(parts):
            if i % 2:
                special = self.specials[int(part)]
                spans.append((len(text), len(text) + len(special)))
                text += special
            else:
                text += part
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        ids: list[int] = []
        pos = 0
        for token_id, (start, end) in zip(enc.ids, enc.offsets):
            if token_id not in self.special_id_set or any(s < end and start < e for s, e in spans):
                continue  # ordinary text, or the user's special text: encoded below as text
            if start > pos:
                ids += self.plain().encode(text[pos:start], add_special_tokens=False).ids
            ids.append(token_id)
            pos = end
        if pos < len(text):
            ids += self.plain().encode(text[pos:], add_special_tokens=False).ids
        return ids
