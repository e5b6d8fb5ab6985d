"""StepBudget: the tokens one step may still schedule, per KV pool.

With one pool (every configuration but data-parallel attention) it is one number. Under
data-parallel attention each rank attends over the requests in its own pool, so the budget is
split evenly over the pools and a request spends its own pool's share, as vLLM runs one
scheduler with its own budget per data-parallel rank: otherwise one long prompt could take a
whole step's budget on one rank while the other rank's attention sat idle and its MLP waited
at the all-gather (random:deepseek-v3-1b, 8 prompts of 1024 tokens at TP=2: 33% of rank 0's
prefill time blocked in the gathers with one shared budget).
"""

from __future__ import annotations


class StepBudget:
    def __init__(self, total: int, num_pools: int = 1) -> None:
        self.left = [total // num_pools + (p < total % num_pools) for p in range(num_pools)]

    @property
    def total(self) -> int:
        return sum(self.left)

    def of(self, pool: int) -> int:
        return self.left[pool]

    def spend(self, pool: int, n: int) -> None:
        if n > self.left[pool]:
            raise RuntimeError(f"pool {pool} spends {n} tokens with {self.left[pool]} left this step")
        self.left[pool] -= n
