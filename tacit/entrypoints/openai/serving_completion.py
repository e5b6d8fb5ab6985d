"""POST /v1/completions: text in, text out, streamed as SSE or returned whole.

echo puts the prompt before the generated text (for token-id prompts, the ids decoded), and with
logprobs the logprobs object covers the prompt's tokens first: the first of them has none (null),
as with OpenAI and vLLM. That is how lm-evaluation-harness scores a continuation (max_tokens 1
or 0, echo, logprobs 1). A stream sends the echoed prompt in each choice's first chunk.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from tacit.engine.request_stream import RequestStream
from tacit.entrypoints.openai.completion_protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
)
from tacit.entrypoints.openai.errors import error_sse
from tacit.entrypoints.openai.protocol import UsageInfo, random_id
from tacit.entrypoints.openai.serving_common import (
    ServingContext,
    abort_on_disconnect,
    engine_error,
    final_outputs_unless_disconnected,
    logprob_entries,
    merge_streams,
    token_text,
)
from tacit.outputs import Logprob, RequestOutput

# (token id, {token_id: Logprob} or None where the token has no logprob) per logprobs position.
Positions = list[tuple[int, dict[int, Logprob] | None]]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies must not buffer a stream


class CompletionServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        ctx = self.ctx
        ctx.check_model(req.model)
        params = ctx.sampling_params(req.to_sampling_params)
        for p in req.prompts():
            if isinstance(p, str):
                ctx.refuse_surely_too_long([p], "prompt")
        # Off the event loop: a long prompt took 9 s to tokenize and stalled every stream.
        prompts = await asyncio.to_thread(
            lambda: [ctx.tokenizer.encode(p) if isinstance(p, str) else p for p in req.prompts()]
        )
        for ids in prompts:
            ctx.check_length(len(ids), req.max_tokens)
        echoes: list[str] = []  # what echo prepends: the prompt as sent, or its ids decoded (specials kept)
        if req.echo:
            echoes = await asyncio.to_thread(
                lambda: [p if isinstance(p, str) else ctx.tokenizer.decode(p, False) for p in req.prompts()]
            )
        request_id = random_id("cmpl")
        streams = await ctx.submit(prompts, params, request_id, req.priority, req.structured_param, req.cache_salt)
        num_prompt_tokens = sum(len(ids) for ids in prompts)
        if req.stream:
            return StreamingResponse(
                self._stream(req, raw, streams, request_id, num_prompt_tokens, echoes),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        return await self._full(req, raw, streams, request_id, num_prompt_tokens, echoes)

    def _logprobs(self, req: CompletionRequest, positions: Positions, text_offset: int) -> CompletionLogprobs | None:
        if req.logprobs is None:
            return None
        tok = self.ctx.tokenizer
        as_ids = req.return_tokens_as_token_ids
        lp = CompletionLogprobs()
        for token_id, entry in positions:
            chosen = entry.get(token_id) if entry is not None else None
            lp.tokens.append(token_text(tok, token_id, chosen, as_ids))
            lp.token_logprobs.append(chosen.logprob if chosen else None)
            if entry is None:
                lp.top_logprobs.append(None)
            else:
                ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)
                lp.top_logprobs.append(
                    {
                        token_text(tok, t, l, as_ids): l.logprob
                        for t, l in ranked
                        if l.rank <= req.logprobs or t == token_id
                    }
                )
            lp.text_offset.append(text_offset)
            text_offset += len(token_text(tok, token_id, chosen, False))
        return lp

    @staticmethod
    def _prompt_positions(req: CompletionRequest, out: RequestOutput) -> Positions | None:
        """The echoed prompt's logprobs positions; None while its prompt is still being scored."""
        if not req.echoes_logprobs:
            return []
        scored = out.prompt_logprobs
        if scored is None or len(scored) < len(out.prompt_token_ids):
            return None
        return list(zip(out.prompt_token_ids, scored))

    async def _full(
        self,
        req: CompletionRequest,
        raw: Request,
        streams: list[RequestStream],
        request_id: str,
        num_prompt_tokens: int,
        echoes: list[str],
    ) -> Response:
        outs = await final_outputs_unless_disconnected(raw, self.ctx, streams)
        if outs is None:
            return Response(status_code=499)
        choices = []
        for pi, out in enumerate(outs):
            echo = echoes[pi] if req.echo else ""
            prompt_positions = self._prompt_positions(req, out)
            for c in out.outputs:
                positions = prompt_positions + logprob_entries(c, 0, len(c.token_ids))
                choices.append(
                    CompletionResponseChoice(
                        index=pi * req.n + c.index,
                        text=echo + c.text,
                        logprobs=self._logprobs(req, positions, 0),
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                        prompt_logprobs=out.prompt_logprobs if req.prompt_logprobs is not None else None,
                    )
                )
        completion_tokens = sum(len(c.token_ids) for out in outs for c in out.outputs)
        usage = UsageInfo.of(num_prompt_tokens, completion_tokens, sum(out.num_cached_tokens for out in outs))
        body = CompletionResponse(id=request_id, model=self.ctx.model_name, choices=choices, usage=usage)
        return JSONResponse(body.model_dump())

    async def _stream(
        self,
        req: CompletionRequest,
        raw: Request,
        streams: list[RequestStream],
        request_id: str,
        num_prompt_tokens: int,
        echoes: list[str],
    ) -> AsyncIterator[str]:
        created = int(time.time())
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        echoed: set[int] = set()
        done: set[int] = set()
        completion_tokens = 0
        cached_tokens: dict[int, int] = {}  # per prompt
        async with abort_on_disconnect(raw, self.ctx, streams):
            try:
                async for pi, out in merge_streams(streams):
                    cached_tokens[pi] = out.num_cached_tokens
                    for c in out.outputs:
                        index = pi * req.n + c.index
                        if index in done:
                            continue  # a finished sibling of an n>1 request is reported every step
                        echo, positions = "", []
                        echoing = req.echo and index not in echoed
                        if echoing:
                            positions = self._prompt_positions(req, out)
                            if positions is None:
                                continue  # its prompt is still being scored: echo it whole, later
                            echo = echoes[pi]
                        t0, k0, k1 = sent_text.get(index, 0), sent_tokens.get(index, 0), len(c.token_ids)
                        delta = c.text[t0:]
                        new_logprobs = req.logprobs is not None and k1 > k0
                        if not echoing and not delta and c.finish_reason is None and not new_logprobs:
                            continue  # a token that ends mid-character: wait for the rest
                        # Generated tokens' offsets count the echoed prompt's text before them.
                        offset = (len(echoes[pi]) if req.echo else 0) + t0
                        logprobs = self._logprobs(req, logprob_entries(c, k0, k1), offset)
                        if positions and logprobs is not None:
                            prompt_part = self._logprobs(req, positions, 0)
                            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                                getattr(prompt_part, name).extend(getattr(logprobs, name))
                            logprobs = prompt_part
                        chunk = CompletionChunk(
                            id=request_id,
                            created=created,
                            model=self.ctx.model_name,
                            choices=[
                                CompletionChoice(
                                    index=index,
                                    text=echo + delta,
                                    logprobs=logprobs,
                                    finish_reason=c.finish_reason,
                                    stop_reason=c.stop_reason,
                                )
                            ],
                        )
                        echoed.add(index)
                        sent_text[index], sent_tokens[index] = len(c.text), k1
                        if c.finish_reason is not None:
                            done.add(index)
                            completion_tokens += k1
                        yield f"data: {chunk.model_dump_json()}\n\n"
            except Exception as e:
                # The error as an event, then [DONE]: the status line has gone, and a client
                # waits for [DONE] to know the stream is over.
                yield error_sse(engine_error(e))
                yield "data: [DONE]\n\n"
                return
        if req.include_usage:
            usage = UsageInfo.of(num_prompt_tokens, completion_tokens, sum(cached_tokens.values()))
            chunk = CompletionChunk(id=request_id, created=created, model=self.ctx.model_name, choices=[], usage=usage)
            yield f"data: {chunk.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"
