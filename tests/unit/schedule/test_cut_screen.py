"""Chunk-last's look-past without matching (SchedulingState.screen_cuts, RadixFlowPrefillAdder._provably_cut): once a
cut request is held, the scan holds the requests that would be cut too at their positions, unmatched, when the tree
holds nothing of their path and their prompt is longer than the budget left. On SGLang's real pass the schedule, the
hold counters, the cache's eviction order and the pools are exactly those of matching every request; only SGLang's
matches are saved."""
from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.schedule.state import CUT_HOLDS
from tests.unit.schedule.harness import recording_matches

SYSTEM = list(range(90_001, 90_301))  # two prompts (300, 200 tokens) the tree holds before the queue arrives
SYSTEM2 = list(range(95_001, 95_201))


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def queue() -> list[Any]:
    """T = 400. u0 takes 200; L (300) would be cut to the 200 left: held. Behind it: long new prompts (provably cut),
    a short one that fits, a prompt on a cached prefix whose 20-token extend fits (it must be matched, and is
    admitted whole), a prompt on the other cached prefix whose 150-token tail is longer than the 140 tokens left (cut,
    but matched all the same: SGLang's match refreshes its prefix's place in the LRU order)."""
    return [
        make_request("u0", prompt(1, 200)), make_request("L", prompt(1001, 300)),
        make_request("x1", prompt(2001, 300)), make_request("x2", prompt(3001, 250)),
        make_request("s0", prompt(5001, 40)), make_request("hit", SYSTEM + prompt(6001, 20)),
        make_request("x3", prompt(7001, 350)), make_request("tail", SYSTEM2 + prompt(8001, 150)),
    ]


def run(components: Any, screening: bool, kv_size: int = 16384
        ) -> tuple[list[list[tuple[str, int, int]]], list[str], dict[str, int]]:
    """(rid, prefix_len, extend_len) per round, the rids SGLang matched in the first pass, and each request's hold
    count after it."""
    h = PassHarness(components, arm="radixflow", token_budget=400, rows=8, kv_size=kv_size, mamba_cache_size=64,
                    producer_rows=0, chunk_last=True)
    h.cache.rf_sched.cut_screening = screening
    h.submit(make_request("sys", SYSTEM), make_request("sys2", SYSTEM2))
    h.run_rounds()  # both prompts are in the tree (and on hybrids their states at their ends)
    # One more round: a request of the last round could still be in flight under the overlap scheduler, and a
    # request sharing its key is matched (it might adopt it); two rounds on, the prompts are only the tree's.
    h.submit(make_request("gap", prompt(99_001, 10)))
    h.run_rounds()
    reqs = queue()
    h.submit(*reqs)
    with recording_matches() as matched:
        first = h.run_pass()
    holds = {r.rid: getattr(r, CUT_HOLDS, 0) for r in reqs}
    h.execute()
    rounds = [[(f.rid, f.prefix_len, f.extend_len) for f in r.fragments] for r in h.rounds[-1:]]
    rounds += [[(f.rid, f.prefix_len, f.extend_len) for f in r.fragments] for r in h.run_rounds()]
    h.assert_idle_invariants()  # nothing staged by a screened request, nothing leaked
    assert first, "the first pass admitted nothing"
    return rounds, matched, holds


@pytest.mark.parametrize("kv_size", [16384, 1200], ids=["roomy", "evicting"])
@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_screened_look_past_schedules_exactly_as_matching_every_request(components: Any, kv_size: int) -> None:
    """`evicting`: the pool is small enough that later rounds evict cached prefixes, so a prefix the first pass did
    not touch (a screened request's) would go first and change what `tail` finds."""
    matched_rounds, matched_all, holds_matched = run(components, screening=False, kv_size=kv_size)
    screened_rounds, matched_some, holds_screened = run(components, screening=True, kv_size=kv_size)
    assert screened_rounds == matched_rounds
    assert holds_screened == holds_matched
    # The whole ones behind the cut request ran in its round; L was cut from what they left.
    first = {rid for rid, _, _ in matched_rounds[0]}
    assert {"u0", "s0", "hit", "L"} <= first
    # Matching every request reached all of them (L twice: held, then offered); screening matched only those the
    # tree holds a prefix of.
    assert set(matched_all) >= {"x1", "x2", "x3", "tail"}
    assert not {"x1", "x2", "x3"} & set(matched_some)
    assert {"hit", "tail"} <= set(matched_some)
    assert holds_screened["x1"] == holds_screened["x3"] == 1


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_no_screen_when_the_memory_check_could_fail(components: Any) -> None:
    """A pool so small that x3's prompt and output budget exceed what memory is left once the whole requests are
    admitted: SGLang answers NO_TOKEN there and ends the scan. The proof cannot clear x3 of that, so it is matched and
    SGLang's own verdict decides; the schedule is still the matching pass's."""
    matched_rounds, _, holds_matched = run(components, screening=False, kv_size=900)
    screened_rounds, matched_some, holds_screened = run(components, screening=True, kv_size=900)
    assert screened_rounds == matched_rounds and holds_screened == holds_matched
    assert "x3" in matched_some and not {"x1", "x2"} & set(matched_some)
    assert "L" not in {rid for rid, _, _ in matched_rounds[0]}  # the scan ended on x3's NO_TOKEN: L waits


def test_screening_is_off_without_chunk_last() -> None:
    h = PassHarness(FULL, arm="radixflow", token_budget=400, rows=8, kv_size=16384, producer_rows=0, chunk_last=False)
    h.submit(*queue())
    with mock.patch.object(type(h.cache.rf_sched), "screen_cuts") as screen_cuts:
        h.run_rounds()
    screen_cuts.assert_not_called()
    h.assert_idle_invariants()
