"""What completions and chat share: model check, length check, submitting to the engine,
merging several prompts' streams, watching for a client that went away, logprob formatting."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Callable, Iterable, Mapping

from jinja2 import TemplateError
from starlette.requests import Request

from tacit.engine.async_engine import (
    AsyncLLMEngine,
    EngineDeadError,
    EngineStepError,
    QueueFullError,
    RequestAbortedError,
    RequestStream,
)
from tacit.entrypoints.openai.access_log import note_submitted
from tacit.entrypoints.openai.errors import OpenAIError, bad_request, check_model_name, from_value_error, overloaded
from tacit.entrypoints.openai.harmony import HarmonyTokens
from tacit.outputs import CompletionOutput, Logprob, RequestOutput
from tacit.sampling_params import SamplingParams
from tacit.scheduling.errors import SLOUnattainableError

# Sequences one client request may add (prompts x n). A batch of this many short prompts is
# served as one request even past --max-waiting; beyond it a client should split its batch.
MAX_SEQUENCES_PER_REQUEST = 1024
_NORMALIZATION_MARGIN = 4


class ServingContext:
    def __init__(self, engine: AsyncLLMEngine, model_name: str, harmony: HarmonyTokens | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        # Set when chat output is gpt-oss's harmony format (read off token ids, harmony.py);
        # None: text, with Hermes tool calls (tool_parser.py).
        self.harmony = harmony
        # The tokenizer is only read (HF tokenizers encode is thread-safe); tokenizing here
        # keeps that work off the engine thread, so long prompts do not stall a step.
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        # The model's generation_config.json sampling values, for requests that leave them unset.
        self.sampling_defaults = engine.sampling_defaults
        self.max_token_bytes = self.tokenizer.max_token_bytes  # read once here, not per request

    def refuse_surely_too_long(self, texts: Iterable[str], field: str) -> None:
        """A 400 for prompt text that cannot fit the context whatever it tokenizes to, before it is
        tokenized: a 12 MB prompt took 5.6 s and 0.9 GB to tokenize only to be refused. A text of
        C characters is at least C bytes, so at least C / max_token_bytes tokens; normalization
        can shrink text before that (NFC composes three Hangul jamo into one syllable), hence the
        margin of 4. Anything shorter is tokenized and checked exactly."""
        chars = sum(len(t) for t in texts)
        at_least = chars // (_NORMALIZATION_MARGIN * self.max_token_bytes)
        if at_least > self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, the prompt is at least "
                f"{at_least} tokens ({chars} characters; no token of this model stands for more than "
                f"{self.max_token_bytes} bytes). Please reduce the length of the prompt.",
                field,
            )

    async def encode_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        field: str = "messages",
        template_kwargs: dict | None = None,
    ) -> list[int]:
        """Messages through the chat template to token ids, off the event loop (a long prompt
        took 9 s to tokenize and stalled every stream); a template that refuses them is a 400.
        template_kwargs: more variables for the template (reasoning_effort)."""
        self.refuse_surely_too_long(_message_texts(messages), field)
        try:
            return await asyncio.to_thread(
                self.tokenizer.encode_chat, messages, add_generation_prompt, tools, template_kwargs
            )
        except (ValueError, TemplateError) as e:  # no template, or the template refused these messages
            raise bad_request(f"could not apply the chat template: {e}", "messages") from None

    def check_model(self, name: str | None) -> None:
        check_model_name(name, self.model_name)

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None) -> None:
        """The engine would silently clamp max_tokens to what fits; OpenAI refuses instead, naming
        both numbers, so a client learns its request was too long rather than getting less."""
        if max_tokens is not None and num_prompt_tokens + max_tokens > self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} for the "
                f"completion). Please reduce the length of the prompt or max_tokens.",
                "max_tokens",
            )

    def sampling_params(self, make: Callable[[Mapping[str, float | int]], SamplingParams]) -> SamplingParams:
        """make(the model's sampling defaults): a request's to_sampling_params; its ValueError is a 400."""
        try:
            return make(self.sampling_defaults)
        except ValueError as e:
            raise from_value_error(e) from None

    async def submit(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        request_id: str,
        priority: int,
        structured_param: str | None = None,
        cache_salt: str | None = None,
    ) -> list[RequestStream]:
        """Add one engine request per prompt; all or none (a failure aborts those already in).
        The queue bound is checked for the first prompt only: the batch is one client request.
        structured_param: the request field that carried params' grammar, named if it is invalid."""
        num_sequences = len(prompts) * params.n
        if num_sequences > MAX_SEQUENCES_PER_REQUEST:
            raise bad_request(
                f"this request asks for {num_sequences} sequences ({len(prompts)} prompts x n={params.n}); "
                f"at most {MAX_SEQUENCES_PER_REQUEST} are accepted in one request",
                "prompt",
            )
        streams: list[RequestStream] = []
        try:
            for i, ids in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                streams.append(
                    await self.engine.add_request(ids, params, rid, priority, check_queue=i == 0, cache_salt=cache_salt)
                )
        except BaseException as e:
            for s in streams:
                self.engine.abort(s.request_id)
            if isinstance(e, SLOUnattainableError):  # a load condition, not a bad request
                raise overloaded(str(e), "ttft_slo_ms") from None
            if isinstance(e, ValueError):
                raise from_value_error(e, structured_param) from None
            if isinstance(e, QueueFullError):
                raise overloaded(str(e)) from None
            if isinstance(e, EngineDeadError):
                raise OpenAIError(503, str(e), "server_error") from None
            raise
        note_submitted(request_id, prompts, streams)
        return streams

    def abort_unfinished(self, streams: list[RequestStream]) -> None:
        for s in streams:
            if not s.finished:
                self.engine.abort(s.request_id)
                s.cancel()


def engine_error(e: BaseException) -> OpenAIError:
    """An error met while a request was generating, as an OpenAI error."""
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, EngineDeadError):
        return OpenAIError(503, str(e), "server_error")
    if isinstance(e, RequestAbortedError):
        return OpenAIError(499, str(e), "request_aborted")
    if isinstance(e, EngineStepError):
        return OpenAIError(500, str(e), "server_error")
    return OpenAIError(500, f"internal error: {e!r}", "server_error")


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several streams as they come."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    q: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                q.put_nowait((i, out))
        except BaseException as e:
            q.put_nowait((i, e))
            return
        q.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await q.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def final_outputs(streams: list[RequestStream]) -> list[RequestOutput]:
    async def last(stream: RequestStream) -> RequestOutput:
        out = None
        async for out in stream:
            pass
        assert out is not None
        return out

    return list(await asyncio.gather(*(last(s) for s in streams)))


@contextlib.asynccontextmanager
async def abort_on_disconnect(request: Request, ctx: ServingContext, streams: list[RequestStream]):
    """Abort the requests the moment the client disconnects, whatever the handler is awaiting.

    Starlette also cancels a streaming body on disconnect, but the generator's own cleanup then
    runs only when it is next resumed or collected; this watcher frees the KV blocks at once.
    """

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                ctx.abort_unfinished(streams)
                return

    task = asyncio.create_task(watch())
    try:
        yield task
    finally:
        task.cancel()
        ctx.abort_unfinished(streams)


def token_text(tokenizer, token_id: int, lp: Logprob | None, as_ids: bool) -> str:
    if as_ids:
        return f"token_id:{token_id}"
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id], False)


def logprob_entries(c: CompletionOutput, start: int, end: int) -> list[tuple[int, dict[int, Logprob]]]:
    """(chosen token, {token: Logprob}) for generated positions [start, end)."""
    if c.logprobs is None:
        return []
    # The engine thread appends to c.logprobs after this snapshot was taken; token_ids bound it.
    return list(zip(c.token_ids[start:end], c.logprobs[start:end]))


async def final_outputs_unless_disconnected(
    request: Request, ctx: ServingContext, streams: list[RequestStream]
) -> list[RequestOutput] | None:
    """The finished outputs of a non-streamed reply, or None if the client left first
    (its requests are aborted and their blocks freed at that moment)."""
    async with abort_on_disconnect(request, ctx, streams) as disconnected:
        gen = asyncio.ensure_future(final_outputs(streams))
        await asyncio.wait({gen, disconnected}, return_when=asyncio.FIRST_COMPLETED)
        if not gen.done():  # nobody reads an answer
            gen.cancel()
            return None
        try:
            return gen.result()
        except Exception as e:
            raise engine_error(e) from None


def _message_texts(messages: list[dict]) -> Iterable[str]:
    """The text each message's content holds: a string, or the text of its parts."""
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            yield from (p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
