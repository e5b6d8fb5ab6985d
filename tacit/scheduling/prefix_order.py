"""Cache-aware order of the waiting queue: among waiting requests the policy ranks equal up to
arrival, the one with the longest cached prefix goes first (SGLang's "lpm", longest prefix match).

Why: a request whose leading blocks the pool holds now costs the step only its uncached tokens, so
serving it first lets more requests into the step's token budget (lower mean TTFT), and it takes
its cached blocks before other requests' allocations evict them from the free queue. vLLM has no
such order (its waiting queue is fcfs or priority); SGLang has it as --schedule-policy lpm.

Where it applies: fcfs and priority, whose order within a class (all requests; one priority) is
arrival (SchedulingPolicy.arrival_class). sjf and sla keep their own order within a priority
(predicted length, slack), which already says who should go first. The scheduler's aging rule
(SchedulerConfig.aging_s) stands above it: an aged request goes before every one that has not.

Bounds, so that cache-cold requests are not starved. SGLang's lpm ranks by prefix length alone,
and on production traffic with ~96% hit rate its cache-miss requests formed a 20-60 s TTFT tail
(sgl-project/sglang#31954; SGLang's default --schedule-policy is fcfs). Here:
- only requests that arrived in the same LPM_ARRIVAL_WINDOW_S are reordered; earlier windows go
  first, so a request can be passed only by those arriving in its own window, never by the
  steady stream behind it;
- in a window, resuming requests (preempted: swapped out, or to recompute) go first, by arrival:
  they were running, and a swapped one cannot read the cache (its blocks are its own copy), so
  ranking it by a cached prefix of 0 would push it behind every hit;
- above LPM_MAX_WAITING waiting requests the order is the policy's alone (the lookups' cost).
"""

from __future__ import annotations

from tacit.scheduling.request import Request, RequestStatus

# 128 waiting requests: SGLang's cutoff, for the same reason (its lpm turns into fcfs above 128
# waiting: schedule_policy.py, _determine_active_policy). Ranking walks each waiting request's
# block hashes through the pool's dict once a step: 128 requests of 2,000 prompt tokens in
# 16-token blocks, all cached, took ~1 ms a step here (2 cores), against ~100 ms and more per step
# of the default model: ~1% at 128, and it grows with the queue (~8 us a request) while a queue
# that deep is an overloaded server serving its oldest arrival windows anyway.
LPM_MAX_WAITING = 128

# 1 s: the starvation bound. A cold request can be passed only by requests that arrived in the
# same second as it (a burst, such as an agent's fan-out, is reordered whole), not by the steady
# stream of hits behind it, which under SGLang's unbounded lpm made a 20-60 s tail. One second is
# of the order of one TTFT under load (the mixed-priority benchmark's interactive target is 500 ms
# and its fcfs p50 TTFT 1.1 s, docs/benchmarks.md): a window longer than that would let hits delay
# a cold request by several TTFTs.
LPM_ARRIVAL_WINDOW_S = 1.0


class PrefixOrder:
    """The waiting-queue key of one scheduler, with each waiting request's cached prefix looked
    up at most once a step (begin_step forgets them: the pool changes between steps)."""

    def __init__(self, scheduler) -> None:  # a Scheduler; untyped: scheduler.py imports this module
        self._s = scheduler
        self._cached: dict[str, int] = {}

    def begin_step(self) -> None:
        self._cached.clear()

    def active(self) -> bool:
        """Whether ranking by cached prefix is on and worth its lookups now."""
        s = self._s
        return s.config.enable_cache_aware_scheduling and s.kv.enable_caching and 1 < len(s.waiting) <= LPM_MAX_WAITING

    def waiting_key(self, req: Request) -> tuple:
        """The policy's waiting_key, or with the cache-aware order: class, arrival window,
        resuming first, longest cached prefix, arrival."""
        s = self._s
        cls = s.policy.arrival_class(req) if self.active() else None
        if cls is None:
            return s.policy.waiting_key(req, s.view)
        window = int(req.arrival_time // LPM_ARRIVAL_WINDOW_S)
        if req.status == RequestStatus.PREEMPTED or req.num_computed_tokens:
            return (*cls, window, 0, 0, req.arrival_time, req.arrival_seq)
        return (*cls, window, 1, -self.cached_blocks(req), req.arrival_time, req.arrival_seq)

    def cached_blocks(self, req: Request) -> int:
        """Leading blocks of req the prefix cache holds now: in the pool it is placed in, or for
        one not placed, the best pool (where Scheduler._place will put it)."""
        n = self._cached.get(req.request_id)
        if n is None:
            s, kv = self._s, self._s.kv
            hashes = s._lookup_hashes(req)
            if not hashes:
                n = 0
            elif kv.num_pools > 1 and not kv.num_blocks_of(req.request_id):
                n = max(kv.cached_prefix_blocks(hashes, req.num_tokens, p) for p in range(kv.num_pools))
            else:
                n = kv.cached_prefix_blocks(hashes, req.num_tokens, kv.pool_of(req.request_id))
            self._cached[req.request_id] = n
        return n
