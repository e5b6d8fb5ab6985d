"""Structured output on the wire: OpenAI's response_format, vLLM's guided_* fields and its
structured_outputs object, resolved to one StructuredOutputsParams and the field that carried it
(a 400 names that field). The request models are protocol.py's; this reads them by name.
"""

from __future__ import annotations

from typing import Any

from tacit.sampling_params import StructuredOutputsParams


class FieldError(ValueError):
    """A bad value in the request body whose field is known: the server answers 400 with `param`."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


# The request fields that ask for structured output; at most one may be given.
_STRUCTURED_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)


def resolve_structured_outputs(req: Any) -> tuple[str, StructuredOutputsParams] | None:
    """(the wire field that asked, as a 400's `param` names it; the engine's spec), or None.
    Raises FieldError for two fields at once, an unsupported option or an empty spec."""
    given = [name for name in _STRUCTURED_FIELDS if getattr(req, name) is not None]
    rf = req.response_format
    if rf is not None and rf.type == "text":
        given.remove("response_format")  # OpenAI's default: plain text, nothing to constrain
    if len(given) > 1:
        raise FieldError(
            given[1], f"give at most one of {', '.join(_STRUCTURED_FIELDS)}; this request sets {', '.join(given)}"
        )
    if req.guided_whitespace_pattern is not None:
        raise FieldError("guided_whitespace_pattern", "guided_whitespace_pattern is not supported")
    if req.guided_decoding_backend not in (None, "auto", "guidance", "llguidance"):
        raise FieldError(
            "guided_decoding_backend",
            f"guided_decoding_backend={req.guided_decoding_backend!r} is not available; "
            "tacit's is llguidance ('auto', 'guidance' or 'llguidance')",
        )
    if not given:
        return None
    name = given[0]
    if name == "response_format":
        if rf.type == "json_object":
            return _spec("response_format", json_object=True)
        if rf.json_schema is None or rf.json_schema.json_schema is None:
            param = "response_format.json_schema" + ("" if rf.json_schema is None else ".schema")
            raise FieldError(param, f'response_format type "json_schema" needs {param} (a JSON schema object)')
        return _spec("response_format.json_schema.schema", json=rf.json_schema.json_schema)
    if name == "structured_outputs":
        so = req.structured_outputs
        kw = dict(json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar, json_object=so.json_object)
        kw = {k: v for k, v in kw.items() if v is not None and v is not False}
        if len(kw) != 1:
            raise FieldError(
                "structured_outputs",
                f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object; got {sorted(kw) or 'none'}",
            )
        return _spec(f"structured_outputs.{next(iter(kw))}", **kw)
    field = name.removeprefix("guided_")
    return _spec(name, **{field: getattr(req, name)})


def _spec(param: str, **kw: Any) -> tuple[str, StructuredOutputsParams]:
    try:
        return param, StructuredOutputsParams(**kw)
    except ValueError as e:
        raise FieldError(param, f"{param} is invalid: {e}") from None
