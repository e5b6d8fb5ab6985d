"""AsyncLLMEngine: one LLMEngine stepping in one background thread, fed by asyncio handlers.

LLMEngine is not thread-safe, so exactly one thread (the engine thread) ever touches it. Handlers
talk to it through two one-way channels:

    handler --(queue.SimpleQueue of _Add/_Abort/_Stop)--> engine thread   (applied between steps)
    engine thread --(loop.call_soon_threadsafe)--> RequestStream's asyncio.Queue --> handler

A request that arrives while others run is added between two steps and joins the very next
one: that is continuous batching, and it is what makes 32 streams cost ~1 step per token
rather than 32. Nothing a handler does waits on a step except awaiting its own outputs, and an
add waits only for the gap between two steps (one decode step: ~1 ms tiny, ~50 ms for 135M on
2 CPU cores) to learn whether it was accepted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from typing import Any, AsyncIterator, Callable

from tacit.engine.adaptation import EngineAdaptation
from tacit.engine.engine_commands import _Abort, _Add, _Stop
from tacit.engine.executor import WorkerDiedError
from tacit.engine.llm_engine import LLMEngine
from tacit.engine.metrics import ServingMetrics
from tacit.engine.request_metrics import observe_finished, observe_step
from tacit.engine.request_stream import (
    EngineDeadError,
    EngineStepError,
    QueueFullError,
    RequestAbortedError,
    RequestStream,
    StepDelivery,
)
from tacit.engine.vllm_metrics import VllmRequestMetrics
from tacit.outputs import RequestOutput
from tacit.sampling_params import SamplingParams
from tacit.scheduling.adaptive import AdaptiveBounds
from tacit.scheduling.errors import SLOUnattainableError
from tacit.tokenizer import Tokenizer
from tacit.worker.paths.base import finish

# The handler-side types live in request_stream.py; they are re-exported here for the server.
__all__ = [
    "AsyncLLMEngine",
    "EngineDeadError",
    "EngineStepError",
    "QueueFullError",
    "RequestAbortedError",
    "RequestStream",
]

logger = logging.getLogger("tacit.engine")


class AsyncLLMEngine:
    def __init__(
        self, engine_factory: Callable[[], LLMEngine], max_waiting: int = 256, adaptive: AdaptiveBounds | None = None
    ) -> None:
        """engine_factory builds the LLMEngine; it runs on the engine thread (see start()). adaptive:
        the bounds of the step budget and long-prefill cap moved with the load (engine/adaptation.py)."""
        if max_waiting < 1:
            raise ValueError(f"max_waiting={max_waiting} is invalid: it must be >= 1")
        self._engine_factory = engine_factory
        self.engine: LLMEngine | None = None  # set by start()
        self.max_waiting = max_waiting
        self._adaptive, self.adaptation = adaptive, None  # EngineAdaptation, built by start() with the engine
        self.metrics = ServingMetrics()
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._deferred: list[_Abort | _Stop] = []  # engine thread only: commands held back mid-step
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="tacit-engine", daemon=True)
        self._ready = threading.Event()
        self._build_error: BaseException | None = None
        # Set when the engine can never step again (a tensor-parallel worker died); on_fatal,
        # if given, is then called from the engine thread (the server exits non-zero on it).
        self.fatal_error: BaseException | None = None
        self.on_fatal: Callable[[], None] | None = None

    @classmethod
    def from_engine_args(
        cls, max_waiting: int = 256, adaptive: AdaptiveBounds | None = None, **engine_kwargs: Any
    ) -> "AsyncLLMEngine":
        return cls(lambda: LLMEngine(**engine_kwargs), max_waiting=max_waiting, adaptive=adaptive)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread and return once it has built the engine (re-raising its error).

        The engine is built on the thread that steps it, not handed over from the main thread:
        a model loaded on the main thread and stepped on another measured ~1.4x slower per step
        (SmolLM2-135M bf16, 64 sequences, 2 cores: ~280 vs ~200 ms/step). The cause is OpenMP's:
        the load left the main thread a pool of worker threads, and while two pools' threads
        outnumber the cores every parallel region pays a wake-up (platforms/compute_thread.py).
        The same holds for any torch work the caller runs on its own thread before this engine
        steps: run it through compute_thread.run_on_own_thread, as tacit's measuring commands do.
        """
        self._thread.start()
        self._ready.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.config.model.hf["vocab_size"]

    @property
    def hf_config(self) -> dict:
        """The model's config.json as read (the server picks gpt-oss's output format from it)."""
        return self.engine.config.model.hf

    @property
    def hidden_size(self) -> int:  # an embedding's length: /v1/embeddings' dimensions stay within it
        return int(self.engine.config.model.hf["hidden_size"])

    @property
    def sampling_defaults(self) -> dict[str, float | int]:
        """generation_config.json's sampling values (LLMEngine.sampling_defaults)."""
        return self.engine.sampling_defaults

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort whatever is still in flight, then stop and join the engine thread (and the
        engine's worker processes)."""
        if self._thread.is_alive():
            self._commands.put(_Stop())
            self._thread.join(timeout)
        if self.engine is not None and not self._thread.is_alive():
            self.engine.shutdown()

    # ---- handler side (event loop thread) ---------------------------------------------------

    async def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
        check_queue: bool = True,
        cache_salt: str | None = None,
    ) -> RequestStream:
        """Queue a request; returns once the engine accepted it, or raises ValueError /
        QueueFullError / EngineDeadError. Iterate the returned stream for outputs."""
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        stream = RequestStream(rid, asyncio.get_running_loop())
        stream.params = params
        self._commands.put(_Add(rid, prompt, params, priority, stream, check_queue, cache_salt))
        try:
            while True:
                done, _ = await asyncio.wait({stream.accepted}, timeout=1.0)
                if done:
                    stream.accepted.result()  # raises the engine's answer if it said no
                    break
                if not self.is_running:  # the thread stopped after our is_running check
                    raise EngineDeadError("the engine stopped before taking the request")
        except asyncio.CancelledError:
            self.abort(rid)  # commands are FIFO: this lands after the add, so nothing leaks
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Drop a request; its KV blocks are freed before the next step. Safe from a finally
        block of a cancelled task (it never awaits), and a no-op for unknown ids."""
        self._commands.put(_Abort(request_id))

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None, priority: int = 0
    ) -> AsyncIterator[RequestOutput]:
        stream = await self.add_request(prompt, params, request_id, priority)
        try:
            async for out in stream:
                yield out
        finally:
            if not stream.finished:
                self.abort(stream.request_id)

    # ---- engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.engine = self._engine_factory()
            self.metrics.vllm = VllmRequestMetrics(self.engine.max_model_len)
            if self._adaptive is not None:
                self.adaptation = EngineAdaptation(self._adaptive, self.engine, self.metrics)
            self._publish()
        except BaseException as e:
            self._build_error = e
            return
        finally:
            self._ready.set()
        stop_reason: BaseException = EngineDeadError("the server is shutting down")
        stepped = False  # since the heap was last trimmed
        try:
            while True:
                idle = not self.engine.has_unfinished_requests()
                if idle and stepped:
                    # About to wait for work: a good moment to give freed heap pages back.
                    self.engine.platform.release_host_memory()
                    stepped = False
                if not self._apply_commands(block=idle):
                    break
                if self.engine.has_unfinished_requests():
                    steps_before = self.engine.num_steps
                    stepped = True
                    self._step()
                    if self.engine.num_steps == steps_before and self.engine.has_unfinished_requests():
                        # Nothing could be scheduled (the current scheduler never does this, but
                        # a busy loop here would starve the handlers of the GIL): wait a little.
                        if not self._apply_commands(block=True, timeout=0.01):
                            break
                self._publish()
        except WorkerDiedError as e:
            logger.error("%s", e)
            self.fatal_error = e
            stop_reason = EngineDeadError(f"the engine stopped: {e}")
        except BaseException as e:  # a bug outside step(): fail every caller instead of hanging them
            logger.exception("engine loop crashed")
            stop_reason = EngineDeadError(f"the engine loop crashed: {e!r}")
        finally:
            for rid in list(self._streams):
                self._fail(rid, stop_reason)
            self._drain_rejecting(stop_reason)
            self._publish()
            if self.fatal_error is not None and self.on_fatal is not None:
                self.on_fatal()

    def _apply_commands(self, block: bool, timeout: float | None = None, adds_only: bool = False) -> bool:
        """Apply queued adds/aborts; with block, wait for the first one. False means stop.

        adds_only (mid-step): aborts and stops wait for the step to end, since the step in
        flight is still writing the KV blocks an abort would free."""
        if not adds_only and self._deferred:
            pending, self._deferred = self._deferred, []
            for cmd in pending:
                if not self._apply(cmd):
                    return False
        try:
            cmd = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if adds_only and not isinstance(cmd, _Add):
                self._deferred.append(cmd)
            elif not self._apply(cmd):
                return False
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, cmd: _Add | _Abort | _Stop) -> bool:
        if isinstance(cmd, _Stop):
            return False
        if isinstance(cmd, _Add):
            self._add(cmd)
        else:
            self._abort(cmd.request_id)
        return True

    def _run_step(self) -> list[RequestOutput]:
        """One engine step; in each of its pauses between two decoder layers, take new requests
        in and let those the policy says may cut in prefill now (their own step, run here while
        this one waits), so an interactive request's first token does not wait for a loaded step
        to end."""
        return finish(self.engine.step_in_layers(), self._cut_in)

    def _cut_in(self) -> None:
        if not self._commands.empty():
            self._apply_commands(block=False, adds_only=True)
            self._deliver(self.engine.cut_in_step())

    def _num_waiting_sequences(self) -> int:
        # Sequences, not parents: one request with n=100000 once queued 99,297 sequences past a
        # bound of 256 "requests" and starved every other client for 30 s.
        return self.engine.get_stats().num_waiting

    def _add(self, cmd: _Add) -> None:
        error: BaseException | None = None
        # The bound is checked once per client request (check_queue): the later prompts of a
        # batch join with the first, so a 300-prompt batch on an idle server is served, not
        # refused half-way by its own earlier prompts.
        if cmd.check_queue and self._num_waiting_sequences() >= self.max_waiting:
            error = QueueFullError(
                f"the server is at capacity: {self.max_waiting} sequences are already waiting; retry later"
            )
            self.metrics.count_request("rejected")
        else:
            try:
                self.engine.add_request(cmd.prompt, cmd.params, cmd.request_id, cmd.priority, cmd.cache_salt)
                self._streams[cmd.request_id] = cmd.stream
            except ValueError as e:  # the caller's fault (or, for sla admission, the load's): tell them
                error = e
                if isinstance(e, SLOUnattainableError):
                    self.metrics.count_request("slo_rejected")
            except Exception as e:  # not the caller's fault, but still no reason to die
                logger.exception("add_request failed")
                error = RuntimeError(f"could not add the request: {e!r}")
        self._call_on_loop(cmd.stream, cmd.stream._accept, error)

    def _abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        try:
            self.engine.abort_request(request_id)
        except Exception:  # a bookkeeping bug must not take every other request down with it
            logger.exception("abort_request(%r) failed", request_id)
        self.metrics.count_request("abort")

    def _step(self) -> None:
        started = time.monotonic()
        try:
            outputs = self._run_step()
        except WorkerDiedError:
            raise  # no later step can run either: the loop ends, failing every request with it
        except Exception as e:
            logger.exception("engine step failed")
            # The requests scheduled in the failed step are now running; drop those (if schedule()
            # itself failed nothing is running, and every request is suspect).
            failed = self.engine.running_request_ids() or set(self._streams)
            for rid in failed:
                self._fail(rid, EngineStepError(f"the engine step failed: {e!r}"))
            return
        self._deliver(outputs)
        if self.adaptation is not None:  # between two steps: the next schedule() runs with its decision
            self.adaptation.after_step(self.engine, started, time.monotonic())

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        deliveries: dict[asyncio.AbstractEventLoop, StepDelivery] = {}
        step_tokens = 0
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            step_tokens += observe_step(self.metrics, stream, out, now)
            if out.finished:
                del self._streams[out.request_id]
                for c in out.outputs:
                    self.metrics.count_request(c.finish_reason or "unknown")
                observe_finished(self.metrics, stream, out, now)
            deliveries.setdefault(stream.loop, StepDelivery()).items.append((stream, out))
        if self.metrics.vllm is not None:
            self.metrics.vllm.iteration_tokens.observe(step_tokens)
        for loop, delivery in deliveries.items():
            try:
                loop.call_soon_threadsafe(delivery)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                for stream, _ in delivery.items:
                    self._abort(stream.request_id)

    def _fail(self, request_id: str, error: BaseException) -> None:
        stream = self._streams.pop(request_id, None)
        try:
            self.engine.abort_request(request_id)
        except Exception:
            logger.exception("abort_request(%r) failed while failing it", request_id)
        if stream is not None:
            self.metrics.count_request("error")
            self._call_on_loop(stream, stream._put, error)

    def _drain_rejecting(self, error: BaseException) -> None:
        """After the loop stops: adds still queued must not wait forever for an answer."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                self._call_on_loop(cmd.stream, cmd.stream._accept, error)

    @staticmethod
    def _call_on_loop(stream: RequestStream, fn: Any, arg: Any) -> None:
        try:
            stream.loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:
            pass  # the loop is closed; the caller is gone

    def _publish(self) -> None:
        self.metrics.snapshot = self.engine.get_stats()
