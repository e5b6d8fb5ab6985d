"""What the engine hands back (vLLM's RequestOutput / CompletionOutput shapes), and what the model
runner hands the scheduler each step (ModelRunnerOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    # One dict per generated token: {token_id: Logprob}, the chosen token plus the top-n.
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict[str, float] = field(default_factory=dict)
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (nothing
    # predicts it), else {token_id: Logprob} holding the prompt's own token plus the top-n.
    # Filled chunk by chunk while the prompt prefills; complete once the first token is out.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # Prompt tokens whose KV came from the prefix cache (vLLM's name): for n > 1, the most any
    # of the sequences found.
    num_cached_tokens: int = 0
    # An embedding request (SamplingParams.pooling), once finished: its pooled vector.
    embedding: list[float] | None = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """LLM.embed's result for one prompt (vLLM's shape)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


# (chosen token's logprob, its rank, [(token_id, logprob), ...] top-n) for one sampled row.
RawLogprobs = tuple[float, int, list[tuple[int, float]]]


@dataclass(frozen=True)
class RawPromptLogprobs:
    """Logprobs of consecutive prompt tokens scored in one step: prompt tokens start,
    start + 1, ..., each entry as for a sampled token (start >= 1: the first token has none)."""

    start: int
    token_ids: list[int]
    entries: list[RawLogprobs]


@dataclass
class ModelRunnerOutput:
    """What the model runner hands back to the scheduler for one step: plain data, vLLM v1's name.

    Only requests that sampled this step appear in req_ids (a prefill chunk short of its
    request's last prompt token samples nothing, nor does a prompt only scored, max_tokens=0).
    Each of them gets a list of tokens: the draft tokens its verify step accepted, in order,
    then the one token sampled after them (just that one without drafts).
    """

    req_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    # Per request, one entry per token of sampled_token_ids (None: it did not ask for logprobs).
    logprobs: list[list[RawLogprobs] | None] = field(default_factory=list)
    # Seconds the runner spent on this step's own forward and sampling, not counting work run
    # between its layers (a cut-in prefill): what the step-cost model learns from.
    execute_s: float = 0.0
    # Of execute_s, the seconds the draft proposer took (a draft model's or MTP's forwards): the
    # cost model leaves them out of the step's time and the draft-length controller prices
    # each proposed token with them.
    propose_s: float = 0.0
    # Of propose_s, the seconds spent catching up on context the proposer had not seen (a draft
    # model prefilling a prompt): a request's one-time cost, not a proposed token's.
    propose_catch_up_s: float = 0.0
    # KV blocks this runner copied for the step's swap_ops, and the seconds it took (the
    # scheduler's copy-bandwidth estimate learns from them).
    swap_blocks: int = 0
    swap_s: float = 0.0
    # Requests with prompt_logprobs whose prefill chunk scored prompt tokens this step (any chunk,
    # sampling or not).
    prompt_logprobs: dict[str, RawPromptLogprobs] = field(default_factory=dict)
    # Draft tokens the runner's proposer offers for each request's next step (vLLM v1's
    # spec_token_ids); the scheduler decides how many of them the next step verifies.
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Embedding requests whose prompt ended this step: their pooled vector (vLLM's pooler_output).
    pooler_output: dict[str, list[float]] = field(default_factory=dict)
