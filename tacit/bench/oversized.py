"""The oversized-prompt check: one prompt far past the context, sent to a running `tacit serve`,
while /health is polled. A 12 MB prompt once took 5.6 s to refuse, held /health for 5.1 s (a
liveness probe with a 1-2 s timeout would have restarted the server) and kept 0.9 GB resident.

    python scripts/oversized_prompt_check.py [--megabytes 12] [serve flags ...]
"""

from __future__ import annotations

import threading
import time
from pathlib import Path


def resident_mb(pid: int) -> float:
    """A process's resident set in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def oversized_prompt_check(url: str, pid: int, megabytes: float, settle_s: float = 2.0) -> dict[str, float]:
    """Send a `megabytes` MB completion prompt (words, ~1 token each) and poll /health every 20 ms
    meanwhile: {'status', 'refused_s', 'health_max_s', 'rss_before_mb', 'rss_after_mb'} (after
    `settle_s` more seconds)."""
    import httpx

    rss_before = resident_mb(pid)
    prompt = "lorem ipsum dolor sit amet " * int(megabytes * 1e6 / 27)
    health: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                c.get(f"{url}/health")
                health.append(time.perf_counter() - t0)
                time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    time.sleep(0.2)  # a few polls before the prompt arrives
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 4}, timeout=300)
    refused_s = time.perf_counter() - t0
    time.sleep(0.2)
    done.set()
    poller.join()
    time.sleep(settle_s)
    return {
        "status": r.status_code,
        "message": r.json().get("error", {}).get("message", ""),
        "refused_s": refused_s,
        "health_max_s": max(health),
        "health_polls": len(health),
        "rss_before_mb": rss_before,
        "rss_after_mb": resident_mb(pid),
    }
