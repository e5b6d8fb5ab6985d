"""Suffix drafts, vLLM's "suffix" method (SuffixDecoding, Oliaro et al.): the longest suffix of a
request's tokens found earlier in them or in recent requests' outputs, continued along the path
those earlier occurrences most often took, for as long as that path is likely enough.

Where prompt lookup ("ngram") proposes what followed the single latest match, this pools every
occurrence of the longest match: in the request's own prompt and output, and in the outputs of the
last suffix_decoding_max_cached_requests finished requests (agent loops, tool-call JSON and code
edits repeat across requests, not only within one). At each draft position the most frequent next
token among the occurrences still on the path is proposed if its share of them is at least
suffix_decoding_min_token_prob; the occurrences that continue otherwise drop out. A match of L
tokens proposes at most suffix_decoding_max_spec_factor * L drafts: a short match is weak
evidence.

The index (SuffixIndex) keys every position by the two tokens before it, holding the latest 256
positions per key, and extends a candidate's match backwards token by token, up to
suffix_decoding_max_tree_depth: memory is one entry a token (~100 bytes), the finished requests'
share bounded by their count, a lookup at most 256 x depth comparisons.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict

from tacit.config.speculative import SpeculativeConfig
from tacit.worker.drafter import DraftProposer, register_draft_proposer
from tacit.worker.request_state import CachedRequestState

_KEY = 2  # tokens a position is keyed by: the shortest suffix that is matched
_PER_KEY = 256  # latest positions kept per key: bounds a lookup (a frequent bigram has thousands)


class SuffixIndex:
    """Token sequences, each position keyed by the _KEY tokens before it."""

    def __init__(self, max_sequences: int | None = None) -> None:
        self.max_sequences = max_sequences
        self.seqs: OrderedDict[object, list[int]] = OrderedDict()
        self._indexed: dict[object, int] = {}
        self._index: dict[tuple[int, ...], list[tuple[object, int]]] = {}

    def update(self, sid: object, tokens: list[int]) -> None:
        """Index sequence sid as it is now (tokens may be a list that grows between calls): every
        position that has a token after it gets its key."""
        if sid in self.seqs and self.seqs[sid] is not tokens:
            self.seqs[sid] = tokens  # a resumed request's state, rebuilt: the same tokens, a new list
        if sid not in self.seqs:
            self.seqs[sid] = tokens
            self._indexed[sid] = _KEY
            if self.max_sequences is not None and len(self.seqs) > self.max_sequences:
                old, _ = self.seqs.popitem(last=False)  # its entries are skipped, then pruned
                self._indexed.pop(old, None)
        start = self._indexed[sid]
        for p in range(start, len(tokens)):
            bucket = self._index.setdefault(tuple(tokens[p - _KEY : p]), [])
            bucket.append((sid, p))
            if len(bucket) > 2 * _PER_KEY:
                del bucket[: len(bucket) - _PER_KEY]
        self._indexed[sid] = max(start, len(tokens))

    def remove(self, sid: object) -> None:
        self.seqs.pop(sid, None)
        self._indexed.pop(sid, None)

    def occurrences(self, context: list[int]) -> list[tuple[list[int], int]]:
        """(sequence, position after the context's last _KEY tokens) for each earlier place those
        tokens occur; the context's own end is not one (a position must have a token after it)."""
        bucket = self._index.get(tuple(context[-_KEY:]), ())
        out = []
        for sid, p in bucket[-_PER_KEY:]:
            seq = self.seqs.get(sid)
            if seq is not None:
                out.append((seq, p))
        return out


def suffix_drafts(
    context: list[int],
    occurrences: list[tuple[list[int], int]],
    k: int,
    max_depth: int,
    min_prob: float,
    spec_factor: float,
) -> list[int]:
    """Up to k drafts after `context` from the earlier occurrences of its last tokens (module
    docstring): the longest matches, continued by majority while the majority is likely enough."""
    if len(context) < _KEY or not occurrences:
        return []
    best, path = 0, []
    n = len(context)
    for seq, p in occurrences:
        length = _KEY
        while length < max_depth and p - length - 1 >= 0 and n - length - 1 >= 0:
            if seq[p - length - 1] != context[n - length - 1]:
                break
            length += 1
        if length > best:
            best, path = length, [(seq, p)]
        elif length == best:
            path.append((seq, p))
    limit = min(k, math.ceil(spec_factor * best))
    drafts: list[int] = []
    for j in range(limit):
        counts = Counter(seq[p + j] for seq, p in path if p + j < len(seq))
        if not counts:
            break
        token, count = counts.most_common(1)[0]
        if count < min_prob * len(path):
            break
        drafts.append(token)
        path = [(seq, p) for seq, p in path if p + j < len(seq) and seq[p + j] == token]
    return drafts


@register_draft_proposer("suffix")
class SuffixProposer(DraftProposer):
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.max_depth = config.suffix_decoding_max_tree_depth
        self.min_prob = config.suffix_decoding_min_token_prob
        self.spec_factor = config.suffix_decoding_max_spec_factor
        self.requests = SuffixIndex()  # running requests' own tokens
        self.finished = SuffixIndex(config.suffix_decoding_max_cached_requests)  # finished outputs

    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        out = {}
        for r in requests:
            self.requests.update(r.req_id, r.token_ids)
            tokens = r.token_ids
            found = self.requests.occurrences(tokens) + self.finished.occurrences(tokens)
            drafts = suffix_drafts(tokens, found, self.k, self.max_depth, self.min_prob, self.spec_factor)
            if drafts:
                out[r.req_id] = drafts
        return out

    def request_finished(self, state: CachedRequestState) -> None:
        self.requests.remove(state.req_id)
        output = state.output_token_ids
        if len(output) > _KEY:
            self.finished.update(state.req_id, output)
