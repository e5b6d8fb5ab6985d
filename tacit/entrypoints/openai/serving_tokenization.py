"""/tokenize, /detokenize and /tokenizer_info, in vLLM's shapes: what a client needs to count or
inspect tokens (prompt budgeting, lm-evaluation-harness) without generating."""

from __future__ import annotations

import asyncio
from typing import Any

from tacit.engine.input_processor import check_token_ids
from tacit.entrypoints.openai.errors import bad_request
from tacit.entrypoints.openai.serving_common import ServingContext
from tacit.entrypoints.openai.tokenization_protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)


class TokenizationServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        ctx = self.ctx
        ctx.check_model(req.model)
        tok = ctx.tokenizer
        if req.messages is not None:
            messages = [m.to_template_dict() for m in req.messages]
            tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
            ids = await ctx.encode_chat(messages, req.add_generation_prompt, tools)
        else:
            ids = await asyncio.to_thread(tok.encode, req.prompt, req.add_special_tokens)
        return TokenizeResponse(count=len(ids), max_model_len=ctx.max_model_len, tokens=ids)

    async def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        ctx = self.ctx
        ctx.check_model(req.model)
        try:
            check_token_ids(req.tokens, ctx.vocab_size, "token ids")
        except ValueError as e:
            raise bad_request(str(e), "tokens") from None
        return DetokenizeResponse(prompt=ctx.tokenizer.decode(req.tokens, False))

    def tokenizer_info(self) -> dict[str, Any]:
        """GET /tokenizer_info (behind --enable-tokenizer-info-endpoint), vLLM's shape: the
        tokenizer's tokenizer_config.json less its file paths, AddedToken entries as their text,
        tokenizer_class, and the chat template in use (--chat-template's, else the checkpoint's).
        bos_token, eos_token and pad_token are always there (null when the tokenizer has none):
        lm-evaluation-harness's remote tokenizer takes a reply without eos_token for no support.
        max_model_len is tacit's addition, the context the server accepts (as /tokenize gives it)."""
        tok = self.ctx.tokenizer
        info = {k: _plain(v) for k, v in tok.config.items() if k not in ("vocab_file", "merges_file", "chat_template")}
        # tacit serves the tokenizer.json, which transformers loads as the class's fast variant.
        name = info.get("tokenizer_class") or "PreTrainedTokenizerFast"
        info["tokenizer_class"] = name if name.endswith("Fast") else name + "Fast"
        info["bos_token"], info["eos_token"] = tok.bos_token, tok.eos_token
        info.setdefault("pad_token", None)
        if tok.chat_template:
            info["chat_template"] = tok.chat_template
        info["max_model_len"] = self.ctx.max_model_len
        return info


def _plain(value: Any) -> Any:
    """A tokenizer_config.json value as vLLM serves it: an AddedToken ({"content": ..., ...}) as its text."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str):
            return value["content"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
