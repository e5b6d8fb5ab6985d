"""`tacit profile --compare A B`: two earlier profiles side by side, before (A) and after (B).

Nothing runs: per step kind and operator class, the mean seconds per step in A and in B, B/A
and B - A, largest |B - A| first, and each kind's total (the class means add up to the mean
step, host being the step's remainder). Means, not medians: only means add up to the total.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from tacit.profiler.categories import CATEGORIES, LABELS, STEP_KINDS
from tacit.profiler.summary import PROFILE_VERSION

PROFILE_FILE = "profile.json"
COMPARE_VERSION = 1
_EXPECTED = f"the {PROFILE_FILE} that `tacit profile --out DIR` writes, or DIR itself"


def describe_device(device: torch.device) -> str:
    """The device a profile ran on, for the comparison's header: the GPU's name, or the CPU's
    model name and the cores this process may use (2 shared cores time unlike 16)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def load_profile(path: str) -> dict[str, Any]:
    """A profile.json (or the directory holding one), checked to be one before anything reads it."""
    given = Path(path)
    file = given / PROFILE_FILE if given.is_dir() else given
    if not file.is_file():
        raise FileNotFoundError(f"--compare {path}: no such file; expected {_EXPECTED}")
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--compare {path}: {file} is not JSON ({e}); expected {_EXPECTED}") from None
    if isinstance(data, dict) and "compare_version" in data:
        raise ValueError(
            f"--compare {path}: {file} is a comparison (`tacit profile --compare`), not a profile; expected {_EXPECTED}"
        )
    if not isinstance(data, dict) or "version" not in data or not isinstance(data.get("kinds"), dict):
        raise ValueError(
            f"--compare {path}: {file} is not a tacit profile (no 'version' and 'kinds'); expected {_EXPECTED}"
        )
    if data["version"] != PROFILE_VERSION:
        raise ValueError(
            f"--compare {path}: profile version {data['version']!r}; this tacit reads version {PROFILE_VERSION}"
        )
    for kind, k in data["kinds"].items():
        cats = k.get("categories") if isinstance(k, dict) else None
        if not isinstance(cats, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("mean"), (int, float)) for v in cats.values()
        ):
            raise ValueError(f"--compare {path}: step kind {kind!r} has no per-class means; expected {_EXPECTED}")
    data["path"] = str(file)
    return data


def _model(p: dict[str, Any]) -> str:
    m = p.get("model", {})
    return f"{m.get('name', '?')} ({m.get('dtype', '?')}, {m.get('num_layers', '?')} layers)"


def _workload(p: dict[str, Any]) -> str:
    reqs = p.get("workload", {}).get("requests", [])
    lengths = sorted({(r["input_len"], r["output_len"]) for r in reqs})
    shown = ", ".join(f"{i} -> {o}" for i, o in lengths)
    return f"{len(reqs)} requests ({shown}) x {p.get('workload', {}).get('repeats', '?')} passes"


def _differences(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(warnings, notes): a change of model or device is worth a warning (comparing one may still
    be the point); engine or workload changes are what a before/after usually varies."""
    warnings, notes = [], []
    if _model(a) != _model(b):
        warnings.append(f"different models: A {_model(a)}, B {_model(b)}")
    # The same checkpoint held another way (GGML blocks dequantized to bf16 off the CPU kernels'
    # path: 97 -> 269 MB for SmolLM2-135M Q4_1) is a change of path, not of model.
    wa, wb = (p.get("model", {}).get("weight_bytes") for p in (a, b))
    if wa and wb and wa != wb:
        notes.append(f"weights held: A {wa / 1e6:.1f} MB, B {wb / 1e6:.1f} MB")
    da, db = a.get("device"), b.get("device")
    if da and db and da != db:
        warnings.append(f"different devices: A {da}, B {db}")
    ea, eb = a.get("engine", {}), b.get("engine", {})
    changed = [f"{k} {ea.get(k)} -> {eb.get(k)}" for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)]
    if changed:
        notes.append("engine: " + ", ".join(changed))
    if _workload(a) != _workload(b):
        notes.append(f"workload: A {_workload(a)}, B {_workload(b)}")
    return warnings, notes


def _means(p: dict[str, Any], kind: str, classes: list[str]) -> dict[str, float] | None:
    k = p["kinds"].get(kind)
    if k is None:
        return None
    # A class a profile does not list (one written before the class existed) took no time there.
    return {c: float(k["categories"].get(c, {}).get("mean", 0.0)) for c in classes}


def _row(name: str, a: float | None, b: float | None) -> dict[str, Any]:
    both = a is not None and b is not None
    return {
        "category": name,
        "a_s": a,
        "b_s": b,
        "diff_s": b - a if both else None,
        "ratio": b / a if both and a > 0 else None,
    }


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """compare.json: both profiles' descriptions, their differences, and per step kind the rows
    (classes with time in A or B, largest |B - A| first) and the total."""
    listed = set(a.get("categories", CATEGORIES)) | set(b.get("categories", CATEGORIES))
    classes = [c for c in CATEGORIES if c in listed] + sorted(listed - set(CATEGORIES))
    kind_names = [k for k in STEP_KINDS if k in a["kinds"] or k in b["kinds"]]
    kind_names += sorted((set(a["kinds"]) | set(b["kinds"])) - set(STEP_KINDS))
    kinds = {}
    for kind in kind_names:
        ma, mb = _means(a, kind, classes), _means(b, kind, classes)
        rows = [
            _row(c, ma[c] if ma else None, mb[c] if mb else None)
            for c in classes
            if (ma and ma[c] != 0) or (mb and mb[c] != 0)
        ]
        # Present in one profile only: its own times, largest first, and no change to rank by.
        rows.sort(key=lambda r: -abs(next(v for v in (r["diff_s"], r["a_s"], r["b_s"]) if v is not None)))
        kinds[kind] = {
            "a_steps": a["kinds"][kind]["steps"] if ma else 0,
            "b_steps": b["kinds"][kind]["steps"] if mb else 0,
            "rows": rows,
            "total": _row("total", sum(ma.values()) if ma else None, sum(mb.values()) if mb else None),
        }
    warnings, notes = _differences(a, b)
    return {
        "compare_version": COMPARE_VERSION,  # not "version": compare.json is no profile
        "a": {"path": a["path"], "model": a.get("model"), "device": a.get("device"), "engine": a.get("engine")},
        "b": {"path": b["path"], "model": b.get("model"), "device": b.get("device"), "engine": b.get("engine")},
        "warnings": warnings,
        "notes": notes,
        "kinds": kinds,
    }


def _ms(s: float | None) -> str:
    return "absent" if s is None else f"{s * 1e3:.3f}"


def table_rows(k: dict[str, Any]) -> list[list[str]]:
    """A kind's rows as text (class, A ms, B ms, B/A, B - A ms), the total last: the terminal's
    table and the report's."""
    out = []
    for r in [*k["rows"], k["total"]]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        diff = "-" if r["diff_s"] is None else f"{r['diff_s'] * 1e3:+.3f}"
        out.append([LABELS.get(r["category"], r["category"]), _ms(r["a_s"]), _ms(r["b_s"]), ratio, diff])
    return out


TABLE_HEADER = ["class", "A ms/step", "B ms/step", "B/A", "B-A ms"]


def format_compare(cmp: dict[str, Any]) -> str:
    """The terminal's text: header (paths, warnings, notes), then one table per step kind."""
    lines = [f"A: {cmp['a']['path']}", f"B: {cmp['b']['path']}"]
    lines += [f"warning: {w}" for w in cmp["warnings"]] + [f"note: {n}" for n in cmp["notes"]]
    for kind, k in cmp["kinds"].items():
        steps = [
            f"{side} {n} step{'s' if n > 1 else ''}" if n else f"absent in {side}"
            for side, n in (("A", k["a_steps"]), ("B", k["b_steps"]))
        ]
        lines.append(f"\n{kind} ({', '.join(steps)}): mean ms per step, largest change first")
        rows = [TABLE_HEADER, *table_rows(k)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
        for r in rows:
            lines.append("  " + r[0].ljust(widths[0]) + "".join("  " + c.rjust(w) for c, w in zip(r[1:], widths[1:])))
    return "\n".join(lines)
