"""The TPOT a client measures when the batch is served as a closed loop with prefill on the same
devices ("PD mixed": vLLM's and SGLang's colocated serving). `bench_serving --max-concurrency N`
keeps N requests in flight and replaces each one that finishes; the new request's prompt is
prefilled in steps (or chunks riding in steps) that the running requests' decodes wait through.
Its mean TPOT, (E2E - TTFT) / (output - 1), counts those prefills; `tacit predict`'s TPOT, the
decode step alone, does not (what a PD-disaggregated deployment's decode devices see).

Steady state: a request lives L = P + (output_len - 1) * X (P one prompt's TTFT alone, X the
served TPOT), so the other N - 1 requests' prompts arrive at (N - 1) / L. Spread over D attention
groups (data-parallel ranks, which step together because their MoE layers exchange tokens), one
group prefills a share u_g = (N - 1) * P / (D * L) of the time, and some group prefills
u = 1 - (1 - u_g)^D of it: groups whose prefills coincide share the step (arrivals independent).
Decodes advance the rest of the time, so X * (1 - u) = TPOT. X * (1 - u(X)) rises with X, and
the root lies between TPOT and TPOT + (N - 1) * P / (output_len - 1) (where u <= D * u_g), so
bisection finds it. Prefills that coincide on one group are priced one after the other (the
prompts are long next to a step's other work, so their compute adds).

The loop's output rate follows by Little's law: N requests in flight, each yielding output_len
tokens a life, give N * output_len / L tokens a second: what an offline throughput benchmark
(trtllm-bench, vLLM's benchmark_throughput) measures once its queue keeps the engine at N."""

from __future__ import annotations

# bisection steps: the bracket is at most (N - 1) * P / (output_len - 1) wide, 2^-60 of it is
# far below a nanosecond for any batch a deployment runs
_STEPS = 60


def some_group_share(per_group: float, groups: int) -> float:
    """The share of the time some of `groups` attention groups prefills, each one `per_group` of
    it independently: 1 - (1 - u_g)^D (the groups step together, so any one prefilling holds all)."""
    return 1.0 - (1.0 - per_group) ** groups


def prefill_share(x_s: float, prefill_one_s: float, batch: int, output_len: int, groups: int) -> float:
    """u: the share of the time some attention group is prefilling another request's prompt,
    each request living prefill_one_s + (output_len - 1) * x_s."""
    life = prefill_one_s + (output_len - 1) * x_s
    return some_group_share(min(1.0, (batch - 1) * prefill_one_s / (groups * life)), groups)


def served_tpot(
    tpot_s: float, prefill_one_s: float, batch: int, output_len: int, attention_groups: int = 1
) -> tuple[float, float]:
    """(served TPOT in seconds, the share of the time spent in the others' prefills) for `batch`
    requests in a closed loop; (tpot_s, 0.0) where nothing interrupts (one request, one output
    token, no prompt)."""
    if tpot_s <= 0 or attention_groups < 1:
        raise ValueError(f"tpot_s {tpot_s} and attention_groups {attention_groups} must be positive")
    if batch <= 1 or output_len <= 1 or prefill_one_s <= 0:
        return tpot_s, 0.0
    lo, hi = tpot_s, tpot_s + (batch - 1) * prefill_one_s / (output_len - 1)
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        if mid * (1.0 - prefill_share(mid, prefill_one_s, batch, output_len, attention_groups)) < tpot_s:
            lo = mid
        else:
            hi = mid
    return hi, prefill_share(hi, prefill_one_s, batch, output_len, attention_groups)


def served_throughput(batch: int, output_len: int, prefill_one_s: float, served_tpot_s: float) -> float:
    """Output tokens a second of `batch` requests in the closed loop, each living prefill_one_s
    + (output_len - 1) * served_tpot_s (Little's law)."""
    return batch * output_len / (prefill_one_s + (output_len - 1) * served_tpot_s)
