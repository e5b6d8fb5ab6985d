"""Workload files: one request per JSONL line, {"arrival_s", "input_len", "output_len", "priority"}.

`tacit bench serve` draws its requests on the fly (sample_lengths, Poisson/gamma arrivals); a
file freezes one such draw so `tacit predict --serve` can replay exactly the same requests on a
simulated clock, and a later `tacit bench serve` run can be compared against it. `make_workload`
uses the same length distributions and the same arrival law as `tacit bench serve` (gamma gaps
of shape `burstiness`, mean 1/rate; 1 is Poisson).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tacit.bench.workloads import sample_lengths

FIELDS = ("arrival_s", "input_len", "output_len", "priority")


@dataclass(frozen=True)
class WorkloadRequest:
    arrival_s: float
    input_len: int
    output_len: int
    priority: int = 0


def _parse_line(text: str, where: str) -> WorkloadRequest:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{where}: must be a JSON object with {', '.join(FIELDS)}")
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(FIELDS)}")
    for key in ("arrival_s", "input_len", "output_len"):
        if key not in d:
            raise ValueError(f"{where}: missing {key!r}")
    arrival = d["arrival_s"]
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival) or arrival < 0:
        raise ValueError(f"{where}: arrival_s must be a finite number >= 0, got {arrival!r}")
    for key, low in (("input_len", 1), ("output_len", 1)):
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{where}: {key} must be an integer >= {low}, got {v!r}")
    prio = d.get("priority", 0)
    if isinstance(prio, bool) or not isinstance(prio, int):
        raise ValueError(f"{where}: priority must be an integer, got {prio!r}")
    return WorkloadRequest(float(arrival), d["input_len"], d["output_len"], prio)


def load_workload(path: str | Path) -> list[WorkloadRequest]:
    """The file's requests in file order; blank lines and lines starting with # are skipped.
    Any bad line is refused with its path and 1-based line number."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"workload file {p} does not exist")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        text = line.strip()
        if text and not text.startswith("#"):
            out.append(_parse_line(text, f"{p} line {i}"))
    if not out:
        raise ValueError(f"workload file {p} has no requests")
    return out


def make_workload(
    num_prompts: int,
    rate: float,
    dist: str = "longtail",
    input_len: int = 128,
    output_len: int = 64,
    burstiness: float = 1.0,
    seed: int = 0,
) -> list[WorkloadRequest]:
    """`tacit bench serve`'s draw as a list: lengths from sample_lengths, gaps gamma(burstiness,
    1/(rate*burstiness)) (rate inf: everyone at 0)."""
    if num_prompts < 1 or rate <= 0 or burstiness <= 0:
        raise ValueError(f"need num_prompts >= 1, rate > 0, burstiness > 0; got {num_prompts}, {rate}, {burstiness}")
    rng = np.random.default_rng(seed)
    pairs = sample_lengths(dist, num_prompts, input_len, output_len, seed=seed)
    t, out = 0.0, []
    for i, o in pairs:
        out.append(WorkloadRequest(round(t, 6), i, o))
        if math.isfinite(rate):
            t += float(rng.gamma(burstiness, 1.0 / (rate * burstiness)))
    return out


def write_workload(requests: list[WorkloadRequest], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(asdict(r)) + "\n" for r in requests))
