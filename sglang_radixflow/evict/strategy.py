"""The `rr` entry in SGLang's eviction-strategy table (`--radix-eviction-policy rr`) and its knobs.

SGLang's tree core builds a strategy object for whatever policy name it is given, with `--radix-eviction-policy-config`
(a JSON object) as keyword arguments, so `rr` needs one. RR-Evict itself does not rank nodes: the round-robin walk
lives in the radixflow components (evict/round_robin.py). Whatever SGLang still orders with the strategy outside those
walks (host-tier eviction, the mamba fallback walk when no idle trajectory is left) is ordered by recency, as under
`lru`. Kept tiny: plugin.register() imports it in every process.

The knobs, one source of truth: `--radix-eviction-policy-config '{"block": 32, "order": "share"}'`; a key left out
falls back to RADIXFLOW_RR_BLOCK / RADIXFLOW_RR_ORDER, then to the defaults (16 tokens in whole pages, share).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from sglang.srt.mem_cache.evict_policy import LRUStrategy

POLICY_NAME = "rr"
ORDERS = ("share", "cursor")
CONFIG_KEYS = ("block", "order")
CONFIG_HELP = (
    "block: tokens per tail unit on full-attention paths, a positive multiple of --page-size; "
    f"order: {' | '.join(ORDERS)} (which idle trajectory loses the next unit)"
)


def check_policy_config(config: Optional[Mapping[str, Any]], page_size: Optional[int] = None) -> dict[str, Any]:
    """The validated `--radix-eviction-policy-config` of `rr` (only the keys given). ValueError names the bad key or
    value and what is allowed."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"--radix-eviction-policy-config: unknown key(s) {', '.join(map(repr, unknown))} for "
            f"--radix-eviction-policy {POLICY_NAME}; allowed keys: {CONFIG_HELP}"
        )
    if "block" in config:
        block = config["block"]
        if isinstance(block, bool) or not isinstance(block, int) or block <= 0 or (page_size and block % page_size):
            raise ValueError(
                f"--radix-eviction-policy-config: block={block!r} is invalid for --radix-eviction-policy "
                f"{POLICY_NAME}; allowed: a positive integer" + (f", a multiple of the page size ({page_size})"
                                                                  if page_size else "")
            )
    if "order" in config and config["order"] not in ORDERS:
        raise ValueError(
            f"--radix-eviction-policy-config: order={config['order']!r} is invalid for --radix-eviction-policy "
            f"{POLICY_NAME}; allowed: {', '.join(ORDERS)}"
        )
    return config


class RoundRobinStrategy(LRUStrategy):
    """Recency order for SGLang's own walks; the RR rotation is not a per-node priority. Takes (and checks) the
    policy config SGLang passes as keyword arguments; the walks read it from the cache's init params."""

    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.config = check_policy_config(config)
