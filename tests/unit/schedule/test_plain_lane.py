"""The adder's plain lane: `SchedulingState.examine` says in O(1) which checks could matter for a request. One nothing
can block (no open promise or in-flight request on its sibling key) skips `blocking_promise`; one that would plan
nothing (no waiting sibling, not cache-only, no producer rows hold) skips planning; a request with neither goes
straight to SGLang's admission. On SGLang's real pass the lane must decide exactly what the full checks decide, round
by round, while most requests of an ordinary queue take it."""
from __future__ import annotations

import dataclasses

from typing import Any
from unittest import mock

import pytest

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.schedule.producers import namespace_of
from sglang_radixflow.schedule.state import (
    CUT_HOLDS, DEFER_COUNT, MAY_BLOCK, MAY_FRAGMENT, MAY_PLAN, PLAIN, SchedulingState,
)


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
    answers: list[int] = []
    real_examine = SchedulingState.examine

    def examine(self: SchedulingState, req: Any) -> int:
        checks = real_examine(self, req)
        answers.append(checks)
        # the full checks: blocking_promise and planning for every request
        return checks if plain_lane else checks | MAY_BLOCK | MAY_PLAN

    with mock.patch.object(SchedulingState, "examine", examine):
        h.submit(*waves[0])
        rounds = [h.execute()] if h.run_pass() else []  # one round: the second wave meets open promises
        h.submit(*waves[1])
        rounds += h.run_rounds()
    h.assert_idle_invariants()
    counters = {r.rid: (getattr(r, DEFER_COUNT, 0), getattr(r, CUT_HOLDS, 0)) for wave in waves for r in wave}
    lone = sum(1 for checks in answers if checks == PLAIN)
    return [r.fragments for r in rounds], {"counters": counters, "plain": lone, "asked": len(answers)}


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
        assert sched.examine(lone) == PLAIN
        assert sched.examine(sib1) == MAY_PLAN  # s2 waits beside it
        assert sched.examine(warm) == MAY_PLAN  # cache-only
        sched.promises.register(namespace_of(lone), prompt(1, 40), 40, "p", 1)
        assert sched.examine(lone) == MAY_BLOCK  # a promise on its first tokens
        assert not sched.examine(sib1) & MAY_BLOCK
    finally:
        sched.end_pass()
    sched.config = dataclasses.replace(sched.config, fragmentation=True)
    sched.begin_pass(2, h.sched.waiting_queue, 8, 4096)
    try:
        assert sched.examine(lone) == MAY_BLOCK | MAY_FRAGMENT  # the extension checks every request
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
        assert sched2.examine(later) == MAY_BLOCK  # it may adopt `first`, in flight
    finally:
        sched2.end_pass()
    h2.execute()
