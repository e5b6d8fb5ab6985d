"""The handler's side of AsyncLLMEngine: a RequestStream per request, and the errors it raises.

The engine thread fills a stream through loop.call_soon_threadsafe (one StepDelivery per step and
event loop); the handler iterates it on its event loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from tacit.outputs import RequestOutput
from tacit.sampling_params import SamplingParams


class QueueFullError(RuntimeError):
    """The waiting queue holds max_waiting requests: the caller should retry later (HTTP 503)."""


class EngineStepError(RuntimeError):
    """A step raised while this request was in it; the request is dropped, the engine goes on."""


class EngineDeadError(RuntimeError):
    """The engine thread has stopped (shutdown, or a bug outside a step)."""


class RequestAbortedError(RuntimeError):
    """The handler itself gave up on this request (its client went away)."""


class RequestStream:
    """The handler's end of one request: cumulative RequestOutputs, newest last."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self.accepted: asyncio.Future[None] = loop.create_future()
        self.finished = False
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        # Engine-thread bookkeeping for the latency histograms; the server's access log reads the
        # first token's time and the token counts once the request is over (access_log.py).
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None  # time.monotonic() of the first generated token
        self.tokens_seen: dict[int, int] = {}
        self.first_token_at: dict[int, float] = {}  # per sequence, for vLLM's prefill/decode times
        self.last_token_time: dict[int, float] = {}
        self.params: SamplingParams | None = None  # the request's, for vLLM's request_params_* histograms

    # -- called on the event loop, scheduled by the engine thread --
    def _accept(self, error: BaseException | None) -> None:
        if self.accepted.done():  # the handler was cancelled while waiting
            return
        if error is None:
            self.accepted.set_result(None)
        else:
            self.accepted.set_exception(error)

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    def cancel(self) -> None:
        """Wake whoever iterates this stream with RequestAbortedError: after an abort the engine
        sends nothing more, and an iterator left waiting would wait forever. Event loop only."""
        if not self.finished:
            self._put(RequestAbortedError(f"request {self.request_id} was aborted"))

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self._queue.get()
            # Outputs are cumulative, so a handler that fell behind (slow client) skips to the
            # newest one instead of replaying every step: its deltas just get bigger.
            error = item if isinstance(item, BaseException) else None
            while error is None and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if isinstance(nxt, BaseException):
                    error = nxt
                else:
                    item = nxt
            if error is not None:
                self.finished = True
                raise error
            assert isinstance(item, RequestOutput)
            self.finished = item.finished
            yield item


@dataclass
class StepDelivery:
    """Everything one step produced for one event loop: a single cross-thread wakeup per step."""

    items: list[tuple[RequestStream, Any]] = field(default_factory=list)

    def __call__(self) -> None:
        for stream, item in self.items:
            stream._put(item)
