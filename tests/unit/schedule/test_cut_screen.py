"""Chunk-last's look-past without matching (SchedulingState.screen_cuts, RadixFlowPrefillAdder._provably_cut): once a
cut request is held, the scan holds the requests that would be cut too at their positions, unmatched, when the tree's
path length proves that no match could leave them an extend that fits. On SGLang's real pass the schedule, the hold
counters and the pools are exactly those of matching every request; only SGLang's matches are saved."""
from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from sglang.srt.managers.schedule_batch import Req

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.schedule.state import CUT_HOLDS

SYSTEM = list(range(90_001, 90_301))  # two prompts (300, 200 tokens) the tree holds before the queue arrives
SYSTEM2 = list(range(95_001, 95_201))


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def queue() -> list[Any]:
    """T = 400. u0 takes 200; L (300) would be cut to the 200 left: held. Behind it: long new prompts (provably cut),
    a short one that fits, a prompt on a cached prefix whose 20-token extend fits (its path length makes a cut
    unprovable: it must be matched, and is admitted whole), a prompt on the other cached prefix whose 150-token tail
    is longer than the 140 tokens left (provably cut even with its whole path matched)."""
    return [
        make_request("u0", prompt(1, 200)), make_request("L", prompt(1001, 300)),
        make_request("x1", prompt(2001, 300)), make_request("x2", prompt(3001, 250)),
        make_request("s0", prompt(5001, 40)), make_request("hit", SYSTEM + prompt(6001, 20)),
        make_request("x3", prompt(7001, 350)), make_request("tail", SYSTEM2 + prompt(8001, 150)),
    ]


def run(components: Any, screening: bool) -> tuple[list[list[tuple[str, int, int]]], list[str], dict[str, int]]:
    """(rid, prefix_len, extend_len) per round, the rids SGLang matched in the first pass, and each request's hold
    count after it."""
    h = PassHarness(components, arm="radixflow", token_budget=400, rows=8, kv_size=16384, mamba_cache_size=64,
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
    matched: list[str] = []
    orig = Req.init_next_round_input

    def matching(self: Req, *a: Any, **k: Any) -> Any:
        matched.append(self.rid)
        return orig(self, *a, **k)

    with mock.patch.object(Req, "init_next_round_input", matching):
        first = h.run_pass()
    holds = {r.rid: getattr(r, CUT_HOLDS, 0) for r in reqs}
    h.execute()
    rounds = [[(f.rid, f.prefix_len, f.extend_len) for f in r.fragments] for r in h.rounds[-1:]]
    rounds += [[(f.rid, f.prefix_len, f.extend_len) for f in r.fragments] for r in h.run_rounds()]
    h.assert_idle_invariants()  # nothing staged by a screened request, nothing leaked
    assert first, "the first pass admitted nothing"
    return rounds, matched, holds


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_screened_look_past_schedules_exactly_as_matching_every_request(components: Any) -> None:
    matched_rounds, matched_all, holds_matched = run(components, screening=False)
    screened_rounds, matched_some, holds_screened = run(components, screening=True)
    assert screened_rounds == matched_rounds
    assert holds_screened == holds_matched
    # The whole ones behind the cut request ran in its round; L was cut from what they left.
    first = {rid for rid, _, _ in matched_rounds[0]}
    assert {"u0", "s0", "hit", "L"} <= first
    # Matching every request reached all of them (L twice: held, then offered); screening matched only the one
    # whose match could make it fit.
    assert set(matched_all) >= {"x1", "x2", "x3", "tail"}
    assert not {"x1", "x2", "x3", "tail"} & set(matched_some)
    assert "hit" in matched_some
    assert holds_screened["x1"] == holds_screened["tail"] == 1


def test_no_screen_when_the_memory_check_could_fail() -> None:
    """SGLang answers NO_TOKEN (and ends the scan) when a request's prompt and output budget exceed what memory
    is left: a request the proof cannot clear of that is matched, so SGLang's own verdict decides."""
    h = PassHarness(FULL, arm="radixflow", token_budget=400, rows=8, kv_size=16384, producer_rows=0, chunk_last=True)
    reqs = queue()
    h.submit(*reqs)
    proofs: list[bool] = []
    from sglang_radixflow.schedule.adder import RadixFlowPrefillAdder

    orig = RadixFlowPrefillAdder._provably_cut

    def tight(self: Any, req: Any) -> bool:
        with mock.patch.object(type(self.memory_budget), "remaining_total", new_callable=mock.PropertyMock,
                               return_value=len(req.origin_input_ids) + 1):
            proofs.append(orig(self, req))
        return proofs[-1]

    with mock.patch.object(RadixFlowPrefillAdder, "_provably_cut", tight):
        h.run_pass()
    assert proofs and not any(proofs)


def test_screening_is_off_without_chunk_last() -> None:
    h = PassHarness(FULL, arm="radixflow", token_budget=400, rows=8, kv_size=16384, producer_rows=0, chunk_last=False)
    h.submit(*queue())
    with mock.patch.object(type(h.cache.rf_sched), "screen_cuts") as screen_cuts:
        h.run_rounds()
    screen_cuts.assert_not_called()
    h.assert_idle_invariants()
