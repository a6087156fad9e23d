"""Chunk-last (RADIXFLOW_CHUNK_LAST, on by default in the skip arms): in SGLang's real pass, a request that the rest of
the token budget would cut into a chunk is passed over while the scan looks S requests further, and is offered again
(and cut from what is left) in the same pass. Whole requests behind it finish a round earlier; the cut request itself
finishes its prefill in the same round as without it; nothing is dropped or leaked."""
from __future__ import annotations

from typing import Any

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.bench.replay import make_instance, replay
from sglang_radixflow.config import ConfigError, load_config
from sglang_radixflow.schedule.prefix_request import prefix_rid
from sglang_radixflow.schedule.holds import HOLD_RUN_LIMIT
from tests.unit.schedule.harness import recording_matches

import pytest


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def schedule(components: Any, reqs: list[Any], chunk_last: bool, arm: str = "radixflow", rows: int = 8,
             tokens: int = 400) -> list[list[tuple[str, int, int]]]:
    """(rid, prefix_len, extend_len) of each round's fragments, until the queue drains."""
    h = PassHarness(components, arm=arm, token_budget=tokens, rows=rows, kv_size=16384, mamba_cache_size=64,
                    producer_rows=0, chunk_last=chunk_last)
    h.submit(*reqs)
    rounds = h.run_rounds()
    h.assert_idle_invariants()  # every KV and mamba slot back in the allocator or the tree
    return [[(f.rid, f.prefix_len, f.extend_len) for f in r.fragments] for r in rounds]


def finished_in(rounds: list[list[tuple[str, int, int]]], rid: str) -> int:
    return max(i for i, frags in enumerate(rounds, 1) for f in frags if f[0] == rid)


def a_cut_request_then_short_ones() -> list[Any]:
    # T = 400: u0 takes 200, L (300) fits a full budget but not the 200 left; four 40-token requests behind it.
    return [make_request("u0", prompt(1, 200)), make_request("L", prompt(1001, 300))] + [
        make_request(f"s{i}", prompt(5001 + 100 * i, 40)) for i in range(4)]


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_whole_requests_behind_a_cut_one_run_in_this_round(components: Any) -> None:
    """SGLang cuts L to the 200 tokens left and its chunk ends the scan: the four short requests wait a round.
    Chunk-last admits them whole first; L is cut from the 40 tokens they leave and still finishes in round 2."""
    off = schedule(components, a_cut_request_then_short_ones(), chunk_last=False)
    on = schedule(components, a_cut_request_then_short_ones(), chunk_last=True)
    assert off == [[("u0", 0, 200), ("L", 0, 200)],
                   [("L", 200, 100)] + [(f"s{i}", 0, 40) for i in range(4)]]
    assert on == [[("u0", 0, 200)] + [(f"s{i}", 0, 40) for i in range(4)] + [("L", 0, 40)],
                  [("L", 40, 260)]]
    assert finished_in(on, "L") == finished_in(off, "L") == 2


def test_a_request_longer_than_the_budget_is_never_held() -> None:
    """A prompt longer than T is cut whatever happens; holding it would only shrink its first chunk (and could cost
    it a round): the schedule is SGLang's."""
    reqs = lambda: [make_request("u0", prompt(1, 200)), make_request("B", prompt(1001, 900))] + [  # noqa: E731
        make_request(f"s{i}", prompt(5001 + 100 * i, 40)) for i in range(4)]
    assert schedule(FULL, reqs(), chunk_last=True) == schedule(FULL, reqs(), chunk_last=False)


def test_the_stop_traversal_is_unchanged() -> None:
    """prefix-stop keeps SGLang's scan (the baseline): chunk-last is a skip-traversal mechanism."""
    on = schedule(FULL, a_cut_request_then_short_ones(), chunk_last=True, arm="prefix-stop")
    off = schedule(FULL, a_cut_request_then_short_ones(), chunk_last=False, arm="prefix-stop")
    assert on == off and on[0] == [("u0", 0, 200), ("L", 0, 200)]


def test_a_producer_whose_prefix_request_would_be_cut_is_held_not_its_prefix_request() -> None:
    """Hybrid no_buffer: a producer publishes through a prefix request; when that would be cut, the producer (the
    request in the queue) is held, and its prefix request is made again when the scan offers it."""
    doc = prompt(50_000, 300)

    def reqs() -> list[Any]:
        group = [make_request(f"g{c}", doc + prompt(60_000 + 10 * c, 8)) for c in range(2)]
        return [make_request("u0", prompt(1, 200))] + group + [make_request("s0", prompt(5001, 40))]

    p = prefix_rid("g0", len(doc))
    off = schedule(HYBRID, reqs(), chunk_last=False)
    on = schedule(HYBRID, reqs(), chunk_last=True)
    assert off[0] == [("u0", 0, 200), (p, 0, 200)]
    assert on[0] == [("u0", 0, 200), ("s0", 0, 40), (p, 0, 160)]
    assert finished_in(on, "g1") == finished_in(off, "g1")  # the siblings start from b as soon as without it


def test_holds_are_bounded_per_request() -> None:
    """With RADIXFLOW_MAX_DEFER_ROUNDS = 0 no request is ever held: SGLang's schedule."""
    h = PassHarness(FULL, token_budget=400, rows=8, kv_size=16384, producer_rows=0, chunk_last=True)
    h.cache.rf_sched.config = load_config({"RADIXFLOW_MAX_DEFER_ROUNDS": "0", "RADIXFLOW_PRODUCER_ROWS": "0"})
    h.submit(*a_cut_request_then_short_ones())
    first = [f.rid for f in h.run_rounds()[0].fragments]
    assert first == ["u0", "L"]


def test_only_the_request_the_pass_would_cut_spends_its_bound() -> None:
    """Natively a pass cuts one request and ends: the requests behind it are not admitted either way, so a look-past
    that passes over them does not delay them and must not spend their bound. With a bound of 1: L is cut-held in
    round 1 and M, behind it, is passed over too; in round 2 M is the one the budget would cut, and it is still held,
    so s1 (arrived after round 1) runs whole before it."""
    h = PassHarness(FULL, token_budget=400, rows=8, kv_size=16384, producer_rows=0, chunk_last=True)
    h.cache.rf_sched.config = load_config({"RADIXFLOW_MAX_DEFER_ROUNDS": "1", "RADIXFLOW_PRODUCER_ROWS": "0"})
    h.submit(make_request("u0", prompt(1, 200)), make_request("L", prompt(1001, 300)),
             make_request("M", prompt(20_001, 300)), make_request("s0", prompt(5001, 40)))
    first = h.run_pass()
    assert [(r.rid, r.extend_end - r.prefix_len) for r in first] == [("u0", 200), ("s0", 40), ("L", 160)]
    h.execute()
    h.submit(make_request("s1", prompt(7001, 40)))
    rounds = [[(f.rid, f.prefix_len, f.extend_len) for f in r.fragments] for r in h.run_rounds()]
    h.assert_idle_invariants()
    assert rounds[0] == [("L", 160, 140), ("s1", 0, 40), ("M", 0, 220)]


def cut_pass(queue: list[Any]) -> tuple[dict[str, Any], list[str]]:
    """One token-bound pass (T = 400, S = 64): its record, and the rids SGLang matched in it (in order)."""
    h = PassHarness(FULL, token_budget=400, rows=64, kv_size=65536, producer_rows=0, chunk_last=True)
    h.submit(*queue)
    with recording_matches() as matched:
        h.run_pass()
    _, stats, rows, tokens, waiting_after = h.cache.rf_sched.pending_pass
    return h.cache.rf_sched.pass_record(stats, rows, tokens, waiting_after), matched


def test_a_run_of_cut_requests_ends_the_look_past() -> None:
    """A token-bound pass over a long queue of requests each bigger than the budget left: the scan stops looking past
    the first cut one after HOLD_RUN_LIMIT more cut in a row (each costs SGLang a match) instead of S positions, and
    the first one still gets the chunk."""
    queue = [make_request("u0", prompt(1, 350)),
             *[make_request(f"c{i}", prompt(10_000 + 1000 * i, 100)) for i in range(40)]]
    record, matched = cut_pass(queue)
    assert record["admitted"] == ["u0", "c0"]
    assert record["cut_holds"] == HOLD_RUN_LIMIT + 1  # c0 and the HOLD_RUN_LIMIT behind it, not the 39 behind it
    assert matched.count("c0") == 2 and f"c{HOLD_RUN_LIMIT}" in matched
    assert f"c{HOLD_RUN_LIMIT + 1}" not in matched


@pytest.mark.parametrize("cut_ahead", [HOLD_RUN_LIMIT - 1, HOLD_RUN_LIMIT, HOLD_RUN_LIMIT + 3])
def test_a_look_past_admits_a_whole_request_within_its_window(cut_ahead: int) -> None:
    """L is cut; `cut_ahead` requests too long for what is left follow it, then a short one that fits. The short one
    lies inside the look-past's window (HOLD_RUN_LIMIT more held in a row) when cut_ahead < HOLD_RUN_LIMIT: it is
    admitted whole before L. Beyond the window L is offered again first and takes the chunk, as without chunk-last."""
    queue = [make_request("u0", prompt(1, 200)), make_request("L", prompt(1001, 300)),
             *[make_request(f"c{i}", prompt(10_000 + 1000 * i, 300)) for i in range(cut_ahead)],
             make_request("s0", prompt(5001, 40))]
    record, matched = cut_pass(queue)
    reachable = cut_ahead < HOLD_RUN_LIMIT
    assert record["admitted"] == (["u0", "s0", "L"] if reachable else ["u0", "L"])
    assert matched.count("L") == 2  # held, then offered again


def test_a_whole_request_breaks_the_run_of_cut_ones() -> None:
    """The bound counts cut requests in a row: one that fits starts the count again, so a short request found after
    a long run of cut ones is still admitted whole."""
    big = [make_request(f"c{i}", prompt(10_000 + 1000 * i, 100)) for i in range(HOLD_RUN_LIMIT)]
    more = [make_request(f"d{i}", prompt(60_000 + 1000 * i, 100)) for i in range(HOLD_RUN_LIMIT)]
    h = PassHarness(FULL, token_budget=400, rows=64, kv_size=65536, producer_rows=0, chunk_last=True)
    h.submit(make_request("u0", prompt(1, 350)), *big, make_request("s0", prompt(5001, 20)), *more,
             make_request("s1", prompt(7001, 20)))
    h.run_pass()
    _, stats, rows, tokens, waiting_after = h.cache.rf_sched.pending_pass
    record = h.cache.rf_sched.pass_record(stats, rows, tokens, waiting_after)
    assert record["admitted"] == ["u0", "s0", "s1", "c0"]


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_siblings_of_a_cut_producer_are_held_with_it(components: Any) -> None:
    """A producer the budget left would cut is held; its waiting siblings share its uncached document, so each would
    be cut too (and, admitted first, would compute the document once more): they are held with it when the scan
    reaches them, and count toward the run of cut requests. The round admits what it admitted when they were
    matched and cut; every sibling then starts from the producer's boundary."""
    doc = prompt(50_000, 300)

    def reqs() -> list[Any]:
        group = [make_request(f"g{c}", doc + prompt(60_000 + 10 * c, 8)) for c in range(4)]
        return [make_request("u0", prompt(1, 250))] + group + [make_request("s0", prompt(5001, 40))]

    h = PassHarness(components, token_budget=400, rows=8, kv_size=16384, mamba_cache_size=64, producer_rows=0,
                    chunk_last=True)
    h.submit(*reqs())
    h.run_pass()
    _, stats, rows, tokens, waiting_after = h.cache.rf_sched.pending_pass
    record = h.cache.rf_sched.pass_record(stats, rows, tokens, waiting_after)
    assert record["cut_holds"] == 4
    producer = "g0" if components is FULL else prefix_rid("g0", len(doc))
    assert record["admitted"] == ["u0", "s0", producer]
    h.execute()
    rounds = [[(f.rid, f.prefix_len, f.extend_len) for f in r.fragments] for r in h.run_rounds()]
    h.assert_idle_invariants()
    consumers = [f for r in rounds for f in r if f[0] in ("g1", "g2", "g3")]
    assert sorted(f[0] for f in consumers) == ["g1", "g2", "g3"] and {f[1] for f in consumers} == {len(doc)}


def test_the_round_record_counts_cut_holds() -> None:
    h = PassHarness(FULL, token_budget=400, rows=8, kv_size=16384, producer_rows=0, chunk_last=True)
    h.submit(*a_cut_request_then_short_ones())
    h.run_pass()
    _, stats, rows, tokens, waiting_after = h.cache.rf_sched.pending_pass
    record = h.cache.rf_sched.pass_record(stats, rows, tokens, waiting_after)
    assert record["cut_holds"] == 1 and record["admitted"] == ["u0", "s0", "s1", "s2", "s3", "L"]


def test_chunk_last_never_adds_rounds_on_generated_instances() -> None:
    """The bench's multi-candidate instances at the live bench's budgets: same tokens computed (only the packing
    changes), never more rounds, and fewer on mc-mixed."""
    fewer = 0
    for name in ("mc-cold", "mc-mixed", "mc-reuse"):
        inst = make_instance(name, questions=48, seed=0)
        off, on = replay(inst, "radixflow", chunk_last=False), replay(inst, "radixflow", chunk_last=True)
        assert on.tokens == off.tokens and on.K <= off.K
        fewer += on.K < off.K
    assert fewer >= 1


def test_the_variable_is_validated() -> None:
    assert load_config({}).chunk_last and not load_config({"RADIXFLOW_CHUNK_LAST": "0"}).chunk_last
    with pytest.raises(ConfigError, match="RADIXFLOW_CHUNK_LAST='maybe' is invalid; allowed: 1/0, true/false, on/off"):
        load_config({"RADIXFLOW_CHUNK_LAST": "maybe"})
