"""The round record of a prefill pass (per-round observability): Σĥ and Σh of the admitted requests, each one's
first-selection wait, and ĥ / h in each request's meta channel, on SGLang's real pass over a tree holding a published
document."""
from __future__ import annotations

import time

import pytest

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.observe.meta import META_STATE_HIT, META_TOKEN_HIT
from tests.unit.cache.helpers import CacheDriver

DOC = list(range(5_000, 5_300))


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_the_pass_record_sums_hits_and_times_first_selection(components: tuple) -> None:
    h = PassHarness(components, token_budget=4096, rows=8, kv_size=16384)
    CacheDriver(h.cache, h.allocator, h.pool).insert(DOC)  # with a state at its end on the hybrid
    h.forward_ct += 1  # the inserting round has ended: the document is published
    early = make_request("early", DOC + [7, 8, 9])
    future = make_request("future", DOC + [17, 18])
    unrecorded = make_request("unrecorded", list(range(90_000, 90_040)))
    channel_user = make_request("channel_user", DOC + [27])
    channel_user.customized_info = {"other": ["kept"]}  # SGLang's channel already in use: ĥ and h join it
    partial = make_request("partial", DOC[:250] + [37, 38])  # on the hybrid no state at 250: ĥ = 250, h = 0
    h.submit(early, future, unrecorded, channel_user, partial)
    now = time.perf_counter()
    early.time_stats.wait_queue_entry_time = now - 5.0
    future.time_stats.wait_queue_entry_time = now + 1_000.0  # a clock read after the pass began: no negative wait
    unrecorded.time_stats.wait_queue_entry_time = 0.0  # SGLang's "never entered": no wait recorded

    admitted = h.run_pass()

    assert [r.rid for r in admitted] == ["early", "future", "unrecorded", "channel_user", "partial"]
    _, stats, rows, tokens, waiting_after = h.cache.rf_sched.pending_pass
    record = h.cache.rf_sched.pass_record(stats, rows, tokens, waiting_after)
    assert record["admitted"] == ["early", "future", "unrecorded", "channel_user", "partial"]
    # Three consumers match the whole published document, on the hybrid its state at the end too; the partial one
    # matches 250 tokens of its KV, which on the hybrid holds no state there.
    partial_state_hit = 0 if components is HYBRID else 250
    assert record["token_hit_sum"] == 3 * len(DOC) + 250
    assert record["state_hit_sum"] == 3 * len(DOC) + partial_state_hit
    first, second, *_ = record["first_selection_wait_s"]
    assert 5.0 <= first < 65.0
    assert second == 0.0
    for req, hit in ((early, len(DOC)), (future, len(DOC)), (unrecorded, 0)):
        assert req.customized_info == {META_TOKEN_HIT: [hit], META_STATE_HIT: [hit]}
    assert partial.customized_info == {META_TOKEN_HIT: [250], META_STATE_HIT: [partial_state_hit]}
    assert channel_user.customized_info == {"other": ["kept"], META_TOKEN_HIT: [len(DOC)], META_STATE_HIT: [len(DOC)]}
