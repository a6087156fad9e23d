"""ĥ and h per request in the response's meta_info, through SGLang's customized-info channel (no SGLang file
patched). The keys are request-level (plugin.py tells SGLang's output streamer), so they are emitted once, when the
request finishes: meta_info["radixflow_token_hit"] == [ĥ], meta_info["radixflow_state_hit"] == [h] at admission.
"""
from __future__ import annotations

import itertools
import operator
from collections import deque
from typing import Any, Sequence

META_TOKEN_HIT = "radixflow_token_hit"
META_STATE_HIT = "radixflow_state_hit"
META_KEYS = frozenset({META_TOKEN_HIT, META_STATE_HIT})


_CUSTOMIZED_INFO = operator.attrgetter("customized_info")


def note_admitted_metas(reqs: Sequence[Any], token_hits: Sequence[int], state_hits: Sequence[int]) -> None:
    """Write ĥ and h of each of a pass's admitted requests (in the same order) to its channel: a new dict each where
    the channel is unused (the common case, in C); where another user's dict is there, added to it, its keys kept."""
    unused = list(map(operator.is_, map(_CUSTOMIZED_INFO, reqs), itertools.repeat(None)))
    if not all(unused):
        for req, token_hit, state_hit in itertools.compress(zip(reqs, token_hits, state_hits),
                                                             map(operator.not_, unused)):
            req.customized_info.setdefault(META_TOKEN_HIT, [token_hit])
            req.customized_info.setdefault(META_STATE_HIT, [state_hit])
        reqs, token_hits, state_hits = (list(itertools.compress(x, unused)) for x in (reqs, token_hits, state_hits))
    pairs = zip(zip(itertools.repeat(META_TOKEN_HIT), map(list, zip(token_hits))),
                zip(itertools.repeat(META_STATE_HIT), map(list, zip(state_hits))))
    deque(map(setattr, reqs, itertools.repeat("customized_info"), map(dict, pairs)), maxlen=0)
