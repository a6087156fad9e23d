"""The paper's Figure-1 instance on SGLang's real scheduler (hybrid model, CPU `no_buffer` mode), round by round.

Paper: 15 fragments, 12,970 tokens, S = 4 rows, T = 4096 tokens per round, dependency depth D = 2; prefix-stop takes
6 rounds with 9 empty row slots, state-ready traversal 4 rounds (= max(ceil(W/T), ceil(V/S), D) = 4) with 1.

The note gives only the totals, so the instance is constructed (sizes in tokens):
- group a: 4 branches = a 1,200-token shared document + a distinct 900-token continuation each;
- group b: the same with a 1,000-token document;
- 5 unrelated requests of 800, 700, 900, 650 and 520 tokens;
- FCFS queue, all waiting at round 1 (no arrivals): a0 a1 a2 a3 u1 u2 u3 u4 b0 b1 b2 b3 u5; every request
  generates one token (finishes at prefill, as in the paper's evaluation).
A fragment is one row of one round. On a hybrid without the extra buffer a state exists only at the end of an
extend, so a producer publishes its document through a prefix request, an extend of its first b tokens (`a0#p`
below; radixflow's default; with prefix requests off, a chunk of a0 cut at b, the same fragment): group a =
a0[0,1200) (depth 1), then a0[1200,2100) and a1..a3 from h = 1200 (depth 2), 5 fragments and 1,200 + 4 x 900 = 4,800
tokens; group b = 5 fragments, 4,600 tokens; the unrelated requests = 5 fragments, 3,570 tokens. V = 15, W = 12,970,
D = 2. Why this order: group b sits behind four unrelated requests so that traversal's first round fills its 4 rows
before reaching it. Every admitted fragment fits the remaining budget whole, so SGLang never chunks for budget and
both arms run the same 15 fragments:
- traversal:   [a0#p, u1, u2, u3] [a0 tail, a1, a2, a3] [u4, b0#p, u5] [b0 tail, b1, b2, b3] -> 4 rounds, 1 empty
  (the paper's FCFS scan, RADIXFLOW_PRODUCER_ROWS=0; the default R = 2 packs differently, also 4 rounds, 1 empty);
- prefix-stop: [a0#p] [a0 tail, a1, a2, a3] [u1..u4] [b0#p] [b0 tail, b1, b2, b3] [u5] -> 6 rounds, 9 empty
  (a Blocked a0 / a1 / b1 ends the scan, so u1 / u5 wait a round behind it).
Native SGLang (reference) admits siblings together; each recomputes its document (the split document node has no
state), budget-chunked: 17 fragments, 19,570 tokens, 6 rounds, 7 empty slots.
"""
from __future__ import annotations

from typing import Optional

from sglang_radixflow.bench.passes import HYBRID, PassHarness, RoundRecord, make_request
from sglang_radixflow.bench.replay import (
    FIG1_BRANCH as BRANCH, FIG1_DOCS as DOCS, FIG1_ORDER as ORDER, FIG1_S as S, FIG1_T as T,
    FIG1_UNRELATED as UNRELATED, Instance, dependency_depth as _depth, figure1_instance as build_instance,
)
from sglang_radixflow.bench.bounds import empty_row_slots, round_lower_bound
from sglang_radixflow.schedule.prefix_request import prefix_rid

W, V, D = 12_970, 15, 2


def run(arm: str, producer_rows: Optional[int] = None) -> tuple[list[RoundRecord], Instance]:
    instance = build_instance()
    h = PassHarness(HYBRID, arm=arm, token_budget=T, rows=S, kv_size=16384, mamba_cache_size=64, max_context_len=4096,
                    producer_rows=producer_rows)
    h.submit(*(make_request(rid, p) for rid, p in instance.prompts.items()))
    rounds = h.run_rounds()
    h.assert_idle_invariants()  # leak-free: every slot back in the allocator or the tree
    return rounds, instance


def dependency_depth(rounds: list[RoundRecord], instance: Instance) -> int:
    return _depth(rounds, instance.prompts)


def test_instance_matches_the_paper_totals() -> None:
    instance = build_instance()
    assert len(ORDER) == 13 and set(ORDER) == set(instance.prompts)
    assert sum(DOCS.values()) + 8 * BRANCH + sum(UNRELATED.values()) == W
    assert round_lower_bound(W, V, D, S=S, T=T) == 4


def prefix(rid: str) -> str:
    """The rid of the prefix request publishing `rid`'s document."""
    return prefix_rid(rid, DOCS[rid[0]])


def test_traversal_reaches_the_lower_bound() -> None:
    rounds, instance = run("radixflow", producer_rows=0)  # the paper's FCFS scan, round by round
    assert [r.rids for r in rounds] == [
        [prefix("a0"), "u1", "u2", "u3"], ["a0", "a1", "a2", "a3"], ["u4", prefix("b0"), "u5"], ["b0", "b1", "b2", "b3"],
    ]
    assert sum(r.rows for r in rounds) == V and sum(r.tokens for r in rounds) == W
    assert all(r.rows <= S and r.tokens <= T for r in rounds)
    assert dependency_depth(rounds, instance) == D
    assert len(rounds) == round_lower_bound(W, V, D, S=S, T=T) == 4
    assert empty_row_slots([r.rows for r in rounds], S) == 1
    # Consumers start from the document state the producer published one round earlier.
    assert rounds[1].fragment("a1").prefix_len == DOCS["a"] and rounds[3].fragment("b3").prefix_len == DOCS["b"]


def test_the_default_arm_packs_the_same_fragments_into_the_lower_bound() -> None:
    """The default radixflow arm (producer rows R = 2): after S - R = 2 unrelated requests the scan looks ahead and
    admits b's producer in round 1; still the bound, 4 rounds with 1 empty slot, over the same 15 fragments."""
    rounds, instance = run("radixflow")
    paper, _ = run("radixflow", producer_rows=0)
    assert [r.rids for r in rounds] != [r.rids for r in paper]  # the default really is not the FCFS order here
    assert sorted(f for r in rounds for f in r.fragments) == sorted(f for r in paper for f in r.fragments)
    assert all(r.rows <= S and r.tokens <= T for r in rounds)
    assert dependency_depth(rounds, instance) == D
    assert len(rounds) == 4 and empty_row_slots([r.rows for r in rounds], S) == 1


def test_prefix_stop_takes_six_rounds_with_nine_empty_slots() -> None:
    rounds, instance = run("prefix-stop")
    assert [r.rids for r in rounds] == [
        [prefix("a0")], ["a0", "a1", "a2", "a3"], ["u1", "u2", "u3", "u4"], [prefix("b0")], ["b0", "b1", "b2", "b3"],
        ["u5"],
    ]
    assert sum(r.rows for r in rounds) == V and sum(r.tokens for r in rounds) == W  # the same fragments
    assert all(r.rows <= S and r.tokens <= T for r in rounds)
    assert dependency_depth(rounds, instance) == D
    assert len(rounds) == 6
    assert empty_row_slots([r.rows for r in rounds], S) == 9


def test_both_arms_run_the_same_fragments() -> None:
    """Same fragments (so the same W, V, D and the same lower bound); only their packing into rounds differs."""
    traversal, _ = run("radixflow")
    stop, _ = run("prefix-stop")
    frags = lambda rounds: sorted(f for r in rounds for f in r.fragments)  # noqa: E731
    assert frags(traversal) == frags(stop)


def test_native_sglang_reference() -> None:
    rounds, instance = run("sglang")
    assert len(rounds) == 6
    assert sum(r.rows for r in rounds) == 17 and sum(r.tokens for r in rounds) == 19_570
    assert empty_row_slots([r.rows for r in rounds], S) == 7
    # No branch starts from a document state: every fragment starts at 0 or continues its own budget chunk.
    for r in rounds:
        for f in r.fragments:
            assert f.prefix_len == 0 or f.prefix_len not in DOCS.values()
    assert dependency_depth(rounds, instance) == 2  # only chunk continuations depend on anything

