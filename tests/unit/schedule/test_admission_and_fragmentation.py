"""Flexible admission decisions, and the fragmentation ablation on SGLang's real prefill pass."""
from __future__ import annotations

from types import SimpleNamespace

from sglang_radixflow.schedule.admission import PROBE_EVERY, QUIET_AFTER, AdmissionGate
from tests.unit.cache.helpers import FULL
from tests.unit.schedule.harness import PassHarness, make_request


def _req(rid: str, n: int, arrived: float):  # noqa: ANN202
    return SimpleNamespace(
        rid=rid, origin_input_ids=list(range(n)), output_ids=[], extra_key=None, cache_salt=None,
        time_stats=SimpleNamespace(wait_queue_entry_time=arrived),
    )


def gate(mode: str, hold_ms: float = 5.0, hit: int = 0) -> AdmissionGate:
    return AdmissionGate(mode, hold_ms, state_ready_len=lambda ns, toks: hit)


def test_flex_holds_fresh_arrivals_while_the_worker_is_idle() -> None:
    g = gate("flex")
    d = g.decide(waiting=[_req("a", 100, 10.000)], worker_busy=False, row_budget=8, token_budget=4096, now=10.001)
    assert d.hold


def test_flex_releases_early_for_each_reason() -> None:
    waiting = [_req(f"r{i}", 1000, 10.0) for i in range(4)]
    cases = {
        "worker busy": dict(worker_busy=True, row_budget=8, token_budget=10**6),
        "rows full": dict(worker_busy=False, row_budget=4, token_budget=10**6),
        "tokens full": dict(worker_busy=False, row_budget=8, token_budget=4000),
    }
    for reason, kwargs in cases.items():
        d = gate("flex").decide(waiting=waiting, now=10.001, **kwargs)
        assert (d.hold, d.reason) == (False, reason)
    # The token demand is what is left after the state-ready hit: with 900 cached per request, 4 x 100 < 4000.
    d = gate("flex", hit=900).decide(waiting=waiting, worker_busy=False, row_budget=8, token_budget=4000, now=10.001)
    assert d.hold


def test_deadline_runs_from_the_oldest_arrival_so_nobody_waits_for_siblings() -> None:
    waiting = [_req("old", 10, 10.000), _req("new", 10, 10.004)]
    d = gate("flex").decide(waiting=waiting, worker_busy=False, row_budget=8, token_budget=4096, now=10.005)
    assert (d.hold, d.reason) == (False, "deadline")


def test_timer_ignores_early_release_but_not_its_deadline() -> None:
    waiting = [_req(f"r{i}", 5000, 10.0) for i in range(8)]
    held = gate("timer", 10.0).decide(waiting=waiting, worker_busy=True, row_budget=1, token_budget=10, now=10.009)
    assert held.hold
    g = gate("timer", 10.0)
    assert not g.decide(waiting=waiting, worker_busy=False, row_budget=8, token_budget=10, now=10.011).hold


def test_native_never_holds_and_release_reasons_are_counted() -> None:
    assert not gate("native").decide(waiting=[_req("a", 1, 10.0)], worker_busy=False, row_budget=8,
                                     token_budget=1, now=10.0).hold
    g = gate("flex")
    w = [_req("a", 10, 10.0)]
    held = g.decide(waiting=w, worker_busy=False, row_budget=8, token_budget=4096, now=10.001)
    assert g.settle(held, held.hold)
    released = g.decide(waiting=w, worker_busy=True, row_budget=8, token_budget=4096, now=10.002)
    assert not g.settle(released, released.hold)
    assert (g.holds, g.releases) == (1, {"worker busy": 1})


def test_counts_follow_the_shared_decision_not_this_ranks_own() -> None:
    """With TP, rank 0's decision is broadcast: another rank counts what the scheduler did, so every rank's round
    records agree (tests/integration/test_tensor_parallel.py)."""
    g = gate("flex")
    w = [_req("a", 10, 10.0)]
    own = g.decide(waiting=w, worker_busy=False, row_budget=8, token_budget=4096, now=10.006)
    assert not own.hold and own.reason == "deadline"
    assert g.settle(own, True)  # rank 0 still held
    own = g.decide(waiting=w, worker_busy=False, row_budget=8, token_budget=4096, now=10.001)
    assert not g.settle(own, False)  # rank 0 released while this rank would have held on
    assert (g.holds, g.releases) == (1, {"rank 0": 1})


def _arrival_scanned_at_once(g: AdmissionGate, rid: str, now: float, shared: bool = False) -> bool:
    """One idle arrival through the gate: held until its deadline, or scanned at once (the gate's last word); then
    the pass that takes it, which shares (plans a producer, ...) or not."""
    req = _req(rid, 64, now)
    first = g.decide(waiting=[req], worker_busy=False, row_budget=8, token_budget=4096, now=now)
    held = g.settle(first, first.hold)
    if held:
        late = g.decide(waiting=[req], worker_busy=False, row_budget=8, token_budget=4096, now=now + 0.006)
        assert not g.settle(late, late.hold)
    g.note_pass(shared)
    return not held


def test_holds_that_gather_nobody_stop_and_a_probe_in_eight_still_holds() -> None:
    g = gate("flex")
    at_once = [_arrival_scanned_at_once(g, f"r{i}", 10.0 + i) for i in range(QUIET_AFTER + 2 * PROBE_EVERY)]
    # QUIET_AFTER lone arrivals held in vain, then one held in PROBE_EVERY (each probe gathers nobody either)
    assert at_once[:QUIET_AFTER] == [False] * QUIET_AFTER
    quiet = at_once[QUIET_AFTER:]
    assert quiet.count(False) == 2 and quiet[PROBE_EVERY - 1] is False and quiet[-1] is False
    assert g.holds == QUIET_AFTER + 2


def test_a_pass_that_shares_makes_every_idle_arrival_held_again() -> None:
    g = gate("flex")
    for i in range(QUIET_AFTER):
        _arrival_scanned_at_once(g, f"r{i}", 10.0 + i)
    assert g.barren_holds == QUIET_AFTER
    assert _arrival_scanned_at_once(g, "siblings", 20.0, shared=True)  # scanned at once; its pass planned a producer
    assert g.barren_holds == 0
    assert not _arrival_scanned_at_once(g, "next", 30.0)  # held again
    # a hold whose pass shared resets the count too; one that did not adds to it
    assert (g.barren_holds, _arrival_scanned_at_once(g, "group", 40.0, shared=True), g.barren_holds) == (1, False, 0)


def _fragment_queue():  # noqa: ANN202
    return [make_request("A", range(10_000, 10_660)), make_request("B", range(20_000, 20_300)),
            make_request("C", range(30_000, 30_030))]


def test_fragmentation_defers_a_request_that_would_be_cut_below_the_minimum() -> None:
    h = PassHarness(FULL, arm="radixflow+frag", token_budget=700, kv_size=8192)
    h.submit(*_fragment_queue())
    assert [r.rid for r in h.run_pass()] == ["A", "C"]  # B would get a 40-token fragment: it waits
    assert [r.rid for r in h.waiting] == ["B"]


def test_without_fragmentation_sglang_cuts_the_small_fragment() -> None:
    # (Chunk-last off: it would admit C first and cut B from what C leaves, test_chunk_last.py.)
    h = PassHarness(FULL, arm="radixflow", token_budget=700, kv_size=8192, chunk_last=False)
    h.submit(*_fragment_queue())
    batch = h.run_pass()
    assert [r.rid for r in batch] == ["A", "B"]
    assert batch[1].extend_end == 40 and h.sched.chunked_req is batch[1]
