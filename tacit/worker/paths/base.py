"""The execution-path seam: what every path is told (PathContext), what it returns (PathResult),
and the registry the model runner picks from, in order of preference.

A path either produces the final hidden states of the rows that sample (`hidden_steps`, so
another path can compose it: the split path runs the fused one and the torch one and merges
their rows) or, where it needs collectives around the head as well, the logits themselves
(`steps`). Both are generators: asked to be pausable, a path yields at every decoder-layer
boundary, and whoever drives it (the engine loop, through the runner) may run other work there,
a cut-in request's whole step, before resuming it. The forward's frames are suspended, not
below the other work on the stack: nothing is re-entered. run() and hidden() drive them through.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Generator, NamedTuple, TypeVar

import torch
from torch import nn

from tacit.distributed.communicator import Communicator
from tacit.outputs import RawPromptLogprobs
from tacit.registry import Registry
from tacit.worker.input_batch import PromptScores, Rows, TorchInputs, has_pooling
from tacit.worker.prompt_logprobs import score_prompt_tokens
from tacit.worker.request_state import CachedRequestState

T = TypeVar("T")
# A forward that may pause: yields at decoder-layer boundaries, returns its result.
Steps = Generator[None, None, T]


def finish(steps: Steps[T], at_pause: Callable[[], None] | None = None) -> T:
    """Run a pausable step to its end: the one driver of every pausable forward. at_pause() runs
    in each pause (the online engine's cut-ins); without it nothing is interleaved."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        if at_pause is not None:
            at_pause()


class PathResult(NamedTuple):
    """Indexes of the rows that sample (in scheduled order), their final hidden states (from
    HiddenStatesPath.hidden) or logits (from ExecutionPath.run), and the prompt logprobs the
    step's chunks scored; with PathContext.keep_row_hidden, every token's final hidden states
    (rows in scheduled order, each row's tokens in order)."""

    samples: list[int]
    values: torch.Tensor | None
    prompt_logprobs: PromptScores
    row_hidden: torch.Tensor | None = None


@dataclass
class PathContext:
    """What every path reads, owned by the model runner: set once at load except where a comment
    says otherwise."""

    model: nn.Module
    device: torch.device
    block_size: int
    attn_backend: Any
    vocab_size: int
    # The C++ decoder (kernels/cpu_fused_decode.py) or None; tests set it to None to force torch.
    fused_decode: Any = None
    comm: Communicator | None = None
    two_batch_overlap: bool = False
    data_parallel: bool = False
    # Mixed steps with at least this many one-token rows split (see paths/split.py).
    split_min_decodes: int = 1
    # Set by LLMEngine.score_full_logprobs for the length of one call: (req_id, first prompt
    # token, [rows, vocab] float32 log-softmax) for every slice a prompt_logprobs request scores.
    full_prompt_logprobs: Callable[[str, int, torch.Tensor], None] | None = None
    # Set when the drafter reads every token's final hidden states (MTP drafts from them): only
    # the paths that export them are built (ExecutionPath.exports_row_hidden).
    keep_row_hidden: bool = False

    def wants_row_hidden(self, rows: Rows) -> bool:
        """Whether a step of these rows exports every token's final hidden states: always for a
        drafter that reads them, and for a step holding an embedding request's rows (its pool
        reads them; paths that cannot export them decline such steps)."""
        return self.keep_row_hidden or has_pooling(rows)

    def score_prompt(self, r: CachedRequestState, first: int, end: int, hidden: torch.Tensor) -> RawPromptLogprobs:
        """r's prompt tokens [first, end) scored from the hidden states of the positions before them."""
        sink = self.full_prompt_logprobs
        full = None if sink is None else (lambda start, lp: sink(r.req_id, start, lp))
        return score_prompt_tokens(
            self.model.compute_logits,
            hidden,
            r.token_ids[first:end],
            first,
            r.sampling_params.prompt_logprobs,
            self.vocab_size,
            full,
        )

    def torch_outputs(self, rows: Rows, built: TorchInputs, hidden: torch.Tensor) -> PathResult:
        """The sampling rows' final hidden states and the prompt logprobs of the rows that score."""
        prompt_logprobs = {
            rows[i][0].req_id: self.score_prompt(rows[i][0], first, end, hidden[row : row + end - first])
            for i, first, end, row in built.scored
        }
        row_hidden = hidden if self.wants_row_hidden(rows) else None
        return PathResult(built.samples, hidden[built.sample_rows], prompt_logprobs, row_hidden)


def run_layers(run: Callable[[int, int], None], num_layers: int, pausable: bool) -> Steps[None]:
    """The one loop over decoder layers, for every path: all at once, or one at a time with a
    pause at every boundary."""
    if not pausable:
        run(0, num_layers)
        return
    for layer in range(num_layers):
        if layer:
            yield
        run(layer, layer + 1)


class ExecutionPath(ABC):
    """One way to run a step's forward. `available` says whether it applies to this rank at all
    (its kernels built, its parallel layout on); `accepts` whether it takes these rows."""

    name: ClassVar[str]
    # Lower runs first: the runner takes the first available path that accepts the rows.
    preference: ClassVar[int]
    # Whether its PathResult carries row_hidden when PathContext.keep_row_hidden asks.
    exports_row_hidden: ClassVar[bool] = False

    def __init__(self, ctx: PathContext) -> None:
        self.ctx = ctx

    @classmethod
    def available(cls, ctx: PathContext) -> bool:
        return True

    @abstractmethod
    def accepts(self, rows: Rows, pausable: bool) -> bool: ...

    def compose(self, paths: list[ExecutionPath]) -> None:
        """Told every path of this rank once they are built (the split path runs two of them)."""

    @abstractmethod
    def steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        """The rows' forward (writing their KV) and the head: the sampling rows' logits."""

    def run(self, rows: Rows) -> PathResult:
        return finish(self.steps(rows, False))


class HiddenStatesPath(ExecutionPath):
    """A path whose forward ends at the final hidden states, so another path can compose it; the
    head runs after it, once over the rows that sample."""

    @abstractmethod
    def hidden_steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        """The rows' forward: writes their KV, returns the sampling rows' final hidden states."""

    def hidden(self, rows: Rows) -> PathResult:
        return finish(self.hidden_steps(rows, False))

    def steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        out = yield from self.hidden_steps(rows, pausable)
        if not out.samples:
            return PathResult([], None, out.prompt_logprobs, out.row_hidden)
        return PathResult(out.samples, self.ctx.model.compute_logits(out.values), out.prompt_logprobs, out.row_hidden)


EXECUTION_PATHS = Registry("execution_path")
register_execution_path = EXECUTION_PATHS.register


def build_paths(ctx: PathContext) -> list[ExecutionPath]:
    """Every registered path that applies to this rank, in order of preference."""
    classes = sorted(EXECUTION_PATHS.values(), key=lambda cls: cls.preference)
    paths = [cls(ctx) for cls in classes if cls.available(ctx) and (cls.exports_row_hidden or not ctx.keep_row_hidden)]
    for p in paths:
        p.compose(paths)
    return paths


def first_accepting(paths: list[ExecutionPath], rows: Rows, pausable: bool) -> ExecutionPath:
    """The first path (in preference order) that takes these rows; the torch path takes any."""
    return next(p for p in paths if p.accepts(rows, pausable))
