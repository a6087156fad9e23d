"""Requests in flight: admitted by a recent pass, their KV (and tracked state) not in the tree yet. Under SGLang's
overlap scheduler a late sibling adopts one as its producer (full attention, extra_buffer hybrids). See docs/design.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from sglang_radixflow.cache.promises import longest_common_prefix
from sglang_radixflow.schedule.producers import request_tokens
from sglang_radixflow.schedule.siblings import SiblingKey, sibling_key


@dataclass(slots=True)
class InFlightRequest:
    req: Any
    extend_end: int  # its KV up to here lands when its round's results are processed
    admitted_round: int


@dataclass(frozen=True)
class Adoption:
    """An in-flight request that will land `boundary` tokens of a waiting request's useful prefix."""

    producer: Any
    boundary: int


def lands_under_token_ids(req: Any) -> bool:
    """Whether the request's KV enters the tree under its token ids (no session, no multimodal or embedding input,
    not barred from the tree): only such a request can be adopted."""
    return (
        req.session is None and req.multimodal_inputs is None and req.input_embeds is None
        and not req.skip_radix_cache_insert
    )


def tracked_in_extend(req: Any) -> int:
    """extra_buffer: where SGLang snapshots a state inside the in-flight extend (set by its prepare_for_extend), or 0
    when it snapshots none (an older value at or before the extend's start is already in the tree)."""
    tracked = req.kv.mamba_last_track_seqlen
    return int(tracked) if tracked is not None and tracked > int(req.prefix_len) else 0


class InFlightTable:
    def __init__(self) -> None:
        self._by_key: dict[SiblingKey, dict[int, InFlightRequest]] = {}

    def track(self, req: Any, key: Optional[SiblingKey], round_id: int) -> None:
        """req (sibling key `key`) was admitted in round `round_id`."""
        if key is None or not lands_under_token_ids(req):
            return
        assert isinstance(req.extend_end, int), "Req.extend_end is an int once admitted"
        self._by_key.setdefault(key, {})[id(req)] = InFlightRequest(req, req.extend_end, round_id)

    def landed(self, req: Any) -> None:
        """The request's KV entered the tree, or it left: nothing left to adopt."""
        key = sibling_key(req) if self._by_key else None
        group = self._by_key.get(key) if key is not None else None
        if group is not None:
            group.pop(id(req), None)
            if not group:
                del self._by_key[key]

    def forget_before(self, round_id: int) -> None:
        """Drop entries admitted before `round_id`: their round's results were processed under either event loop,
        so whatever they will ever land is in the tree (or was evicted since: then nothing is coming)."""
        for key, group in list(self._by_key.items()):
            for rid in [rid for rid, entry in group.items() if entry.admitted_round < round_id]:
                del group[rid]
            if not group:
                del self._by_key[key]

    def on_key(self, key: Optional[SiblingKey]) -> list[InFlightRequest]:
        group = self._by_key.get(key) if key is not None else None
        return list(group.values()) if group else []

    def best_adoption(self, req: Any, entries: list[InFlightRequest], tokens: Sequence[int], need: int, limit: int,
                      partial: bool, page_size: int) -> Optional[Adoption]:
        """Of `entries` (on req's key), the in-flight request that will land the most of `req`'s first `limit`
        tokens, at least `need` of them.
        Full attention (`partial`): its whole extend, shared in part. extra_buffer hybrid: the one state SGLang
        snapshots inside the extend, which `req` must share whole."""
        best: Optional[tuple[Any, int, int]] = None  # (request, tokens it serves req, boundary of its promise)
        for entry in entries:
            other = entry.req
            if other is req:
                continue
            end = entry.extend_end if partial else tracked_in_extend(other)
            if end < need:
                continue
            shared = min(longest_common_prefix(tokens, request_tokens(other)), end, limit)
            shared -= shared % page_size
            if shared >= need and (partial or shared == end) and (best is None or shared > best[1]):
                best = (other, shared, end - end % page_size)
        return Adoption(best[0], best[2]) if best is not None else None
