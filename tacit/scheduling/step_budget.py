"""StepBudget: the tokens one step may still schedule, and its long-prefill slots, per KV pool.

With one pool (every configuration but data-parallel attention) it is one number and one count.
Under data-parallel attention each rank attends over the requests in its own pool, so the token
budget is split evenly over the pools and each pool has its own long-prefill slots, a request
spending its own pool's, as vLLM runs one scheduler with its own budget per data-parallel rank:
otherwise one long prompt could take a whole step on one rank while the other rank's attention
sat idle and its MLP waited at the all-gather (random:deepseek-v3-1b, 8 prompts of 1024 tokens at
TP=2: 33% of rank 0's prefill time blocked in the gathers with one shared budget, ~20% with the
budget split but one long-prefill slot for both ranks).
"""

from __future__ import annotations


class StepBudget:
    def __init__(self, total: int, num_pools: int = 1, long_prefills: int = 0) -> None:
        """long_prefills: how many long prompts each pool may prefill this step."""
        self.left = [total // num_pools + (p < total % num_pools) for p in range(num_pools)]
        self.long_left = [long_prefills] * num_pools

    @property
    def any_long_slot(self) -> bool:
        return any(self.long_left)

    def take_long_slot(self, pool: int) -> bool:
        """Use one of pool's long-prefill slots; False if it has none left."""
        if not self.long_left[pool]:
            return False
        self.long_left[pool] -= 1
        return True

    @property
    def total(self) -> int:
        return sum(self.left)

    def of(self, pool: int) -> int:
        return self.left[pool]

    def spend(self, pool: int, n: int) -> None:
        if n > self.left[pool]:
            raise RuntimeError(f"pool {pool} spends {n} tokens with {self.left[pool]} left this step")
        self.left[pool] -= n
