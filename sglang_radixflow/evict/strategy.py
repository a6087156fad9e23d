"""The `rr` entry in SGLang's eviction-strategy table (`--radix-eviction-policy rr`).

SGLang's tree core builds a strategy object for whatever policy name it is given, so `rr` needs one. RR-Evict itself
does not rank nodes: the round-robin walk lives in the radixflow components (evict/round_robin.py). Whatever SGLang
still orders with the strategy outside those walks (host-tier eviction, the mamba fallback walk when no idle
trajectory is left) is ordered by recency, as under `lru`. Kept tiny: plugin.register() imports it in every process.
"""
from __future__ import annotations

from sglang.srt.mem_cache.evict_policy import LRUStrategy

POLICY_NAME = "rr"


class RoundRobinStrategy(LRUStrategy):
    """Recency order for SGLang's own walks; the RR rotation is not a per-node priority."""
