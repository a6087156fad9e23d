"""Flexible admission decisions, and the fragmentation ablation on SGLang's real prefill pass."""
from __future__ import annotations

from types import SimpleNamespace

from sglang_radixflow.config import RadixFlowConfig
from sglang_radixflow.schedule.admission import NOTHING_TO_GAIN, QUIET, QUIET_AFTER, AdmissionGate
from sglang_radixflow.schedule.producers import PublishMode
from sglang_radixflow.schedule.state import SchedulingState
from tests.unit.cache.helpers import FULL
from tests.unit.schedule.harness import PassHarness, make_request


def _req(rid: str, n: int, arrived: float, first: int = 0):  # noqa: ANN202
    """A request of n tokens from `first` on (requests with the same `first` are siblings)."""
    return SimpleNamespace(
        rid=rid, origin_input_ids=list(range(first, first + n)), output_ids=[], extra_key=None, cache_salt=None,
        time_stats=SimpleNamespace(wait_queue_entry_time=arrived),
    )


def gate(mode: str, hold_ms: float = 5.0, hit: int = 0, min_gain: int = 1) -> AdmissionGate:
    return AdmissionGate(mode, hold_ms, state_ready_len=lambda ns, toks: hit, min_gain=min_gain)


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


def test_flex_does_not_hold_requests_that_have_less_than_min_gain_left_to_compute() -> None:
    """Siblings share at most what each has left past its state-ready hit: with under min_gain tokens left in every
    waiting request (a short question on a cached document), no producer could save anyone min_gain tokens."""
    waiting = [_req(f"r{i}", 1000, 10.0, first=7) for i in range(4)]
    kwargs = dict(waiting=waiting, worker_busy=False, row_budget=8, token_budget=10**6, now=10.001)
    assert (gate("flex", hit=940, min_gain=64).decide(**kwargs).reason) == NOTHING_TO_GAIN  # 60 tokens left each
    assert gate("flex", hit=936, min_gain=64).decide(**kwargs).hold  # 64 left: a producer could save that much
    assert gate("timer", hit=940, min_gain=64).decide(**kwargs).hold  # the fixed-hold ablation holds regardless


def test_flex_never_holds_on_full_attention_where_late_siblings_use_the_first_ones_kv() -> None:
    """Full attention: a sibling arriving after the first was scanned uses its KV from the next round on (adopting
    it while in flight), as it would after a hold, so the hold would only delay the first. Hybrids keep it (a late
    sibling finds no state at the branch point), and so do the fixed-hold ablations."""
    modes = {mode: SchedulingState(RadixFlowConfig(), mode, 64).gate.mode for mode in PublishMode}
    assert modes == {PublishMode.KV: "native", PublishMode.CHUNK_END: "flex", PublishMode.TRACK: "flex"}
    timer = SchedulingState(RadixFlowConfig(admission="timer", hold_ms=5.0), PublishMode.KV, 1)
    assert timer.gate.mode == "timer"


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


def _arrival_scanned_at_once(g: AdmissionGate, rid: str, now: float, shared: bool = False, first: int = 0) -> bool:
    """One idle arrival through the gate: held until its deadline, or scanned at once (the gate's last word); then
    the pass that takes it, which shares (plans a producer, ...) or not."""
    req = _req(rid, 64, now, first)
    first = g.decide(waiting=[req], worker_busy=False, row_budget=8, token_budget=4096, now=now)
    held = g.settle(first, first.hold)
    if held:
        late = g.decide(waiting=[req], worker_busy=False, row_budget=8, token_budget=4096, now=now + 0.006)
        assert not g.settle(late, late.hold)
    g.note_pass(shared)
    return not held


def test_holds_that_gather_nobody_stop_for_good_where_nothing_is_shared() -> None:
    g = gate("flex")
    at_once = [_arrival_scanned_at_once(g, f"r{i}", 10.0 + i) for i in range(QUIET_AFTER + 16)]
    # QUIET_AFTER lone arrivals held in vain, then none: each arrival is scanned at once
    assert at_once == [False] * QUIET_AFTER + [True] * 16
    assert g.holds == QUIET_AFTER


def test_once_quiet_an_arrival_is_held_when_its_sibling_was_scanned_within_the_hold() -> None:
    g = gate("flex")
    for i in range(QUIET_AFTER):
        _arrival_scanned_at_once(g, f"r{i}", 10.0 + i, first=1000 * i)

    def decide(req: SimpleNamespace, now: float) -> bool:
        d = g.decide(waiting=[req], worker_busy=False, row_budget=8, token_budget=4096, now=now)
        assert d.hold or d.reason == QUIET
        return g.settle(d, d.hold)

    assert not decide(_req("a", 64, 20.000, first=7000), 20.000)  # quiet: scanned at once
    assert not decide(_req("a", 64, 20.000, first=7000), 20.001)  # seen again: it is not its own sibling
    g.note_pass(False)
    assert not decide(_req("x", 64, 20.001, first=8000), 20.001)  # no sibling: scanned at once
    g.note_pass(False)
    # a's sibling 2 ms after it: the round was shorter than the spread, and a hold would have met them
    assert decide(_req("b", 64, 20.002, first=7000), 20.002)
    # a sibling 10 ms after the last one: a hold of 5 ms would not have met them
    g2 = gate("flex")
    for i in range(QUIET_AFTER):
        _arrival_scanned_at_once(g2, f"r{i}", 10.0 + i, first=1000 * i)
    for rid, at in (("c", 30.000), ("d", 30.010)):
        d = g2.decide(waiting=[_req(rid, 64, at, first=9000)], worker_busy=False, row_budget=8, token_budget=4096,
                      now=at)
        assert (d.hold, d.reason) == (False, QUIET)
        g2.settle(d, d.hold)
        g2.note_pass(False)


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
