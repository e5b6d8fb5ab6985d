"""The memory soak: a running `tacit serve` under four clients for several minutes, mixed prompt
lengths, streamed and whole answers, structured output; its RSS sampled throughout. An 8.5-minute
soak once rose 2957 -> 3402 MB (3269 idle after): each new prefill size cost native memory.

    python scripts/soak.py [--minutes 8] [--clients 4] [-- serve flags, e.g. --model M]
"""

from __future__ import annotations

import random
import threading
import time

from tacit.bench.oversized import resident_mb

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


def _one_request(client, url: str, rng: random.Random) -> None:
    words = rng.choice([rng.randint(3, 40), rng.randint(40, 300), rng.randint(300, 900)])
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    max_tokens = rng.randint(4, 48)
    kind = rng.choice(["completion", "completion-stream", "chat-stream", "chat-json"])
    if kind.startswith("completion"):
        body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0.8, "stream": kind.endswith("stream")}
        path = "/v1/completions"
    else:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0.8}
        if kind == "chat-json":
            body["response_format"] = {"type": "json_object"}
        else:
            body["stream"] = True
        path = "/v1/chat/completions"
    if body.get("stream"):
        with client.stream("POST", url + path, json=body) as r:
            for _ in r.iter_lines():
                pass
            r.raise_for_status()
    else:
        client.post(url + path, json=body).raise_for_status()


def soak(url: str, pid: int, minutes: float, clients: int = 4, sample_s: float = 10.0, seed: int = 0) -> dict:
    """Run the clients for `minutes`, sampling the server's RSS every sample_s: {'samples':
    [(s, MB)], 'requests', 'rss_at_1min_mb', 'rss_peak_mb', 'rss_end_mb', 'rss_idle_mb', 'drift'}
    (drift: idle RSS over RSS after the first minute, minus one)."""
    import httpx

    stop = time.monotonic() + 60 * minutes
    count, errors = [0], []

    def client_loop(i: int) -> None:
        rng = random.Random(seed * 100 + i)
        with httpx.Client(timeout=300) as client:
            while time.monotonic() < stop:
                try:
                    _one_request(client, url, rng)
                    count[0] += 1
                except Exception as e:  # reported, the soak goes on
                    errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    samples = []
    while time.monotonic() < stop:
        samples.append((round(time.monotonic() - start, 1), resident_mb(pid)))
        time.sleep(sample_s)
    for t in threads:
        t.join()
    end = resident_mb(pid)
    time.sleep(5.0)
    idle = resident_mb(pid)
    at_1min = next((mb for s, mb in samples if s >= 60), samples[-1][1])
    return {
        "samples": samples,
        "requests": count[0],
        "errors": errors[:5],
        "num_errors": len(errors),
        "rss_at_1min_mb": at_1min,
        "rss_peak_mb": max(mb for _, mb in samples + [(0, end)]),
        "rss_end_mb": end,
        "rss_idle_mb": idle,
        "drift": idle / at_1min - 1,
    }
