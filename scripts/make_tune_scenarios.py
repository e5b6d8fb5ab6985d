"""Draw the three workloads `tacit tune --scenario NAME` runs on the default model (issue 38).

    python scripts/make_tune_scenarios.py      # writes tacit/tune/scenarios/*.jsonl

The files and their SLOs (tacit/tune/scenarios/scenarios.yaml) are fixed once committed: a
tuned recipe is compared with the defaults on exactly these requests. The lengths come from
`tacit bench serve`'s distributions (bench/workloads.sample_lengths) and the arrivals from its
gamma law (shape = burstiness, 1 is Poisson).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tacit.bench.workload_file import WorkloadRequest, make_workload, write_workload
from tacit.bench.workloads import sample_lengths

OUT = Path(__file__).resolve().parent.parent / "tacit" / "tune" / "scenarios"


def bursty_priority(n: int, rate: float, burstiness: float, batch_share: float, seed: int) -> list[WorkloadRequest]:
    """Interactive chat (priority 0) and long batch jobs (priority 1) in one gamma arrival
    process: each arrival is a batch job with probability batch_share."""
    rng = np.random.default_rng(seed)
    chat = iter(sample_lengths("longtail", n, 96, 48, seed=seed))
    batch = iter(sample_lengths("uniform", n, 800, 64, seed=seed + 1))
    t, out = 0.0, []
    for _ in range(n):
        is_batch = rng.random() < batch_share
        i, o = next(batch) if is_batch else next(chat)
        out.append(WorkloadRequest(round(t, 6), i, o, 1 if is_batch else 0))
        t += float(rng.gamma(burstiness, 1.0 / (rate * burstiness)))
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write_workload(make_workload(120, 5.0, "longtail", 128, 64, 1.0, seed=38), OUT / "chat-high-rate.jsonl")
    write_workload(make_workload(24, 0.6, "uniform", 2000, 32, 1.0, seed=39), OUT / "retrieval-long.jsonl")
    write_workload(bursty_priority(60, 1.5, 0.3, 0.3, seed=40), OUT / "bursty-priority.jsonl")


if __name__ == "__main__":
    main()
