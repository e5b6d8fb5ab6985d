"""What a tune is judged on: a workload (requests with arrival times, lengths and priorities) and
its SLOs. The committed scenarios (tacit/tune/scenarios/scenarios.yaml, drawn by
scripts/make_tune_scenarios.py) or a workload file with --slo."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from tacit.bench.workload_file import WorkloadRequest, load_workload
from tacit.tune.objective import SLO

SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"
_BOUND_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2e_ms": "e2e"}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workload: list[WorkloadRequest]
    slo: SLO
    source: str  # the workload file, for the recipe's reproduce command


def _catalog() -> dict:
    return yaml.safe_load((SCENARIOS_DIR / "scenarios.yaml").read_text())


def scenario_names() -> list[str]:
    return list(_catalog())


def _bounds(d: dict, where: str) -> dict[str, float]:
    unknown = sorted(set(d) - set(_BOUND_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown bound(s) {', '.join(unknown)}; valid: {', '.join(_BOUND_KEYS)}")
    return {_BOUND_KEYS[k]: float(v) / 1000 for k, v in d.items()}


def load_scenario(name: str) -> Scenario:
    """A committed scenario by name."""
    catalog = _catalog()
    if name not in catalog:
        raise ValueError(f"--scenario {name!r} is not known; valid: {', '.join(catalog)}")
    entry = catalog[name]
    slo = entry["slo"]
    classes = {int(p): _bounds(b, f"scenario {name} slo class {p}") for p, b in (slo.get("classes") or {}).items()}
    path = SCENARIOS_DIR / entry["file"]
    return Scenario(
        name,
        " ".join(str(entry["description"]).split()),
        load_workload(path),
        SLO(classes, _bounds(slo.get("default") or {}, f"scenario {name} slo default")),
        str(path),
    )


def workload_scenario(path: str, slo_text: str | None) -> Scenario:
    """--workload FILE --slo ttft=MS,tpot=MS: every priority held to the same bounds."""
    if not slo_text:
        raise ValueError("--workload needs --slo ttft=MS,tpot=MS: goodput counts the requests that meet it")
    workload = load_workload(path)
    if not workload:
        raise ValueError(f"--workload {path}: no requests")
    return Scenario(Path(path).stem, f"the workload in {path}", workload, SLO.parse(slo_text), path)
