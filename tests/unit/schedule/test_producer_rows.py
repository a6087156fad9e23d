"""Producer rows (RADIXFLOW_PRODUCER_ROWS = R, 2 by default; 0 is the paper's FCFS scan): in SGLang's real pass,
once S - R rows went to Ready non-producers, further ones are passed over while the scan looks S requests ahead for
producers, then offered again in the same pass. It may reorder admissions, never drop or delay one for nothing."""
from __future__ import annotations

from typing import Any

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.bench.replay import figure1_instance, make_instance, replay
from sglang_radixflow.config import ConfigError, load_config
from sglang_radixflow.schedule.prefix_request import prefix_rid
from sglang_radixflow.schedule.holds import HOLD_RUN_LIMIT

import pytest


def unrelated(n: int, length: int = 40) -> list[Any]:
    return [make_request(f"u{i}", list(range(1000 * i + 1, 1000 * i + 1 + length))) for i in range(n)]


def schedule(components: Any, reqs: list[Any], rows: int, producer_rows: int, tokens: int = 4096) -> list[Any]:
    h = PassHarness(components, token_budget=tokens, rows=rows, kv_size=16384, mamba_cache_size=64,
                    producer_rows=producer_rows)
    h.submit(*reqs)
    rounds = h.run_rounds()
    h.assert_idle_invariants()
    return rounds


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_with_no_producer_behind_them_held_requests_run_in_the_same_pass(components: Any) -> None:
    """Nothing to make room for: the held requests are offered again and the schedule is FCFS's, round by round
    (chunks included: the token budget cuts the same request at the same place)."""
    queue = lambda: unrelated(9, 40) + unrelated(3, 300)[1:]  # noqa: E731
    fcfs = schedule(components, queue(), rows=4, producer_rows=0, tokens=400)
    rows = schedule(components, queue(), rows=4, producer_rows=2, tokens=400)
    assert [r.fragments for r in rows] == [r.fragments for r in fcfs]


def test_a_producer_behind_ready_requests_gets_a_row_in_this_pass() -> None:
    """Four Ready requests then a new document's group, S = 4, R = 2 (hybrid: the producer publishes through a prefix
    request). FCFS fills round 1 with the Ready ones, runs the prefix alone in round 2 and the group in round 3;
    with producer rows the prefix runs in round 1 beside two of them, the third Ready one takes the row left over
    in the same pass, and three of the group finish a round earlier."""
    doc = list(range(50_000, 50_600))

    def rounds(producer_rows: int) -> list[list[str]]:
        group = [make_request(f"g{c}", doc + list(range(60_000 + 10 * c, 60_000 + 10 * c + 8))) for c in range(4)]
        result = schedule(HYBRID, unrelated(4) + group, rows=4, producer_rows=producer_rows, tokens=2048)
        return [[f.rid for f in r.fragments] for r in result]

    p = prefix_rid("g0", len(doc))
    assert rounds(0) == [["u0", "u1", "u2", "u3"], [p], ["g0", "g1", "g2", "g3"]]
    assert rounds(2) == [["u0", "u1", p, "u2"], ["u3", "g0", "g1", "g2"], ["g3"]]


def test_the_round_record_counts_producer_holds() -> None:
    """S = 4, R = 2: u2..u5 are passed over for the group behind them (whose first request produces its document),
    then u2 takes the row left."""
    doc = list(range(50_000, 50_600))
    group = [make_request(f"g{c}", doc + list(range(60_000 + 10 * c, 60_000 + 10 * c + 8))) for c in range(4)]
    h = PassHarness(FULL, token_budget=4096, rows=4, kv_size=16384, producer_rows=2)
    h.submit(*unrelated(6), *group)
    h.run_pass()
    _, stats, rows, tokens, waiting_after = h.cache.rf_sched.pending_pass
    record = h.cache.rf_sched.pass_record(stats, rows, tokens, waiting_after)
    assert record["producer_holds"] == 4 and record["admitted"] == ["u0", "u1", "g0", "u2"]


def published_consumers(components: Any, groups: int, producer_rows: int = 2) -> PassHarness:
    """A harness whose tree holds `groups` documents (a state at each one's end on a hybrid), with four consumers of
    each waiting: every one Ready from its document, none a producer (their tails differ at the first token)."""
    h = PassHarness(components, token_budget=65536, rows=8, kv_size=65536, mamba_cache_size=64,
                    producer_rows=producer_rows)
    docs = [list(range(10_000 * (g + 1), 10_000 * (g + 1) + 300)) for g in range(groups)]
    h.submit(*[make_request(f"d{g}", doc) for g, doc in enumerate(docs)])
    h.run_rounds()
    h.submit(*[make_request(f"g{g}c{c}", doc + list(range(100 * c + 1, 100 * c + 9)))
               for g, doc in enumerate(docs) for c in range(4)])
    return h


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_a_hold_no_producer_uses_admits_what_fcfs_admits(components: Any) -> None:
    """Published consumers fill a row-bound pass (S = 8, R = 2): none is a producer, so the held ones are offered
    again after HOLD_RUN_LIMIT more holds and the pass admits FCFS's requests, each from its document's state."""
    def first_pass(producer_rows: int) -> tuple[list[str], list[int], int]:
        h = published_consumers(components, groups=4, producer_rows=producer_rows)
        batch = h.run_pass()
        held = h.cache.rf_sched.pending_pass[1].held
        h.execute()
        h.run_rounds()
        h.assert_idle_invariants()
        return [r.rid for r in batch], [int(r.prefix_len) for r in batch], held

    held, fcfs = first_pass(producer_rows=2), first_pass(producer_rows=0)
    assert held[:2] == fcfs[:2] == ([f"g{g}c{c}" for g in range(2) for c in range(4)], [300] * 8)
    assert (held[2], fcfs[2]) == (HOLD_RUN_LIMIT + 1, 0)


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_a_producer_past_a_published_document_keeps_the_hold(components: Any) -> None:
    """The window's proof counts only what the tree holds: behind the consumers wait x0..x3, a new question on the
    first document (they share 70 tokens past it, their hit). x0 is a producer, so the hold is made and x0 gets a
    row (on the hybrid, its prefix request) ahead of g1c2 and g1c3."""
    h = published_consumers(components, groups=2)
    doc = list(range(10_000, 10_300))
    h.submit(*[make_request(f"x{c}", doc + list(range(70_000, 70_070)) + [90 + c] * 4) for c in range(4)])
    batch = h.run_pass()
    x0 = "x0" if components is FULL else prefix_rid("x0", 370)
    assert [r.rid for r in batch] == [f"g{g}c{c}" for g in range(2) for c in range(4)][:6] + [x0, "g1c2"]
    assert h.cache.rf_sched.pending_pass[1].held == 2  # g1c2 and g1c3, then x0 came
    h.execute()
    h.run_rounds()
    h.assert_idle_invariants()


def test_a_run_of_held_requests_ends_the_look_ahead() -> None:
    """A row-bound pass over a long queue with no producer in it (S = 64, R = 2): the scan stops looking for
    producers after HOLD_RUN_LIMIT more Ready requests in a row were held, instead of S positions (each one SGLang
    matched), and the held ones take the last rows in queue order."""
    h = PassHarness(FULL, token_budget=65536, rows=64, kv_size=65536, max_num_reqs=72, producer_rows=2)
    h.submit(*unrelated(200))
    h.run_pass()
    _, stats, rows, tokens, waiting_after = h.cache.rf_sched.pending_pass
    record = h.cache.rf_sched.pass_record(stats, rows, tokens, waiting_after)
    assert record["admitted"] == [f"u{i}" for i in range(64)]
    assert record["producer_holds"] == HOLD_RUN_LIMIT + 1  # u62 and the HOLD_RUN_LIMIT behind it, not 64


def test_producer_rows_fill_the_rounds_of_generated_instances() -> None:
    """The bench's multi-candidate instances: FCFS alternates token-bound producer rounds with empty rows and
    row-bound consumer rounds; keeping rows for producers fills them (fewer rounds, never more)."""
    fewer = {}
    for name in ("mc-cold", "mc-mixed"):
        inst = make_instance(name, questions=12, seed=0)
        fcfs, rows = replay(inst, "radixflow", producer_rows=0), replay(inst, "radixflow", producer_rows=2)
        assert rows.K <= fcfs.K and rows.empty_slots <= fcfs.empty_slots
        assert rows.tokens == fcfs.tokens  # the same reuse: only the packing changed
        fewer[name] = rows.K < fcfs.K
    # mc-cold: 10 -> 9 rounds; on mc-mixed the FCFS scan already packs its 8 rounds (one over the bound)
    assert fewer == {"mc-cold": True, "mc-mixed": False}
    fig1 = figure1_instance()
    assert replay(fig1, "radixflow", producer_rows=2).K == replay(fig1, "radixflow", producer_rows=0).K == 4  # bound


def test_the_variable_is_validated() -> None:
    assert load_config({"RADIXFLOW_PRODUCER_ROWS": "0"}).producer_rows == 0  # the paper's FCFS scan
    assert load_config({}).producer_rows == load_config({"RADIXFLOW_ARM": "radixflow+frag"}).producer_rows == 2
    with pytest.raises(ConfigError, match="RADIXFLOW_PRODUCER_ROWS='-1' is invalid; allowed: an integer >= 0"):
        load_config({"RADIXFLOW_PRODUCER_ROWS": "-1"})
