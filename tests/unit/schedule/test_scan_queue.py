"""The scan's screen (schedule/scan_queue.py): siblings proven Blocked on a producer admitted in the same pass are
skipped without SGLang matching them. On SGLang's real pass it must change nothing but the work: the same rounds,
the same fragments, the same Blocked count, every request still queued, nothing leaked."""
from __future__ import annotations

import random
from typing import Any
from unittest import mock

import pytest
from sglang.srt.managers.schedule_batch import Req

from sglang_radixflow.schedule import scan_queue
from sglang_radixflow.schedule.producers import namespace_of, request_tokens
from sglang_radixflow.schedule.state import SchedulingState
from tests.unit.cache.helpers import FULL, HYBRID
from tests.unit.schedule.harness import PassHarness, make_request


def waves(seed: int) -> list[list[Req]]:
    """Arrival waves: groups of 2-4 candidates over a few documents (a document recurs across groups, some groups
    share a question, some requests carry another cache_salt), and unrelated requests in between."""
    rng = random.Random(seed)
    fresh = iter(range(10_000, 10**9, 7))
    tokens = lambda k: [next(fresh) for _ in range(k)]  # noqa: E731
    docs = [tokens(rng.randint(60, 240)) for _ in range(4)]
    questions = [tokens(rng.randint(1, 12)) for _ in range(3)]
    result: list[list[Req]] = []
    for w in range(4):
        wave: list[Req] = []
        for g in range(rng.randint(3, 7)):
            if rng.random() < 0.2:
                wave.append(make_request(f"w{w}u{g}", tokens(rng.randint(30, 200))))
                continue
            shared = rng.choice(docs) + rng.choice(questions)
            salt = "tenant-2" if rng.random() < 0.15 else None
            for c in range(rng.randint(2, 4)):
                wave.append(make_request(f"w{w}g{g}c{c}", shared + tokens(rng.randint(1, 8)), cache_salt=salt))
        result.append(wave)
    return result


def run(components: Any, seed: int, screened: bool, overlap: bool = False, producer_rows: int = 0
        ) -> tuple[list[Any], list[int], int]:
    """(per-round fragments, per-pass Blocked skips, requests SGLang matched) over all waves, one wave arriving
    every two rounds. overlap: as SGLang's overlap scheduler, each pass runs before the previous round's results are
    processed, so every promise is still in flight at the next pass. Unscreened: nothing is ever proven Blocked
    ahead of the scan (the queue's iteration itself is the same)."""
    h = PassHarness(components, token_budget=512, rows=6, kv_size=16384, mamba_cache_size=64,
                    producer_rows=producer_rows)
    matched = [0]
    original = Req.init_next_round_input

    def counting(self: Req, *a: Any, **k: Any) -> Any:
        matched[0] += 1
        return original(self, *a, **k)

    blocked: list[int] = []
    screened_skips = [0]
    held = [0]
    patches = [mock.patch.object(Req, "init_next_round_input", counting)]
    if not screened:
        patches.append(mock.patch.object(SchedulingState, "_mark", lambda self, promise, held: None))
    for p in patches:
        p.start()
    try:
        pending = waves(seed)
        rounds = 0
        in_flight = None  # a launched round whose results are not processed yet (overlap)
        while pending or h.waiting or h.sched.chunked_req is not None or in_flight is not None:
            if pending and rounds % 2 == 0:
                h.submit(*pending.pop(0))
            rounds += 1
            assert rounds < 200, "queue not drained"
            queued = {id(r) for r in h.waiting}
            admitted = h.run_pass()
            stats = h.cache.rf_sched.pending_pass
            blocked.append(stats[1].blocked_skips if stats is not None and admitted else 0)
            screened_skips[0] += stats[1].screened if stats is not None and admitted else 0
            held[0] += stats[1].held if stats is not None and admitted else 0
            h.cache.rf_sched.pending_pass = None
            # Nothing is lost: every request queued before the pass is admitted now or still waiting.
            assert queued <= {id(r) for r in admitted} | {id(r) for r in h.waiting}
            assert type(h.sched.waiting_queue) is list  # the screen is gone after the pass
            launched = h.launch() if admitted else None
            if in_flight is not None:
                h.finish(in_flight)
                in_flight = None
            if launched is not None:
                if overlap:
                    in_flight = launched
                else:
                    h.finish(launched)
        h.assert_idle_invariants()
    finally:
        for p in reversed(patches):
            p.stop()
    # The passes report how many of their Blocked skips SGLang never matched: some with the screen, none without.
    assert (screened_skips[0] > 0) is screened
    assert (held[0] > 0) is (producer_rows > 0)  # the waves exercise producer rows when they are on
    return [r.fragments for r in h.rounds], blocked, matched[0]


@pytest.mark.parametrize("producer_rows", [0, 2], ids=["fcfs", "producer-rows"])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
@pytest.mark.parametrize("seed", [0, 1])
def test_screening_changes_the_work_not_the_schedule(components: Any, seed: int, overlap: bool,
                                                       producer_rows: int) -> None:
    plain_rounds, plain_blocked, plain_matched = run(components, seed, False, overlap, producer_rows)
    rounds, blocked, matched = run(components, seed, True, overlap, producer_rows)
    assert rounds == plain_rounds
    assert blocked == plain_blocked
    assert sum(blocked) > 0, "the workload must exercise Blocked verdicts"
    # The screened scan matched fewer requests: the skipped siblings were never handed to SGLang.
    assert matched < plain_matched


def mark(state: Any, req: Any) -> None:
    """A promise on req's first 30 tokens provably Blocks it: what _mark_consumers / _mark_in_flight record."""
    promise = state.promises.register(namespace_of(req), request_tokens(req)[:30], 30, f"producer-of-{req.rid}", 1)
    promise.consumers = ((req, 30),)
    state._mark(promise, 0)


def test_scan_queue_hides_marked_requests_from_the_scan_only() -> None:
    """Outside a pass, and in any iteration during which SGLang examines nothing (policy sorting, the rebuild of the
    queue after the scan), every request is seen; the scan's own iteration skips marked ones as it reaches them."""
    h = PassHarness(FULL)
    state = h.cache.rf_sched
    reqs = [make_request(f"r{i}", list(range(100 * i + 1, 100 * i + 40))) for i in range(5)]
    queue = scan_queue.ScanQueue(reqs, state)
    assert list(queue) == reqs  # no pass: plain
    state.begin_pass(1, reqs)
    mark(state, reqs[0])
    mark(state, reqs[2])
    assert list(queue) == reqs  # nothing examined during this iteration: not the scan, nothing skipped
    scan = iter(queue)
    assert next(scan) is reqs[0]  # the scan is recognised by its first examination, so its first request is seen
    state.examine(reqs[0])  # SGLang hands it to the adder
    assert next(scan) is reqs[1]
    state.examine(reqs[1])
    assert next(scan) is reqs[3]  # reqs[2] passed over ...
    assert state.current is not None and state.current.blocked_skips == 0
    state.examine(reqs[3])  # ... and counted as Blocked once SGLang examines reqs[3]
    assert state.current.blocked_skips == 1
    mark(state, reqs[4])
    assert list(scan) == [reqs[4]]  # the queue ends on a screened request: SGLang's checks decide there
    # An iteration starting once SGLang examined a request in this pass (the rebuild after the scan) cannot be the
    # scan: it iterates the plain list, not a screen that would walk the whole queue in Python.
    assert type(iter(queue)) is type(iter([]))
    assert list(queue) == reqs  # ... and sees everything
    state.end_pass()
    assert list(queue) == reqs
