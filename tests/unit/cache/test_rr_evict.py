"""RR-Evict (`--radix-eviction-policy rr`) on a real RadixFlowCache with SGLang's CPU pools, in-process.

The agent model check drives n trajectories through SGLang's public cache API the way the scheduler does (match,
lock the own prefix, evict the shortfall, insert reusing the tree's KV, lock the new end while the turn runs) and
compares what each returning agent still finds with the ideal h = (m - n_a)/(n*s).
"""
from __future__ import annotations

import random
import re
import statistics
from array import array
from dataclasses import dataclass

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

from sglang_radixflow import plugin
from sglang_radixflow.cache.tree import RadixFlowCache
from sglang_radixflow.evict.round_robin import RadixFlowRRCache
from sglang_radixflow.evict.trajectories import _PRUNE_MIN, DEPTH, depth_of, traj_of
from tests.unit.cache.helpers import FULL, HYBRID, CacheDriver, build, tokens

plugin.register_eviction_policy()


def rr_driver(components, order: str = "share", block: int = 8, **cfg) -> CacheDriver:
    cache, allocator, pool = build(RadixFlowRRCache, components, eviction_policy="rr", **cfg)
    cache.rf_rr.block, cache.rf_rr.order = block, order
    return CacheDriver(cache, allocator, pool)


def path_values(cache, node_id) -> torch.Tensor:
    node, parts = cache.tree_core.node_by_id(node_id), []
    while node is not cache.tree_core.root_node:
        parts.append(node.component_data[ComponentType.FULL].value)
        node = node.parent
    return torch.cat(parts[::-1])


def extend(d: CacheDriver, toks: list[int], have: int, end: int) -> None:
    """Insert toks[:end] reusing the tree's KV for toks[:have] (as checkpoint_into_tree does via prev_prefix_len)."""
    new = d.allocator.alloc(end - have)
    assert new is not None, "KV pool exhausted: the eviction did not free the shortfall"
    value = new if have == 0 else torch.cat([path_values(d.cache, d.match(toks[:have]).last_device_node), new])
    params = InsertParams(key=RadixKey(array("q", toks[:end])), value=value, prev_prefix_len=have)
    if d.hybrid:
        params.mamba_value = d.pool.mamba_allocator.alloc(1)
        assert params.mamba_value is not None, "mamba pool exhausted"
    result = d.cache.insert(params)
    assert result.prefix_len >= have, (result.prefix_len, have)  # a hybrid may find stateless KV past h: SGLang frees our copy
    if d.hybrid and result.mamba_exist:
        d.pool.mamba_allocator.free(params.mamba_value)


def accounted(d: CacheDriver, total: int) -> None:
    """Every KV slot is free, evictable or protected, exactly once (a double free or a leak breaks this)."""
    assert d.allocator.available_size() + d.cache.evictable_size() + d.cache.protected_size() == total


@dataclass(frozen=True)
class Regime:
    n: int = 10  # trajectories
    n_a: int = 2  # active at any time
    m: int = 6  # cache capacity, in trajectories
    length: int = 64  # tokens per trajectory
    seg: int = 8  # hybrid: one state per segment; full attention: the RR block

    @property
    def s(self) -> float:  # idle fraction of an agent's time
        return 1 - self.n_a / self.n

    @property
    def h(self) -> float:
        return (self.m - self.n_a) / (self.n * self.s)


def run_agents(policy: str, components, regime: Regime, schedule: str, steps: int, seed: int = 0,
               order: str = "share") -> list[tuple[int, float]]:
    """(agent, retained fraction when it comes back) per return. Each step one idle agent starts a turn that runs
    n_a steps: `cyclic` wakes the longest-idle agent, `random` a uniformly random idle one."""
    r = regime
    total = r.m * r.length
    cls = RadixFlowRRCache if policy == "rr" else RadixFlowCache
    cache, allocator, pool = build(cls, components, eviction_policy=policy, kv_size=total,
                                   mamba_cache_size=r.n * r.length // r.seg + 16, max_num_reqs=r.n + 4)
    if policy == "rr":
        cache.rf_rr.block, cache.rf_rr.order = r.seg, order
    d = CacheDriver(cache, allocator, pool)
    rng = random.Random(seed)
    paths = [tokens(10_000 * (a + 1), r.length) for a in range(r.n)]
    running: dict[int, tuple[int, object]] = {}
    last_turn = {a: -a for a in range(r.n)}
    returns: list[tuple[int, float]] = []
    for step in range(steps):
        for a, (until, lock) in list(running.items()):
            if until <= step:
                cache.unlock(lock)
                del running[a]
        idle = [a for a in range(r.n) if a not in running]
        a = rng.choice(idle) if schedule == "random" else min(idle, key=lambda x: last_turn[x])
        have = d.match(paths[a]).device_prefix_len
        if step >= 3 * r.n:  # past the cold start
            returns.append((a, have / r.length))
        hold = cache.lock(d.match(paths[a][:have]).last_device_node)  # the agent's own prefix, while it runs
        ends = list(range(have + r.seg, r.length + 1, r.seg)) if d.hybrid else ([r.length] if have < r.length else [])
        for end in ends:
            short = (end - have) - allocator.available_size()
            if short > 0:
                cache.evict(EvictParams(num_tokens=short))
            if d.hybrid and pool.mamba_allocator.available_size() < 1:
                cache.evict(EvictParams(mamba_num=1))
            extend(d, paths[a], have, end)
            have = end
            cache.unlock(hold)
            hold = cache.lock(d.match(paths[a][:have]).last_device_node)
        running[a] = (step + r.n_a, hold)
        last_turn[a] = step
        accounted(d, total)
    cache.sanity_check()
    return returns


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


REGIME = Regime()


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_model_check_cyclic_rr_keeps_h_for_every_idle_trajectory_lru_keeps_nothing(components):
    r = REGIME
    assert r.n_a < r.m < r.n and r.h == pytest.approx(0.5)
    rr = run_agents("rr", components, r, "cyclic", steps=8 * r.n)
    lru = run_agents("lru", components, r, "cyclic", steps=8 * r.n)
    # RR-Evict: every returning agent finds the ideal fraction h of its trajectory.
    assert [f for _, f in rr] == pytest.approx([r.h] * len(rr), abs=1 / 64)
    # LRU: the agent that comes back is always the longest idle one, and it was evicted whole.
    assert all(f == 0.0 for _, f in lru)


def test_model_check_cyclic_plain_cursor_falls_short_of_h():
    """The ablation behind the default `share` order: a plain cursor cuts every idle trajectory at the same rate,
    so the longest-idle (returning) agent keeps about 2h - 1 of its trajectory, not h."""
    r = REGIME
    cursor = run_agents("rr", FULL, r, "cyclic", steps=8 * r.n, order="cursor")
    assert [f for _, f in cursor] == pytest.approx([2 * r.h - 1 + 1 / 8] * len(cursor), abs=1 / 64)


def test_model_check_random_lru_concentrates_misses_rr_spreads_them():
    r = REGIME
    rr = run_agents("rr", FULL, r, "random", steps=30 * r.n, seed=3)
    lru = run_agents("lru", FULL, r, "random", steps=30 * r.n, seed=3)
    kept_rr, kept_lru = [f for _, f in rr], [f for _, f in lru]
    # The same expected recompute q = 1 - h under both...
    assert statistics.mean(kept_rr) == pytest.approx(r.h, abs=0.1)
    assert statistics.mean(kept_lru) == pytest.approx(r.h, abs=0.1)
    # ...but LRU is all-or-nothing: whole misses for whoever idled longest.
    all_or_nothing = sum(f in (0.0, 1.0) for f in kept_lru) / len(kept_lru)
    assert all_or_nothing == 1.0
    assert pct([1 - f for f in kept_lru], 0.99) == 1.0
    # RR-Evict: no return loses more than 1 - h of its trajectory (P99 miss = q, the paper's claim).
    assert max(1 - f for f in kept_rr) <= 1 - r.h + 1 / 64
    # Per agent, the retained fraction is even under RR.
    per_agent: dict[int, list[float]] = {}
    for a, f in rr:
        per_agent.setdefault(a, []).append(f)
    means = [statistics.mean(v) for v in per_agent.values()]
    assert max(means) - min(means) < 0.2


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_locked_paths_are_never_evicted(components):
    d = rr_driver(components, kv_size=1024)
    paths = [tokens(1000 * (a + 1), 64) for a in range(6)]
    for p in paths:
        extend(d, p, 0, 64)
    locked = {0, 3}
    locks = [d.cache.lock(d.match(paths[a]).last_device_node) for a in sorted(locked)]
    d.evict(num_tokens=10_000)  # everything that may go
    if d.hybrid:
        d.evict(mamba_num=10_000)
    for a, p in enumerate(paths):
        res = d.match(p)
        if a in locked:
            assert res.device_prefix_len == 64 and res.full_kv_hit_length == 64
        else:
            assert res.full_kv_hit_length == 0
    for lock in locks:
        d.cache.unlock(lock)
    d.cache.sanity_check()
    accounted(d, 1024)


def concurrent_agents(d: CacheDriver, total: int, seed: int = 5, steps: int = 600) -> list[tuple]:
    """Random interleaving of many requests' steps (match+lock, evict, insert, unlock) on `d`, checking the pool's
    accounting after every step; returns what RR decided, step by step (rotation, victims, each history's hit)."""
    rng = random.Random(seed)
    decisions = []
    system = tokens(50_000, 32)
    histories = {a: system + tokens(1000 * (a + 1), 16) for a in range(12)}
    inflight: dict[int, object] = {}
    for _ in range(steps):
        a = rng.randrange(12)
        if a in inflight:  # finish its turn: release, the history grows
            d.cache.unlock(inflight.pop(a))
            histories[a] = histories[a] + tokens(rng.randrange(3, 30_000), 8)
            if len(histories[a]) > 160:
                histories[a] = histories[a][:48]
            continue
        toks = histories[a]
        have = d.match(toks).device_prefix_len
        hold = d.cache.lock(d.match(toks[:have]).last_device_node)
        short = (len(toks) - have) - d.allocator.available_size()
        if short > d.cache.evictable_size():  # SGLang would not admit it now: it waits
            d.cache.unlock(hold)
            continue
        if short > 0:
            d.evict(num_tokens=short)
        if d.hybrid and d.pool.mamba_allocator.available_size() < 1:
            d.evict(mamba_num=1)
        if len(toks) > have:
            extend(d, toks, have, len(toks))
        d.cache.unlock(hold)
        inflight[a] = d.cache.lock(d.match(toks).last_device_node)
        accounted(d, total)
        ev = d.cache.rf_rr
        decisions.append((tuple(ev.rotation), ev.victims, tuple(d.match(h).device_prefix_len for h in histories.values())))
    for lock in inflight.values():
        d.cache.unlock(lock)
    return decisions


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_sanity_holds_after_heavy_eviction_under_concurrent_requests(components):
    """Many requests' steps interleaved at random, pool at ~3x overcommit: accounting holds after every step."""
    total = 512
    d = rr_driver(components, kv_size=total, mamba_cache_size=128)
    concurrent_agents(d, total)
    d.cache.sanity_check()
    accounted(d, total)
    assert d.cache.rf_rr.units > 20  # the run did evict, heavily


@pytest.mark.parametrize("order", ["share", "cursor"])
@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_two_caches_fed_alike_decide_alike(components, order):
    """What tensor-parallel ranks are: separate caches fed the same operations. SGLang's idle-leaf set iterates in a
    different order in each (its nodes hash by address), so a decision read off that order would diverge here."""
    runs = []
    for _ in range(2):
        d = rr_driver(components, order=order, kv_size=512, mamba_cache_size=128)
        runs.append(concurrent_agents(d, 512, seed=9, steps=400))
        assert d.cache.rf_rr.units > 20
    assert runs[0] == runs[1]


def test_full_attention_unit_is_one_tail_block_and_rotation_moves_on():
    d = rr_driver(FULL, block=16, order="cursor", kv_size=1024)
    a, b, c = (tokens(1000 * (i + 1), 64) for i in range(3))
    for p in (a, b, c):
        extend(d, p, 0, 64)
    assert list(d.cache.rf_rr.rotation) == ["path:1", "path:2", "path:3"]
    evicted = [d.evict(num_tokens=1).num_tokens_evicted for _ in range(4)]
    assert evicted == [16, 16, 16, 16]
    # one block from each trajectory in turn, then A again; every remainder is a contiguous reusable prefix
    assert [d.match(p).device_prefix_len for p in (a, b, c)] == [32, 48, 48]
    assert list(d.cache.rf_rr.rotation) == ["path:2", "path:3", "path:1"]
    d.cache.sanity_check()


def test_share_rule_cuts_the_trajectory_keeping_the_largest_fraction_of_its_peak_not_the_deepest():
    """Unequal lengths pin the victim rule: A (128 tokens, oldest), B (32), C (64), 16-token units. `share` cuts the
    idle trajectory that retains the largest fraction of its peak length, ties going to the front of the rotation:
    A (1 = 1 = 1, A first), B (1 = 1 > 0.875), C (1), A (0.875), C (0.75 = 0.75, C ahead of A). Deepest-first
    would have cut A five times (48 / 32 / 64 kept) and SGLang's LRU drops the oldest leaf whole (A: 0 kept)."""
    d = rr_driver(FULL, block=16, order="share", kv_size=1024)
    a, b, c = tokens(1000, 128), tokens(5000, 32), tokens(9000, 64)
    for p in (a, b, c):
        extend(d, p, 0, len(p))
    kept = []
    for _ in range(5):
        assert d.evict(num_tokens=1).num_tokens_evicted == 16
        kept.append(tuple(d.match(p).device_prefix_len for p in (a, b, c)))
    assert kept == [(112, 32, 64), (112, 16, 64), (112, 16, 48), (96, 16, 48), (96, 16, 32)]
    d.cache.sanity_check()

    lru = CacheDriver(*build(RadixFlowCache, FULL, kv_size=1024, eviction_policy="lru"))
    for p in (a, b, c):
        extend(lru, p, 0, len(p))
    lru.evict(num_tokens=16 * 5)
    assert tuple(lru.match(p).device_prefix_len for p in (a, b, c)) == (0, 32, 64)


def test_prune_forgets_gone_trajectories_everywhere_and_the_rotation_order_holds():
    """The rotation keeps gone trajectories until it has doubled; a walk then sweeps them out of the rotation, the
    positions it ranks by and the peaks alike, and the survivors keep their order (position order = rotation)."""
    n = _PRUNE_MIN
    d = rr_driver(FULL, block=16, order="cursor", kv_size=2 * n * 16 + 64)
    ev = d.cache.rf_rr
    first = [tokens(1000 * (i + 1), 16) for i in range(n)]
    for p in first:
        extend(d, p, 0, 16)
    assert d.evict(num_tokens=16 * (n - 3)).num_tokens_evicted == 16 * (n - 3)  # cursor: the front ones, whole
    assert len(ev.rotation) == n  # gone ones are kept until the rotation doubles
    for i in range(n):
        extend(d, tokens(10**6 + 1000 * i, 16), 0, 16)
    d.evict(num_tokens=16)  # this walk prunes first, then cuts the front trajectory (the oldest survivor), whole
    assert len(ev.rotation) == 3 + n and set(ev.position) == set(ev.rotation) == set(ev.peak)
    assert sorted(ev.position, key=ev.position.get) == list(ev.rotation)
    assert list(ev.rotation)[-1] == f"path:{n - 2}"  # the cut one went to the back
    assert [d.match(p).device_prefix_len for p in first[-3:]] == [0, 16, 16]
    d.cache.sanity_check()


def test_rotation_survives_a_split_inside_a_trajectory_and_joins_new_ones_at_the_back():
    d = rr_driver(FULL, block=16, order="cursor", kv_size=1024)
    a, b = tokens(1000, 64), tokens(5000, 64)
    extend(d, a, 0, 64)
    extend(d, b, 0, 64)
    # Another agent branches inside A's node: SGLang splits it; A's tail keeps its node id and its trajectory.
    branch = a[:40] + tokens(9000, 24)
    tail_id = d.match(a).last_device_node
    extend(d, branch, 0, 64)
    tail = d.cache.tree_core.node_by_id(tail_id)
    assert traj_of(tail) == "path:1" and len(tail.key) == 24
    assert traj_of(tail.parent) is None  # the split's prefix node belongs to nobody yet
    # end depths are cached on nodes; a split must neither move the tail's end nor hand the prefix the tail's cache
    assert depth_of(tail) == 64 and depth_of(tail.parent) == 40
    assert tail.parent.component_data[ComponentType.FULL].metadata[DEPTH] == 40
    assert list(d.cache.rf_rr.rotation) == ["path:1", "path:2", "path:3"]  # the branch joined at the back
    # A's cuts follow the rotation: A (its 24-token tail: one 16 block), B, the branch, A again (the last 8)...
    d.evict(num_tokens=1)
    assert d.match(a).device_prefix_len == 48
    d.evict(num_tokens=1)
    d.evict(num_tokens=1)
    assert [d.match(p).device_prefix_len for p in (a, b, branch)] == [48, 48, 48]
    d.evict(num_tokens=1)  # A's last 8 tail tokens
    assert d.match(a).device_prefix_len == 40
    d.cache.sanity_check()


def test_a_cut_that_exposes_a_shared_prefix_hands_it_to_the_cut_trajectory():
    d = rr_driver(FULL, block=64, order="cursor", kv_size=1024)
    a = tokens(1000, 64)
    branch = a[:32] + tokens(9000, 32)
    extend(d, a, 0, 64)
    extend(d, branch, 0, 64)
    d.evict(num_tokens=1)  # A's tail (32 tokens, its whole node)
    d.evict(num_tokens=1)  # the branch's tail: the shared 32-token prefix becomes a leaf of the branch's trajectory
    prefix = d.cache.tree_core.node_by_id(d.match(a).last_device_node)
    assert d.match(a).device_prefix_len == 32 and traj_of(prefix) == "path:2"


def _stateless_middle(d: CacheDriver) -> tuple[list[int], list[int], list[int]]:
    """P (state) - Q (no state: a split's prefix) - {R, S} (states at their ends)."""
    p = tokens(100, 32)
    q = tokens(500, 16)
    r_path, s_path = p + q + tokens(700, 16), p + q + tokens(900, 16)
    extend(d, p, 0, 32)
    extend(d, r_path, 32, 64)
    extend(d, s_path, 0, 64)
    return p, r_path, s_path


def test_hybrid_unit_goes_back_to_the_nearest_published_state():
    d = rr_driver(HYBRID, kv_size=1024)
    p, r_path, s_path = _stateless_middle(d)
    assert d.match(p + tokens(500, 16)).device_prefix_len == 32  # Q has KV but no state
    d.evict(num_tokens=1)  # R (the rotation's front) goes whole: Q still has S below it
    assert d.match(r_path).device_prefix_len == 32 and d.match(s_path).device_prefix_len == 64
    d.evict(num_tokens=1)  # S goes, which exposes Q without a state: the unit takes Q too
    res = d.match(s_path)
    assert res.device_prefix_len == 32 and res.full_kv_hit_length == 32  # no stateless KV left past P's state
    d.cache.sanity_check()


def test_hybrid_unit_is_finished_when_sglang_stops_the_walk_at_its_allocation_target():
    d = rr_driver(HYBRID, kv_size=1024)
    p, r_path, s_path = _stateless_middle(d)
    d.evict(num_tokens=1)  # R
    # The allocator is 16 tokens short: SGLang's walk stops right after S (16 tokens), mid-unit.
    short = 16
    d.cache.evict_for_alloc(EvictParams(num_tokens=short))
    res = d.match(s_path)
    assert res.full_kv_hit_length == 32 == res.device_prefix_len
    d.cache.sanity_check()


def test_session_and_routing_keys_name_the_trajectory():
    d = rr_driver(FULL, kv_size=1024)
    toks = tokens(100, 32)
    value = d.allocator.alloc(32)
    d.cache.insert(InsertParams(key=RadixKey(array("q", toks)), value=value, session_id="agent-7"))
    node = d.cache.tree_core.node_by_id(d.match(toks).last_device_node)
    assert traj_of(node) == "session:agent-7"

    class Req:
        session_id = None
        routing_key = "agent-9"

    d.cache.rf_rr.on_request(node, Req())
    assert traj_of(node) == "routing:agent-9"
    assert list(d.cache.rf_rr.rotation)[-1] == "routing:agent-9"


@pytest.mark.parametrize("policy", ["lru", "tlru", "lfu"])
@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_sglang_policies_keep_working_with_the_radixflow_backend(policy, components):
    cache, allocator, pool = build(RadixFlowCache, components, eviction_policy=policy, kv_size=256)
    d = CacheDriver(cache, allocator, pool)
    for a in range(8):
        toks = tokens(1000 * (a + 1), 48)
        short = 48 - allocator.available_size()
        if short > 0:
            assert d.evict(num_tokens=short).num_tokens_evicted >= short
        extend(d, toks, 0, 48)
        accounted(d, 256)
    cache.sanity_check()


def test_rr_cache_refuses_another_policy_and_bad_settings():
    with pytest.raises(ValueError, match="needs --radix-eviction-policy rr"):
        build(RadixFlowRRCache, FULL, eviction_policy="lru")
    from sglang_radixflow.evict.trajectories import RoundRobinEvictor

    with pytest.raises(ValueError, match="block=12 is invalid; allowed: a positive multiple"):
        RoundRobinEvictor(12, 8)
    with pytest.raises(ValueError, match="order='lifo' is invalid; allowed: share, cursor"):
        RoundRobinEvictor(16, 1, "lifo")


@pytest.mark.parametrize("config, error", [
    ({"nonsense": 1}, "unknown key(s) 'nonsense' for --radix-eviction-policy rr; allowed keys: block: "),
    ({"block": 0}, "block=0 is invalid for --radix-eviction-policy rr; allowed: a positive integer"),
    ({"block": "16"}, "block='16' is invalid"),
    ({"block": True}, "block=True is invalid"),
    ({"order": "lifo"}, "order='lifo' is invalid for --radix-eviction-policy rr; allowed: share, cursor"),
])
def test_policy_config_names_the_bad_key_and_what_is_allowed(config, error):
    from sglang_radixflow.evict.strategy import RoundRobinStrategy, check_policy_config

    with pytest.raises(ValueError, match=re.escape(error)):
        check_policy_config(config)
    with pytest.raises(ValueError, match=re.escape(error)):
        RoundRobinStrategy(**config)  # what SGLang's tree core builds from --radix-eviction-policy-config


def test_policy_config_sets_the_knobs_before_the_environment(monkeypatch):
    """--radix-eviction-policy-config wins over RADIXFLOW_RR_*, which fill in what it leaves out."""
    from sglang_radixflow.config import load_config

    cache, _, _ = build(RadixFlowRRCache, FULL, eviction_policy="rr", kv_size=256,
                        eviction_policy_config={"block": 32})
    cache.configure(load_config({"RADIXFLOW_RR_BLOCK": "8", "RADIXFLOW_RR_ORDER": "cursor"}))
    assert (cache.rf_rr.block, cache.rf_rr.order) == (32, "cursor")
    with pytest.raises(ValueError, match="block=12 is invalid for --radix-eviction-policy rr; allowed: a positive "
                                         "integer, a multiple of the page size \\(8\\)"):
        build(RadixFlowRRCache, FULL, eviction_policy="rr", kv_size=256, page_size=8, eviction_policy_config={"block": 12})


def test_the_environment_sets_a_block_on_pages_that_16_does_not_divide():
    """At --page-size 32 the default block is one page, RADIXFLOW_RR_BLOCK=64 is taken, and a block off the page
    grid is refused by name (the cache used to check the 16-token default before reading the environment)."""
    from sglang_radixflow.config import load_config

    cache, _, _ = build(RadixFlowRRCache, FULL, eviction_policy="rr", kv_size=512, page_size=32)
    cache.configure(load_config({}))
    assert cache.rf_rr.block == 32
    cache, _, _ = build(RadixFlowRRCache, FULL, eviction_policy="rr", kv_size=512, page_size=32)
    cache.configure(load_config({"RADIXFLOW_RR_BLOCK": "64"}))
    assert cache.rf_rr.block == 64
    cache, _, _ = build(RadixFlowRRCache, FULL, eviction_policy="rr", kv_size=512, page_size=32)
    with pytest.raises(ValueError, match=re.escape("RR-Evict block=16 is invalid; allowed: a positive multiple of the "
                                                   "page size (32)")):
        cache.configure(load_config({"RADIXFLOW_RR_BLOCK": "16"}))


def test_flush_forgets_rotation_and_peaks_but_keeps_settings():
    d = rr_driver(FULL, block=16, order="cursor", kv_size=1024)
    a = tokens(1000, 64)
    extend(d, a, 0, 64)
    assert d.cache.rf_rr.peak == {"path:1": 64}
    d.cache.reset()  # what SGLang's /flush_cache runs
    ev = d.cache.rf_rr
    assert not ev.rotation and not ev.peak and (ev.block, ev.order) == (16, "cursor")
    extend(d, a[:32], 0, 32)  # a shorter history under a reused identity is measured against itself, not the old peak
    assert ev.peak == {"path:1": 32}
    assert d.evict(num_tokens=1).num_tokens_evicted == 16 and d.match(a).device_prefix_len == 16
    d.cache.sanity_check()
