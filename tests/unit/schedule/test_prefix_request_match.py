"""A producer hands its match to its prefix request (adder.take_match) instead of the prefix request matching again.

The hand-over must stage exactly what SGLang's own match of the prefix request's tokens would: the same hits, nodes,
copy-on-write state source and protected length, and it must leave the producer holding nothing (its mamba slot is
the prefix request's now). Real cache, pools and Req on CPU.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sglang_radixflow.schedule.adder import can_take_match, take_match
from sglang_radixflow.schedule.prefix_request import make_prefix_request
from tests.unit.cache.helpers import HYBRID
from tests.unit.schedule.harness import PassHarness, make_request

DOC = list(range(1000, 1600))  # 600 shared tokens
WARM = 200  # the tree holds the document's first 200 tokens, with a state there


def warmed() -> PassHarness:
    h = PassHarness(HYBRID, arm="radixflow", kv_size=8192, mamba_cache_size=64)
    h.submit(make_request("warm", DOC[:WARM], max_new_tokens=1))
    h.run_rounds()
    return h


def _fields(req: Any) -> dict[str, Any]:
    kv = {f"kv.{f.name}": getattr(req.kv, f.name) for f in dataclasses.fields(req.kv)}
    return {**{k: v for k, v in vars(req).items() if k != "kv"}, **kv}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if hasattr(a, "__len__") and hasattr(b, "__len__") and not isinstance(a, str):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b or a == b


def test_the_handed_over_match_is_the_one_sglang_would_stage() -> None:
    h = warmed()
    producer = make_request("c0", DOC + list(range(20)))
    producer.init_next_round_input(h.cache)
    assert producer.prefix_len == WARM and producer.kv.mamba_cow_src_index is not None  # a state to copy
    staged_slot = producer.kv.mamba_pool_idx
    unmatched = make_prefix_request(producer, len(DOC))  # what matching changes: this against a matched one
    expected = make_prefix_request(producer, len(DOC))
    expected.init_next_round_input(h.cache)
    changed = {k for k, v in _fields(expected).items() if not _same(v, _fields(unmatched).get(k))}
    changed.discard("time_stats")  # construction instants of the two requests, not the match
    # what SGLang's match stages here (the test is only as good as this set is complete)
    assert {"prefix_len", "last_node", "best_match_node", "num_matched_prefix_tokens", "kv.cache_protected_len",
            "kv.mamba_cow_src_index", "kv.mamba_pool_idx"} <= changed
    assert can_take_match(producer, len(DOC), page_size=1)
    got = make_prefix_request(producer, len(DOC))
    take_match(got, producer)
    got_fields, want = _fields(got), _fields(expected)
    differ = sorted(k for k in changed - {"kv.mamba_pool_idx"} if not _same(got_fields[k], want[k]))
    assert differ == []
    # the producer's slot moved to its prefix request; the producer holds nothing, as after release_staged
    assert got.kv.mamba_pool_idx is staged_slot
    assert producer.kv.mamba_pool_idx is None and producer.kv.mamba_cow_src_index is None
    assert not producer.kv.mamba_needs_clear


def test_a_producer_whose_walk_reached_the_boundary_matches_its_prefix_request_again() -> None:
    """When the tree holds the producer's tokens up to b or past it, a walk of its first b tokens stops elsewhere
    (at b, where a node may be split): the producer's match is not the prefix request's."""
    h = warmed()
    h.submit(make_request("seen", DOC + [7, 7, 7], max_new_tokens=1))  # KV of the whole document, state at its end
    h.run_rounds()
    producer = make_request("c0", DOC + list(range(20)))
    producer.init_next_round_input(h.cache)
    assert producer.rf_token_hit >= len(DOC)
    assert not can_take_match(producer, len(DOC), page_size=1)
    assert can_take_match(producer, producer.rf_token_hit + 2, page_size=1)
    assert not can_take_match(producer, producer.rf_token_hit + 2, page_size=16)


def test_a_pass_admits_the_prefix_request_from_the_producers_match_and_leaks_nothing() -> None:
    """The real pass: the prefix request starts from the producer's state-ready hit with the producer's slot, one
    mamba slot is staged for the pair (not two), and the rounds drain with SGLang's idle checks passing."""
    h = warmed()
    free = h.pool.mamba_allocator.available_size()
    h.submit(*[make_request(f"c{i}", DOC + list(range(10 * i, 10 * i + 20))) for i in range(4)])
    batch = h.run_pass()
    prefix_req = batch[0]
    assert prefix_req.prefix_len == WARM and prefix_req.kv.mamba_cow_src_index is not None
    assert h.pool.mamba_allocator.available_size() == free - 1
    assert all(not r.kv.holds_mamba for r in h.waiting)
    h.execute()
    h.run_rounds()
    assert not h.waiting
    h.assert_idle_invariants()
