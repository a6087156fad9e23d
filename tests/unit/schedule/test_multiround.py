"""Traversal over several rounds on SGLang's real pass + real allocation, result processing and pool accounting.

The paper's basic case (4 candidates share a 600-token document, plus an unrelated request, all waiting at once),
run until the queue drains: the producer publishes the document, the consumers start from it one round later, and
every KV slot, mamba slot and request row is back in the allocator or the tree at the end.
"""
from __future__ import annotations

from typing import Any

import pytest

from sglang_radixflow.schedule.prefix_request import prefix_rid
from tests.unit.cache.helpers import FULL, HYBRID
from tests.unit.schedule.harness import Fragment, PassHarness, make_request

DOC = list(range(1000, 1600))  # 600 shared tokens
TAIL = 20


def candidates():  # noqa: ANN201
    return [make_request(f"c{i}", DOC + list(range(10 * i, 10 * i + TAIL))) for i in range(4)]


def unrelated():  # noqa: ANN201
    return make_request("other", list(range(5000, 5300)))


def harness(components, arm: str, prefix_requests: bool = True, **cfg: Any) -> PassHarness:  # noqa: ANN001
    return PassHarness(components, arm=arm, kv_size=8192, mamba_cache_size=64, prefix_requests=prefix_requests, **cfg)


def prefix(rid: str, boundary: int = len(DOC)) -> str:
    """The rid of the prefix request publishing `rid`'s first `boundary` tokens."""
    return prefix_rid(rid, boundary)


@pytest.mark.parametrize("prefix_requests", [True, False], ids=["prefix-request", "chunk-cut"])
def test_hybrid_consumers_start_from_the_published_state_one_round_later(prefix_requests: bool) -> None:
    h = harness(HYBRID, "radixflow", prefix_requests=prefix_requests)
    reqs = candidates()
    h.submit(*reqs, unrelated())
    first, second = h.run_rounds()
    # Round 1: the producer's first b tokens, through a prefix request or its own chunk cut at b (either way the
    # extend ends at the branch point, where its state lands), + the unrelated request.
    producer = prefix("c0") if prefix_requests else "c0"
    assert first.fragments == (Fragment(producer, 0, len(DOC)), Fragment("other", 0, 300))
    # Round 2: the producer's tail and the three consumers, all from h = 600 (the state published by round 1).
    assert second.fragments == (
        Fragment("c0", len(DOC), TAIL), *(Fragment(f"c{i}", len(DOC), TAIL) for i in (1, 2, 3)),
    )
    # SGLang's own per-request hit count agrees: each consumer reused the whole document (and so did the producer
    # after its prefix request: the document was computed once, by the prefix request).
    assert [r.cached_tokens for r in reqs] == [len(DOC) if prefix_requests else 0, len(DOC), len(DOC), len(DOC)]
    counters = h.cache.rf_sched.promises.counters
    assert (counters.registered, counters.published, counters.cancelled) == (1, 1, 0)
    h.assert_idle_invariants()


def test_full_attention_consumers_hit_the_producers_kv_one_round_later() -> None:
    h = harness(FULL, "radixflow")
    reqs = candidates()
    h.submit(*reqs, unrelated())
    first, second = h.run_rounds()
    # The producer runs whole (its KV enters the tree after the round and splits at the branch point).
    assert first.fragments == (Fragment("c0", 0, len(DOC) + TAIL), Fragment("other", 0, 300))
    assert second.fragments == tuple(Fragment(f"c{i}", len(DOC), TAIL) for i in (1, 2, 3))
    assert [r.cached_tokens for r in reqs] == [0, len(DOC), len(DOC), len(DOC)]
    h.assert_idle_invariants()


def test_prefix_stop_holds_back_the_unrelated_request_for_a_round() -> None:
    h = harness(HYBRID, "prefix-stop")
    h.submit(*candidates(), unrelated())
    first, second = h.run_rounds()
    assert first.rids == [prefix("c0")]
    assert second.rids == ["c0", "c1", "c2", "c3", "other"]
    assert second.fragment("c1").prefix_len == len(DOC)
    h.assert_idle_invariants()


def test_native_sglang_runs_everything_at_once_and_recomputes_the_document() -> None:
    h = harness(HYBRID, "sglang")
    h.submit(*candidates(), unrelated())
    (only,) = h.run_rounds()
    assert only.rids == ["c0", "c1", "c2", "c3", "other"]
    assert all(f.prefix_len == 0 for f in only.fragments)
    h.assert_idle_invariants()


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_idle_check_catches_a_leaked_kv_slot(components) -> None:  # noqa: ANN001
    """The accounting is not vacuous: one KV slot that is neither free nor in the tree fails it."""
    h = harness(components, "radixflow")
    h.submit(*candidates(), unrelated())
    h.run_rounds()
    h.assert_idle_invariants()
    leaked = h.allocator.alloc(1)
    with pytest.raises(AssertionError, match="full"):
        h.assert_idle_invariants()
    h.allocator.free(leaked)
    h.assert_idle_invariants()


def test_idle_check_catches_a_leaked_mamba_slot() -> None:
    h = harness(HYBRID, "radixflow")
    h.submit(*candidates(), unrelated())
    h.run_rounds()
    slot = h.pool.mamba_allocator.alloc(1)
    with pytest.raises(AssertionError, match="mamba"):
        h.assert_idle_invariants()
    h.pool.mamba_allocator.free(slot)
    h.assert_idle_invariants()


def test_busy_check_catches_a_kv_slot_leaked_mid_run() -> None:
    """After every round the harness runs the scheduler's busy check (the chunked request's own KV counts as
    in use); a slot lost between rounds fails the next one."""
    h = harness(HYBRID, "radixflow", prefix_requests=False)
    h.submit(*candidates(), unrelated())
    h.run_pass()
    h.execute()
    assert h.sched.chunked_req is not None  # the producer's row and KV are held across rounds, not leaked
    h.allocator.alloc(1)
    h.run_pass()
    with pytest.raises(AssertionError, match="Full Pool Mem Leak"):
        h.execute()


def test_execute_refuses_requests_that_need_decode() -> None:
    h = harness(FULL, "sglang")
    h.submit(make_request("long-answer", list(range(5000, 5100)), max_new_tokens=4))
    h.run_pass()
    with pytest.raises(AssertionError, match="decode"):
        h.execute()



def test_a_budget_chunk_never_displaces_the_producers_chunk() -> None:
    """Regression (multi-round): with the producer cut at b holding SGLang's one chunked-request slot, a later
    request that does not fit the rest of the budget must wait, not be chunked too; otherwise the producer is
    processed as finished after its first chunk (it answers a truncated prompt) or its continuation is lost."""
    h = PassHarness(
        HYBRID, arm="radixflow", token_budget=1000, kv_size=8192, mamba_cache_size=64, prefix_requests=False,
    )
    h.submit(*candidates(), make_request("long", list(range(5000, 5800))))
    first, second = h.run_rounds()  # execute() fails if any request finishes before its whole prompt ran
    assert first.fragments == (Fragment("c0", 0, len(DOC)),)
    assert second.fragment("c0") == Fragment("c0", len(DOC), TAIL)
    assert second.fragment("long") == Fragment("long", 0, 800)
    h.assert_idle_invariants()


def test_a_prefix_request_leaves_the_chunk_slot_to_fill_the_budget() -> None:
    """With the producer publishing through a prefix request, SGLang's chunk slot stays free: the request that does
    not fit the rest of the budget is chunked into it (as natively) instead of waiting a round."""
    h = PassHarness(HYBRID, arm="radixflow", token_budget=1000, kv_size=8192, mamba_cache_size=64)
    h.submit(*candidates(), make_request("long", list(range(5000, 5800))))
    first, second = h.run_rounds()  # execute() fails if any request finishes before its whole prompt ran
    assert first.fragments == (Fragment(prefix("c0"), 0, len(DOC)), Fragment("long", 0, 1000 - len(DOC)))
    assert second.fragment("long") == Fragment("long", 1000 - len(DOC), 800 - (1000 - len(DOC)))
    assert {f.rid for f in second.fragments} == {"long", "c0", "c1", "c2", "c3"}
    assert all(second.fragment(f"c{i}").prefix_len == len(DOC) for i in range(4))
    h.assert_idle_invariants()


def group(name: str, doc: list[int]):  # noqa: ANN201
    return [make_request(f"{name}{i}", doc + list(range(10 * i, 10 * i + TAIL))) for i in range(4)]


def test_hybrid_two_groups_publish_through_prefix_requests_in_one_round() -> None:
    """SGLang tracks one chunked request per pass, so chunk cuts could publish one document per round; each group's
    producer publishes b through a prefix request (max_new_tokens = 0, never reported to a client) instead. Both
    documents are computed once in round 1; every consumer, and both producers themselves, start from b in round 2."""
    doc_b = list(range(3000, 3600))
    h = harness(HYBRID, "radixflow")
    a, b = group("a", DOC), group("b", doc_b)
    h.submit(*a, *b)
    first, second = h.run_rounds()
    assert first.fragments == (Fragment(prefix("a0"), 0, len(DOC)), Fragment(prefix("b0", len(doc_b)), 0, len(doc_b)))
    assert second.fragments == (
        *(Fragment(f"a{i}", len(DOC), TAIL) for i in range(4)), *(Fragment(f"b{i}", len(doc_b), TAIL) for i in range(4)),
    )
    assert [r.cached_tokens for r in a + b] == [len(DOC)] * 4 + [len(doc_b)] * 4
    counters = h.cache.rf_sched.promises.counters
    assert (counters.registered, counters.published, counters.cancelled) == (2, 2, 0)
    h.assert_idle_invariants()  # the prefix request's row, KV and mamba slot went back like any request's


def test_without_prefix_requests_the_second_group_recomputes_its_document() -> None:
    doc_b = list(range(3000, 3600))
    h = PassHarness(HYBRID, arm="radixflow", kv_size=8192, mamba_cache_size=64, prefix_requests=False)
    a, b = group("a", DOC), group("b", doc_b)
    h.submit(*a, *b)
    first, _ = h.run_rounds()
    assert [f.rid for f in first.fragments] == ["a0", "b0", "b1", "b2", "b3"]
    assert [r.cached_tokens for r in b] == [0, 0, 0, 0]
    h.assert_idle_invariants()


def test_full_attention_a_request_sharing_part_of_the_promise_waits_for_it() -> None:
    """The producer's boundary serves its two closest siblings (document + question, 900 tokens); a third request
    shares only the document (another question). Its KV will be in the tree after the producer's round as well, so
    it waits one round and reuses the document instead of recomputing it alongside the producer."""
    question = list(range(8000, 8300))
    close = [make_request(f"q1-{i}", DOC + question + [100 + i] * 5) for i in range(3)]
    other_question = make_request("q2", DOC + list(range(9000, 9020)))
    h = harness(FULL, "radixflow")
    h.submit(*close, other_question)
    first, second = h.run_rounds()
    assert first.rids == ["q1-0"]
    assert sorted(second.rids) == ["q1-1", "q1-2", "q2"]
    assert [r.cached_tokens for r in (*close, other_question)] == [0, 900, 900, len(DOC)]
    h.assert_idle_invariants()


def test_a_producer_with_a_hit_serves_a_sibling_one_token_past_it_and_not_one_sharing_only_the_hit() -> None:
    """The threshold on the producer's side: with the document in the tree (the producer's hit), a sibling that
    shares one more token of its path (min_gain = 1 here) waits for it; one that shares only the document runs now,
    from its hit, beside the producer."""
    h = harness(FULL, "radixflow", min_gain_tokens=1)
    h.submit(make_request("base", DOC + [1]))
    h.run_rounds()  # DOC is in the tree
    producer = make_request("p", DOC + [50] + list(range(2000, 2020)))
    one_more = make_request("one-more", DOC + [50] + list(range(3000, 3020)))
    none_more = make_request("none-more", DOC + list(range(4000, 4020)))
    h.submit(producer, one_more, none_more)
    batch = h.run_pass()
    assert [r.rid for r in batch] == ["p", "none-more"]
    assert [int(r.prefix_len) for r in batch] == [len(DOC), len(DOC)]
    (promise,) = h.cache.rf_sched.promises.open_promises()
    assert (promise.producer_rid, promise.boundary) == ("p", len(DOC) + 1)
    assert [r.rid for r in h.waiting] == ["one-more"]
    h.execute()
    h.run_rounds()
    assert one_more.cached_tokens == len(DOC) + 1
    h.assert_idle_invariants()


def test_by_default_a_sibling_waits_only_for_64_tokens_past_its_hit() -> None:
    """The default minimum gain (64): with the document in the tree, a sibling sharing a 20-token question with the
    producer runs beside it, from its hit (the question costs less than a round's wait); one sharing 70 more tokens
    waits for the producer's round and then starts past them."""
    h = harness(FULL, "radixflow")
    assert h.cache.rf_sched.config.min_gain_tokens == 64
    h.submit(make_request("base", DOC + [1]))
    h.run_rounds()  # DOC is in the tree
    question, long_question = list(range(2000, 2020)), list(range(3000, 3070))
    producer = make_request("p", DOC + long_question + question + [7])
    short = make_request("short", DOC + question + [8])
    short_producer = make_request("sp", DOC + question + [9])
    long = make_request("long", DOC + long_question + [10])
    h.submit(producer, short_producer, short, long)
    batch = h.run_pass()
    assert sorted(r.rid for r in batch) == ["p", "short", "sp"]  # "short" shares 20 tokens with "sp": no wait
    assert [r.rid for r in h.waiting] == ["long"]
    h.execute()
    h.run_rounds()
    assert (short.cached_tokens, long.cached_tokens) == (len(DOC), len(DOC) + len(long_question))
    h.assert_idle_invariants()


def test_full_attention_promise_is_published_when_the_producers_kv_lands() -> None:
    """The producer's KV enters the tree as one node running past b: the promise counts as published (a full-attention
    prefix is usable inside a node), not as cancelled."""
    h = harness(FULL, "radixflow")
    h.submit(*candidates())
    h.run_rounds()
    counters = h.cache.rf_sched.promises.counters
    assert (counters.registered, counters.published, counters.cancelled) == (1, 1, 0)
    h.assert_idle_invariants()


def question(name: str, doc: list[int], q: list[int]):  # noqa: ANN201
    return [make_request(f"{name}{i}", doc + q + list(range(10 * i, 10 * i + TAIL))) for i in range(4)]


def test_hybrid_a_document_seen_before_gets_a_state_at_its_end_for_later_questions() -> None:
    """A second question on a known document: the tree holds the document's KV (ĥ = 600, where this question leaves
    the first question's path) but its only states sit past the first question. The producer publishes at ĥ, not at
    its siblings' branch point (document + question): the state lands at the document's end, so a third question on
    it starts from 600 at once instead of recomputing the document."""
    q1, q2, q3 = list(range(7000, 7040)), list(range(7100, 7140)), list(range(7200, 7240))
    h = harness(HYBRID, "radixflow")
    h.submit(*question("a", DOC, q1))
    h.run_rounds()
    second = question("b", DOC, q2)
    h.submit(*second)
    rounds = h.run_rounds()
    # the prefix request starts from h = 0 (no state at 600) and ends at ĥ = 600, the document's end
    assert rounds[0].fragments == (Fragment(prefix("b0", len(DOC)), 0, len(DOC)),)
    assert all(r.cached_tokens >= len(DOC) for r in second)
    third = question("c", DOC, q3)
    h.submit(*third)
    first_of_third = h.run_rounds()[0]
    # the third question's producer starts from the document's state: the document is not computed again
    assert all(f.prefix_len >= len(DOC) for f in first_of_third.fragments), first_of_third.fragments
    assert all(r.cached_tokens >= len(DOC) for r in third)
    h.assert_idle_invariants()


def test_hybrid_without_the_cap_every_later_question_recomputes_the_document(monkeypatch) -> None:  # noqa: ANN001
    """The same run with the producer planning at its siblings' branch point only: the third question finds no state
    at the document's end and computes it again (what the cap above is for)."""
    from sglang_radixflow.schedule import state

    real = state.plan_producer
    monkeypatch.setattr(state, "plan_producer", lambda *a, **kw: real(*a, **{**kw, "token_hit": 0}))
    q1, q2, q3 = list(range(7000, 7040)), list(range(7100, 7140)), list(range(7200, 7240))
    h = harness(HYBRID, "radixflow")
    for name, q in (("a", q1), ("b", q2)):
        h.submit(*question(name, DOC, q))
        h.run_rounds()
    h.submit(*question("c", DOC, q3))
    first_of_third = h.run_rounds()[0]
    assert first_of_third.fragments[0].prefix_len == 0
    h.assert_idle_invariants()
