"""POST /v1/responses: the Responses API over the chat path (template, engine, one message out),
returned whole or streamed as OpenAI's typed events (`event: <type>` + `data: {..."type"...}`)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from tacit.engine.request_stream import RequestStream
from tacit.entrypoints.openai.protocol import random_id
from tacit.entrypoints.openai.responses_protocol import (
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from tacit.entrypoints.openai.serving_common import (
    ServingContext,
    abort_on_disconnect,
    engine_error,
    final_outputs_unless_disconnected,
)
from tacit.entrypoints.openai.serving_completion import SSE_HEADERS
from tacit.outputs import CompletionOutput


class ResponsesServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: ResponsesRequest, raw: Request) -> Response:
        ctx = self.ctx
        ctx.check_model(req.model)
        params = ctx.sampling_params(req.to_sampling_params)
        ids = await ctx.encode_chat(req.messages(), field="input")
        ctx.check_length(len(ids), req.max_output_tokens)
        response_id = random_id("resp")
        (stream,) = await ctx.submit([ids], params, response_id, 0, "text.format.schema", req.cache_salt)
        if req.stream:
            return StreamingResponse(
                self._stream(req, raw, stream, response_id, len(ids)),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        outs = await final_outputs_unless_disconnected(raw, ctx, [stream])
        if outs is None:
            return Response(status_code=499)
        (c,) = outs[0].outputs
        body = self._response(req, response_id, random_id("msg"), len(ids), c, outs[0].num_cached_tokens)
        return JSONResponse(body.model_dump())

    def _response(
        self,
        req: ResponsesRequest,
        response_id: str,
        message_id: str,
        num_prompt: int,
        c: CompletionOutput | None,
        cached_tokens: int = 0,
    ) -> ResponseObject:
        """The response object: in progress (c is None) or final."""
        r = ResponseObject(
            id=response_id,
            status="in_progress",
            model=self.ctx.model_name,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            temperature=req.temperature if req.temperature is not None else 1.0,
            top_p=req.top_p if req.top_p is not None else 1.0,
            user=req.user,
            metadata=req.metadata or {},
        )
        if req.text is not None:
            r.text = {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)}
        if c is None:
            return r
        incomplete = c.finish_reason == "length"
        r.status = "incomplete" if incomplete else "completed"
        r.incomplete_details = IncompleteDetails(reason="max_output_tokens") if incomplete else None
        r.output = [OutputMessage(id=message_id, status=r.status, content=[OutputText(text=c.text)])]
        n = len(c.token_ids)
        r.usage = ResponseUsage(
            input_tokens=num_prompt,
            input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
            output_tokens=n,
            total_tokens=num_prompt + n,
        )
        return r

    async def _stream(
        self, req: ResponsesRequest, raw: Request, stream: RequestStream, response_id: str, num_prompt: int
    ) -> AsyncIterator[str]:
        seq = 0
        message_id = random_id("msg")

        def event(type_: str, **fields: Any) -> str:
            nonlocal seq
            body = {"type": type_, "sequence_number": seq, **fields}
            seq += 1
            return f"event: {type_}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

        def where() -> dict[str, Any]:
            return {"item_id": message_id, "output_index": 0, "content_index": 0}

        start = self._response(req, response_id, message_id, num_prompt, None).model_dump()
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        item = OutputMessage(id=message_id, status="in_progress").model_dump()
        yield event("response.output_item.added", output_index=0, item=item)
        yield event("response.content_part.added", part=OutputText(text="").model_dump(), **where())
        sent, last, cached_tokens = 0, None, 0
        async with abort_on_disconnect(raw, self.ctx, [stream]):
            try:
                async for out in stream:
                    last, cached_tokens = out.outputs[0], out.num_cached_tokens
                    if len(last.text) > sent:
                        yield event("response.output_text.delta", delta=last.text[sent:], logprobs=[], **where())
                        sent = len(last.text)
            except Exception as e:
                # The status line has gone: the failure travels as OpenAI's `error` event.
                err = engine_error(e)
                yield event("error", code=str(err.code), message=err.message, param=err.param)
                return
        assert last is not None
        final = self._response(req, response_id, message_id, num_prompt, last, cached_tokens)
        text = final.output[0].content[0]
        yield event("response.output_text.done", text=text.text, logprobs=[], **where())
        yield event("response.content_part.done", part=text.model_dump(), **where())
        yield event("response.output_item.done", output_index=0, item=final.output[0].model_dump())
        kind = "response.incomplete" if final.status == "incomplete" else "response.completed"
        yield event(kind, response=final.model_dump())
