"""ĥ and h per request in the response's meta_info, through SGLang's customized-info channel (no SGLang file
patched). The keys are request-level (plugin.py tells SGLang's output streamer), so they are emitted once, when the
request finishes: meta_info["radixflow_token_hit"] == [ĥ], meta_info["radixflow_state_hit"] == [h] at admission.
"""
from __future__ import annotations

from typing import Any

META_TOKEN_HIT = "radixflow_token_hit"
META_STATE_HIT = "radixflow_state_hit"
META_KEYS = frozenset({META_TOKEN_HIT, META_STATE_HIT})


def note_hits(req: Any, token_hit: int, state_hit: int) -> None:
    """Write an admitted request's ĥ and h to its channel; where another user's dict is there, keep its keys."""
    if req.customized_info is None:
        req.customized_info = {}
    req.customized_info.setdefault(META_TOKEN_HIT, [token_hit])
    req.customized_info.setdefault(META_STATE_HIT, [state_hit])
