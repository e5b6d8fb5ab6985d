"""Errors the scheduling dimension raises to refuse a request; the HTTP layer maps them to codes."""


class SLOUnattainableError(ValueError):
    """Admission refused a request whose TTFT target its estimate already misses (HTTP 503)."""
