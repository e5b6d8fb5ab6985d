"""POST /v1/completions: text in, text out, streamed as SSE or returned whole."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from tacit.engine.request_stream import RequestStream
from tacit.entrypoints.openai.errors import error_sse
from tacit.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    random_id,
)
from tacit.entrypoints.openai.serving_common import (
    ServingContext,
    abort_on_disconnect,
    engine_error,
    final_outputs_unless_disconnected,
    logprob_entries,
    merge_streams,
    token_text,
)
from tacit.outputs import CompletionOutput

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies must not buffer a stream


class CompletionServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        ctx = self.ctx
        ctx.check_model(req.model)
        params = ctx.sampling_params(req.to_sampling_params)
        # Off the event loop: a long prompt took 9 s to tokenize and stalled every stream.
        prompts = await asyncio.to_thread(
            lambda: [ctx.tokenizer.encode(p) if isinstance(p, str) else p for p in req.prompts()]
        )
        for ids in prompts:
            ctx.check_length(len(ids), req.max_tokens)
        request_id = random_id("cmpl")
        streams = await ctx.submit(prompts, params, request_id, req.priority, req.structured_param)
        num_prompt_tokens = sum(len(ids) for ids in prompts)
        if req.stream:
            return StreamingResponse(
                self._stream(req, raw, streams, request_id, num_prompt_tokens),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        return await self._full(req, raw, streams, request_id, num_prompt_tokens)

    def _logprobs(
        self, req: CompletionRequest, c: CompletionOutput, start: int, end: int, text_offset: int
    ) -> CompletionLogprobs | None:
        if req.logprobs is None:
            return None
        tok = self.ctx.tokenizer
        as_ids = req.return_tokens_as_token_ids
        lp = CompletionLogprobs()
        for token_id, entry in logprob_entries(c, start, end):
            chosen = entry.get(token_id)
            lp.tokens.append(token_text(tok, token_id, chosen, as_ids))
            lp.token_logprobs.append(chosen.logprob if chosen else None)
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)
            lp.top_logprobs.append(
                {token_text(tok, t, l, as_ids): l.logprob for t, l in ranked if l.rank <= req.logprobs or t == token_id}
            )
            lp.text_offset.append(text_offset)
            text_offset += len(token_text(tok, token_id, chosen, False))
        return lp

    async def _full(
        self,
        req: CompletionRequest,
        raw: Request,
        streams: list[RequestStream],
        request_id: str,
        num_prompt_tokens: int,
    ) -> Response:
        outs = await final_outputs_unless_disconnected(raw, self.ctx, streams)
        if outs is None:
            return Response(status_code=499)
        choices = []
        for pi, out in enumerate(outs):
            for c in out.outputs:
                choices.append(
                    CompletionChoice(
                        index=pi * req.n + c.index,
                        text=c.text,
                        logprobs=self._logprobs(req, c, 0, len(c.token_ids), 0),
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                )
        completion_tokens = sum(len(c.token_ids) for out in outs for c in out.outputs)
        usage = UsageInfo(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=num_prompt_tokens + completion_tokens,
        )
        body = CompletionResponse(id=request_id, model=self.ctx.model_name, choices=choices, usage=usage)
        return JSONResponse(body.model_dump())

    async def _stream(
        self,
        req: CompletionRequest,
        raw: Request,
        streams: list[RequestStream],
        request_id: str,
        num_prompt_tokens: int,
    ) -> AsyncIterator[str]:
        created = int(time.time())
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        done: set[int] = set()
        completion_tokens = 0
        async with abort_on_disconnect(raw, self.ctx, streams):
            try:
                async for pi, out in merge_streams(streams):
                    for c in out.outputs:
                        index = pi * req.n + c.index
                        if index in done:
                            continue  # a finished sibling of an n>1 request is reported every step
                        t0, k0, k1 = sent_text.get(index, 0), sent_tokens.get(index, 0), len(c.token_ids)
                        delta = c.text[t0:]
                        new_logprobs = req.logprobs is not None and k1 > k0
                        if not delta and c.finish_reason is None and not new_logprobs:
                            continue  # a token that ends mid-character: wait for the rest
                        chunk = CompletionChunk(
                            id=request_id,
                            created=created,
                            model=self.ctx.model_name,
                            choices=[
                                CompletionChoice(
                                    index=index,
                                    text=delta,
                                    logprobs=self._logprobs(req, c, k0, k1, t0),
                                    finish_reason=c.finish_reason,
                                    stop_reason=c.stop_reason,
                                )
                            ],
                        )
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
            usage = UsageInfo(
                prompt_tokens=num_prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=num_prompt_tokens + completion_tokens,
            )
            chunk = CompletionChunk(id=request_id, created=created, model=self.ctx.model_name, choices=[], usage=usage)
            yield f"data: {chunk.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"
