"""Where an admitted request should publish a prefix for its waiting siblings, and how (per cache mode).

- full attention: nothing to do, the producer's KV enters the tree after its round and splits at b;
- hybrid, `no_buffer` (CPU): a state exists only at the end of an extend, so the producer's chunk must end at b
  (SGLang tracks one chunked request at a time: when that slot is taken, no promise is made);
- hybrid, `extra_buffer` (GPU default): the producer tracks a state at b inside its extend via
  `req.mamba_branching_seqlen`; b must lie on the mamba cache-chunk grid counted from the request's prefix.
"""
from __future__ import annotations

import enum
import itertools
import operator
from array import array
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping, Optional, Sequence

from sglang_radixflow.cache.promises import as_tokens, best_boundary, common_prefix_with, tokens_share_more_than

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
    later: tuple[int, ...] = ()  # further boundaries, in order: each continuation chunk is cut at the next one
    # (sibling, shared length capped at its key limit) for every waiting sibling the plan looked at: the promise's
    # consumers, whom the scan can prove Blocked without matching them (SchedulingState._consumers).
    shared: tuple[tuple[Any, int], ...] = field(default=(), compare=False, repr=False)


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
    """The request's tokens, read-only. Before any output this is the prompt array itself, not an O(prompt) copy:
    the scan calls this several times for every request it examines."""
    if not req.output_ids:
        origin = req.origin_input_ids  # as_tokens' common case inlined: a call less per use
        return origin if origin.__class__ is array and origin.typecode == "q" else as_tokens(origin)
    return as_tokens(req.origin_input_ids + req.output_ids)


SIBLING_KEY = "rf_sibling_key"  # per-request cache of sibling_key (the prompt and namespace never change)


def sibling_key(req: Any) -> Optional[tuple]:
    """(namespace, first INDEX_PREFIX tokens) grouping siblings; None for requests too short to index."""
    try:
        return getattr(req, SIBLING_KEY)  # cached: the common case, kept to one attribute read
    except AttributeError:
        pass
    origin = req.origin_input_ids
    if len(origin) > INDEX_PREFIX:  # output tokens can no longer change the key: cache it for the request's life
        key = (namespace_of(req), as_tokens(origin[:INDEX_PREFIX]).tobytes())
        setattr(req, SIBLING_KEY, key)
        return key
    tokens = request_tokens(req)
    return (namespace_of(req), as_tokens(tokens[:INDEX_PREFIX]).tobytes()) if len(tokens) > INDEX_PREFIX else None


def key_limit(req: Any, tokens: Sequence[int]) -> int:
    """The longest prefix SGLang would ever match for this request (input_len - 1, logprob start caps it)."""
    return int(req._compute_max_prefix_len(len(tokens)))


_KEY_OF_MEMBER = operator.itemgetter(1)  # SiblingIndex._members' values: (request, sibling key or None)
_REQUEST_OF_MEMBER = operator.itemgetter(0)


class SiblingIndex:
    """Waiting requests grouped by (namespace, first INDEX_PREFIX tokens).

    Kept across passes and brought up to date by identity (`refresh`), so that only requests that arrived or left
    since the last pass cost Python work. Fast path: SGLang's queue between two passes is the previous one less what
    that pass admitted (`left`) plus arrivals appended at its end, which a C-level list comparison with the snapshot
    the index holds (`_order`) confirms; anything else (an abort, a reordering policy) takes the id-set diff.
    Holding the members alive keeps their ids from being reused by new objects while they are indexed.
    Invariant: when `_order` is not None, the members are exactly the requests in `_order`."""

    def __init__(self, waiting: Iterable[Any] = ()) -> None:
        self._members: dict[int, tuple[Any, Optional[tuple]]] = {}  # id -> (request, its sibling key when indexed)
        self._groups: dict[tuple, dict[int, Any]] = {}
        self._shared = 0  # groups with two members or more
        self._cache_only: set[int] = set()  # members that plan alone (is_cache_only)
        self._order: Optional[list[Any]] = None
        self.refresh(list(waiting))

    def refresh(self, waiting: Sequence[Any]) -> None:
        order = self._order
        n = len(order) if order is not None else -1
        if 0 <= n <= len(waiting) and waiting[:n] == order:  # Req has no __eq__: identity compare, in C
            for req in waiting[n:]:
                if id(req) not in self._members:  # a request queued twice is indexed once
                    self._add(req)
        else:
            self._diff(waiting)
        self._order = list(waiting) if len(self._members) == len(waiting) else None

    def left(self, gone: Sequence[Any], remaining: Sequence[Any]) -> None:
        """`gone` left the queue (admitted by a pass) and `remaining` is SGLang's queue now. The snapshot moves to
        `remaining` only when the counts prove it is the indexed queue less `gone`; otherwise the next refresh
        diffs."""
        members, groups = self._members, self._groups
        if not self._shared:
            # Every group is one request (no two share a key): each member leaves with its group, in C.
            left = filter(None, map(members.pop, map(id, gone), itertools.repeat(None)))
            deque(map(groups.__delitem__, filter(None, map(_KEY_OF_MEMBER, left))), maxlen=0)
        else:
            # Each member leaves its group in C; then each group it left (not each request) is checked once.
            left = list(filter(_KEY_OF_MEMBER, filter(None, map(members.pop, map(id, gone), itertools.repeat(None)))))
            keys = list(map(_KEY_OF_MEMBER, left))
            deque(map(dict.__delitem__, map(groups.__getitem__, keys), map(id, map(_REQUEST_OF_MEMBER, left))),
                  maxlen=0)
            for key, n in Counter(keys).items():
                size = len(groups[key])
                if size <= 1 < size + n:
                    self._shared -= 1  # two or more before, at most one now
                if not size:
                    del groups[key]
        if self._cache_only:
            self._cache_only.difference_update(map(id, gone))
        synced = self._order is not None and len(self._members) == len(remaining)
        self._order = list(remaining) if synced else None

    def _diff(self, waiting: Sequence[Any]) -> None:
        ids = set(map(id, waiting))
        members = self._members
        if members.keys() == ids:  # a keys view compares as a set, in C
            return
        for rid in members.keys() - ids:
            self._remove(rid)
        arrived = ids - members.keys()
        if arrived:  # one pass over the queue, only when something arrived
            for req in waiting:
                if id(req) in arrived and id(req) not in members:
                    self._add(req)

    def _add(self, req: Any) -> None:
        rid = id(req)
        key = sibling_key(req)
        self._members[rid] = (req, key)
        if key is not None:
            group = self._groups.setdefault(key, {})
            group[rid] = req
            if len(group) == 2:
                self._shared += 1
        if is_cache_only(req):
            self._cache_only.add(rid)

    def _remove(self, rid: int) -> None:
        _, key = self._members.pop(rid)
        self._cache_only.discard(rid)
        if key is not None:
            group = self._groups[key]
            del group[rid]
            if not group:
                del self._groups[key]
            elif len(group) == 1:
                self._shared -= 1

    def plans_nothing(self, unlanded: Mapping[tuple, Any]) -> bool:
        """Whether no member could plan or be Blocked through the index: no two share a sibling key, none shares one
        with a request in `unlanded` (sibling key -> requests in flight), none is cache-only. O(1), but for the
        in-flight keys (a C-level walk of the shorter key set)."""
        return not self._shared and not self._cache_only and (
            not unlanded or unlanded.keys().isdisjoint(self._groups.keys())
        )

    def groups_view(self) -> Mapping[tuple, Mapping[int, Any]]:
        """The indexed requests by sibling key, then by id: a live read-only view (never replaced), for a caller that
        tests membership inline. None (no key) is never a key; a group is never left empty."""
        return self._groups

    def indexed_view(self) -> Mapping[int, Any]:
        """The indexed requests by id (to (request, sibling key)): a live read-only view (never replaced), for a
        caller that tests membership inline."""
        return self._members

    def members(self, key: tuple) -> Mapping[int, Any]:
        """The indexed requests with sibling key `key`, by id (empty if none). A read-only view of the index."""
        return self._groups.get(key) or {}

    def group_with(self, req: Any) -> Iterable[Any]:
        """The indexed requests sharing `req`'s sibling key, possibly `req` itself; empty when it has no sibling (the
        common case). A read-only view of the index: iterate it before the index changes."""
        key = sibling_key(req)
        group = self._groups.get(key) if key is not None else None
        if not group or (len(group) == 1 and id(req) in group):
            return ()
        return group.values()


def native_branch(req: Any) -> Optional[int]:
    """extra_buffer: where SGLang itself will snapshot this request's state in its extend. Its match sets
    `req.mamba_branching_seqlen` to the grid-aligned token hit when the tree's KV runs past the last state (the point
    where this request leaves a path the tree knows); None otherwise."""
    assert hasattr(req, "mamba_branching_seqlen"), "Req.mamba_branching_seqlen (set by SGLang's match)"
    return req.mamba_branching_seqlen


def plan_producer(
    req: Any, tokens: Sequence[int], siblings: Iterable[Any], *, min_gain: int, mode: PublishMode,
    cache_chunk: int, excluded: set[int], token_hit: int = 0, page_size: int = 1, branch: Optional[int] = None,
) -> Optional[ProducerPlan]:
    """The boundary that saves the waiting siblings the most recomputation, if any is worth a promise. `siblings` may
    include `req` itself (skipped).

    The tree holds whole pages only (SGLang inserts and matches page-aligned keys), so what a sibling can reuse is
    its shared prefix rounded down to a page: the boundary is a page multiple, and none is planned when rounding
    leaves less than min_gain past the producer's state hit (a page-aligned hit).

    no_buffer hybrids: when the tree already holds KV past the producer's state (token hit ĥ >= h + min_gain), ĥ is
    where this request leaves a path the tree knows, i.e. a branch point (a document seen before under another
    question). A state exists there for no one, so every later request on that prefix would recompute it: the
    boundary is capped at ĥ. The siblings then compute their part past ĥ themselves (a question's few tokens, or a
    promise of their own next round), and later requests on the prefix find a state at ĥ.

    extra_buffer hybrids keep one snapshot per extend, and SGLang already points it at that branch (`branch`, its
    grid-aligned ĥ: `native_branch`): the boundary is capped there too, so that radixflow never moves SGLang's own
    snapshot off the branch point."""
    state_hit = int(req.prefix_len)
    floor = state_hit + min_gain - 1  # a boundary must pass it; a sibling sharing no more than that is no consumer
    if len(tokens) <= floor:
        return None  # no sibling can share more of it than that
    head: Optional[bytes] = None  # the producer's token bytes: made once, when a sibling first needs them
    shared = []
    lcp = longest = 0
    for sib in siblings:
        if sib is req or id(sib) in excluded:
            continue
        sib_tokens = request_tokens(sib)
        if state_hit and not tokens_share_more_than(tokens, sib_tokens, floor):
            # No consumer, ruled out without the LCP search: the common case of a request whose own shared prefix is
            # already state-ready (a consumer after publication; a question on a document seen before). (With
            # nothing cached, siblings share more than min_gain tokens as a rule: the search runs anyway.)
            shared.append((sib, 0))
            continue
        if head is None:
            head = as_tokens(tokens).tobytes()  # once per producer, not once per sibling
        lcp = common_prefix_with(head, sib_tokens, hint=lcp)
        usable = min(lcp, key_limit(sib, sib_tokens), len(tokens))
        usable -= usable % page_size
        shared.append((sib, usable))
        if usable > longest:
            longest = usable
    if longest <= floor:
        return None  # no sibling reaches a boundary past floor: best_boundary would find none
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
    req: Any, tokens: Sequence[int], *, token_hit: int, min_gain: int, mode: PublishMode, cache_chunk: int,
    branch: Optional[int] = None,
) -> Optional[ProducerPlan]:
    """Boundaries where a cache-only request should leave states (hybrids): the branch point the tree already knows is
    shared (its token hit, when beyond its state hit: the state there is missing) and the last position its followers
    can match (prompt length - CACHE_ONLY_BACKOFF).

    extra_buffer keeps one snapshot per extend: when SGLang points it at the branch point (`branch`), that one stays
    (it serves every later request on the prefix; this request's followers start there); otherwise it goes to the last
    usable grid position."""
    state_hit = int(req.prefix_len)
    last = len(tokens) - CACHE_ONLY_BACKOFF
    if mode is PublishMode.TRACK:  # one tracked state per extend, on the cache-chunk grid counted from the prefix
        if branch is not None and branch > state_hit:
            return None
        last = state_hit + (last - state_hit) // cache_chunk * cache_chunk
        return ProducerPlan(last, mode, 0) if last >= state_hit + min_gain else None
    cuts = sorted({b for b in (token_hit, last) if state_hit + min_gain <= b <= last})
    if not cuts:
        return None
    return ProducerPlan(cuts[0], mode, 0, tuple(cuts[1:]))
