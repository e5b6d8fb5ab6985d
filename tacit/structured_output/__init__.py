"""Structured output: grammars (JSON schema, regex, choice, EBNF/Lark) compiled with llguidance,
one matcher per constrained request, and the per-step token bitmask the sampler applies."""

from tacit.structured_output.grammar import StructuredOutputError
from tacit.structured_output.manager import StructuredOutputManager

__all__ = ["StructuredOutputError", "StructuredOutputManager"]
