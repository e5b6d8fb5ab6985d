"""`tacit predict --published`: the model against published figures (data/published.yaml).

Each entry states a figure someone published (a URL or repository path, the sentence or table row,
its conditions and caveats) and the `tacit predict` arguments that express it. The runner parses
those arguments with predict's own parser, runs the CLI's predict path in-process with `--json`
to a temporary file, reads the entry's metric from that JSON and reports the error by category
(platform x kind). An entry whose arguments the current code cannot parse or run is reported as
not expressible, with the error, and counted; it never stops the run."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from tacit.perf_model.validate import _percentile

PUBLISHED_FILE = Path(__file__).parent / "data" / "published.yaml"
PLATFORMS = ("cpu", "ascend", "nvidia")
# small_batch_decode: batch 1 or a few sequences per attention group (a latency deployment);
# large_batch: throughput at a large batch; prefill: TTFT or prompt tokens/s.
KINDS = ("small_batch_decode", "large_batch", "prefill")
# Keys of predict's --json (served_tpot_ms: a PD-mixed deployment's TPOT, the others' prefills
# counted; tpot_ms: the decode step alone, a PD-disaggregated one's; served_ttft_ms: the mean TTFT
# at --request-rate, its wait included), plus decode_tok_s: the
# deployment's output tokens/s in steady decode, --batch-size sequences every TPOT (what "tokens/s
# per node during decoding" figures count).
METRICS = (
    "tpot_ms",
    "served_tpot_ms",
    "ttft_ms",
    "served_ttft_ms",
    "decode_step_ms",
    "throughput_tok_s",
    "served_throughput_tok_s",
    "throughput_tok_s_per_device",
    "prefill_tok_s",
    "decode_tok_s",
)
REQUIRED = ("id", "platform", "kind", "source", "quote", "conditions", "caveats", "metric", "value", "command")
CONDITIONS = ("model", "hardware", "layout", "batch", "lengths", "precision", "engine")
# Flags an entry may not carry: the runner owns the output, and the other modes are not one prediction.
FORBIDDEN = ("--json", "--validate", "--serve", "--published", "--html", "--plot")


@dataclass(frozen=True)
class Result:
    entry: dict
    predicted: float | None  # None: not expressible
    error: str = ""  # why not expressible

    @property
    def category(self) -> str:
        return f"{self.entry['platform']}/{self.entry['kind']}"

    @property
    def rel_error(self) -> float | None:
        """(predicted - published) / published, None when not expressible."""
        if self.predicted is None:
            return None
        return (self.predicted - self.entry["value"]) / self.entry["value"]


def load_entries(path: Path = PUBLISHED_FILE) -> list[dict]:
    entries = yaml.safe_load(Path(path).read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of figures, got {type(entries).__name__}")
    seen: set[str] = set()
    for e in entries:
        check_entry(e)
        if e["id"] in seen:
            raise ValueError(f"{path}: id {e['id']!r} appears twice")
        seen.add(e["id"])
    return entries


def check_entry(e: dict) -> None:
    """Every field a figure needs, or a ValueError naming the entry and the field."""
    name = e.get("id", "<no id>") if isinstance(e, dict) else repr(e)
    if not isinstance(e, dict):
        raise ValueError(f"published figure {name}: expected a mapping")
    missing = [k for k in REQUIRED if k not in e or e[k] in (None, "", [], {})]
    if missing:
        raise ValueError(f"published figure {name}: missing {', '.join(missing)}")
    if e["platform"] not in PLATFORMS:
        raise ValueError(f"published figure {name}: platform {e['platform']!r}; valid: {', '.join(PLATFORMS)}")
    if e["kind"] not in KINDS:
        raise ValueError(f"published figure {name}: kind {e['kind']!r}; valid: {', '.join(KINDS)}")
    if e["metric"] not in METRICS:
        raise ValueError(f"published figure {name}: metric {e['metric']!r}; valid: {', '.join(METRICS)}")
    src = e["source"]
    if not isinstance(src, dict) or not (src.get("url") or (src.get("repository") and src.get("path"))):
        raise ValueError(f"published figure {name}: source needs a url, or a repository and a path")
    cond = e["conditions"]
    lacking = [k for k in CONDITIONS if not isinstance(cond, dict) or not cond.get(k)]
    if lacking:
        raise ValueError(f"published figure {name}: conditions lack {', '.join(lacking)}")
    if not isinstance(e["value"], (int, float)) or e["value"] <= 0:
        raise ValueError(f"published figure {name}: value {e['value']!r} must be a positive number")
    scale = e.get("scale", 1)
    if not isinstance(scale, (int, float)) or scale <= 0:
        raise ValueError(f"published figure {name}: scale {scale!r} must be a positive number")
    if not isinstance(e["caveats"], list):
        raise ValueError(f"published figure {name}: caveats must be a list")
    used = [f for f in FORBIDDEN if any(t == f or t.startswith(f + "=") for t in shlex.split(e["command"]))]
    if used:
        raise ValueError(f"published figure {name}: the command may not carry {', '.join(used)}")


def run_entry(entry: dict, parser: argparse.ArgumentParser) -> Result:
    """The entry's metric as `tacit predict <command> --json` gives it, times the entry's scale;
    any failure to parse or run is the result's error, not an exception. `parser` is predict's
    own (perf_model/cli.py's predict_parser: the CLI passes it, so this module never imports it)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "prediction.json"
        argv = ["predict", *_data_paths(shlex.split(entry["command"])), "--json", str(out)]
        try:
            args = _parse(parser, argv)
            with contextlib.redirect_stdout(io.StringIO()):
                args.func(args)
            prediction = json.loads(out.read_text())
            value = metric_value(prediction, entry["metric"], args)
        except Exception as exc:  # noqa: BLE001 - any failure makes the figure not expressible
            return Result(entry, None, f"{type(exc).__name__}: {exc}")
    return Result(entry, value * entry.get("scale", 1))


def _data_paths(words: list[str]) -> list[str]:
    """An entry's --hardware-file FILE, when relative, names a file beside published.yaml (a
    published run's box as its author measured it: data/hardware/), wherever the runner runs."""
    out = list(words)
    for i, word in enumerate(out):
        if word == "--hardware-file" and i + 1 < len(out) and not Path(out[i + 1]).is_absolute():
            out[i + 1] = str(PUBLISHED_FILE.parent / out[i + 1])
        elif word.startswith("--hardware-file=") and not Path(word.split("=", 1)[1]).is_absolute():
            out[i] = f"--hardware-file={PUBLISHED_FILE.parent / word.split('=', 1)[1]}"
    return out


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_known_args with argparse's exits turned into a ValueError carrying its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args, unknown = parser.parse_known_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise ValueError(lines[-1] if lines else "the arguments did not parse") from None
    if unknown:
        raise ValueError(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def metric_value(prediction: dict, metric: str, args: argparse.Namespace) -> float:
    """The metric from predict's JSON. decode_tok_s is --batch-size sequences each producing a
    token every TPOT; prefill_tok_s, when the JSON has none, is the batch's prompt tokens over TTFT."""
    if metric == "decode_tok_s":
        return args.batch_size * 1e3 / prediction["tpot_ms"]
    if metric == "prefill_tok_s" and metric not in prediction:
        return args.batch_size * args.input_len * 1e3 / prediction["ttft_ms"]
    if metric not in prediction:
        raise KeyError(f"predict's JSON has no {metric!r} (keys: {', '.join(sorted(prediction))})")
    return float(prediction[metric])


def summarize(results: list[Result]) -> dict[str, dict]:
    """Per category (platform/kind), per platform, per kind and overall: figures, expressible,
    median and p90 absolute relative error over the expressible ones (None when there are none)."""
    groups: dict[str, list[Result]] = {"all": list(results)}
    for r in results:
        for key in (r.category, r.entry["platform"], r.entry["kind"]):
            groups.setdefault(key, []).append(r)
    summary = {}
    for key, rs in groups.items():
        errs = [abs(r.rel_error) for r in rs if r.rel_error is not None]
        summary[key] = {
            "figures": len(rs),
            "expressible": len(errs),
            "median_abs_err": statistics.median(errs) if errs else None,
            "p90_abs_err": _percentile(errs, 0.9) if errs else None,
        }
    return summary


def report(results: list[Result], summary: dict[str, dict]) -> str:
    lines = [f"{'id':<50}{'category':<28}{'metric':<24}{'published':>12}{'predicted':>12}{'error':>9}"]
    for r in results:
        e = r.entry
        if r.predicted is None:
            lines.append(
                f"{e['id']:<50}{r.category:<28}{e['metric']:<24}{e['value']:>12g}   not expressible: {r.error}"
            )
        else:
            lines.append(
                f"{e['id']:<50}{r.category:<28}{e['metric']:<24}{e['value']:>12g}{r.predicted:>12.4g}"
                f"{100 * r.rel_error:>+8.0f}%"
            )
    lines.append("")
    lines.append(f"{'category':<30}{'figures':>8}{'expressible':>13}{'median |err|':>14}{'p90 |err|':>11}")
    order = [f"{p}/{k}" for p in PLATFORMS for k in KINDS] + list(PLATFORMS) + list(KINDS) + ["all"]
    for key in order:
        s = summary.get(key)
        if s is None:
            continue
        med, p90 = s["median_abs_err"], s["p90_abs_err"]
        lines.append(
            f"{key:<30}{s['figures']:>8}{s['expressible']:>13}"
            f"{'-' if med is None else f'{100 * med:.0f}%':>14}{'-' if p90 is None else f'{100 * p90:.0f}%':>11}"
        )
    return "\n".join(lines)


def run_published(json_out: str | None, parser: argparse.ArgumentParser, path: Path = PUBLISHED_FILE) -> int:
    """`tacit predict --published`: every figure, the table, the summary; --json writes both."""
    entries = load_entries(path)
    results = [run_entry(e, parser) for e in entries]
    summary = summarize(results)
    print(report(results, summary))
    print("error = (predicted - published) / published; |err| statistics over the expressible figures")
    if json_out:
        rows = [
            {
                "id": r.entry["id"],
                "category": r.category,
                "metric": r.entry["metric"],
                "published": r.entry["value"],
                "predicted": r.predicted,
                "error": r.rel_error,
                "not_expressible": r.error or None,
            }
            for r in results
        ]
        Path(json_out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0
