"""A chunked request's next chunk when the running batch's decode headroom has spent the prefill budget.

SGLang's single-pool budget lets the continuation of a chunked request through even then ("it must make progress
to release its KV") at its full chunk size, whatever the pool still holds; the allocation then fails and the
scheduler dies ("Out of memory. Try to lower your batch size."). Producers cut at their boundary make such
continuations common under radixflow, so its adder caps the chunk at the room the pool has (free + evictable KV)
and, with none, leaves it for a later pass while the running requests decode and free their KV.
"""
from __future__ import annotations

from typing import Any

import pytest
from sglang.srt.managers.schedule_batch import ScheduleBatch

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request

POOL = 600
BUDGET = 256
PROMPT = 500


def decoding_batch() -> ScheduleBatch:
    """A running request whose remaining decode (reserved at SGLang's new-token ratio) exceeds the whole pool."""
    return ScheduleBatch(reqs=[make_request("decoding", [1, 2, 3], max_new_tokens=4 * POOL)])


def first_chunk_then_pool_taken(components: Any, room: int) -> tuple[PassHarness, Any, Any]:
    """Round 1 runs the first BUDGET tokens of a PROMPT-token request; then the running batch's KV takes the pool
    down to `room` free tokens (nothing else is evictable: the chunk's own prefix is locked)."""
    h = PassHarness(components, token_budget=BUDGET, rows=4, kv_size=POOL, mamba_cache_size=16)
    h.submit(make_request("long", list(range(1000, 1000 + PROMPT))))
    assert [r.rid for r in h.run_pass()] == ["long"]
    h.execute()
    assert h.sched.chunked_req is not None and h.cache.full_evictable_size() == 0
    taken = h.allocator.alloc(h.allocator.available_size() - room)
    assert taken is not None and h.allocator.available_size() == room
    return h, h.sched.chunked_req, taken


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_a_continuation_is_cut_to_the_room_left(components: Any) -> None:
    h, long, taken = first_chunk_then_pool_taken(components, room=40)
    assert h.run_pass(running=decoding_batch()) == [long]
    # SGLang alone would extend min(BUDGET, PROMPT - BUDGET) = 244 tokens here and fail to allocate them.
    assert 0 < long.extend_len <= 40 - h.allocator.page_size
    assert h.cache.rf_sched.pending_pass[1].room_cuts == 1  # the round record's chunk_room_cuts
    launched = h.launch()  # allocates: no "Out of memory"
    h.allocator.free(taken)  # the running request finished (before the pool check, which would count it leaked)
    h.finish(launched)
    h.run_rounds()
    assert long.finished()
    h.assert_idle_invariants()


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_a_continuation_with_no_room_waits_and_nothing_else_runs(components: Any) -> None:
    h, long, taken = first_chunk_then_pool_taken(components, room=0)
    h.submit(make_request("short", [5, 6, 7]))
    assert h.run_pass(running=decoding_batch()) == []  # parked: a batch without it would miscount its chunks
    assert h.sched.chunked_req is long and long.extend_len == 0
    h.allocator.free(taken)
    h.run_rounds()
    assert long.finished() and h.waiting == []
    h.assert_idle_invariants()
