"""Preemption decisions: which running request gives up its blocks, and whether its KV is
swapped to host memory or recomputed on resume (the scheduler's model is in scheduler.py's
docstring; Scheduler._preempt carries a decision out).

A request that has aged past SchedulerConfig.aging_s is a victim only when every candidate
has: the aging bound promises it will not be pushed out again once it got in.

A victim is preempted for its blocks, and with the prefix cache some of its blocks may be
shared with other running requests: those stay held, so a victim whose blocks are all shared
frees nothing and loses its work for nothing. When the policy's victim is such a one, the
policy's next choice in the same class (same priority) that frees at least one block goes
instead; never one of another class, so priority order holds. Among the candidates that free
something the policy's order still decides, rather than "whoever frees the most": the most
blocks belong to the oldest, longest request, and preempting it first would throw away the most
computed work and let it be preempted again each time it resumes (fcfs preempts the newest so
the oldest always finishes).

Each function takes the Scheduler as `s`, untyped: importing Scheduler here would close an
import cycle (scheduler.py imports this module).
"""

from __future__ import annotations

from tacit.scheduling.request import Request


def should_swap(s, request: Request, num_blocks: int) -> bool:
    """Whether to swap request's KV out (else it is recomputed on resume): "swap" does whenever
    the swap space has room, any other mode but "recompute" when the copy out and back costs less
    than prefilling its computed tokens again."""
    mode = s.config.preemption_mode
    if s.swapper is None or mode == "recompute" or not num_blocks or not s.swapper.has_room(num_blocks):
        return False  # "swap" with the swap space full falls back to recompute
    return mode == "swap" or (s.swapper.cost_s(num_blocks) < request.num_computed_tokens * s.cost.prefill_s_per_token)


def pick_victim(s, candidates: list[Request]) -> Request:
    """The request to preempt for a batch slot (max_num_seqs): the policy's victim."""
    fresh = [r for r in candidates if not r.aged]
    return s.policy.pick_victim(fresh or candidates)


def pick_victim_for_blocks(s, candidates: list[Request], requester: Request | None = None) -> Request:
    """The request to preempt for KV blocks: the policy's victim, unless it frees no block (all
    its blocks are shared), then the policy's next in the same class that frees one. requester
    (the request the room is for, among the candidates) ends the walk: reaching it, it yields
    its own blocks rather than take those of someone the policy ranks below it."""
    fresh = [r for r in candidates if not r.aged] or candidates
    victim = s.policy.pick_victim(fresh)
    cls = s.policy.victim_class(victim)
    rest = [r for r in fresh if s.policy.victim_class(r) == cls]
    choice = victim
    while choice is not requester and not s.kv.num_unshared_blocks(choice.request_id):
        rest.remove(choice)
        if not rest:
            return victim  # no one in its class frees anything: the policy's choice stands
        choice = s.policy.pick_victim(rest)
    return choice


def make_room_for_urgent(s, preempted: list[Request]) -> None:
    """Preempt lower-ranked running work so the best waiting request can start this step."""
    if not s.waiting or not s.running:
        return
    head = s._next_waiting()
    need = s.kv.blocks_needed(head.num_computed_tokens + s._chunk(head, s.config.max_num_batched_tokens))
    outranked = [r for r in s.running if s._outranks(head, r)]
    reclaimable = sum(s.kv.num_blocks_of(r.request_id) for r in outranked)
    if not outranked or s.kv.num_free_blocks + reclaimable < need:
        return  # preempting would not let it in: do not throw away their work for nothing
    while True:
        short_of_slots = len(s.running) >= s.config.max_num_seqs
        short_of_blocks = need > s.kv.num_free_blocks
        if not (short_of_slots or short_of_blocks) or not outranked:
            return
        victim = pick_victim_for_blocks(s, outranked) if short_of_blocks else pick_victim(s, outranked)
        outranked.remove(victim)
        s._preempt(victim, preempted)
