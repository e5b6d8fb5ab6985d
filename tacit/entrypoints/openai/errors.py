"""OpenAI's error body, {"error": {"message", "type", "param", "code"}}, for every failure.

Clients (the `openai` package included) read `error.message` and map the status to an exception
class, so every path out of the server that is not a success, FastAPI's own included, must use
this shape. FastAPI answers 422 for a body that fails validation; OpenAI answers 400, and so
do we.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Sequence, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tacit.entrypoints.openai.limits import DEFAULT_MAX_REQUEST_BYTES
from tacit.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from tacit.structured_output import StructuredOutputError

logger = logging.getLogger("tacit.server")

# How long a client told "at capacity" should wait: about the time a few requests need to
# leave the waiting queue at the default model's speed on a small CPU box.
RETRY_AFTER_S = 1


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: int | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param
        self.code = code if code is not None else status
        self.headers = headers


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", param)


def overloaded(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(503, message, "server_overloaded", param, headers={"Retry-After": str(RETRY_AFTER_S)})


_PARAM_IN_MESSAGE = re.compile(r"^SamplingParams\.(\w+)=")


def check_model_name(name: str | None, served: str, what: str = "serves") -> None:
    """A request's `model` must be the served one (unset means it): else OpenAI's 404 model_not_found."""
    if name is not None and name != served:
        raise OpenAIError(
            404,
            f"The model `{name}` does not exist; this server {what} `{served}`.",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def from_value_error(e: ValueError, structured_param: str | None = None) -> OpenAIError:
    """The engine's and SamplingParams' ValueErrors already say what is wrong and what is valid;
    SamplingParams' also name the field, which becomes `param`. A grammar the engine could not
    compile is named by the request field that carried it (structured_param)."""
    message = str(e)
    if isinstance(e, StructuredOutputError) and structured_param is not None:
        return bad_request(f"{structured_param} is invalid: {e.reason}", structured_param)
    param = getattr(e, "param", None)  # protocol.FieldError
    if isinstance(param, str):
        return bad_request(message, param)
    m = _PARAM_IN_MESSAGE.match(message)
    if m:
        return bad_request(message.removeprefix("SamplingParams."), m.group(1))
    return bad_request(message)


def error_response(e: OpenAIError) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=e.message, type=e.type, param=e.param, code=e.code))
    return JSONResponse(body.model_dump(), status_code=e.status, headers=e.headers)


def error_sse(e: OpenAIError) -> str:
    """An error in the middle of a stream: the status line has gone, so it travels as an event."""
    body = ErrorResponse(error=ErrorInfo(message=e.message, type=e.type, param=e.param, code=e.code))
    return f"data: {json.dumps(body.model_dump())}\n\n"


def validation_error(errors: Sequence[Any]) -> OpenAIError:
    """pydantic's error list -> one 400 naming the first bad field (as `param`)."""
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}")
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "extra_forbidden":
        message = (
            "this server does not support this field; remove it (fields it cannot honour are refused, not ignored)"
        )
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return bad_request(message, param)


M = TypeVar("M", bound=BaseModel)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows; send finite numbers only")


def _first_bad_string(data: Any) -> str | None:
    """The first string holding a lone UTF-16 surrogate (JSON's \\ud800 escapes allow them, and
    no tokenizer takes them), found without recursion."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to pass `limit` bytes: from its
    Content-Length header before reading anything, else while it streams in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise OpenAIError(413, f"the request body is {declared} bytes; this server takes at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise OpenAIError(413, f"the request body is over {limit} bytes, the most this server takes")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(request: Request, model: type[M], limit: int = DEFAULT_MAX_REQUEST_BYTES) -> M:
    """Parse the body as JSON whatever its Content-Type says (curl -d sends form-urlencoded,
    and OpenAI's server accepts it), then validate it; every failure is a 400 (413 if too big)."""
    raw = await read_body(request, limit)
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, and NaN / Infinity from _reject_constant
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply to parse") from None
    bad = _first_bad_string(data)
    if bad is not None:
        raise bad_request(
            f"the request body holds a string with a lone UTF-16 surrogate ({bad[:40]!r}); "
            "strings must be valid Unicode"
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors()) from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply to validate") from None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(request: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(
            OpenAIError(exc.status_code, str(exc.detail), type_, headers=getattr(exc, "headers", None))
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error serving %s", request.url.path)
        return error_response(OpenAIError(500, f"internal server error: {exc!r}", "server_error"))
