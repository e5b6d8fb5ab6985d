"""The search space of `tacit tune`, read from EngineArgs' knob marks (knob(..., tune=TuneSpec)).

No knob is listed here: a knob is in the space because its field says so (config/engine_args.py),
with its range and the reason for it. What this module adds is what no single knob can say:

- which marks apply to a base configuration: a dict knob's keys only where the base sets the dict
  (speculative_config's draft bounds need a method), a choice only where the base sets the field it
  needs (sla needs slo_classes, swap needs swap_space), and which stage searches what (stage=);
- the rules between knobs that the engine's own checks make (_narrow), applied while a point is
  drawn, so every point sample() or suggest() gives passes validate_point.

A dimension of a dict knob's key is named "field.key" (speculative_config.num_speculative_tokens).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tacit.config.engine_args import EngineArgs
from tacit.config.tunable import TuneSpec

if TYPE_CHECKING:
    import optuna

STAGES = ("both", "model", "measured")


@dataclass(frozen=True)
class Dimension:
    """One searched knob: name is the EngineArgs field ("field.key" for a dict knob's key), spec its
    range as it applies to the base, default the base's value (None: the engine's automatic one)."""

    name: str
    spec: TuneSpec
    default: Any

    @property
    def field(self) -> str:
        return self.name.partition(".")[0]

    @property
    def key(self) -> str | None:
        return self.name.partition(".")[2] or None


def _marks() -> dict[str, TuneSpec]:
    """Every marked knob, by dimension name, in EngineArgs' field order."""
    marks: dict[str, TuneSpec] = {}
    for f in fields(EngineArgs):
        mark = f.metadata["tune"]
        if isinstance(mark, TuneSpec):
            marks[f.name] = mark
        elif mark:
            marks.update({f"{f.name}.{key}": spec for key, spec in mark.items()})
    return marks


def output_changing_knobs() -> tuple[str, ...]:
    """The dimensions marked changes_output (weight quantization, the KV cache's dtype)."""
    return tuple(name for name, spec in _marks().items() if spec.changes_output)


def base_value(base: EngineArgs, name: str) -> Any:
    field_name, _, key = name.partition(".")
    value = getattr(base, field_name)
    return (value or {}).get(key) if key else value


def _applied(name: str, spec: TuneSpec, base: EngineArgs) -> TuneSpec | str:
    """The spec as it applies to base, or why it does not apply at all."""
    field_name, _, key = name.partition(".")
    if key and getattr(base, field_name) is None:
        return f"it is a key of {field_name}, which the base configuration does not set"
    if spec.choices_need:
        need = dict(spec.choices_need)
        kept = tuple(c for c in spec.choices if c not in need or getattr(base, need[c]))
        spec = dataclasses.replace(spec, choices=kept, choices_need=())
    if spec.upto_cores:
        cores = len(os.sched_getaffinity(0))
        spec = dataclasses.replace(spec, high=max(spec.low, min(spec.high, cores)), upto_cores=False)
    return spec


def search_space(
    allow_output_changes: bool = False,
    include: set[str] | None = None,
    exclude: set[str] = frozenset(),
    *,
    base: EngineArgs | None = None,
    stage: str = "both",
) -> list[Dimension]:
    """The marked knobs, in EngineArgs' field order, as they apply to base (default: EngineArgs()).

    allow_output_changes: also the knobs marked changes_output (under an accuracy budget).
    include / exclude: dimension names to keep / drop; a name that is not a dimension is refused.
    stage: "model" drops the measured_only knobs (the performance model cannot price them),
    "measured" the model_only ones (layouts a one-process measured trial does not run); "both" keeps all.
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not known; valid: {', '.join(STAGES)}")
    base = EngineArgs() if base is None else base
    marks = _marks()
    unknown = sorted((set(include or ()) | set(exclude)) - set(marks))
    if unknown:
        raise ValueError(f"not tunable knobs: {', '.join(unknown)}; tunable: {', '.join(marks)}")
    space = []
    for name, spec in marks.items():
        if name in exclude or (include is not None and name not in include):
            continue
        refused = None
        if spec.changes_output and not allow_output_changes:
            refused = "it changes outputs: allow output changes (an accuracy budget) to search it"
        elif (stage == "model" and spec.measured_only) or (stage == "measured" and spec.model_only):
            refused = f"the {stage} stage does not search it ({spec.describe()})"
        else:
            applied = _applied(name, spec, base)
            refused = applied if isinstance(applied, str) else None
        if refused is None:
            space.append(Dimension(name, applied, base_value(base, name)))
        elif include is not None:
            raise ValueError(f"{name} was asked for, but {refused}")
    return space


# ---- the rules between knobs the engine's checks make -------------------------------------------

_LAYOUT_FLAGS = ("expert_parallel", "two_batch_overlap", "data_parallel_attention")
# ParallelConfig refuses two_batch_overlap and data_parallel_attention together.
_EXCLUSIVE = {"two_batch_overlap": "data_parallel_attention", "data_parallel_attention": "two_batch_overlap"}


def _narrow(dim: Dimension, value: Callable[[str], Any]) -> TuneSpec | None:
    """dim's spec given the knobs drawn before it (value(name): as drawn; the base's for a knob
    not in the space; None for one drawn later, which is then drawn within what this one leaves);
    None where the engine's checks leave it one value, _held's.

    ParallelConfig: two_batch_overlap and data_parallel_attention need tensor_parallel_size >= 2 and
    exclude each other (expert_parallel with one rank is accepted but changes nothing: held off too).
    SpeculativeConfig: min_speculative_tokens <= num_speculative_tokens.
    """
    spec = dim.spec
    if dim.name == "tensor_parallel_size" and any(value(f) for f in _EXCLUSIVE):
        return dataclasses.replace(spec, choices=tuple(n for n in spec.choices if n >= 2))
    if dim.name in _LAYOUT_FLAGS:
        if value("tensor_parallel_size") < 2 or (dim.name in _EXCLUSIVE and value(_EXCLUSIVE[dim.name])):
            return None
    if dim.name == "speculative_config.num_speculative_tokens":
        least = value("speculative_config.min_speculative_tokens")
        if least is not None and least > spec.low:
            return None if least > spec.high else dataclasses.replace(spec, low=least)
    if dim.name == "speculative_config.min_speculative_tokens":
        most = value("speculative_config.num_speculative_tokens")
        if most is not None and most < spec.high:
            return dataclasses.replace(spec, high=max(spec.low, most))
    return spec


def _held(dim: Dimension) -> Any:
    """The value of a dimension _narrow switched off: a layout flag off (what its check needs), any
    other knob the base's own value (valid with the rest of the base, which is what it depends on)."""
    return False if dim.name in _LAYOUT_FLAGS else dim.default


def _draw(space: list[Dimension], base: EngineArgs | None, pick: Callable[[Dimension, TuneSpec], Any]) -> dict:
    base = EngineArgs() if base is None else base
    names = {d.name for d in space}
    point: dict[str, Any] = {}

    def value(name: str) -> Any:
        # Not drawn yet: a later dimension, which will be drawn within what this one leaves.
        return point.get(name) if name in names else base_value(base, name)

    for dim in space:
        spec = _narrow(dim, value)
        point[dim.name] = _held(dim) if spec is None else pick(dim, spec)
    return point


def sample(space: list[Dimension], rng: np.random.Generator, base: EngineArgs | None = None) -> dict[str, Any]:
    """One random point of space (every dimension), valid for base (search_space's own base):
    ints uniform (log: log-uniform) over their range, choices and bools uniform."""

    def pick(dim: Dimension, spec: TuneSpec) -> Any:
        if spec.kind == "bool":
            return bool(rng.integers(2))
        if spec.kind == "choice":
            return spec.choices[int(rng.integers(len(spec.choices)))]
        if spec.log:  # log-uniform over [low, high + 1), floored: each octave drawn as often
            drawn = math.exp(rng.uniform(math.log(spec.low), math.log(spec.high + 1)))
            return min(int(drawn), spec.high)
        return int(rng.integers(spec.low, spec.high + 1))

    return _draw(space, base, pick)


def suggest(space: list[Dimension], trial: optuna.Trial, base: EngineArgs | None = None) -> dict[str, Any]:
    """The same point through Optuna: trial.suggest_* per dimension, under the dimension's name.
    A dimension the rules switch off is not suggested (Optuna's conditional parameters); the
    point still holds its value."""

    def pick(dim: Dimension, spec: TuneSpec) -> Any:
        if spec.kind == "int":
            return trial.suggest_int(dim.name, spec.low, spec.high, log=spec.log)
        if spec.kind == "bool":
            return trial.suggest_categorical(dim.name, [False, True])
        return trial.suggest_categorical(dim.name, list(spec.choices))

    return _draw(space, base, pick)


def validate_point(point: dict[str, Any], base: EngineArgs) -> EngineArgs:
    """base with point's values (a "field.key" name sets that key of the dict knob), held to
    EngineArgs.check(): every check the engine makes without a model. An invalid combination is
    refused with a ValueError naming the point's knobs and the engine's reason."""
    marks = _marks()
    unknown = [n for n in point if n not in marks]
    if unknown:
        raise ValueError(f"not tunable knobs: {', '.join(unknown)}; tunable: {', '.join(marks)}")
    changes: dict[str, Any] = {}
    for name, v in point.items():
        field_name, _, key = name.partition(".")
        if not key:
            changes[field_name] = v
            continue
        current = changes.get(field_name, getattr(base, field_name))
        if current is None:
            raise ValueError(f"{name}={v!r}: the base configuration sets no {field_name} to set {key} in")
        changes[field_name] = {**current, key: v}
    said = ", ".join(f"{n}={v!r}" for n, v in point.items())
    try:
        args = dataclasses.replace(base, **changes)
        args.check()
    except (ValueError, TypeError) as e:
        raise ValueError(f"the point {{{said}}} is invalid: {e}") from None
    return args
