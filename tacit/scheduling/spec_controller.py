"""DraftLengthController: how many of a request's draft tokens a step verifies, the one place
the draft length is decided, between the speculative config's bounds (min_speculative_tokens,
num_speculative_tokens: what the proposer offers).

A draft token is worth verifying when what it is expected to save exceeds what it costs. Draft
i of a request is kept only if drafts 1..i-1 were, so with a per-token acceptance rate a it is
worth a^i tokens. It costs the step cost model's measured seconds a decode row (a draft is one
more row: StepCostModel.draft_s_per_token), against which a decode step without drafts yields
num_decodes / decode_step_s(num_decodes) tokens a second (as measured at that batch): keeping it
raises the step's tokens a second when

    a^i > draft_s_per_token * num_decodes / decode_step_s(num_decodes)

At batch 1 a draft row costs a fraction of the step (on the default model ~1.4 ms of ~4.9: its
Q4 GEMVs are compute-bound at this size; on a memory-bound model far less), so drafts of fair
acceptance pay; at batch 16 a row costs ~3 ms of ~52 and only drafts nearly sure to be kept do. Nothing here assumes a
speed: until the cost model has seen a step with drafts every draft is verified, which is how
it learns what they cost.

A proposer that runs a model (a draft model, MTP) costs time too, paid for every token it
proposes whether or not the token is verified: the measured seconds per proposed token
(observe_proposer, a moving average; a request's one-time catch-up, a draft model prefilling
its prompt, left out) join the row's cost in the bar:

    a^i > (draft_s_per_token + propose_s_per_token) * num_decodes / decode_step_s(num_decodes)

On the default model drafting for itself (a draft as costly as the target) this bar is never
cleared and the proposer stops running (propose_after_step); prompt lookup costs ~0.1 ms a call
and barely moves it.

A request's rate a is estimated from its own verifies (each a run of accepted drafts ended by
the first rejection: accepted successes in accepted + 1 trials, or all of them), decayed so it
follows the text as it changes (code being rewritten, then prose), from a prior of 1/2. A
request whose drafts are all turned down gets one every PROBE_EVERY steps, so a rate that has
improved is seen.
"""

from __future__ import annotations

from tacit.scheduling.cost_model import StepCostModel
from tacit.scheduling.request import Request

# Each draft token tried discounts what came before by 0.75 (~4 tokens' memory): a change of
# text shows within a verify or two (a rejection weighs one trial, a run of 4 accepted four),
# while one unlucky draft does not turn speculation off.
_DECAY = 0.75
PROBE_EVERY = 8


def max_acceptance(k: int) -> float:
    """The highest acceptance the estimate reaches with k drafts a verify, every one kept for ever
    (k / (1 - decay^k) trials, all accepted, over the prior's 1 of 2): 0.87 at k = 4. A bar above
    it can never be cleared, so nothing is proposed or probed (a probe's row would be paid for
    nothing: at batch 16 on the default model the probes alone cost 7% of throughput)."""
    trials = k / (1 - _DECAY**k)
    return (trials + 1) / (trials + 2)


class DraftLengthController:
    def __init__(self, cost: StepCostModel, min_tokens: int = 0, max_tokens: int = 8) -> None:
        """min_tokens: verify at least this many of the drafts offered, whatever they cost;
        max_tokens: the most a proposer offers (num_speculative_tokens)."""
        self.cost = cost
        self.min_tokens = min_tokens
        self.ceiling = max_acceptance(max(max_tokens, 1))
        self.threshold = 0.0
        # Seconds the proposer spends per token it proposes (None: not measured yet).
        self.propose_s_per_token: float | None = None
        # The decodes of the step whose proposals measured it, and of the step being built.
        self.measured_at_decodes = 0
        self.num_decodes = 0

    def begin_step(self, num_decodes: int) -> None:
        """The acceptance a draft must be expected to clear this step (see the module docstring)."""
        self.num_decodes = num_decodes
        step = self.cost.decode_step_s(num_decodes)
        if not self.cost.num_observed_with_drafts or step <= 0:
            self.threshold = 0.0  # nothing measured yet: verify, and learn what a draft costs
            return
        per_token = self.cost.draft_s_per_token + (self.propose_s_per_token or 0.0)
        self.threshold = per_token * max(num_decodes, 1) / step

    @property
    def worth_proposing(self) -> bool:
        """Whether any draft could be verified at this step's bar (else the proposer need not run)."""
        return self.threshold < self.ceiling or self.min_tokens > 0

    def propose_after_step(self) -> bool:
        """Whether the runner proposes drafts after the step being built: when worth it, and when
        the batch has shrunk below the one the proposer's cost was measured at (each draft row
        then weighs less against the step, so the cost is measured again). A proposer too
        costly at a batch stays off at that batch and above: the bar only rises with the batch
        (rows and proposals grow with it, a step's time less), and measuring again would pay a
        whole context's catch-up (a draft model prefilling what it has not seen)."""
        return self.worth_proposing or (
            self.propose_s_per_token is not None and self.num_decodes < self.measured_at_decodes
        )

    @staticmethod
    def acceptance(req: Request) -> float:
        return (req.spec_accepted + 1.0) / (req.spec_trials + 2.0)

    def draft_length(self, req: Request, proposed: int) -> int:
        """How many of req's `proposed` drafts to verify now."""
        if not proposed:
            return 0
        a, worth, k = self.acceptance(req), 1.0, 0
        while k < proposed:
            worth *= a
            if worth <= self.threshold:
                break
            k += 1
        k = max(k, min(self.min_tokens, proposed))
        if k:
            req.spec_idle_steps = 0
            return k
        req.spec_idle_steps += 1
        if req.spec_idle_steps >= PROBE_EVERY and self.threshold < self.ceiling:
            req.spec_idle_steps = 0
            return 1
        return 0

    def observe_proposer(self, seconds: float, num_proposed: int) -> None:
        """The proposer took `seconds` to propose num_proposed tokens (one step's proposals)."""
        if num_proposed <= 0:
            return
        per_token = seconds / num_proposed
        last = self.propose_s_per_token
        self.measured_at_decodes = self.num_decodes
        self.propose_s_per_token = per_token if last is None else _DECAY * last + (1 - _DECAY) * per_token

    @staticmethod
    def observe(req: Request, num_drafts: int, num_accepted: int) -> None:
        """req's step verified num_drafts drafts and kept the first num_accepted."""
        trials = num_accepted + (1 if num_accepted < num_drafts else 0)
        keep = _DECAY**trials
        req.spec_accepted = keep * req.spec_accepted + num_accepted
        req.spec_trials = keep * req.spec_trials + trials
