"""A chat turn's prefill over a cached prefix against the same chunk with no context: engine
steps timed on the default model (docs/benchmarks.md, "Prefix caching: multi-turn conversations").

Run: python scripts/cached_turn_step.py
"""

import time

from tacit import LLM, SamplingParams


def main() -> None:
    engine = LLM().engine  # the default model, prefix cache on
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def timed(prompt: list[int], label: str) -> None:
        engine.add_request(prompt, params)
        steps = []
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t)
        print(label, "steps", len(steps), "ms", [round(s * 1000, 1) for s in steps])

    base = [100 + (i * 7) % 5000 for i in range(2900)]
    timed(base, "first 2900")
    for k in (170, 170, 340):
        base = base + [7 + i for i in range(k)]
        timed(base, f"turn +{k} (cached prefix)")
    timed([9000 + i for i in range(170)], "fresh 170")
    timed([9100 + i for i in range(170)], "fresh 170")


if __name__ == "__main__":
    main()
