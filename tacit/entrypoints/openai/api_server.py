"""`tacit serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over AsyncLLMEngine.

POST /v1/completions        POST /v1/chat/completions       (stream: SSE)
POST /v1/responses          (OpenAI's Responses API: text in and out, streamed as typed events)
POST /v1/embeddings         (pooled hidden states: float lists or base64)
POST /tokenize              POST /detokenize                (vLLM's shapes)
GET  /tokenizer_info        (with --enable-tokenizer-info-endpoint, as vLLM)
GET  /v1/models             GET  /health                    GET /metrics (Prometheus text)
Every response carries X-Request-Id (the client's, or a new one). With --enable-log-requests
each request ends with one line on the logger tacit.access (access_log.py).
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import logging
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tacit.config.engine_args import EngineArgs
from tacit.engine.async_engine import AsyncLLMEngine
from tacit.entrypoints.adaptive_args import adaptive_bounds
from tacit.entrypoints.openai.access_log import AccessLogMiddleware, configure_access_log
from tacit.entrypoints.openai.chat_protocol import ChatCompletionRequest
from tacit.entrypoints.openai.completion_protocol import CompletionRequest
from tacit.entrypoints.openai.embeddings_protocol import EmbeddingRequest
from tacit.entrypoints.openai.errors import (
    OpenAIError,
    install_error_handlers,
    parse_body,
)
from tacit.entrypoints.openai.harmony import select_harmony
from tacit.entrypoints.openai.limits import DEFAULT_MAX_REQUEST_BYTES
from tacit.entrypoints.openai.protocol import ModelCard, ModelList
from tacit.entrypoints.openai.responses_protocol import ResponsesRequest
from tacit.entrypoints.openai.serving_chat import ChatServing
from tacit.entrypoints.openai.serving_common import ServingContext
from tacit.entrypoints.openai.serving_completion import CompletionServing
from tacit.entrypoints.openai.serving_embedding import EmbeddingServing
from tacit.entrypoints.openai.serving_images import (
    ImageServing,
    add_image_only_routes,
    add_image_routes,
    image_serving_from_args,
)
from tacit.entrypoints.openai.serving_responses import ResponsesServing
from tacit.entrypoints.openai.serving_tokenization import TokenizationServing
from tacit.entrypoints.openai.tokenization_protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from tacit.loader.hf_cache import display_name

logger = logging.getLogger("tacit.server")

# In-flight streams get this long to finish after SIGTERM before they are cancelled (and their
# requests aborted): long enough for a typical chat reply at CPU speed, short enough for an
# orchestrator's default 30 s kill deadline.
DEFAULT_SHUTDOWN_TIMEOUT_S = 20.0


def api_key_check(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """The dependency every /v1 route takes: a 401 unless the request carries the bearer key."""

    async def check_api_key(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        # compare_digest: the time a wrong key takes to reject says nothing about the right one.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise OpenAIError(
                401,
                "Incorrect or missing API key: send the header `Authorization: Bearer <key>`.",
                "authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check_api_key


def build_app(
    engine: AsyncLLMEngine,
    model_name: str,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    enable_log_requests: bool = False,
    enable_tokenizer_info_endpoint: bool = False,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    image_serving: ImageServing | None = None,
) -> FastAPI:
    """The ASGI app. The engine is started by the caller; the app stops it on shutdown.
    image_serving: also serve POST /v1/images/generations with this image model (--image-model).
    enable_log_requests: an access line per request (AccessLogMiddleware); off, as vLLM's.
    enable_tokenizer_info_endpoint: serve GET /tokenizer_info; off (404), as vLLM's.
    tool_call_parser, reasoning_parser: vLLM's flags (None: from the model); "openai" /
    "openai_gptoss", or a gpt-oss model, read chat output as harmony (harmony.py)."""
    harmony = select_harmony(engine.hf_config, engine.tokenizer, tool_call_parser, reasoning_parser)
    ctx = ServingContext(engine, model_name, harmony)
    completions, chat, tokenization = CompletionServing(ctx), ChatServing(ctx), TokenizationServing(ctx)
    embeddings = EmbeddingServing(ctx)
    responses = ResponsesServing(ctx)

    engines: list[Any] = [engine] if image_serving is None else [engine, image_serving.engine]
    app = new_app(engines, enable_log_requests)
    v1 = [Depends(api_key_check(api_key))]

    @app.post("/v1/completions", dependencies=v1)
    async def create_completion(request: Request) -> Response:
        return await completions.create(await parse_body(request, CompletionRequest, max_request_bytes), request)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def create_chat_completion(request: Request) -> Response:
        return await chat.create(await parse_body(request, ChatCompletionRequest, max_request_bytes), request)

    @app.post("/v1/responses", dependencies=v1)
    async def create_response(request: Request) -> Response:
        return await responses.create(await parse_body(request, ResponsesRequest, max_request_bytes), request)

    @app.post("/v1/embeddings", dependencies=v1)
    async def create_embeddings(request: Request) -> Response:
        body = await embeddings.create(await parse_body(request, EmbeddingRequest, max_request_bytes), request)
        return Response(status_code=499) if body is None else JSONResponse(body.model_dump())

    @app.post("/tokenize", dependencies=v1)
    async def tokenize(request: Request) -> TokenizeResponse:
        return await tokenization.tokenize(await parse_body(request, TokenizeRequest, max_request_bytes))

    @app.post("/detokenize", dependencies=v1)
    async def detokenize(request: Request) -> DetokenizeResponse:
        return await tokenization.detokenize(await parse_body(request, DetokenizeRequest, max_request_bytes))

    if enable_tokenizer_info_endpoint:
        info = tokenization.tokenizer_info()  # the tokenizer never changes while serving

        @app.get("/tokenizer_info", dependencies=v1)
        async def tokenizer_info() -> JSONResponse:
            return JSONResponse(info)

    @app.get("/openapi.json", dependencies=v1, include_in_schema=False)
    async def openapi_schema() -> JSONResponse:
        return JSONResponse(app.openapi())

    cards = [ModelCard(id=model_name, max_model_len=ctx.max_model_len)]
    if image_serving is not None:
        add_image_routes(app, image_serving, v1, max_request_bytes)
        cards.append(ModelCard(id=image_serving.model_name))

    @app.get("/v1/models", dependencies=v1)
    async def list_models() -> ModelList:
        return ModelList(data=cards)

    @app.get("/health")
    async def health() -> Response:
        if not all(e.is_running for e in engines):
            raise OpenAIError(503, "the engine is not running", "server_error")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            engine.metrics.render_prometheus(model_name), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return app


def new_app(engines: list[Any], enable_log_requests: bool) -> FastAPI:
    """The app with tacit's error shapes and middleware and no route; on shutdown it stops the
    engines (AsyncLLMEngine, ImageEngine), which the caller started."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn has stopped accepting and waited for (or cancelled) in-flight requests:
        # whatever the engines still hold has no reader, so abort it and stop their threads.
        for engine in engines:
            engine.shutdown()

    # The schema is served by a route, behind the API key like every other /v1 route.
    app = FastAPI(title="tacit", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    if enable_log_requests:  # added last, so outermost: it sees the X-Request-Id the client gets
        app.add_middleware(AccessLogMiddleware)
    return app


def build_image_app(
    image_serving: ImageServing,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    enable_log_requests: bool = False,
) -> FastAPI:
    """The app of a server with an image model and no language model (`tacit serve` on a
    diffusion checkpoint): its LLM routes answer 404 saying so."""
    app = new_app([image_serving.engine], enable_log_requests)
    add_image_only_routes(app, image_serving, [Depends(api_key_check(api_key))], max_request_bytes)
    return app


class RequestIdMiddleware:
    """Echo the client's X-Request-Id, or make one, on every response, so a client can match its
    logs to the server's. Plain ASGI rather than @app.middleware("http"): starlette's
    BaseHTTPMiddleware wraps streaming responses and would hide a client's disconnect, which is
    how an abandoned stream gets aborted and its KV blocks freed."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id")
        rid = given if given else uuid.uuid4().hex.encode()

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
            await send(message)

        await self.app(scope, receive, send_with_id)


# Streams still open this long before the grace period ends are ended by the server (an error
# event, then [DONE]) rather than cut by uvicorn's cancellation, which clients saw as a protocol
# error. One second is ample for the engine thread to fail them and the events to be written.
_END_STREAMS_BEFORE_S = 1.0


def _draining_server_class():  # uvicorn is imported lazily: `tacit serve` is an optional extra
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn.Server that, once asked to exit, ends the engine's in-flight requests just
        before the graceful-shutdown deadline, so every stream closes with an error event."""

        def __init__(self, config: Any, stop_engines: Callable[[], None], grace_s: float | None) -> None:
            super().__init__(config)
            self._stop_engines, self._grace_s, self._timer = stop_engines, grace_s, None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self._timer is None and self._grace_s is not None:
                delay = max(0.0, self._grace_s - _END_STREAMS_BEFORE_S)
                self._timer = threading.Timer(delay, self._stop_engines)
                self._timer.daemon = True
                self._timer.start()
            super().handle_exit(sig, frame)

    return DrainingServer


def served_model_name(args: argparse.Namespace, model: str | None) -> str:
    """--served-model-name, else the model as given (flag or recipe), else the default model's name."""
    if getattr(args, "served_model_name", None):
        return args.served_model_name
    if model is None:
        from tacit.loader.default_model import DEFAULT_MODEL_FILE

        return DEFAULT_MODEL_FILE.split(".")[0]  # "SmolLM2-135M-Instruct"
    return model


def describe_sampling_defaults(defaults: dict[str, float | int]) -> str:
    """What a request that sets no temperature / top_p / top_k / min_p / repetition_penalty samples
    with, for the start-up line."""
    if defaults:
        return "sampling defaults from generation_config.json: " + ", ".join(f"{k} {v}" for k, v in defaults.items())
    return "sampling defaults: OpenAI's (temperature 1, top_p 1)"


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def open_bind_warning(host: str, api_key: str | None) -> str | None:
    """What to warn of when the server listens beyond this machine with no API key (None: nothing)."""
    if api_key or host in LOOPBACK or host.startswith("127."):
        return None
    return (
        f"serving on {host} without --api-key (or TACIT_API_KEY): anyone who can reach this port can use "
        "the model; set one, or bind 127.0.0.1"
    )


def run_server(args: argparse.Namespace) -> int:
    """Load the model(s), serve until SIGTERM/SIGINT, then drain and exit 0 (1 if the engine died)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # --image-model, or --model itself when it is a diffusion checkpoint (then images only).
    image_serving, images_only = image_serving_from_args(args)
    engines: list[Any] = [] if image_serving is None else [image_serving.engine]
    engine: AsyncLLMEngine | None = None
    try:
        if images_only:
            assert image_serving is not None
            app = build_image_app(image_serving, args.api_key, args.max_request_bytes, args.enable_log_requests)
        else:
            engine, name = _load_llm_engine(args)
            engines.insert(0, engine)
            app = build_app(
                engine,
                name,
                args.api_key,
                args.max_request_bytes,
                enable_log_requests=args.enable_log_requests,
                enable_tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
                tool_call_parser=args.tool_call_parser,
                reasoning_parser=args.reasoning_parser,
                image_serving=image_serving,
            )
    except BaseException:  # flags that contradict the model: stop the loaded engines' threads, then say so
        for e in engines:
            e.shutdown()
        raise
    warning = open_bind_warning(args.host, args.api_key)
    if warning:
        print(f"tacit: warning: {warning}", file=sys.stderr, flush=True)
    if args.enable_log_requests:
        configure_access_log(args.log_format)

    def stop_engines() -> None:
        for e in engines:
            e.shutdown()

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=getattr(args, "shutdown_timeout", DEFAULT_SHUTDOWN_TIMEOUT_S),
        lifespan="on",
    )
    server = _draining_server_class()(config, stop_engines, config.timeout_graceful_shutdown)
    if engine is not None:
        # A dead tensor-parallel worker ends the engine for good: requests get 503, then the
        # server exits non-zero so a supervisor restarts it.
        engine.on_fatal = lambda: setattr(server, "should_exit", True)
    # uvicorn re-raises the signal it caught once it has shut down gracefully; with the default
    # SIGTERM handler that kills the process (status 143) after a clean drain. A no-op handler
    # is what it restores and re-raises into, so a SIGTERM ends in `return 0`.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    except KeyboardInterrupt:  # SIGINT re-raised the same way lands here
        pass
    finally:
        stop_engines()
    if engine is not None and engine.fatal_error is not None:
        print(f"tacit: exiting: {engine.fatal_error}", file=sys.stderr)
        return 1
    return 0 if server.started else 1


def _load_llm_engine(args: argparse.Namespace) -> tuple[AsyncLLMEngine, str]:
    """The language model's engine, started (its model built) before the port is bound, so
    /health answering means the model is ready; and the name it is served as."""
    t0 = time.perf_counter()
    engine_args = EngineArgs.from_cli_args(args)
    adaptive = adaptive_bounds(args)  # before loading: a stray --adaptive-* flag fails at once
    print(
        f"tacit: loading {engine_args.model or 'the default model (SmolLM2-135M-Instruct)'} ...",
        file=sys.stderr,
        flush=True,
    )
    engine = AsyncLLMEngine.from_engine_args(max_waiting=args.max_waiting, adaptive=adaptive, engine_args=engine_args)
    engine.start()  # builds the model on the engine thread; raises what loading raised
    name = served_model_name(args, engine_args.model)
    e = engine.engine
    print(
        f"tacit: loaded {display_name(engine_args.model, Path(e.source.path))} in {time.perf_counter() - t0:.1f}s ({e.config.model.dtype}, "
        f"{e.num_kv_blocks} KV blocks, max_model_len {e.max_model_len}); serving `{name}` on "
        f"http://{args.host}:{args.port}/v1; decode: {e.runner.decode_path}; "
        f"{describe_sampling_defaults(e.sampling_defaults)}",
        file=sys.stderr,
        flush=True,
    )
    return engine, name
