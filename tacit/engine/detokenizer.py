"""Incremental detokenization that is right for multi-byte UTF-8 and SentencePiece spaces.

Decoding one token alone is wrong twice over: a byte-level token can hold half of a UTF-8
character, and SentencePiece drops a token's leading space when it starts the string. So each
step decodes a short window that starts a few tokens back (prefix) and emits only what the
new tokens added, holding text back while it ends in an incomplete character (U+FFFD).
"""

from __future__ import annotations

from tacit.tokenizer import Tokenizer

# Tokens of context kept before the new ones; enough for any merge that crosses tokens.
_PREFIX_WINDOW = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids = list(prompt_token_ids[-_PREFIX_WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def step(self, token_id: int) -> str:
        """Append one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        full = self.tokenizer.decode(self.ids[self.prefix_offset :], self.skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        # Keep the window short: the decode cost stays constant per token.
        if self.prefix_offset > 64:
            self.ids = self.ids[self.prefix_offset :]
            self.read_offset -= self.prefix_offset
            self.prefix_offset = 0
        return full[len(prefix) :]

    def flush(self) -> str:
        """At the end of a sequence, whatever was held back (bytes that never completed a character)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        full = self.tokenizer.decode(self.ids[self.prefix_offset :], self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :]
