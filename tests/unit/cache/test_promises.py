"""Promise table: life cycle, blocking rule, boundary choice."""
from __future__ import annotations

from array import array

import pytest

from sglang_radixflow.cache.promises import PromiseState, PromiseTable, best_boundary, longest_common_prefix

DOC = list(range(100, 200))


def test_blocking_requires_namespace_prefix_gain_and_key_limit() -> None:
    table = PromiseTable()
    table.register("ns", DOC[:80], 80, "p", round_id=1)
    consumer = array("q", DOC + [1, 2, 3])
    assert table.blocking("ns", consumer, state_hit=0, key_limit=102, min_gain=1) is not None
    assert table.blocking("other", consumer, 0, 102, 1) is None  # never across namespaces
    assert table.blocking("ns", DOC[:50] + [9] * 60, 0, 109, 1) is None  # does not share the prefix
    assert table.blocking("ns", consumer, state_hit=80, key_limit=102, min_gain=1) is None  # nothing to gain
    assert table.blocking("ns", consumer, state_hit=0, key_limit=79, min_gain=1) is None  # cannot use b
    assert table.blocking("ns", consumer, 0, 102, 1, exclude_rid="p") is None  # the producer itself


def test_deepest_open_promise_wins_and_closed_ones_never_block() -> None:
    table = PromiseTable()
    shallow = table.register("ns", DOC[:40], 40, "a", 1)
    deep = table.register("ns", DOC[:90], 90, "b", 1)
    assert table.blocking("ns", DOC, 0, 99, 1) is deep
    table.cancel(deep, 2, "aborted")
    assert deep.state is PromiseState.CANCELLED
    assert table.blocking("ns", DOC, 0, 99, 1) is shallow
    table.publish(shallow, 2)
    assert table.blocking("ns", DOC, 0, 99, 1) is None
    assert (table.counters.registered, table.counters.published, table.counters.cancelled) == (2, 1, 1)
    with pytest.raises(AssertionError):
        table.publish(deep, 3)  # a closed promise stays closed


def test_expiry_and_producer_cancellation() -> None:
    table = PromiseTable()
    table.register("ns", DOC[:10], 10, "old", 1)
    table.register("ns", DOC[:20], 20, "new", 5)
    table.register("ns", DOC[:30], 30, "new", 5)
    assert table.expire(round_id=10, max_age_rounds=8) == 1
    assert table.cancel_producer("new", 10, "finished without publishing") == 2
    assert len(table) == 0 and table.producers() == set()
    assert table.counters.cancel_reasons == {"expired": 1, "finished without publishing": 2}


def test_lcp_and_boundary_choice() -> None:
    assert longest_common_prefix(array("q", DOC), DOC[:37] + [0]) == 37
    assert longest_common_prefix([], DOC) == 0
    # three siblings share 100 tokens, one shares 300: 3 x 100 beats 1 x 300 - nothing.
    assert best_boundary([100, 100, 100, 150], floor=0) == 100
    assert best_boundary([100, 400], floor=0) == 400
    assert best_boundary([10, 20], floor=20) == 0


def test_partial_promises_serve_whole_pages_only() -> None:
    """SGLang's tree holds whole pages: a full-attention promise serves the shared part rounded down to a page, and a
    boundary that is not a page multiple is refused (the planner rounds it)."""
    table = PromiseTable()
    doc = list(range(1000, 1100))
    promise = table.register("ns", doc[:96], 96, "p", 1, partial=True, page_size=16)
    assert promise.serves("ns", doc[:70] + [1] * 40) == 64  # 70 shared: 4 pages
    assert promise.serves("ns", doc) == 96
    assert table.blocking("ns", doc[:70] + [1] * 40, state_hit=64, key_limit=109, min_gain=1) is None  # no page to gain
    assert table.blocking("ns", doc[:70] + [1] * 40, state_hit=48, key_limit=109, min_gain=1) is promise
    with pytest.raises(AssertionError, match="not a multiple of the page"):
        table.register("ns", doc[:90], 90, "q", 1, partial=True, page_size=16)
