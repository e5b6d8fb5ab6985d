"""POST /v1/images/generations: one ImageRequest per client request, queued on the ImageEngine
(priorities, batching of compatible requests), answered with the images inline as base64.

Also what `tacit serve` needs to serve an image model: loading one (image_serving_from_args) and,
on a server with no language model, clear 404s on the LLM routes (add_no_llm_routes).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tacit.engine.image_engine import DEFAULT_MAX_IMAGE_BATCH, DEFAULT_MAX_IMAGE_WAITING, ImageEngine, native_size
from tacit.engine.request_stream import EngineDeadError, QueueFullError
from tacit.entrypoints.image_cli import check_diffusion_checkpoint, is_diffusion_checkpoint
from tacit.entrypoints.openai.errors import OpenAIError, bad_request, check_model_name, overloaded, parse_body
from tacit.entrypoints.openai.images_protocol import ImageData, ImageGenerationRequest, ImagesResponse
from tacit.entrypoints.openai.protocol import ModelCard, ModelList, random_id

if TYPE_CHECKING:
    from PIL.Image import Image

    from tacit.diffusion.request import ImageRequest

logger = logging.getLogger("tacit.server")

# The LLM routes, answered on a server that serves only an image model.
LLM_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/tokenize", "/detokenize")


def load_image_engine(
    path: str,
    dtype: str = "float32",
    tokenizer_dir: str | None = None,
    max_batch_images: int = DEFAULT_MAX_IMAGE_BATCH,
    max_waiting: int = DEFAULT_MAX_IMAGE_WAITING,
    compile: bool = False,
) -> ImageEngine:
    """The pipeline loaded and its engine's worker started. tokenizer_dir: where a single-file
    checkpoint's tokenizers are (a directory holding tokenizer/ and, for SDXL, tokenizer_2/)."""

    from tacit.diffusion.optimize import serving_options
    from tacit.diffusion.pipeline import ImagePipeline

    check_diffusion_checkpoint(path, "--image-model")
    options = serving_options(dtype, compile)
    pipeline = ImagePipeline.from_pretrained(path, dtype=options.dtype, options=options, tokenizer_dir=tokenizer_dir)
    engine = ImageEngine(pipeline, max_batch_images, max_waiting)
    engine.start()
    return engine


def image_serving_from_args(args: argparse.Namespace) -> tuple["ImageServing | None", bool]:
    """`tacit serve`'s image model, loaded, and whether it is the only model: --image-model PATH
    serves it beside the language model; --model PATH, when PATH is a diffusion checkpoint,
    serves it alone (then --served-model-name names it)."""
    images_only = getattr(args, "image_model", None) is None and is_diffusion_checkpoint(args.model)
    path = args.model if images_only else getattr(args, "image_model", None)
    if path is None:
        return None, False
    # With no LLM, --dtype and --tokenizer are the image model's; --dtype auto (or unset) is float32,
    # the precision every diffusion checkpoint's reference output is defined in.
    dtype = args.image_dtype or (args.dtype if images_only and args.dtype not in (None, "auto") else "float32")
    t0 = time.perf_counter()
    print(f"tacit: loading image model {path} ...", file=sys.stderr, flush=True)
    tokenizer_dir = args.image_tokenizer or (args.tokenizer if images_only else None)
    engine = load_image_engine(
        path, dtype, tokenizer_dir, args.max_image_batch, args.max_image_waiting, args.image_compile
    )
    name = (args.served_model_name if images_only else None) or path
    width, height = native_size(engine.pipeline)
    print(
        f"tacit: loaded image model {path} in {time.perf_counter() - t0:.1f}s ({dtype}, native size {width}x{height}, "
        f"batches of up to {args.max_image_batch} images); serving `{name}` on POST /v1/images/generations",
        file=sys.stderr,
        flush=True,
    )
    return ImageServing(engine, name), images_only


def encode_image(image: "Image", fmt: str, compression: int | None) -> str:
    """The image as base64 of a png / jpeg / webp file (compression: jpeg/webp quality 0..100)."""
    buf = io.BytesIO()
    kwargs: dict[str, Any] = {} if compression is None else {"quality": compression}
    image.save(buf, format=fmt.upper(), **kwargs)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def limits_error(e: ValueError, request: "ImageRequest | None" = None) -> OpenAIError:
    """The pipeline's ValueError as a 400. ImageLimits.validate's messages start "FIELD=VALUE:"
    and name the valid range; FIELD is the request field of that name (`param`), except width and
    height, which the client sent as `size`."""
    message = str(e)
    field = message.split("=", 1)[0].strip() if "=" in message else ""
    if field in ("width", "height"):
        size = f" {request.width}x{request.height}" if request is not None else ""
        return bad_request(f"size{size}: {message}", "size")
    return bad_request(message, field if field.isidentifier() else None)


class ImageServing:
    def __init__(self, engine: ImageEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def check_model(self, name: str | None) -> None:
        check_model_name(name, self.model_name, "makes images with")

    def image_request(self, req: ImageGenerationRequest, request_id: str) -> "ImageRequest":
        """The pipeline's request: the client's fields over ImageRequest's defaults; size unset
        or "auto" is the model's native size."""
        from tacit.diffusion.request import ImageRequest

        width, height = req.dimensions(native_size(self.engine.pipeline))
        given = {
            "negative_prompt": req.negative_prompt,
            "n": req.n,
            "steps": req.steps,
            "guidance_scale": req.guidance_scale,
            "seed": req.seed,
            "scheduler": req.scheduler,
        }
        fields = {k: v for k, v in given.items() if v is not None}
        return ImageRequest(
            prompt=req.prompt,
            width=width,
            height=height,
            priority=req.priority,
            request_id=request_id,
            **fields,
        )

    async def create(self, req: ImageGenerationRequest, raw: Request) -> Response:
        self.check_model(req.model)
        try:
            fmt = req.image_format()
        except ValueError as e:
            raise bad_request(str(e), "output_compression") from None
        request_id = random_id("img")
        if req.user is not None:  # OpenAI's abuse-monitoring id: it changes no image, so it is logged
            logger.info("image request %s from user %r", request_id, req.user)
        image_request = self.image_request(req, request_id)
        try:
            future = self.engine.submit(image_request)
        except ValueError as e:
            raise limits_error(e, image_request) from None
        except QueueFullError as e:
            raise overloaded(str(e)) from None
        except EngineDeadError as e:
            raise OpenAIError(503, str(e), "server_error") from None
        result = await _unless_disconnected(raw, asyncio.wrap_future(future))
        if result is None:
            return Response(status_code=499)
        t0 = time.perf_counter()
        # Off the event loop: a 1024x1024 PNG takes ~0.1 s to compress.
        data = await asyncio.to_thread(
            lambda: [
                ImageData(b64_json=encode_image(im, fmt, req.output_compression), seed=result.seed + i)
                for i, im in enumerate(result.images)
            ]
        )
        timings = {**result.timings, "encode_s": time.perf_counter() - t0}
        body = ImagesResponse(
            created=int(time.time()),
            data=data,
            output_format=fmt,
            size=f"{image_request.width}x{image_request.height}",
            timings=timings,
        )
        return JSONResponse(body.model_dump())


async def _unless_disconnected(raw: Request, result: "asyncio.Future[Any]") -> Any:
    """The result, or None if the client left first (its request is then cancelled: dropped from
    the queue if it has not started; a batch already denoising runs to its end)."""

    async def watch() -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not result.done():
        result.cancel()
        return None
    try:
        return result.result()
    except ValueError as e:  # what the pipeline found wrong with this request alone
        raise limits_error(e) from None
    except EngineDeadError as e:
        raise OpenAIError(503, str(e), "server_error") from None
    except Exception as e:
        raise OpenAIError(500, f"image generation failed: {e!r}", "server_error") from None


def add_image_routes(app: FastAPI, serving: ImageServing, dependencies: list[Any], max_request_bytes: int) -> None:
    @app.post("/v1/images/generations", dependencies=dependencies)
    async def create_images(request: Request) -> Response:
        return await serving.create(await parse_body(request, ImageGenerationRequest, max_request_bytes), request)


def add_no_llm_routes(app: FastAPI, image_model: str, dependencies: list[Any]) -> None:
    """A server started on a diffusion checkpoint has no language model: its LLM routes say so
    and how to get one, rather than a bare "Not Found"."""

    async def no_llm(request: Request) -> Response:
        raise OpenAIError(
            404,
            f"{request.url.path} needs a language model; this server serves only the image model `{image_model}` "
            f"(POST /v1/images/generations). To serve both: tacit serve --model LLM --image-model {image_model}",
            "invalid_request_error",
            code="model_not_found",
        )

    for path in LLM_ROUTES:
        app.add_api_route(path, no_llm, methods=["POST"], dependencies=dependencies)


def add_image_only_routes(app: FastAPI, serving: ImageServing, dependencies: list[Any], max_request_bytes: int) -> None:
    """Every route of a server whose only model is an image model."""
    add_image_routes(app, serving, dependencies, max_request_bytes)
    add_no_llm_routes(app, serving.model_name, dependencies)

    @app.get("/openapi.json", dependencies=dependencies, include_in_schema=False)
    async def openapi_schema() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/v1/models", dependencies=dependencies)
    async def list_models() -> ModelList:
        return ModelList(data=[ModelCard(id=serving.model_name)])

    @app.get("/health")
    async def health() -> Response:
        if not serving.engine.is_running:
            raise OpenAIError(503, "the image engine is not running", "server_error")
        return Response(status_code=200)
