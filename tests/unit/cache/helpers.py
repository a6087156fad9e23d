"""Build real SGLang pools + a RadixFlowCache (or SGLang's UnifiedRadixCache) on CPU for in-process tests.

Uses SGLang's own test kit (sglang/test/kits/unified_radix_cache/fixtures.build_fixture), which wires real
HybridReqToTokenPool / HybridLinearKVPool / TokenToKVPoolAllocator; only the device is pinned to "cpu".
"""
from __future__ import annotations

from array import array
from typing import Optional, Sequence

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_radixflow.bench.passes import FULL, HYBRID, build_cache, cache_config  # noqa: F401  (re-exported)
from sglang_radixflow.cache.tree import RadixFlowCache


def build(cache_class: type[UnifiedRadixCache], components: Sequence[ComponentType], **cfg: object):
    """(cache, allocator, req_to_token_pool) with SGLang's real CPU pools."""
    return build_cache(cache_class, components, **cfg)


def build_radixflow(components: Sequence[ComponentType], **cfg: object):
    return build(RadixFlowCache, components, **cfg)


class CacheDriver:
    """Inserts / matches / evicts through SGLang's public cache API, attaching mamba states on hybrids."""

    def __init__(self, cache: UnifiedRadixCache, allocator: object, pool: object) -> None:
        self.cache, self.allocator, self.pool = cache, allocator, pool
        self.hybrid = ComponentType.MAMBA in cache.components

    def insert(self, tokens: Sequence[int], *, with_state: bool = True, cache_salt: Optional[str] = None):
        key = RadixKey(array("q", tokens), cache_salt=cache_salt)
        value = self.allocator.alloc(len(tokens))
        assert value is not None, "test KV pool exhausted"
        params = InsertParams(key=key, value=value)
        if self.hybrid:
            slot = self.pool.mamba_allocator.alloc(1)
            assert slot is not None, "test mamba pool exhausted"
            params.mamba_value = slot
        result = self.cache.insert(params)
        # SGLang's insert already frees the duplicate part of `value` (the walk's FreeDeviceKV from
        # params.prev_prefix_len=0 up to the overlap), so freeing it here too would double-free. The forked mamba
        # slot of an existing state is left to the caller (SGLang frees it in cleanup_after_caching_req).
        if self.hybrid and result.mamba_exist:
            self.pool.mamba_allocator.free(params.mamba_value)
        return result

    def match(self, tokens: Sequence[int], req: object = None, cache_salt: Optional[str] = None) -> MatchResult:
        key = RadixKey(array("q", tokens), cache_salt=cache_salt)
        return self.cache.match_prefix(MatchPrefixParams(key=key, req=req))

    def evict(self, num_tokens: int = 0, mamba_num: int = 0):
        return self.cache.evict(EvictParams(num_tokens=num_tokens, mamba_num=mamba_num))


def make_req(input_ids: Sequence[int] = (), rid: str = "r", max_new_tokens: int = 1) -> object:
    """A real SGLang Req (no pool slot)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(
        rid=rid, origin_input_text="", origin_input_ids=array("q", input_ids),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=max_new_tokens),
    )


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def as_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.flatten().tolist()]
