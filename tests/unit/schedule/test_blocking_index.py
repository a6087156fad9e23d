"""The Blocked verdict (`blocked.blocked_on`) and what it reads: sibling keys, the promise table's index by first
tokens, and the longest-common-prefix search."""
from __future__ import annotations

import itertools
import random
from array import array

from sglang_radixflow.cache.promises import Promise, PromiseTable, longest_common_prefix
from sglang_radixflow.config import RadixFlowConfig
from sglang_radixflow.schedule.blocked import DEFER_COUNT
from sglang_radixflow.schedule.producers import PublishMode, key_limit, namespace_of, request_tokens
from sglang_radixflow.schedule.siblings import INDEX_PREFIX, SiblingIndex, sibling_key
from sglang_radixflow.schedule.state import SchedulingState
from tests.unit.schedule.harness import make_request

DOC_A = list(range(1000, 1300))
DOC_B = list(range(2000, 2300))


def state() -> SchedulingState:
    """The index at token granularity: any gain blocks (min_gain 1)."""
    sched = SchedulingState(RadixFlowConfig(min_gain_tokens=1), PublishMode.KV, 1)
    sched.begin_pass(1, [])
    return sched


def promise_for(sched: SchedulingState, producer, boundary: int) -> Promise:  # noqa: ANN001
    tokens = request_tokens(producer)
    return sched.promises.register(namespace_of(producer), tokens[:boundary], boundary, str(producer.rid), 1)


def full_scan(sched: SchedulingState, req):  # noqa: ANN001, ANN201
    """The reference: every open promise, no index."""
    tokens = request_tokens(req)
    return sched.promises.blocking(
        namespace_of(req), tokens, int(req.prefix_len), key_limit(req, tokens), sched.config.min_gain_tokens,
        exclude_rid=str(req.rid),
    )


def test_request_tokens_and_sibling_keys() -> None:
    req = make_request("r", DOC_A + [1, 2])
    assert list(request_tokens(req)) == DOC_A + [1, 2]
    req.output_ids.append(9)
    assert list(request_tokens(req)) == DOC_A + [1, 2, 9]
    a1, a2 = make_request("a1", DOC_A + [1]), make_request("a2", DOC_A + [2])
    assert sibling_key(a1) == sibling_key(a2) != sibling_key(make_request("b", DOC_B))
    assert sibling_key(a1) != sibling_key(make_request("a-salted", DOC_A + [1], cache_salt="t"))
    assert sibling_key(make_request("short", DOC_A[:INDEX_PREFIX])) is None
    index = SiblingIndex()
    index.sync([a1, a2, make_request("b", DOC_B), a1])  # a request queued twice counts once
    assert index.group(index.key_of(a1)) == [a1, a2] and index.key_of(a2) == sibling_key(a2)
    assert index.group(index.key_of(make_request("short", DOC_A[:INDEX_PREFIX]))) == []


def test_the_sibling_index_follows_the_queue_across_passes() -> None:
    """Passes admit requests, arrivals join the end of the queue, and now and then a request is aborted from the
    middle, a preempted one is queued again, or a pass never reads the index: after any such sequence the index
    holds the siblings that an index built from the current queue alone holds."""
    rng = random.Random(3)
    docs = [list(range(1000 * d, 1000 * d + 40)) for d in range(4)]
    pool = [make_request(f"r{i}", rng.choice(docs) + [i], cache_salt=rng.choice([None, "t"])) for i in range(80)]
    index, queue, fresh_ids = SiblingIndex(), [], iter(range(len(pool)))
    for _ in range(60):
        queue += [pool[i] for i in itertools.islice(fresh_ids, rng.randint(0, 4))]  # arrivals
        if queue and rng.random() < 0.2:
            queue.pop(rng.randrange(len(queue)))  # an abort
        if rng.random() < 0.2:
            continue  # a pass that never asked for siblings
        index.sync(queue)
        for req in pool:
            expected = sorted({o.rid for o in queue if sibling_key(o) == sibling_key(req)})
            assert sorted(o.rid for o in index.group(index.key_of(req))) == expected
        admitted = [r for r in queue if rng.random() < 0.3]
        queue = [r for r in queue if r not in admitted]
        if admitted and rng.random() < 0.2:
            queue.append(admitted.pop())  # preempted: SGLang queues it again after the pass
        index.left(admitted, queue)


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


def test_the_verdict_follows_the_table_and_the_deferral_bound() -> None:
    sched = state()
    producer, consumer = make_request("p", DOC_A + [7]), make_request("c", DOC_A + [8])
    assert sched.blocking_promise(consumer) is None
    promise = promise_for(sched, producer, len(DOC_A))
    assert sched.blocking_promise(consumer) is promise  # a new promise is seen at once
    setattr(consumer, DEFER_COUNT, sched.config.max_defer_rounds)
    assert sched.blocking_promise(consumer) is None  # past its bound it runs from h
    assert sched.is_blocked_by_promise(consumer)  # (the record's bubble check ignores the bound)
    setattr(consumer, DEFER_COUNT, 0)
    sched.promises.publish(promise, 1)
    assert sched.blocking_promise(consumer) is None  # a closed one no longer blocks
    promise_for(sched, producer, len(DOC_A))
    sched.promises = PromiseTable(head_len=INDEX_PREFIX)  # a replaced table is the one read
    assert sched.blocking_promise(consumer) is None


def test_nothing_blocks_outside_a_pass_or_with_the_traversal_off() -> None:
    sched = state()
    producer, consumer = make_request("p", DOC_A + [7]), make_request("c", DOC_A + [8])
    promise_for(sched, producer, len(DOC_A))
    assert sched.blocking_promise(consumer) is not None
    sched.end_pass([])
    assert sched.blocking_promise(consumer) is None
    sched.begin_pass(2, [consumer])
    sched.disable_traversal("test")
    assert sched.blocking_promise(consumer) is None


def test_longest_common_prefix_matches_a_naive_scan() -> None:
    def naive(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    rng = random.Random(0)
    for length in (70, 700):
        for _ in range(1500):
            base = [rng.randrange(-(1 << 62), 1 << 62) if rng.random() < 0.1 else rng.randrange(-3, 3)
                    for _ in range(length)]
            a = base[: rng.randint(0, length - 10)]
            b = base[: rng.randint(0, len(a))] + [rng.randrange(-3, 3) for _ in range(rng.randint(0, 20))]
            expected = naive(a, b)
            assert longest_common_prefix(a, b) == expected
            assert longest_common_prefix(array("q", b), array("q", a)) == expected
