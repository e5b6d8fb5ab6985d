"""TuneSpec: a knob's search range for `tacit tune`, kept in the knob's own metadata.

`knob(..., tune=TuneSpec(...))` marks an EngineArgs field as part of the search space
(tacit/tune/space.py reads the marks; nothing here imports tacit.tune, which sits tiers above the
config). A dict knob marks its keys instead: `tune={"num_speculative_tokens": TuneSpec(...)}`.
Knobs checks every mark against its knob's default when the class is defined (check_tune_mark),
so a range that excludes the engine's own default cannot ship.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

TUNE_KINDS = ("int", "choice", "bool")


@dataclass(frozen=True)
class TuneSpec:
    """How one knob is searched.

    kind: "int" (low..high, inclusive; log: log-spaced draws), "choice" (one of choices) or "bool".
    changes_output: the knob changes what the model computes (weight or KV quantization): it is
    searched only when the user allows an accuracy budget.
    measured_only: the performance model cannot price it here (threads: a calibration holds for
    the thread count it was fitted at), so the model-only stage holds it at the base's value.
    model_only: only the performance model can price it here (a parallel layout over processes
    this one-process measured trial does not run): the measured stage holds it at the base's value.
    upto_cores: high is also capped at the cores this process may run on, read when the space is built.
    choices_need: (choice, EngineArgs field) pairs: that choice is offered only where the base
    configuration sets the field (sla needs slo_classes; swap needs swap_space).
    why: one line saying why the range is what it is.
    """

    kind: str
    low: int | None = None
    high: int | None = None
    log: bool = False
    choices: tuple = ()
    changes_output: bool = False
    measured_only: bool = False
    model_only: bool = False
    upto_cores: bool = False
    choices_need: tuple[tuple[Any, str], ...] = ()
    why: str = ""

    def check(self, name: str, default: Any = None) -> None:
        """Refuse a spec that cannot be searched, or whose range leaves out the knob's default
        (None: the knob's automatic setting, which the search keeps as the base's own point)."""

        def bad(what: str) -> ValueError:
            return ValueError(f"tune mark of {name}: {what}")

        if self.kind not in TUNE_KINDS:
            raise bad(f"kind={self.kind!r} is not known; valid: {', '.join(TUNE_KINDS)}")
        if not self.why.strip():
            raise bad("why is empty: say in one line why the range is what it is")
        if self.measured_only and self.model_only:
            raise bad("measured_only and model_only together leave no stage to search it")
        if self.kind == "int":
            for bound in ("low", "high"):
                v = getattr(self, bound)
                if isinstance(v, bool) or not isinstance(v, int):
                    raise bad(f"{bound}={v!r} is invalid: an int range needs integer bounds")
            if self.low > self.high:
                raise bad(f"low={self.low} is above high={self.high}")
            if self.log and self.low < 1:
                raise bad(f"log=True needs low >= 1 (got {self.low}); mark 0 as a choice instead")
            if self.choices:
                raise bad("an int range takes low/high, not choices")
            if default is not None and not (isinstance(default, int) and self.low <= default <= self.high):
                raise bad(f"the default {default!r} is outside {self.low}..{self.high}")
        else:
            if self.low is not None or self.high is not None or self.log or self.upto_cores:
                raise bad(f"a {self.kind} takes no low/high/log/upto_cores")
        if self.kind == "choice":
            if not self.choices:
                raise bad("choices is empty")
            if len(set(self.choices)) != len(self.choices):
                raise bad(f"choices {self.choices!r} repeat a value")
            if default not in self.choices:
                raise bad(f"the default {default!r} is not among the choices {self.choices!r}")
        elif self.choices:
            raise bad(f"a {self.kind} takes no choices")
        if self.kind == "bool" and default is not None and not isinstance(default, bool):
            raise bad(f"the default {default!r} is not true or false")
        for choice, _ in self.choices_need:
            if choice not in self.choices:
                raise bad(f"choices_need names {choice!r}, which is not among the choices {self.choices!r}")

    def describe(self) -> str:
        """The range in words, as the engine-arguments reference shows it: "256..16384, log"."""
        if self.kind == "int":
            text = f"{self.low}..{self.high}" + (", log" if self.log else "")
            text += ", at most the cores" if self.upto_cores else ""
        elif self.kind == "bool":
            text = "true, false"
        else:
            need = dict(self.choices_need)
            text = ", ".join(_shown(c) + (f" (where {need[c]} is set)" if c in need else "") for c in self.choices)
        notes = [
            "changes outputs: searched only with an accuracy budget" if self.changes_output else "",
            "measured trials only: the performance model cannot price it" if self.measured_only else "",
            "the performance model's stage only: measured trials hold it" if self.model_only else "",
        ]
        return "; ".join([text, *filter(None, notes)])


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def check_tune_mark(name: str, mark: TuneSpec | Mapping[str, TuneSpec] | None, default: Any) -> None:
    """One knob's tune= mark: a TuneSpec checked against the knob's default, or, for a dict knob,
    a TuneSpec per key (each checked against the key's default where the default dict has one)."""
    if mark is None:
        return
    if isinstance(mark, TuneSpec):
        mark.check(name, default)
        return
    if not isinstance(mark, Mapping) or not mark:
        raise ValueError(f"tune mark of {name}: {mark!r} is neither a TuneSpec nor a non-empty {{key: TuneSpec}}")
    if default is not None and not isinstance(default, Mapping):
        raise ValueError(f"tune mark of {name}: per-key marks need a dict knob (default {default!r})")
    for key, spec in mark.items():
        if not isinstance(spec, TuneSpec):
            raise ValueError(f"tune mark of {name}.{key}: {spec!r} is not a TuneSpec")
        spec.check(f"{name}.{key}", (default or {}).get(key))
