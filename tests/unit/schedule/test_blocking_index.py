"""The scan's fast paths (sibling keys, promise index by first tokens, zero-copy LCP) answer exactly as the slow ones."""
from __future__ import annotations

import random
from typing import Any
from array import array

from sglang_radixflow.cache.promises import PromiseTable, common_prefix_with, longest_common_prefix, shares_more_than
from sglang_radixflow.config import RadixFlowConfig
from sglang_radixflow.schedule.producers import (
    INDEX_PREFIX,
    PublishMode,
    SiblingIndex,
    key_limit,
    namespace_of,
    request_tokens,
    sibling_key,
)
from sglang_radixflow.schedule.state import MAY_BLOCK, PLAIN, SchedulingState
from tests.unit.schedule.harness import make_request

DOC_A = list(range(1000, 1300))
DOC_B = list(range(2000, 2300))


def state() -> SchedulingState:
    sched = SchedulingState(RadixFlowConfig(), PublishMode.KV, 1)
    sched.begin_pass(1, [])
    return sched


def promise_for(sched: SchedulingState, producer, boundary: int) -> None:  # noqa: ANN001
    tokens = request_tokens(producer)
    sched.promises.register(namespace_of(producer), tokens[:boundary], boundary, str(producer.rid), 1)


def full_scan(sched: SchedulingState, req):  # noqa: ANN001, ANN201
    """The reference: every open promise, no index."""
    tokens = request_tokens(req)
    return sched.promises.blocking(
        namespace_of(req), tokens, int(req.prefix_len), key_limit(req, tokens), sched.config.min_gain_tokens,
        exclude_rid=str(req.rid),
    )


def siblings(index: SiblingIndex, req: Any) -> list[Any]:
    """The other requests indexed under req's sibling key."""
    return [s for s in index.group_with(req) if s is not req]


def test_request_tokens_and_sibling_keys() -> None:
    req = make_request("r", DOC_A + [1, 2])
    assert request_tokens(req) is req.origin_input_ids  # no copy before any output
    req.output_ids.append(9)
    assert list(request_tokens(req)) == DOC_A + [1, 2, 9]
    a1, a2 = make_request("a1", DOC_A + [1]), make_request("a2", DOC_A + [2])
    assert sibling_key(a1) == sibling_key(a2) != sibling_key(make_request("b", DOC_B))
    assert sibling_key(a1) != sibling_key(make_request("a-salted", DOC_A + [1], cache_salt="t"))
    assert sibling_key(make_request("short", DOC_A[:INDEX_PREFIX])) is None
    index = SiblingIndex([a1, a2, make_request("b", DOC_B)])
    assert siblings(index, a1) == [a2]


def test_index_gives_the_same_verdicts_as_the_full_table() -> None:
    sched = state()
    producers = [make_request("pa", DOC_A + [7]), make_request("pb", DOC_B + [7])]
    promise_for(sched, producers[0], len(DOC_A))
    promise_for(sched, producers[1], 200)
    waiting = [
        *producers,
        make_request("a1", DOC_A + [1]), make_request("b1", DOC_B + [1]),
        make_request("b-short", DOC_B[:150] + [1]),  # shares the key but not the promised 200 tokens
        make_request("a-other-ns", DOC_A + [1], cache_salt="t"), make_request("u", list(range(9000, 9100))),
        make_request("tiny", DOC_A[:5]),
    ]
    verdicts = {r.rid: sched.blocking_promise(r) for r in waiting}
    assert verdicts == {r.rid: full_scan(sched, r) for r in waiting}
    assert {rid for rid, p in verdicts.items() if p is not None} == {"a1", "b1"}


def test_promises_shorter_than_the_key_still_block() -> None:
    sched = state()
    producer = make_request("p", DOC_A[:5] + [7] * 20)
    promise_for(sched, producer, 5)
    consumer = make_request("c", DOC_A[:5] + [8] * 20)  # shares only 5 tokens: a different sibling key
    assert sibling_key(consumer) != sibling_key(producer)
    assert sched.blocking_promise(consumer) is full_scan(sched, consumer) is not None


def test_index_follows_the_table() -> None:
    sched = state()
    producer, consumer = make_request("p", DOC_A + [7]), make_request("c", DOC_A + [8])
    assert sched.blocking_promise(consumer) is None
    promise_for(sched, producer, len(DOC_A))
    (promise,) = sched.promises.open_promises()
    assert sched.blocking_promise(consumer) is promise  # a new promise is seen at once
    sched.promises.publish(promise, 1)
    assert sched.blocking_promise(consumer) is None  # a closed one no longer blocks
    promise_for(sched, producer, len(DOC_A))
    sched.promises = PromiseTable()  # a replaced table is not served from the old index
    assert sched.blocking_promise(consumer) is None


def test_examine_reads_the_promise_table_of_its_pass() -> None:
    """`examine` takes the table's index once per pass: a table replaced between passes is the one its next pass
    reads (a promise open there on the consumer's key may block it)."""
    sched = state()
    producer, consumer = make_request("p", DOC_A + [7]), make_request("c", DOC_A + [8])
    assert sched.examine(consumer) == PLAIN
    sched.end_pass()
    sched.promises = PromiseTable(head_len=INDEX_PREFIX)
    promise_for(sched, producer, len(DOC_A))
    sched.begin_pass(2, [consumer])
    assert sched.examine(consumer) & MAY_BLOCK
    assert sched.blocking_promise(consumer) is next(sched.promises.open_promises())


def test_longest_common_prefix_matches_a_naive_scan() -> None:
    def naive(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    rng = random.Random(0)
    for _ in range(3000):
        base = [rng.randrange(-(1 << 62), 1 << 62) if rng.random() < 0.1 else rng.randrange(-3, 3) for _ in range(70)]
        a = base[: rng.randint(0, 60)]
        b = base[: rng.randint(0, len(a))] + [rng.randrange(-3, 3) for _ in range(rng.randint(0, 20))]
        expected = naive(a, b)
        assert longest_common_prefix(a, b) == expected
        assert longest_common_prefix(array("q", b), array("q", a)) == expected
    # long sequences (the search narrows to a window before the XOR) and hints, right or wrong
    for _ in range(1000):
        base = [rng.randrange(-(1 << 63), 1 << 63) if rng.random() < 0.5 else rng.randrange(-3, 3) for _ in range(700)]
        a = base[: rng.randint(0, 700)]
        b = base[: rng.randint(0, len(a))] + [rng.randrange(-3, 3) for _ in range(rng.randint(0, 30))]
        expected = naive(a, b)
        head = array("q", a).tobytes()
        for hint in (0, expected, rng.randint(0, 720), expected + 1, max(0, expected - 1)):
            assert common_prefix_with(head, b, hint=hint) == expected, (len(a), len(b), hint)
        # the planner's one-comparison pre-check agrees with the LCP on either side of it
        for n in (-1, 0, expected - 1, expected, expected + 1, rng.randint(0, 720)):
            assert shares_more_than(head, b, n) == (expected > n), (len(a), len(b), n, expected)


def test_persistent_index_follows_the_queue_across_passes() -> None:
    """The index is refreshed by identity diff: arrivals join their group, departures leave it, and after any
    sequence of queue changes it answers like an index built from scratch."""
    rng = random.Random(3)
    docs = [list(range(1000 * k, 1000 * k + 50)) for k in range(1, 5)]
    pool = [make_request(f"r{i}", rng.choice(docs) + [i], cache_salt=rng.choice([None, "t"])) for i in range(40)]
    index = SiblingIndex()
    for _ in range(30):
        waiting = rng.sample(pool, rng.randint(0, len(pool)))
        index.refresh(waiting)
        fresh = SiblingIndex(waiting)
        for req in pool:
            got = siblings(index, req)
            assert sorted(r.rid for r in got) == sorted(r.rid for r in siblings(fresh, req))
            assert all(r in waiting for r in got)  # nobody who left the queue is still offered as a sibling


def test_index_follows_sglangs_queue_pattern_on_its_fast_path() -> None:
    """Between passes SGLang's queue is the previous one less what the pass admitted, plus arrivals at its end: the
    index follows that by a snapshot compare (no id-set diff), and falls back to the diff on anything else (an abort
    from the middle, a reordering policy, a request re-queued during the pass). Either way it answers like an index
    built from scratch."""
    rng = random.Random(5)
    docs = [list(range(1000 * k, 1000 * k + 50)) for k in range(1, 5)]
    counter = iter(range(10**6))
    new = lambda: make_request(f"r{next(counter)}", rng.choice(docs) + [next(counter)])  # noqa: E731
    index = SiblingIndex()
    queue: list = []
    diffs = 0
    original_diff = SiblingIndex._diff

    def counting_diff(self, waiting):  # noqa: ANN001, ANN202
        nonlocal diffs
        diffs += self is index
        return original_diff(self, waiting)

    SiblingIndex._diff = counting_diff
    try:
        for step in range(60):
            queue = queue + [new() for _ in range(rng.randint(0, 6))]  # arrivals, appended
            event = rng.random()
            if event < 0.1 and queue:
                queue.pop(rng.randrange(len(queue)))  # an abort from the middle
            elif event < 0.15:
                queue.reverse()  # a reordering policy
            index.refresh(queue)  # the pass's first plan
            fresh = SiblingIndex(queue)
            for req in queue:
                assert sorted(r.rid for r in siblings(index, req)) == sorted(
                    r.rid for r in siblings(fresh, req)
                )
            admitted = rng.sample(queue, min(len(queue), rng.randint(0, 4)))
            queue = [r for r in queue if r not in admitted]  # SGLang's rebuild after the pass
            if rng.random() < 0.1:
                queue.append(new())  # re-queued during the pass (e.g. preemption): the counts no longer match
            index.left(admitted, queue)
    finally:
        SiblingIndex._diff = original_diff
    assert 0 < diffs < 30  # the irregular steps took the diff, the regular ones the fast path


def test_a_request_proven_alone_past_a_position_shares_no_more_with_any_sibling() -> None:
    """`_none_shares_past`, the group-wide proof that spares a consumer its plan and adoption checks, proves only what
    holds: no other waiting or in-flight request with its sibling key shares more than `last` tokens with it. Also
    once a request the index does not hold (a prefix request) goes in flight after the proof was first asked for, and
    for a request the index does not hold (nothing proven)."""
    rng = random.Random(11)
    proven = refuted_by_late = 0

    def tail() -> list[int]:
        return [rng.randrange(3) for _ in range(rng.randint(0, 4))]  # few values: positions past DOC_A collide

    def admit(sched: SchedulingState, req) -> None:  # noqa: ANN001
        req.prefix_len, req.extend_end = 0, len(req.origin_input_ids)  # as SGLang's match and admission leave them
        sched.note_admitted(req, None)

    for trial in range(200):
        waiting = [make_request(f"w{i}", DOC_A + tail()) for i in range(rng.randint(1, 5))]
        sched = SchedulingState(RadixFlowConfig(), PublishMode.KV, 1)
        sched.begin_pass(1, waiting)
        sched.index_waiting(waiting)  # as examine does before it asks
        for req in rng.sample(waiting, rng.randint(0, len(waiting))):
            admit(sched, req)  # admitted by this pass: still in the index, and in flight
        others = list(waiting)
        if rng.random() < 0.5:  # in flight and not waiting, as if admitted by an earlier pass (counted when asked)
            earlier = make_request("earlier", DOC_A + tail())
            admit(sched, earlier)
            others.append(earlier)
        late = make_request("late", DOC_A + tail())
        stranger = make_request("stranger", DOC_A + tail())  # neither queued nor in flight: counted nowhere
        for step in range(2):
            for req in waiting + [late, stranger] * step:
                tokens = request_tokens(req)
                key = sibling_key(req)
                for last in range(len(DOC_A) - 1, len(DOC_A) + 4):
                    sharing = [o for o in others + [late] * step
                               if o is not req and shares_more_than(tokens.tobytes(), request_tokens(o), last)]
                    got = sched._none_shares_past(req, key, tokens, last)
                    assert not got or not sharing, (trial, step, req.rid, last)
                    proven += got and last < len(tokens)
                    refuted_by_late += sharing == [late] and req is not late  # step 0's proof no longer holds
            if step == 0:
                admit(sched, late)  # not in the index: the proofs made so far no longer count it
    assert proven > 100 and refuted_by_late > 10
