"""The adder's plain lane: a request nothing can block (SchedulingState.could_block, O(1) on its sibling key) skips
`blocking_promise`, and one that would plan nothing (`plans_nothing`: no waiting sibling, not cache-only, no producer
rows hold) goes straight to SGLang's admission. On SGLang's real pass the lane must decide exactly what the full checks
decide, round by round, while most requests of an ordinary queue take it."""
from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.schedule.producers import namespace_of
from sglang_radixflow.schedule.state import CUT_HOLDS, DEFER_COUNT, SchedulingState


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def workload() -> list[list[Any]]:
    """Arrival waves: candidates sharing a document among unrelated requests, a second wave of siblings arriving while
    their producer's promise is open (and, on full attention, while it is in flight), a cache-only warm-up, and long
    prompts that chunk-last holds."""
    doc, doc2 = prompt(10_001, 300), prompt(20_001, 260)
    first = [make_request("u0", prompt(1, 120))]
    first += [make_request(f"a{c}", doc + prompt(11_001 + 100 * c, 12)) for c in range(4)]
    first += [make_request("u1", prompt(2_001, 90)), make_request("L0", prompt(3_001, 500))]
    first += [make_request("warm", doc2, max_new_tokens=0)]
    second = [make_request(f"b{c}", doc + prompt(12_001 + 100 * c, 16)) for c in range(3)]
    second += [make_request(f"w{c}", doc2 + prompt(21_001 + 100 * c, 10)) for c in range(3)]
    second += [make_request(f"u{i}", prompt(4_001 + 500 * i, 70 + 10 * i)) for i in range(2, 7)]
    second += [make_request("L1", prompt(9_001, 450))]
    return [first, second]


def run(components: Any, plain_lane: bool, traversal: str = "radixflow") -> tuple[list[Any], dict[str, tuple]]:
    """Fragments of every round, and each request's defer / cut-hold counters; how many plain answers there were."""
    h = PassHarness(components, arm=traversal, token_budget=512, rows=6, kv_size=16384, mamba_cache_size=64)
    waves = workload()
    answers: list[bool] = []
    real_block, real_plain = SchedulingState.could_block, SchedulingState.plans_nothing

    def block(self: SchedulingState, req: Any) -> bool:
        return real_block(self, req) if plain_lane else True  # the full check: blocking_promise for every request

    def plain(self: SchedulingState, req: Any) -> bool:
        answer = real_plain(self, req) if plain_lane else False  # the full check: planning for every request
        answers.append(answer)
        return answer

    with mock.patch.object(SchedulingState, "could_block", block), \
            mock.patch.object(SchedulingState, "plans_nothing", plain):
        h.submit(*waves[0])
        rounds = [h.execute()] if h.run_pass() else []  # one round: the second wave meets open promises
        h.submit(*waves[1])
        rounds += h.run_rounds()
    h.assert_idle_invariants()
    counters = {r.rid: (getattr(r, DEFER_COUNT, 0), getattr(r, CUT_HOLDS, 0)) for wave in waves for r in wave}
    return [r.fragments for r in rounds], {"counters": counters, "plain": sum(answers), "asked": len(answers)}


@pytest.mark.parametrize("arm", ["radixflow", "prefix-stop"])
@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_plain_lane_schedules_exactly_as_the_full_checks(components: Any, arm: str) -> None:
    full_rounds, full = run(components, plain_lane=False, traversal=arm)
    lane_rounds, lane = run(components, plain_lane=True, traversal=arm)
    assert lane_rounds == full_rounds
    assert lane["counters"] == full["counters"]
    # The workload exercised both: some requests took the lane, and the verdicts (deferrals) still happened.
    assert 0 < lane["plain"] < lane["asked"]
    assert any(defer for defer, _ in full["counters"].values()), "no request was ever deferred: nothing was checked"


def test_a_request_with_anything_to_check_is_not_plain() -> None:
    """Each condition alone takes a request off the lane: a waiting sibling or being cache-only (it may plan), an open
    promise on its first tokens or a sibling in flight (full attention: it may be Blocked)."""
    doc = prompt(30_001, 200)
    h = PassHarness(FULL, arm="radixflow", token_budget=4096, rows=8, kv_size=16384, mamba_cache_size=64)
    lone, sib1, sib2 = make_request("lone", prompt(1, 50)), make_request("s1", doc + [7]), make_request("s2", doc + [8])
    warm = make_request("warm", prompt(40_001, 60), max_new_tokens=0)
    h.submit(lone, sib1, sib2, warm)
    sched = h.cache.rf_sched
    sched.begin_pass(1, h.sched.waiting_queue, 8, 4096)
    try:
        assert sched.plans_nothing(lone) and not sched.could_block(lone)
        assert not sched.plans_nothing(sib1)  # s2 waits beside it
        assert not sched.plans_nothing(warm)
        sched.promises.register(namespace_of(lone), prompt(1, 40), 40, "p", 1)
        assert sched.could_block(lone)  # a promise on its first tokens
        assert not sched.could_block(sib1)
    finally:
        sched.end_pass()

    h2 = PassHarness(FULL, arm="radixflow", token_budget=4096, rows=8, kv_size=16384, mamba_cache_size=64)
    first, later = make_request("f", doc + [1]), make_request("l", doc + [2])
    h2.submit(first)
    assert h2.run_pass() == [first]  # admitted, in flight: its round has not run
    h2.submit(later)
    sched2 = h2.cache.rf_sched
    sched2.begin_pass(2, h2.sched.waiting_queue, 8, 4096)
    try:
        assert sched2.could_block(later)  # it may adopt `first`, in flight
    finally:
        sched2.end_pass()
    h2.execute()
