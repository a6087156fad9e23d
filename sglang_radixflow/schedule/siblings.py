"""Siblings: waiting requests that start with the same INDEX_PREFIX tokens in the same cache namespace.

A producer plans its boundary for its siblings, and promises are indexed by the same key, so a request is only ever
compared with the requests and promises that start as it does.
"""
from __future__ import annotations

from typing import Any, Optional

from sglang_radixflow.cache.promises import as_tokens
from sglang_radixflow.schedule.producers import namespace_of, request_tokens

INDEX_PREFIX = 8  # siblings are found by their first tokens; shorter shared prefixes are not worth a promise

SiblingKey = tuple  # (namespace, bytes of the first INDEX_PREFIX tokens): PromiseTable.head_key's form


def sibling_key(req: Any) -> Optional[SiblingKey]:
    """(namespace, first INDEX_PREFIX tokens) grouping siblings; None for requests too short to index."""
    tokens = request_tokens(req)
    if len(tokens) <= INDEX_PREFIX:
        return None
    return (namespace_of(req), as_tokens(tokens[:INDEX_PREFIX]).tobytes())


class SiblingIndex:
    """The waiting requests by sibling key, kept across passes so that a pass reads only its new arrivals (holding
    the requests keeps their ids from being reused meanwhile)."""

    def __init__(self) -> None:
        self._members: dict[int, tuple[Any, Optional[SiblingKey]]] = {}  # id -> (request, its key)
        self._groups: dict[SiblingKey, dict[int, Any]] = {}
        self._queue: list[Any] = []  # the indexed queue as SGLang left it after the last pass (`left`)

    def sync(self, waiting: list[Any]) -> None:
        """Index exactly the requests of `waiting` (SGLang's queue at the start of a pass)."""
        known = len(self._queue)
        if len(self._members) == known and waiting[:known] == self._queue:
            arrived = waiting[known:]  # the usual case: SGLang appends arrivals to the queue it left
        else:  # anything else (aborts, a reordering policy): compare ids
            present = {id(req) for req in waiting}
            for rid in [rid for rid in self._members if rid not in present]:
                self._remove(rid)
            arrived = waiting
        for req in arrived:
            if id(req) not in self._members:
                key = sibling_key(req)
                self._members[id(req)] = (req, key)
                if key is not None:
                    self._groups.setdefault(key, {})[id(req)] = req
        self._queue = list(waiting)

    def left(self, admitted: list[Any], remaining: list[Any]) -> None:
        """A pass admitted `admitted` and SGLang's queue is now `remaining`."""
        for req in admitted:
            if id(req) in self._members:
                self._remove(id(req))
        self._queue = list(remaining)

    def _remove(self, rid: int) -> None:
        _, key = self._members.pop(rid)
        if key is not None:
            group = self._groups[key]
            del group[rid]
            if not group:
                del self._groups[key]

    def key_of(self, req: Any) -> Optional[SiblingKey]:
        """req's sibling key: the one it was indexed under, else computed."""
        member = self._members.get(id(req))
        return member[1] if member is not None and member[0] is req else sibling_key(req)

    def group(self, key: Optional[SiblingKey]) -> list[Any]:
        """The indexed requests with this sibling key (none for None), in no particular order (no decision depends
        on it)."""
        group = self._groups.get(key) if key is not None else None
        return list(group.values()) if group else []
