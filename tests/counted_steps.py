"""Run prompts one after another on an LLM and count the tokens each one's steps computed: what
the prefix cache tests compare (a hit's tokens are exactly the ones not computed)."""

from __future__ import annotations

from tacit import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def one_by_one(llm: LLM, prompts, params: SamplingParams = GREEDY, **kw):
    """Each prompt alone, in order; the tokens each step computed for it are counted."""
    engine = llm.engine
    computed: dict[str, int] = {}
    real = engine.scheduler.schedule

    def counting():
        out = real()
        for rid, n in out.num_scheduled_tokens.items():
            computed[rid] = computed.get(rid, 0) + n
        return out

    engine.scheduler.schedule = counting
    try:
        outs = []
        for p in prompts:
            rid = engine.add_request(p, params, **kw)
            while engine.has_unfinished_requests():
                for o in engine.step():
                    if o.finished and o.request_id == rid:
                        outs.append(o)
    finally:
        del engine.scheduler.schedule
    # A request's one sequence runs under its own id (n=1: the parent's).
    return outs, [computed[o.request_id] for o in outs]
