"""Where an admitted request should publish a prefix for its waiting siblings, and how (per cache mode).

- full attention: nothing to do, the producer's KV enters the tree after its round and splits at b;
- hybrid, `no_buffer` (CPU): a state exists only at the end of an extend, so the producer's chunk must end at b
  (SGLang tracks one chunked request at a time: when that slot is taken, no promise is made);
- hybrid, `extra_buffer` (GPU default): the producer tracks a state at b inside its extend via
  `req.mamba_branching_seqlen`; b must lie on the mamba cache-chunk grid counted from the request's prefix.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Optional, Sequence

from sglang_radixflow.cache.promises import as_tokens, best_boundary, longest_common_prefix

INDEX_PREFIX = 8  # siblings are found by their first tokens; shorter shared prefixes are not worth a promise


class PublishMode(enum.Enum):
    KV = "kv"  # full attention
    CHUNK_END = "chunk_end"  # hybrid no_buffer: cut the producer's extend at b
    TRACK = "track"  # hybrid extra_buffer: mamba_branching_seqlen = b


@dataclass(frozen=True)
class ProducerPlan:
    boundary: int
    mode: PublishMode
    siblings: int


def namespace_of(req: Any) -> Hashable:
    """Cache namespace: SGLang keys the tree by extra_key (LoRA, ...) and cache_salt as well as tokens."""
    return (req.extra_key, req.cache_salt)


def request_tokens(req: Any) -> Sequence[int]:
    return as_tokens(req.origin_input_ids + req.output_ids)


def key_limit(req: Any, tokens: Sequence[int]) -> int:
    """The longest prefix SGLang would ever match for this request (input_len - 1, logprob start caps it)."""
    return int(req._compute_max_prefix_len(len(tokens)))


class SiblingIndex:
    """Waiting requests grouped by (namespace, first INDEX_PREFIX tokens); built once per scheduling pass."""

    def __init__(self, waiting: Iterable[Any]) -> None:
        self._groups: dict[tuple, list[Any]] = {}
        for req in waiting:
            tokens = request_tokens(req)
            if len(tokens) > INDEX_PREFIX:
                self._groups.setdefault((namespace_of(req), tokens[:INDEX_PREFIX].tobytes()), []).append(req)

    def siblings(self, req: Any, tokens: Sequence[int]) -> list[Any]:
        if len(tokens) <= INDEX_PREFIX:
            return []
        group = self._groups.get((namespace_of(req), as_tokens(tokens[:INDEX_PREFIX]).tobytes()), [])
        return [s for s in group if s is not req]


def plan_producer(
    req: Any, tokens: Sequence[int], siblings: Iterable[Any], *, min_gain: int, mode: PublishMode,
    cache_chunk: int, excluded: set[int],
) -> Optional[ProducerPlan]:
    """The boundary that saves the waiting siblings the most recomputation, if any is worth a promise."""
    state_hit = int(req.prefix_len)
    lcps = []
    for sib in siblings:
        if id(sib) in excluded:
            continue
        sib_tokens = request_tokens(sib)
        lcps.append(min(longest_common_prefix(tokens, sib_tokens), key_limit(sib, sib_tokens), len(tokens)))
    boundary = best_boundary(lcps, floor=state_hit + min_gain - 1)
    if mode is PublishMode.TRACK and boundary:
        boundary = state_hit + (boundary - state_hit) // cache_chunk * cache_chunk
        if boundary < state_hit + min_gain:
            boundary = 0
    if boundary <= state_hit:
        return None
    return ProducerPlan(boundary, mode, sum(1 for x in lcps if x >= boundary))
