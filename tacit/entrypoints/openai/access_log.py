"""`tacit serve --enable-log-requests`: one line per HTTP request when it ends, on the logger
tacit.access: request id, method and route, status, prompt and completion tokens, time to the
first token and total time, in ms. `--log-format json` writes each line as one JSON object.

AccessLogMiddleware times the request and reads its status as the response starts; what the
engine did is noted by ServingContext.submit (note_submitted) on the AccessRecord the middleware
put in a context variable, so the handlers need no parameter for it. The token counts and the
first token's time are the engine's own bookkeeping on each RequestStream (the same that feeds
the TTFT histogram of /metrics), read once the response is over.

No FastAPI or starlette import here: `tacit/entrypoints/cli.py` imports ACCESS_LOG_FORMATS
without the serve extra installed.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, Sequence

ACCESS_LOG_FORMATS = ("text", "json")
logger = logging.getLogger("tacit.access")

# Polled by probes and scrapers (a Kubernetes probe every 10 s is 8,640 lines a day): logged only
# when they fail.
_QUIET_WHEN_OK = {"/health", "/metrics"}


@dataclass
class AccessRecord:
    """What one HTTP request did, filled in as it runs."""

    start: float  # time.monotonic() when the request arrived
    response_id: str | None = None  # the engine's id, the response body's `id` (cmpl-..., chatcmpl-...)
    prompt_tokens: int | None = None
    streams: list[Any] = field(default_factory=list)  # RequestStreams: their tokens and first-token time

    def completion_tokens(self) -> int | None:
        if self.prompt_tokens is None:
            return None
        return sum(sum(s.tokens_seen.values()) for s in self.streams)

    def ttft_ms(self) -> float | None:
        firsts = [s.first_token_time for s in self.streams if s.first_token_time is not None]
        return round((min(firsts) - self.start) * 1e3, 1) if firsts else None


_current: contextvars.ContextVar[AccessRecord | None] = contextvars.ContextVar("tacit_access_record", default=None)


def note_submitted(response_id: str, prompts: Sequence[Sequence[int]], streams: Sequence[Any]) -> None:
    """The prompts a request sent to the engine and their streams (nothing when access logging is off)."""
    record = _current.get()
    if record is None:
        return
    record.response_id = response_id
    record.prompt_tokens = (record.prompt_tokens or 0) + sum(len(p) for p in prompts)
    record.streams.extend(streams)


class AccessLogMiddleware:
    """Plain ASGI, as RequestIdMiddleware and for the same reason (starlette's BaseHTTPMiddleware
    would hide a streaming client's disconnect). Outside RequestIdMiddleware, so the X-Request-Id
    it reads off the response is the one the client got. An exception that escapes the app (its
    500 is written further out) is logged as 500."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = AccessRecord(time.monotonic())
        status: list[int] = []
        request_id: list[str] = []

        async def send_and_note(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                request_id.extend(v.decode("latin-1") for k, v in message.get("headers", []) if k == b"x-request-id")
            await send(message)

        token = _current.set(record)
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            _current.reset(token)
            # The path as sent, still percent-encoded: a decoded %0A would start a forged log line.
            raw = scope.get("raw_path")
            route = raw.decode("latin-1") if raw else scope["path"]
            code = status[0] if status else 500
            if not (code < 400 and scope["path"] in _QUIET_WHEN_OK):
                log_request(
                    {
                        "request_id": request_id[0] if request_id else None,
                        "response_id": record.response_id,
                        "method": scope["method"],
                        "route": route,
                        "status": code,
                        "prompt_tokens": record.prompt_tokens,
                        "completion_tokens": record.completion_tokens(),
                        "ttft_ms": record.ttft_ms(),
                        "total_ms": round((time.monotonic() - record.start) * 1e3, 1),
                    }
                )


def log_request(fields: dict[str, Any]) -> None:
    """One access line: the text form as the message, the fields on the record (for json)."""
    level = logging.WARNING if fields["status"] >= 500 else logging.INFO
    logger.log(level, "%s", text_line(fields), extra={"access": fields})


def text_line(fields: dict[str, Any]) -> str:
    """`POST /v1/completions 200 request_id=... prompt_tokens=5 ...`; an absent value is `-`, and
    one with a space, quote or `=` (a client's X-Request-Id may hold any) is JSON-quoted."""
    head = f"{fields['method']} {fields['route']} {fields['status']}"
    rest = [f"{k}={_text_value(v)}" for k, v in fields.items() if k not in ("method", "route", "status")]
    return " ".join([head, *rest])


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    return json.dumps(text) if any(c in text for c in ' "=\t') or not text else text


class JsonAccessFormatter(logging.Formatter):
    """One JSON object a line: the time (UTC, ISO 8601) and the access fields."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "access", None)
        if fields is None:  # not an access line: keep it a JSON line all the same
            fields = {"message": record.getMessage()}
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        return json.dumps({"timestamp": when, **fields}, ensure_ascii=False)


def configure_access_log(log_format: str, stream: IO[str] | None = None) -> logging.Handler:
    """Send tacit.access to stream (default stderr) in log_format, and not on to the root logger,
    whose `LEVEL name: ` prefix would break a JSON line. Returns the handler it added."""
    if log_format not in ACCESS_LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: valid: {', '.join(ACCESS_LOG_FORMATS)}")
    handler = logging.StreamHandler(stream)
    if log_format == "json":
        handler.setFormatter(JsonAccessFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler
