"""Siblings: waiting requests that start with the same INDEX_PREFIX tokens in the same cache namespace.

A producer plans its boundary for its siblings, and promises are indexed by the same key, so a request is only ever
compared with the requests and promises that start as it does. The groups are rebuilt for every pass that needs them
(a plain group-by of SGLang's waiting queue).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

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


class SiblingGroups:
    """The waiting requests of one pass, grouped by sibling key (each request once, in queue order)."""

    def __init__(self, waiting: Iterable[Any]) -> None:
        self._groups: dict[SiblingKey, dict[int, Any]] = {}
        for req in waiting:
            key = sibling_key(req)
            if key is not None:
                self._groups.setdefault(key, {})[id(req)] = req

    def siblings_of(self, req: Any) -> list[Any]:
        """The other waiting requests with req's sibling key (empty when it has none)."""
        key = sibling_key(req)
        group = self._groups.get(key, {}) if key is not None else {}
        return [other for other in group.values() if other is not req]
