"""Where an admitted request should publish a prefix for its waiting siblings, and how (per cache mode).

- full attention: nothing to do, the producer's KV enters the tree after its round and splits at b;
- hybrid, `no_buffer` (CPU): a state exists only at the end of an extend, so the producer's chunk must end at b
  (SGLang tracks one chunked request at a time: when that slot is taken, no promise is made);
- hybrid, `extra_buffer` (GPU default): the producer tracks a state at b inside its extend via
  `req.mamba_branching_seqlen`; b must lie on the mamba cache-chunk grid counted from the request's prefix.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Optional, Sequence

from sglang_radixflow.cache.promises import as_tokens, best_boundary, longest_common_prefix


class PublishMode(enum.Enum):
    KV = "kv"  # full attention
    CHUNK_END = "chunk_end"  # hybrid no_buffer: cut the producer's extend at b
    TRACK = "track"  # hybrid extra_buffer: mamba_branching_seqlen = b


@dataclass(frozen=True)
class ProducerPlan:
    boundary: int
    mode: PublishMode
    siblings: int
    later: tuple[int, ...] = ()  # further boundaries, in order: each continuation chunk is cut at the next one
    # (sibling, shared length capped at its key limit) for every waiting sibling the plan looked at
    shared: tuple[tuple[Any, int], ...] = field(default=(), compare=False, repr=False)

    def consumers(self) -> list[tuple[Any, int]]:
        """(sibling, tokens the plan's promise serves it) for every sibling it serves: b for a sibling that starts
        with the whole promised prefix, and on full attention (partial promises) the shared part for the others.
        (Readouts of another pooling mode are left to SGLang's own checks.)"""
        partial = self.mode is PublishMode.KV
        result = []
        for sib, shared in self.shared:
            served = min(shared, self.boundary) if partial else (self.boundary if shared >= self.boundary else 0)
            if served > 0 and sib.token_indices_to_pool is None:
                result.append((sib, served))
        return result


# SGLang's frontend `select` scores its choices with logprob_start_len = prompt_len - 2 (token healing), which caps
# their match there: the state a warm-up leaves must sit at or below that position to be usable.
CACHE_ONLY_BACKOFF = 2


def is_cache_only(req: Any) -> bool:
    """No output token and no logprob: the request only fills the cache (the warm-up that sgl.select and fork
    send for a shared prefix). Its state is worth publishing where followers can use it, at the price of one more
    chunk for this request alone."""
    return req.sampling_params.max_new_tokens == 0 and not req.return_logprob


def namespace_of(req: Any) -> Hashable:
    """Cache namespace: SGLang keys the tree by extra_key (LoRA, ...) and cache_salt as well as tokens."""
    return (req.extra_key, req.cache_salt)


def request_tokens(req: Any) -> Sequence[int]:
    """The request's tokens (prompt, then any output so far) as SGLang's array('q')."""
    if not req.output_ids:
        return as_tokens(req.origin_input_ids)
    return as_tokens(list(req.origin_input_ids) + list(req.output_ids))


def key_limit(req: Any, tokens: Sequence[int]) -> int:
    """The longest prefix SGLang would ever match for this request (input_len - 1, logprob start caps it)."""
    return int(req._compute_max_prefix_len(len(tokens)))


def native_branch(req: Any) -> Optional[int]:
    """extra_buffer: where SGLang itself will snapshot this request's state in its extend. Its match sets
    `req.mamba_branching_seqlen` to the grid-aligned token hit when the tree's KV runs past the last state (the point
    where this request leaves a path the tree knows); None otherwise."""
    assert hasattr(req, "mamba_branching_seqlen"), "Req.mamba_branching_seqlen (set by SGLang's match)"
    return req.mamba_branching_seqlen


def plan_producer(
    req: Any, siblings: Iterable[Any], *, min_gain: int, mode: PublishMode, cache_chunk: int, token_hit: int = 0,
    page_size: int = 1, branch: Optional[int] = None,
) -> Optional[ProducerPlan]:
    """The boundary that saves the waiting siblings the most recomputation (whole pages), if any is worth a promise.
    On hybrids it is capped at a branch point the tree already knows without a state (no_buffer: ĥ; extra_buffer:
    SGLang's own snapshot there, `branch`), so later requests on that prefix find a state (docs/design.md)."""
    tokens = request_tokens(req)
    state_hit = int(req.prefix_len)
    floor = state_hit + min_gain - 1  # a boundary must pass it; a sibling sharing no more than that is no consumer
    shared = []
    for sib in siblings:
        if sib is req:
            continue
        sib_tokens = request_tokens(sib)
        usable = min(longest_common_prefix(tokens, sib_tokens), key_limit(sib, sib_tokens), len(tokens))
        shared.append((sib, usable - usable % page_size))
    lcps = [lcp for _, lcp in shared]
    boundary = best_boundary(lcps, floor=floor)
    if mode is PublishMode.CHUNK_END and state_hit + min_gain <= token_hit < boundary:
        boundary = token_hit
    if mode is PublishMode.TRACK and boundary:
        if branch is not None and state_hit + min_gain <= branch < boundary:
            boundary = branch
        boundary = state_hit + (boundary - state_hit) // cache_chunk * cache_chunk
        if boundary < state_hit + min_gain:
            boundary = 0
    if boundary <= state_hit:
        return None
    return ProducerPlan(boundary, mode, sum(1 for x in lcps if x >= boundary), shared=tuple(shared))


def plan_cache_only(
    req: Any, *, token_hit: int, min_gain: int, mode: PublishMode, cache_chunk: int, branch: Optional[int] = None,
) -> Optional[ProducerPlan]:
    """Boundaries where a cache-only request should leave states (hybrids): the known branch point without a state
    (its token hit) and the last position its followers can match. extra_buffer keeps one snapshot per extend: SGLang's
    at the branch point when it has one, else the last usable grid position."""
    state_hit = int(req.prefix_len)
    last = len(request_tokens(req)) - CACHE_ONLY_BACKOFF
    if mode is PublishMode.TRACK:  # one tracked state per extend, on the cache-chunk grid counted from the prefix
        if branch is not None and branch > state_hit:
            return None
        last = state_hit + (last - state_hit) // cache_chunk * cache_chunk
        return ProducerPlan(last, mode, 0) if last >= state_hit + min_gain else None
    cuts = sorted({b for b in (token_hit, last) if state_hit + min_gain <= b <= last})
    if not cuts:
        return None
    return ProducerPlan(cuts[0], mode, 0, tuple(cuts[1:]))
