"""What `tacit tune` leaves in --out: recipe.yaml (which `tacit serve --recipe DIR` takes as it
is) and README.md, the results in words: which knobs mattered and by how much, predicted against
measured, the confirmation's ratio with its interval, and the command that reproduces it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from tacit.config.engine_args import EngineArgs
from tacit.config.recipe import RECIPE_FILE


def recipe_sections(args: EngineArgs) -> dict[str, dict[str, Any]]:
    """args' settings that differ from the engine's defaults, by recipe section and key (the
    model stays a command-line argument: a recipe is for one model on one kind of hardware)."""
    defaults = EngineArgs()
    where = {
        field: (section, key) for section, keys in EngineArgs.recipe_sections().items() for key, field in keys.items()
    }
    out: dict[str, dict[str, Any]] = {}
    for f in fields(EngineArgs):
        value = getattr(args, f.name)
        if f.name == "model" or value == getattr(defaults, f.name):
            continue
        section, key = where[f.name]
        out.setdefault(section, {})[key] = value
    return out


def write_recipe(out_dir: Path, name: str, description: str, hardware: str, args: EngineArgs, why: str) -> Path:
    """recipe.yaml for args, checked by loading it back as `tacit serve --recipe` will."""
    doc: dict[str, Any] = {"name": name, "description": description, "hardware": hardware}
    doc.update(recipe_sections(args))
    header = "".join(f"# {line}\n" for line in why.splitlines())
    path = out_dir / RECIPE_FILE
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    loaded = EngineArgs(**{**EngineArgs.load_recipe(path).engine_args, "model": args.model})
    if loaded != args:
        raise RuntimeError(f"{path} does not read back as the tuned configuration")
    return path


def _fmt(v: float | None, digits: int = 3) -> str:
    return "infeasible" if v is None else f"{v:.{digits}g}"


def point_words(point: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """The knobs point sets, leaving out those at base's value (a dimension's default)."""
    kept = {k: v for k, v in point.items() if base is None or base.get(k, object()) != v}
    return ", ".join(f"{k}={v}" for k, v in sorted(kept.items())) or "the defaults"


def write_readme(out_dir: Path, report: dict) -> Path:
    """README.md from the run's report (run.tune's dict)."""
    defaults = report.get("defaults") or {}
    lines = [
        f"# {report['name']}: tuned by `tacit tune`",
        "",
        f"Scenario: **{report['scenario']}** ({report['scenario_description']}); "
        f"objective **{report['objective']}** under SLO {report['slo']}; hardware {report['hardware']}.",
        "",
        "Reproduce:",
        "",
        "```bash",
        report["command"],
        f"tacit serve --recipe {out_dir}",
        "```",
        "",
        f"## Result\n\n{report['verdict']}",
        "",
    ]
    conf = report.get("confirmation") or []
    if conf:
        lines += [
            "## Confirmation: each candidate alternated with the default configuration",
            "",
            "| candidate | rounds | candidate's values | default's values | x the default (95% interval) |",
            "|---|---|---|---|---|",
        ]
        for c in conf:
            r = c["ratio"]
            ratio = "n/a" if r is None else f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})"
            vals = ", ".join(f"{v:.3g}" for v in c["values"])
            defs = ", ".join(f"{v:.3g}" for v in c["defaults"])
            lines.append(f"| {point_words(c['point'], defaults)} | {len(c['values'])} | {vals} | {defs} | {ratio} |")
        lines.append("")
    if report.get("accuracy_budget") is not None:
        lines += [
            f"## Accuracy: output-changing knobs under a budget of {report['accuracy_budget']:g} mean KLD",
            "",
            "Each combination a trial set was first checked with `tacit eval kld`'s measurement against the "
            "base configuration; over the budget, the trial was infeasible.",
            "",
            "| values | mean KLD (nats/token) | within budget |",
            "|---|---|---|",
        ]
        for c in report.get("accuracy") or []:
            said = ", ".join(f"{k}={v}" for k, v in c["changes"].items())
            lines.append(f"| {said} | {c['kld_mean']:.4g} | {'yes' if c['within_budget'] else 'no'} |")
        lines.append("")
    if report.get("importance"):
        lines += ["## Which knobs mattered (Optuna's fANOVA importance over the measured trials)", ""]
        lines += [f"- {k}: {v:.2f}" for k, v in report["importance"].items()] + [""]
    trials = report.get("trials") or []
    if trials:
        rho = report.get("spearman")
        lines += [
            "## Measured trials, against the performance model's prediction",
            "",
            f"Spearman rank correlation of predicted against measured over the feasible trials: "
            f"{'n/a' if rho is None else f'{rho:.2f}'}.",
            "",
            "| trial | configuration | predicted | measured | seconds | error |",
            "|---|---|---|---|---|---|",
        ]
        for t in trials:
            lines.append(
                f"| {t['number']} | {point_words(t['point'], defaults)} | {_fmt(t['predicted'])} | {_fmt(t['value'])} "
                f"| {t['seconds']:.0f} | {t['error'][:80]} |"
            )
        lines.append("")
    top = report.get("model_top") or []
    if top:
        lines += ["## The model-only stage's best points", "", "| predicted | configuration |", "|---|---|"]
        lines += [f"| {_fmt(p['value'])} | {point_words(p['point'], defaults)} |" for p in top] + [""]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path
