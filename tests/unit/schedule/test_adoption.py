"""Adoption: under SGLang's overlap scheduler a pass runs before the previous round's results are processed, so a
sibling that arrives just after its producer's pass finds nothing of the shared prefix in the tree. On full
attention it waits one round for the in-flight request's KV (a promise registered for that request) instead of
recomputing the prefix beside it. Real pass, real cache and pools, the harness's launch / finish split."""
from __future__ import annotations

import pytest

from sglang_radixflow.cache.promises import PromiseState
from tests.unit.cache.helpers import FULL, HYBRID
from tests.unit.schedule.harness import PassHarness, make_request

DOC = list(range(1000, 1600))  # 600 shared tokens


def candidate(i: int, salt=None):  # noqa: ANN001, ANN201
    return make_request(f"c{i}", DOC + list(range(10 * i, 10 * i + 20)), cache_salt=salt)


def unrelated():  # noqa: ANN201
    return make_request("other", list(range(5000, 5300)))


def rids(reqs) -> list[str]:  # noqa: ANN001
    return [r.rid for r in reqs]


def first_round_in_flight(components, arm: str = "radixflow"):  # noqa: ANN001, ANN201
    """c0 arrives alone and is admitted (nothing to share with yet); its round is launched, not processed."""
    h = PassHarness(components, arm=arm, kv_size=8192, mamba_cache_size=64)
    h.submit(candidate(0))
    assert rids(h.run_pass()) == ["c0"]
    assert not list(h.cache.rf_sched.promises.open_promises())  # no sibling waited: no promise
    return h, h.launch()


def drain(h: PassHarness, in_flight) -> None:  # noqa: ANN001
    """Overlap order to the end (`in_flight`: the last launched round, every admitted batch launched): pass, launch,
    then process the previous round."""
    while h.waiting or in_flight is not None:
        launched = h.launch() if h.run_pass() else None
        if in_flight is not None:
            h.finish(in_flight)
        in_flight = launched
    h.assert_idle_invariants()


def test_late_siblings_wait_for_the_kv_in_flight_and_then_hit_it() -> None:
    h, in_flight = first_round_in_flight(FULL)
    h.submit(candidate(1), candidate(2), unrelated(), candidate(3))
    # c0's KV is not in the tree yet: the siblings would recompute the document. They adopt c0 instead; the scan
    # goes on past them.
    assert rids(h.run_pass()) == ["other"]
    assert rids(h.waiting) == ["c1", "c2", "c3"]
    (promise,) = h.cache.rf_sched.promises.open_promises()
    assert (promise.producer_rid, promise.boundary, promise.partial) == ("c0", len(DOC) + 20, True)
    stats = h.cache.rf_sched.pending_pass[1]
    assert (stats.adopted, stats.blocked_skips) == (1, 3)  # one promise serves all three
    launched = h.launch()
    h.finish(in_flight)  # c0's results: its KV lands and the promise is published
    assert promise.state is PromiseState.PUBLISHED
    batch = h.run_pass()
    assert rids(batch) == ["c1", "c2", "c3"]
    assert [int(r.prefix_len) for r in batch] == [len(DOC)] * 3  # the document is computed once
    this_round = h.launch()
    h.finish(launched)
    drain(h, this_round)


def test_prefix_stop_stops_at_a_sibling_of_the_request_in_flight() -> None:
    h, in_flight = first_round_in_flight(FULL, arm="prefix-stop")
    assert h.run_pass() == []  # an empty queue: a pass that defers nobody is not counted below
    h.submit(candidate(1), unrelated())
    assert h.run_pass() == []  # the scan stops at c1: the unrelated request behind it waits too
    assert rids(h.waiting) == ["c1", "other"]
    h.finish(in_flight)
    batch = h.run_pass()
    assert rids(batch) == ["c1", "other"] and int(batch[0].prefix_len) == len(DOC)
    # The empty pass launched no round; its counts are in the next round's record.
    state = h.cache.rf_sched
    _, stats, rows, tokens, after = state.pending_pass
    record = state.pass_record(stats, rows, tokens, after)
    assert (record["empty_passes"], record["adopted_producers"], record["blocked_skips"]) == (1, 1, 1)
    assert state.pass_record(stats, rows, tokens, after)["empty_passes"] == 0  # counted once
    drain(h, h.launch())


def test_the_synchronous_loop_needs_no_adoption() -> None:
    """Without overlap the previous round's KV is in the tree before the next pass: the sibling simply hits it."""
    h, in_flight = first_round_in_flight(FULL)
    h.finish(in_flight)
    h.submit(candidate(1))
    (batch,) = h.run_pass()
    assert int(batch.prefix_len) == len(DOC)
    assert h.cache.rf_sched.pending_pass[1].adopted == 0
    drain(h, h.launch())


def test_adoption_takes_one_token_past_the_hit_and_not_less() -> None:
    """The threshold: an in-flight request is adopted when it lands at least min_gain (1 here) tokens of the waiting
    request's path past what the tree already holds for it; one that shares only what the tree holds is not (the
    waiting request runs now, from its hit)."""
    h = PassHarness(FULL, kv_size=8192, mamba_cache_size=64, min_gain_tokens=1)
    h.submit(make_request("base", DOC + [1]))
    assert rids(h.run_pass()) == ["base"]
    h.execute()  # DOC is in the tree
    producer = make_request("f", DOC + list(range(50, 70)))
    h.submit(producer)
    assert rids(h.run_pass()) == ["f"] and int(producer.prefix_len) == len(DOC)
    in_flight = h.launch()
    h.submit(make_request("one-more", DOC + [50] + list(range(3000, 3020))),
             make_request("none-more", DOC + list(range(4000, 4020))))
    batch = h.run_pass()
    assert rids(batch) == ["none-more"] and int(batch[0].prefix_len) == len(DOC)
    assert rids(h.waiting) == ["one-more"]
    (promise,) = h.cache.rf_sched.promises.open_promises()
    assert (promise.producer_rid, promise.boundary) == ("f", len(DOC) + 20)
    launched = h.launch()
    h.finish(in_flight)
    assert promise.state is PromiseState.PUBLISHED
    (waited,) = h.run_pass()
    assert rids([waited]) == ["one-more"] and int(waited.prefix_len) == len(DOC) + 1
    this_round = h.launch()
    h.finish(launched)
    drain(h, this_round)


@pytest.mark.parametrize("salt", ["tenant-b", None], ids=["other-salt", "hybrid"])
def test_no_adoption_across_namespaces_nor_on_a_no_buffer_hybrid(salt) -> None:  # noqa: ANN001
    """Another cache_salt cannot use c0's KV; a no_buffer hybrid's c0 leaves a state only at its own end, which no
    sibling can use. Either way the sibling runs now, from what the tree holds (SGLang's native behaviour)."""
    components = FULL if salt else HYBRID
    h, in_flight = first_round_in_flight(components)
    h.submit(candidate(1, salt=salt))
    (batch,) = h.run_pass()
    assert rids([batch]) == ["c1"] and int(batch.prefix_len) == 0
    assert h.cache.rf_sched.pending_pass[1].adopted == 0
    assert not list(h.cache.rf_sched.promises.open_promises())
    launched = h.launch()
    h.finish(in_flight)
    drain(h, launched)


def test_a_released_request_in_flight_releases_its_adopters() -> None:
    h, in_flight = first_round_in_flight(FULL)
    (c0,) = in_flight[0].reqs
    h.submit(candidate(1))
    assert h.run_pass() == []
    # What the cache does when c0 is released before its results land (e.g. aborted): the promise is cancelled ...
    h.cache.rf_sched.on_release(c0, round_id=2)
    assert not list(h.cache.rf_sched.promises.open_promises())
    assert h.cache.rf_sched.records.promise_record()["promises_cancelled_reasons"] == {
        "producer released before publishing": 1}
    # ... and the sibling runs at the next pass, from what the tree holds, without adopting c0 again.
    (batch,) = h.run_pass()
    assert rids([batch]) == ["c1"] and int(batch.prefix_len) == 0
    assert h.cache.rf_sched.pending_pass[1].adopted == 0
    launched = h.launch()
    h.finish(in_flight)
    drain(h, launched)


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_siblings_arriving_after_a_chunk_wait_for_its_continuation(components, policy) -> None:  # noqa: ANN001
    """c0 arrives alone and the token budget cuts it into chunks (400 of its 620 tokens first). Its siblings arrive
    after that pass, so its plan never saw them. The chunked request becomes their producer when it continues: on
    full attention they wait for the KV its continuation lands, on the no_buffer hybrid its continuation is cut at
    the branch point (600), where its state lands. Without it the first sibling produced the document again from 400,
    beside c0's continuation (seen with SGLang's lpm policy on a live server). The document is computed once."""
    hybrid = components is HYBRID
    h = PassHarness(components, token_budget=400, kv_size=8192, mamba_cache_size=64, schedule_policy=policy)
    h.submit(candidate(0))
    (c0,) = h.run_pass()
    assert int(c0.extend_len) == 400
    h.execute()
    h.submit(candidate(1), candidate(2), candidate(3))
    assert rids(h.run_pass()) == ["c0"]  # the continuation alone: its siblings wait for it
    assert (int(c0.prefix_len), int(c0.extend_len)) == (400, 200 if hybrid else 220)
    (promise,) = h.cache.rf_sched.promises.open_promises()
    assert (promise.producer_rid, promise.boundary) == ("c0", len(DOC))
    stats = h.cache.rf_sched.pending_pass[1]
    assert (stats.adopted, stats.blocked_skips) == (1, 3)
    h.execute()
    batch = h.run_pass()  # (a middle chunk enters the tree at the start of the next pass)
    assert promise.state is PromiseState.PUBLISHED
    siblings = [r for r in batch if r.rid != "c0"]
    assert sorted(rids(siblings)) == ["c1", "c2", "c3"]
    assert [int(r.prefix_len) for r in siblings] == [len(DOC)] * 3  # from c0's KV (and state) at the branch point
    h.execute()
    h.run_rounds()
    computed = sum(f.extend_len for r in h.rounds for f in r.fragments)
    assert computed == len(DOC) + 4 * 20  # the document once, each candidate's own 20 tokens
    h.assert_idle_invariants()
