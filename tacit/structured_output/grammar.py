"""A StructuredOutputsParams -> llguidance's grammar text, checked against the tokenizer, cached.

llguidance compiles a grammar lazily inside each matcher, so what is worth caching is the
conversion plus validation of a spec (a JSON schema's conversion walks the whole schema; a GBNF
grammar is re-parsed into Lark): the 50%-json_schema benchmark sends the same schema every time.
"""

from __future__ import annotations

import json
from collections import OrderedDict

import llguidance

from tacit.sampling_params import StructuredOutputsParams

# Distinct specs kept compiled; a server sees a handful of schemas, a client looping over
# generated ones should not grow the cache without bound.
_CACHE_SIZE = 256


class StructuredOutputError(ValueError):
    """A grammar, schema or regex that cannot be compiled; `field` names the StructuredOutputsParams
    field (json, json_object, regex, choice, grammar) so a server can name its own wire field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"structured_outputs.{field} is invalid: {message}")
        self.field = field
        self.reason = message


def spec_key(spec: StructuredOutputsParams) -> tuple[str, str]:
    """(field, canonical text): equal specs share one compiled grammar."""
    field = spec.chosen_fields()[0]
    value = getattr(spec, field)
    if field == "json" and isinstance(value, dict):
        # Key order is kept: llguidance writes properties in the order the schema declares them.
        return field, json.dumps(value)
    if field == "choice":
        return field, json.dumps(value)
    if field == "json_object":
        return field, ""
    return field, value


# JSON is written compactly, one space after ',' and ':' (a schema's own "x-guidance" may say
# otherwise). llguidance's default, any whitespace anywhere, let the tiny test model emit 90
# whitespace tokens after `{"age":4559955595` and run out of max_tokens=100 without closing.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed_objects(schema: object) -> object:
    """The schema with `additionalProperties: false` on every object that does not say.

    JSON Schema lets an object carry keys it does not list, and a small model takes the
    invitation: SmolLM2-135M, asked for instructor's City {name, country, population}, wrote
    `population_density_per_square_kilometer_per_...` keys until max_tokens ran out. vLLM's
    default backend (xgrammar, strict mode) closes objects the same way, and OpenAI's strict
    schemas must; a schema that wants extra keys says `additionalProperties: true`.
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(v) for v in out[key]]
    for key in ("items", "additionalProperties", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    return out


def _to_llguidance(field: str, text: str) -> str:
    if field == "json":
        try:
            text = json.dumps(closed_objects(json.loads(text)))
        except ValueError:
            pass  # not JSON: llguidance's own error names the problem below
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=_JSON_OPTIONS)
    if field == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=_JSON_OPTIONS)
    if field == "regex":
        return llguidance.grammar_from("regex", text)
    if field == "choice":
        return llguidance.grammar_from("choice", text)
    # "grammar" converts GBNF to Lark and passes Lark through unchanged.
    return llguidance.grammar_from("grammar", text)


class GrammarCompiler:
    def __init__(self, tokenizer: llguidance.LLTokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()

    def compile(self, spec: StructuredOutputsParams) -> str:
        """llguidance grammar text for spec; raises StructuredOutputError if it is invalid."""
        key = spec_key(spec)
        grammar = self._cache.get(key)
        if grammar is not None:
            self._cache.move_to_end(key)
            return grammar
        field, text = key
        try:
            grammar = _to_llguidance(field, text)
            error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        except (ValueError, TypeError, RuntimeError) as e:  # GBNF conversion, a schema that is not JSON
            error = str(e)
        if error:
            raise StructuredOutputError(field, error.strip())
        self._cache[key] = grammar
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return grammar

    def matcher(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        m = llguidance.LLMatcher(self.tokenizer, self.compile(spec))
        if m.is_error():  # validate_grammar passed, so this is llguidance's own limit (e.g. size)
            raise StructuredOutputError(spec_key(spec)[0], m.get_error())
        return m
