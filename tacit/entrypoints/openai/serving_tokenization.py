"""/tokenize and /detokenize, in vLLM's shapes: what a client needs to count or inspect tokens
(prompt budgeting, lm-evaluation-harness) without generating."""

from __future__ import annotations

import asyncio

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
