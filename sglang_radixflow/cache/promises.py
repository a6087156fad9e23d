"""In-flight producers: a promise says "request P will publish the prefix up to boundary b (KV and, on hybrids, the
state at b) in namespace N". Consumers whose useful prefix reaches b wait for it instead of recomputing it.

Life cycle: open -> published (the prefix landed in the tree, stamped) | cancelled (producer aborted, retracted,
finished or passed b without leaving it, or too old). Nobody waits on a cancelled promise: `blocking()` only ever
returns open ones. Pure bookkeeping, no SGLang import: decisions depend only on the scheduler's replicated inputs, so
they are identical on every tensor-parallel rank.
"""
from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Iterator, Optional, Sequence


class PromiseState(enum.Enum):
    OPEN = "open"
    PUBLISHED = "published"
    CANCELLED = "cancelled"


@dataclass
class Promise:
    namespace: Hashable
    tokens: Sequence[int]  # the producer's first `boundary` tokens
    boundary: int
    producer_rid: str
    registered_round: int
    state: PromiseState = PromiseState.OPEN
    closed_round: Optional[int] = None
    reason: str = ""
    # Full attention: the producer's KV serves every prefix of the promised one, so a request sharing only part of
    # it (another question on the same document) is served up to what it shares. Hybrids publish one state, at b.
    partial: bool = False
    # SGLang's tree holds whole pages only: a partial promise serves the shared part rounded down to a page.
    page_size: int = 1

    def __post_init__(self) -> None:
        self.tokens = as_tokens(self.tokens)
        assert len(self.tokens) == self.boundary > 0, (len(self.tokens), self.boundary)
        assert self.boundary % self.page_size == 0, f"b={self.boundary} is not a multiple of the page {self.page_size}"
        self._bytes = self.tokens.tobytes() if self.partial else b""

    def covers(self, namespace: Hashable, tokens: Sequence[int]) -> bool:
        """Whether `tokens` (same namespace) starts with the promised prefix."""
        return (
            namespace == self.namespace
            and len(tokens) >= self.boundary
            and as_tokens(tokens[: self.boundary]) == self.tokens
        )

    def serves(self, namespace: Hashable, tokens: Sequence[int]) -> int:
        """How much of `tokens` this promise will publish: b if they start with the whole prefix, for a partial
        (full-attention) promise the shared part; 0 if nothing."""
        if namespace != self.namespace:
            return 0
        if self.partial:
            shared = common_prefix_with(self._bytes, tokens)
            return shared - shared % self.page_size
        return self.boundary if self.covers(namespace, tokens) else 0


@dataclass
class PromiseCounters:
    registered: int = 0
    published: int = 0
    cancelled: int = 0
    cancel_reasons: dict[str, int] = field(default_factory=dict)


class PromiseTable:
    def __init__(self, head_len: int = 0) -> None:
        self._open: dict[str, list[Promise]] = {}  # producer rid -> its open promises
        self.counters = PromiseCounters()
        # Open promises by (namespace, first head_len tokens), kept as promises open and close: a request is checked
        # only against the promises on its own first tokens (`candidates`). Shorter promises go on a list that every
        # request is checked against. head_len 0: no index.
        self.head_len = head_len
        self._by_head: dict[tuple, list[Promise]] = {}
        self._short: list[Promise] = []

    def __len__(self) -> int:
        return sum(len(v) for v in self._open.values())

    def __bool__(self) -> bool:  # O(1): checked at every scan position
        return bool(self._open)

    def open_promises(self) -> Iterator[Promise]:
        for promises in self._open.values():
            yield from promises

    def producers(self) -> set[str]:
        return set(self._open)

    def register(
        self, namespace: Hashable, tokens: Sequence[int], boundary: int, producer_rid: str, round_id: int,
        partial: bool = False, page_size: int = 1,
    ) -> Promise:
        promise = Promise(namespace, tokens, boundary, producer_rid, round_id, partial=partial, page_size=page_size)
        self._open.setdefault(producer_rid, []).append(promise)
        key = self._head_key_of(promise)
        (self._short if key is None else self._by_head.setdefault(key, [])).append(promise)
        self.counters.registered += 1
        return promise

    def head_key(self, namespace: Hashable, tokens: Sequence[int]) -> Optional[tuple]:
        """The index key of a request (or promise) with these tokens; None when shorter than head_len."""
        if not self.head_len or len(tokens) < self.head_len:
            return None
        return (namespace, as_tokens(tokens[: self.head_len]).tobytes())

    def candidates(self, head_key: Optional[tuple]) -> Sequence[Promise]:
        """Every open promise that could serve a request whose head_key is `head_key` (a request with no key: the
        short promises only, since a longer promise serves only requests at least as long as its head). Read-only:
        the table's own lists when no short promise is open (checked for every request the scan examines)."""
        indexed = self._by_head.get(head_key, ()) if head_key is not None else ()
        return [*indexed, *self._short] if self._short else indexed

    def _head_key_of(self, promise: Promise) -> Optional[tuple]:
        return self.head_key(promise.namespace, promise.tokens)

    def for_producer(self, producer_rid: str) -> list[Promise]:
        return list(self._open.get(producer_rid, ()))

    def publish(self, promise: Promise, round_id: int) -> None:
        self._close(promise, PromiseState.PUBLISHED, round_id, "")
        self.counters.published += 1

    def cancel(self, promise: Promise, round_id: int, reason: str) -> None:
        self._close(promise, PromiseState.CANCELLED, round_id, reason)
        self.counters.cancelled += 1
        self.counters.cancel_reasons[reason] = self.counters.cancel_reasons.get(reason, 0) + 1

    def cancel_producer(self, producer_rid: str, round_id: int, reason: str) -> int:
        promises = self.for_producer(producer_rid)
        for promise in promises:
            self.cancel(promise, round_id, reason)
        return len(promises)

    def expire(self, round_id: int, max_age_rounds: int) -> int:
        old = [p for p in self.open_promises() if round_id - p.registered_round > max_age_rounds]
        for promise in old:
            self.cancel(promise, round_id, "expired")
        return len(old)

    def blocking(
        self, namespace: Hashable, tokens: Sequence[int], state_hit: int, key_limit: int, min_gain: int,
        exclude_rid: Optional[str] = None, candidates: Optional[Iterable[Promise]] = None,
    ) -> Optional[Promise]:
        """The open promise that will publish the most of this request's prefix, if that reaches state_hit +
        min_gain within key_limit: the request starts with the whole promised prefix (b <= key_limit), or, for a
        full-attention promise, shares part of it. `candidates`: a subset of the open promises known to hold
        every one that could match (the caller's index), checked instead of the whole table."""
        best: Optional[Promise] = None
        best_served = 0
        for promise in self.open_promises() if candidates is None else candidates:
            if promise.producer_rid == exclude_rid or promise.boundary <= best_served:
                continue
            if state_hit + min_gain > promise.boundary:
                continue
            served = min(promise.serves(namespace, tokens), key_limit)
            if served >= state_hit + min_gain and (promise.partial or served == promise.boundary):
                best, best_served = promise, served
        return best

    def _close(self, promise: Promise, state: PromiseState, round_id: int, reason: str) -> None:
        assert promise.state is PromiseState.OPEN, f"promise of {promise.producer_rid} already {promise.state}"
        promise.state, promise.closed_round, promise.reason = state, round_id, reason
        remaining = [p for p in self._open.get(promise.producer_rid, ()) if p is not promise]
        if remaining:
            self._open[promise.producer_rid] = remaining
        else:
            self._open.pop(promise.producer_rid, None)
        key = self._head_key_of(promise)
        if key is None:
            self._short.remove(promise)
        else:
            same_head = self._by_head[key]
            same_head.remove(promise)
            if not same_head:
                del self._by_head[key]


def as_tokens(tokens: Sequence[int]) -> array:
    """SGLang keeps token ids in array('q'); an array never compares equal to a list, so normalise."""
    return tokens if isinstance(tokens, array) and tokens.typecode == "q" else array("q", tokens)


def longest_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """LCP length of two token sequences."""
    return common_prefix_with(as_tokens(a).tobytes(), b)


def common_prefix_with(head: bytes, b: Sequence[int]) -> int:
    """LCP length of `b` and the tokens whose array('q') bytes are `head`, by binary search over prefix equality
    (`bytes.startswith` of a memoryview slice compares without copying the tokens)."""
    b = as_tokens(b)
    n = min(len(head) // b.itemsize, len(b))
    with memoryview(b) as tail:
        if head.startswith(tail[:n]):
            return n
        lo, hi = 0, n - 1  # invariant: the first lo tokens match, the first hi + 1 do not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if head.startswith(tail[:mid]):
                lo = mid
            else:
                hi = mid - 1
    return lo


def best_boundary(candidate_lcps: Iterable[int], floor: int) -> int:
    """The boundary b > floor maximising (b - floor) x (siblings whose shared prefix reaches b); 0 if none.

    A producer can leave one state; this places it where it saves its siblings the most recomputed tokens."""
    lcps = sorted((x for x in candidate_lcps if x > floor), reverse=True)
    best_b, best_gain = 0, 0
    for count, b in enumerate(lcps, start=1):
        if (b - floor) * count > best_gain:
            best_b, best_gain = b, (b - floor) * count
    return best_b
