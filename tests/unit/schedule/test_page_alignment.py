"""Producers on a paged tree (page_size > 1, e.g. GPU attention backends): SGLang inserts and matches whole pages
only, so a boundary past the last whole page of the shared prefix would never be published, and siblings blocked on
it would be let through one at a time, each planning the same unreachable boundary again."""
from __future__ import annotations

import random

from sglang_radixflow.schedule.producers import PublishMode, plan_producer
from tests.unit.schedule.harness import make_request


def _siblings(doc_len: int = 600, tail: int = 20) -> list:
    rng = random.Random(0)
    doc = [rng.randrange(3, 2000) for _ in range(doc_len)]
    return [make_request(f"c{i}", doc + [rng.randrange(3, 2000) for _ in range(tail)]) for i in range(4)]


def _plan(reqs: list, state_hit: int, page_size: int):
    producer, siblings = reqs[0], reqs[1:]
    producer.prefix_len = state_hit
    return plan_producer(producer, siblings, min_gain=1, mode=PublishMode.KV, cache_chunk=1, page_size=page_size)


def test_the_boundary_is_the_last_whole_page_of_the_shared_prefix() -> None:
    reqs = _siblings()
    assert _plan(reqs, 0, page_size=1).boundary == 600
    plan = _plan(reqs, 0, page_size=16)
    assert (plan.boundary, plan.siblings) == (592, 3)
    assert {served for _, served in plan.shared} == {592}


def test_no_promise_when_rounding_leaves_nothing_past_the_state_hit() -> None:
    reqs = _siblings()
    # the document's whole pages are already in the tree (h = 592): the 8 tokens left can never be published alone
    assert _plan(reqs, 592, page_size=16) is None
    assert _plan(reqs, 592, page_size=1).boundary == 600  # unpaged, they can
