"""POST /v1/chat/completions: messages rendered with the model's chat template, then generated."""

from __future__ import annotations

import json
import time
from typing import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from tacit.engine.request_stream import RequestStream
from tacit.entrypoints.openai.chat_protocol import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatLogprobs,
    ChatTokenLogprob,
    DeltaMessage,
    TopLogprob,
)
from tacit.entrypoints.openai.chat_tools import ChatTools, delta_tool_calls, stream_delta, stream_finish_reason
from tacit.entrypoints.openai.errors import bad_request, error_sse
from tacit.entrypoints.openai.protocol import UsageInfo, random_id
from tacit.entrypoints.openai.serving_common import (
    ServingContext,
    abort_on_disconnect,
    engine_error,
    final_outputs_unless_disconnected,
    logprob_entries,
    token_text,
)
from tacit.entrypoints.openai.serving_completion import SSE_HEADERS
from tacit.outputs import CompletionOutput


class ChatServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        ctx = self.ctx
        ctx.check_model(req.model)
        params = ctx.sampling_params(req.to_sampling_params)
        tools = ChatTools(req, ctx.harmony, ctx.tokenizer)
        structured_param = tools.adjust(params) or req.structured_param
        messages = [m.to_template_dict() for m in req.messages]
        template_kwargs = {}
        if req.reasoning_effort is not None:
            if "reasoning_effort" not in ctx.tokenizer.template_variables:
                raise bad_request(
                    "reasoning_effort: this model's chat template does not read reasoning_effort, so it cannot be "
                    "honoured; remove it (fields the server cannot honour are refused, not ignored)",
                    "reasoning_effort",
                )
            template_kwargs["reasoning_effort"] = req.reasoning_effort
        ids = await ctx.encode_chat(
            messages, req.add_generation_prompt, tools.definitions, template_kwargs=template_kwargs
        )
        ctx.check_length(len(ids), req.requested_max_tokens)
        request_id = random_id("chatcmpl")
        streams = await ctx.submit([ids], params, request_id, req.priority, structured_param, req.cache_salt)
        if req.stream:
            return StreamingResponse(
                self._stream(req, tools, raw, streams[0], request_id, len(ids)),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        return await self._full(req, tools, raw, streams[0], request_id, len(ids))

    def _logprobs(self, req: ChatCompletionRequest, c: CompletionOutput, start: int, end: int) -> ChatLogprobs | None:
        if not req.logprobs:
            return None
        tok, as_ids, k = self.ctx.tokenizer, req.return_tokens_as_token_ids, req.top_logprobs or 0
        content = []
        for token_id, entry in logprob_entries(c, start, end):
            chosen = entry.get(token_id)
            text = token_text(tok, token_id, chosen, as_ids)
            top = [
                TopLogprob(
                    token=token_text(tok, t, l, as_ids),
                    logprob=l.logprob,
                    bytes=list(token_text(tok, t, l, False).encode()),
                )
                for t, l in sorted(entry.items(), key=lambda kv: kv[1].rank)
                if l.rank <= k
            ]
            content.append(
                ChatTokenLogprob(
                    token=text,
                    logprob=chosen.logprob if chosen else float("-inf"),
                    bytes=list(token_text(tok, token_id, chosen, False).encode()),
                    top_logprobs=top,
                )
            )
        return ChatLogprobs(content=content)

    async def _full(
        self,
        req: ChatCompletionRequest,
        tools: ChatTools,
        raw: Request,
        stream: RequestStream,
        request_id: str,
        num_prompt_tokens: int,
    ) -> Response:
        outs = await final_outputs_unless_disconnected(raw, self.ctx, [stream])
        if outs is None:
            return Response(status_code=499)
        (out,) = outs
        choices = []
        for c in out.outputs:
            message, finish_reason = tools.message(c)
            choices.append(
                ChatCompletionChoice(
                    index=c.index,
                    message=message,
                    logprobs=self._logprobs(req, c, 0, len(c.token_ids)),
                    finish_reason=finish_reason,
                    stop_reason=c.stop_reason,
                )
            )
        completion_tokens = sum(len(c.token_ids) for c in out.outputs)
        usage = UsageInfo.of(num_prompt_tokens, completion_tokens, out.num_cached_tokens)
        body = ChatCompletionResponse(
            id=request_id,
            model=self.ctx.model_name,
            choices=choices,
            usage=usage,
            prompt_logprobs=out.prompt_logprobs if req.prompt_logprobs is not None else None,
        )
        return JSONResponse(body.model_dump())

    async def _stream(
        self,
        req: ChatCompletionRequest,
        tools: ChatTools,
        raw: Request,
        stream: RequestStream,
        request_id: str,
        num_prompt_tokens: int,
    ) -> AsyncIterator[str]:
        created = int(time.time())
        model = self.ctx.model_name

        def chunk(
            index: int,
            delta: DeltaMessage,
            logprobs: ChatLogprobs | None = None,
            finish_reason: str | None = None,
            stop_reason: int | str | None = None,
        ) -> str:
            c = ChatCompletionChunk(
                id=request_id,
                created=created,
                model=model,
                choices=[
                    ChatCompletionStreamChoice(
                        index=index,
                        delta=delta,
                        logprobs=logprobs,
                        finish_reason=finish_reason,
                        stop_reason=stop_reason,
                    )
                ],
            )
            body = c.model_dump()
            # A delta carries only what changed: {"content": "x"}, not {"role": null, "content": "x"}.
            body["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        # OpenAI opens each choice with a role-only delta before any content.
        for i in range(req.n):
            yield chunk(i, DeltaMessage(role="assistant", content=""))
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        parsers = {i: tools.stream_parser() for i in range(req.n)} if tools.parses_output else {}
        done: set[int] = set()
        completion_tokens = cached_tokens = 0
        async with abort_on_disconnect(raw, self.ctx, [stream]):
            try:
                async for out in stream:
                    cached_tokens = out.num_cached_tokens
                    for c in out.outputs:
                        if c.index in done:
                            continue  # a finished sibling of an n>1 request is reported every step
                        t0, k0, k1 = sent_text.get(c.index, 0), sent_tokens.get(c.index, 0), len(c.token_ids)
                        delta, reasoning, calls, finish_reason = c.text[t0:], "", [], c.finish_reason
                        parser = parsers.get(c.index)
                        if parser is not None:  # text that may be a tool call waits until it is decided
                            first = parser.num_calls
                            reasoning, delta, new_calls = stream_delta(parser, c)
                            calls = delta_tool_calls(new_calls, first)
                            finish_reason = stream_finish_reason(c.finish_reason, parser.num_calls)
                        new_logprobs = req.logprobs and k1 > k0
                        if not delta and not reasoning and not calls and c.finish_reason is None and not new_logprobs:
                            continue  # a token that ends mid-character (or a harmony marker): wait for the rest
                        piece = chunk(
                            c.index,
                            DeltaMessage(
                                reasoning_content=reasoning or None, content=delta or None, tool_calls=calls or None
                            ),
                            self._logprobs(req, c, k0, k1),
                            finish_reason,
                            c.stop_reason,
                        )
                        sent_text[c.index], sent_tokens[c.index] = len(c.text), k1
                        if c.finish_reason is not None:
                            done.add(c.index)
                            completion_tokens += k1
                        yield piece
            except Exception as e:
                # The error as an event, then [DONE]: the status line has gone, and a client
                # waits for [DONE] to know the stream is over.
                yield error_sse(engine_error(e))
                yield "data: [DONE]\n\n"
                return
        if req.include_usage:
            usage = UsageInfo.of(num_prompt_tokens, completion_tokens, cached_tokens)
            c = ChatCompletionChunk(id=request_id, created=created, model=model, choices=[], usage=usage)
            yield f"data: {c.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"
