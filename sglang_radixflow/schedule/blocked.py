"""The Blocked verdict: a waiting request whose useful prefix is being produced (by an open promise, or a request in
flight it adopts) waits one round instead of recomputing it, within its deferral bound. See docs/design.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from sglang_radixflow.cache.promises import Promise, PromiseTable
from sglang_radixflow.schedule.in_flight import Adoption, InFlightTable
from sglang_radixflow.schedule.producers import key_limit, namespace_of, request_tokens
from sglang_radixflow.schedule.siblings import SiblingKey

DEFER_COUNT = "rf_defer_rounds"  # per-request attribute: passes this request was deferred as Blocked


@dataclass(frozen=True)
class BlockingRules:
    min_gain: int  # tokens past h a promise must publish to be worth waiting for
    max_defer_rounds: int  # past this many deferrals a request runs from h
    partial: bool  # full attention: a promise serves every prefix of its tokens; hybrids publish one state, at b
    page_size: int


def blocked_on(req: Any, key: Optional[SiblingKey], promises: PromiseTable, in_flight: InFlightTable,
               rules: BlockingRules, bounded: bool = True) -> Union[Promise, Adoption, None]:
    """What `req` (whose sibling key is `key`) must wait for: the open promise that serves the most of its prefix,
    else the in-flight request to adopt; None when it is Ready (or, `bounded`, past its deferral bound)."""
    if bounded and getattr(req, DEFER_COUNT, 0) >= rules.max_defer_rounds:
        return None
    candidates = promises.candidates(key)
    waiting_on = in_flight.on_key(key)
    if not candidates and not waiting_on:
        return None
    tokens = request_tokens(req)
    state_hit = int(req.prefix_len)
    limit = key_limit(req, tokens)
    promise = promises.blocking(namespace_of(req), tokens, state_hit, limit, rules.min_gain,
                                exclude_rid=str(req.rid), candidates=candidates)
    if promise is not None or not waiting_on:
        return promise
    return in_flight.best_adoption(req, waiting_on, tokens, state_hit + rules.min_gain, limit, rules.partial,
                                   rules.page_size)
