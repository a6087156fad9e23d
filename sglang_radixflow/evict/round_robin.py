"""RR-Evict: round-robin tail eviction over idle trajectories (`--radix-eviction-policy rr`).

Node-level LRU turns into agent-level eviction on agent workloads (every turn refreshes the agent's whole path, so the
longest-idle agent loses its entire history). RR-Evict instead rotates the reclaim demand over idle trajectories and
cuts one *tail unit* from one trajectory at a time, so every idle trajectory keeps a contiguous reusable prefix.

Idle trajectory: a trajectory with a leaf in SGLang's `evictable_device_leaves` (unlocked; a running or waiting
request's path-lock keeps its whole path out of that set, so locked paths are never touched).

Tail unit:
- full attention: the last `block` tokens of the leaf (the leaf is split; the cut tail keeps the node id, as
  SGLang's walk contract wants a leaf id back); a leaf no longer than `block` goes whole;
- hybrid (FULL + MAMBA): a state lives only on the node it was inserted at, and KV past the deepest state is
  useless for a state-ready hit (h). So the unit is the leaf plus every ancestor that becomes a leaf without a
  published state: the segment back to the nearest ancestor that holds one. A walk that SGLang stops in the middle
  of a unit (allocation target reached) is finished by RadixFlowRRCache right after the walk, so no eviction call
  leaves a path whose end has no usable state.

Trajectories and the rotation that picks the next one: evict/trajectories.py.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

from sglang_radixflow.cache.components import RadixFlowFullComponent, RadixFlowMambaComponent
from sglang_radixflow.cache.tree import RadixFlowCache
from sglang_radixflow.evict.strategy import POLICY_NAME, check_policy_config
from sglang_radixflow.evict.trajectories import FULL, RoundRobinEvictor, default_block, depth_of, traj_of

if TYPE_CHECKING:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore, UnifiedTreeNode

    from sglang_radixflow.config import RadixFlowConfig

logger = logging.getLogger("sglang_radixflow")
MAMBA = ComponentType.MAMBA


class RoundRobinWalk:
    """One component eviction walk (SGLang's evict_device_start .. evict_device_end bracket).

    `next()` returns the next leaf for SGLang to delete (tree_core.evict_device_leaf asserts it is a D-leaf) or
    None. SGLang deletes each returned leaf before asking again, so the previous victim's parent is inspected then.
    """

    def __init__(
        self, ev: RoundRobinEvictor, core: "UnifiedTreeCore", component_type: ComponentType, request_cnt: int,
        state_ok: Optional[Callable[["UnifiedTreeNode"], bool]],
    ) -> None:
        assert isinstance(core.evictable_device_leaves, set), "SGLang changed the evictable leaf set"
        self.ev, self.core, self.ct, self.request_cnt, self.state_ok = ev, core, component_type, request_cnt, state_ok
        ev.maybe_prune(core)
        # Grouped by trajectory; the groups' order is irrelevant (a pick ranks by rotation position and node ids).
        self.leaves: dict[str, list["UnifiedTreeNode"]] = {}
        untagged = []
        for node in core.evictable_device_leaves:
            key = traj_of(node)
            if key is None:
                untagged.append(node)
            else:
                self.leaves.setdefault(key, []).append(node)
        for node in sorted(untagged, key=lambda n: n.id):  # id order: new keys alike on every rank
            key = ev.new_path_key()
            ev.tag(node, key)
            self.leaves.setdefault(key, []).append(node)
        # keys whose lists this walk changed (a pick, an exposed parent): only these can hold gone or repeated
        # nodes, since SGLang deletes nothing but the victims handed to it
        self.changed: set[str] = set()
        self.last: Optional["UnifiedTreeNode"] = None
        self.unit_key: Optional[str] = None
        if ev.pending is not None:
            self.unit_key, self.last = ev.pending
            ev.pending = None

    def next(self, tracker: dict, cache_actions: list) -> Optional["UnifiedTreeNode"]:
        last, self.last = self.last, None
        if last is not None:
            exposed = self._exposed_parent(last)
            if exposed is not None and self.state_ok is not None and not self.state_ok(exposed):
                return self._emit(exposed)  # the hybrid unit goes on back to the nearest published state
        if self.ev.finish_only or tracker[self.ct] >= self.request_cnt:
            return None
        picked = self._pick()
        if picked is None:
            return None
        key, leaf = picked
        self.ev.to_back(key)
        self.unit_key = key
        self.ev.units += 1
        if self.state_ok is None and len(leaf.key) > self.ev.block:
            leaf = self._split_tail(leaf, key, cache_actions)
        return self._emit(leaf)

    def close(self) -> None:
        """End of the walk: a hybrid unit whose last victim exposed a stateless leaf is left to finish."""
        if self.last is not None and self.state_ok is not None:
            exposed = self._exposed_parent(self.last)
            if exposed is not None and not self.state_ok(exposed):
                self.ev.pending = (self.unit_key or traj_of(exposed) or "", self.last)
        self.last = None

    # ---- helpers ----
    def _emit(self, node: "UnifiedTreeNode") -> "UnifiedTreeNode":
        assert node in self.core.evictable_device_leaves, f"RR-Evict picked node {node.id}, not an idle leaf"
        self.last = node
        self.ev.victims += 1
        return node

    def _exposed_parent(self, victim: "UnifiedTreeNode") -> Optional["UnifiedTreeNode"]:
        """The victim's parent if deleting the victim made it an idle leaf (it then joins the cut trajectory)."""
        parent = victim.parent
        if parent is None or parent not in self.core.evictable_device_leaves:
            return None
        key = traj_of(parent)
        if key is None:
            key = self.unit_key or self.ev.new_path_key()
            self.ev.tag(parent, key)
        self.leaves.setdefault(key, []).append(parent)
        self.changed.add(key)
        return parent

    def _pick(self) -> Optional[tuple[str, "UnifiedTreeNode"]]:
        """`share`: the largest retained share, the rotation's front first among equals; `cursor`: the front."""
        idle = self.core.evictable_device_leaves
        position, peak, cursor = self.ev.position, self.ev.peak, self.ev.order == "cursor"
        best: Optional[tuple[tuple[float, int], str, "UnifiedTreeNode"]] = None
        for key, cands in self.leaves.items():
            if not cands:
                continue
            if key in self.changed:
                cands[:] = [n for n in dict.fromkeys(cands) if n in idle]
                if not cands:
                    continue
            # several idle ends of one trajectory (a retried turn): the deepest, then the least recently used
            leaf = cands[0] if len(cands) == 1 else min(cands, key=lambda n: (-depth_of(n), n.last_access_time, n.id))
            rank = (0.0 if cursor else depth_of(leaf) / max(1, peak.get(key, 0)), -position[key])
            if best is None or rank > best[0]:
                best = (rank, key, leaf)
        if best is None:
            return None
        _, key, leaf = best
        self.leaves[key].remove(leaf)
        self.changed.add(key)
        return key, leaf

    def _split_tail(self, leaf: "UnifiedTreeNode", key: str, cache_actions: list) -> "UnifiedTreeNode":
        """Cut the last `block` tokens off `leaf` as their own node; the tail keeps the leaf's id and is returned."""
        split_len = len(leaf.key) - self.ev.block
        assert split_len > 0 and split_len % self.ev.page_size == 0, (split_len, self.ev.page_size)
        prefix, action = self.core._split_node(leaf.key, leaf, split_len)
        assert prefix.parent is not None and leaf.parent is prefix, "SGLang changed _split_node"
        if action is not None:
            cache_actions.append(action)
        self.ev.tag(prefix, key)
        return leaf


def _evictor(component: Any) -> RoundRobinEvictor:
    ev = getattr(component.cache, "rf_rr", None)
    assert isinstance(ev, RoundRobinEvictor), "RR components must belong to a RadixFlowRRCache"
    return ev


def _state_validator(component: Any) -> Optional[Callable[["UnifiedTreeNode"], bool]]:
    """Hybrid trees: 'has a usable state' is the MAMBA validator radixflow matches with (present and published)."""
    mamba = component.cache.components.get(MAMBA)
    return None if mamba is None else mamba.create_match_validator(match_device_only=True)


class RoundRobinFullComponent(RadixFlowFullComponent):
    """FULL KV under RR-Evict: tags trajectory ends on insert; the device walk is the rotation."""

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions) -> None:  # noqa: ANN001
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        _evictor(self).on_insert(node, self.tree_core.root_node, getattr(params, "session_id", None))

    def _evict_device_start(self, request_cnt: int) -> None:
        self._rr_walk = RoundRobinWalk(_evictor(self), self.tree_core, self.component_type, request_cnt,
                                       _state_validator(self))

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):  # noqa: ANN001
        node = self._rr_walk.next(tracker, cache_actions)
        return None if node is None else node.id

    def _evict_device_end(self) -> None:
        self._rr_walk.close()
        self._rr_walk = None


class RoundRobinMambaComponent(RadixFlowMambaComponent):
    """MAMBA slots under RR-Evict: the same rotation (a unit frees its leaf's state). Only when no idle trajectory
    is left does SGLang's own walk run (it tombstones unlocked interior states, never a locked path's KV), so an
    allocation RR cannot serve does not fail where `lru` would have succeeded."""

    def _evict_device_start(self, request_cnt: int) -> None:
        self._rr_walk = RoundRobinWalk(_evictor(self), self.tree_core, self.component_type, request_cnt,
                                       _state_validator(self))
        self._rr_request_cnt = request_cnt
        self._rr_native = False

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):  # noqa: ANN001
        if not self._rr_native:
            node = self._rr_walk.next(tracker, cache_actions)
            if node is not None:
                return node.id
            if _evictor(self).finish_only:
                return None
            super()._evict_device_start(self._rr_request_cnt)
            self._rr_native = True
        return super()._evict_device_next_node(tracker, device_frees, host_frees, cache_actions)

    def _evict_device_end(self) -> None:
        self._rr_walk.close()
        self._rr_walk = None
        if self._rr_native:
            super()._evict_device_end()


RR_COMPONENTS = {FULL: RoundRobinFullComponent, MAMBA: RoundRobinMambaComponent}


class RadixFlowRRCache(RadixFlowCache):
    """RadixFlowCache whose eviction is RR-Evict. Built by the plugin factory when `--radix-eviction-policy rr`."""

    def __init__(self, params: "CacheInitParams") -> None:
        policy = str(params.eviction_policy).lower()
        if policy != POLICY_NAME:
            raise ValueError(f"RadixFlowRRCache needs --radix-eviction-policy {POLICY_NAME}, got {policy!r}")
        if getattr(params, "enable_session_radix_cache", False):
            raise ValueError("--radix-eviction-policy rr does not support --enable-session-radix-cache; drop one")
        from sglang_radixflow.config import RadixFlowConfig

        # --radix-eviction-policy-config first; what it leaves out comes from RADIXFLOW_RR_* (`configure`)
        self.rr_policy_config = check_policy_config(params.eviction_policy_config, int(params.page_size))
        page_size = int(params.page_size)
        # provisional until `configure` reads RADIXFLOW_RR_*: the default block, valid at any page size
        self.rf_rr = RoundRobinEvictor(self.rr_policy_config.get("block", default_block(page_size)), page_size,
                                       self.rr_policy_config.get("order", RadixFlowConfig().rr_order))
        override = dict(params.component_registry_override or {})
        for ct, cls in RR_COMPONENTS.items():
            existing = override.get(ct)
            assert existing is None or issubclass(cls, existing), f"another {ct} component ({existing}) is installed"
            override[ct] = cls
        params.component_registry_override = override
        super().__init__(params)
        if getattr(self, "cache_controller", None) is not None:
            raise ValueError("--radix-eviction-policy rr does not support the hierarchical cache (HiCache); drop one")
        for ct, cls in RR_COMPONENTS.items():
            if ct in self.components:
                assert isinstance(self.components[ct], cls), f"{ct} component is {type(self.components[ct])}"

    def configure(self, config: "RadixFlowConfig", tp_rank: int = 0) -> None:
        super().configure(config, tp_rank)
        block = self.rr_policy_config.get("block", config.rr_block_tokens or default_block(self.rf_rr.page_size))
        self.rf_rr.block = RoundRobinEvictor.check_block(block, self.rf_rr.page_size)
        self.rf_rr.order = RoundRobinEvictor.check_order(self.rr_policy_config.get("order", config.rr_order))
        if tp_rank == 0:
            logger.info("sglang-radixflow: RR-Evict: block=%d tokens, order=%s", self.rf_rr.block, self.rf_rr.order)

    def reset(self) -> None:
        """SGLang's flush_cache empties the tree: forget the rotation and every trajectory's peak with it, or a
        reused session id would be measured against the peak of a history that is gone."""
        super().reset()
        ev = self.rf_rr
        self.rf_rr = RoundRobinEvictor(ev.block, ev.page_size, ev.order)

    def checkpoint_into_tree(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        super().checkpoint_into_tree(req, up_to=up_to, **kwargs)
        node_id = getattr(req, "last_node", None)
        if node_id is not None:
            node = node_id if hasattr(node_id, "component_data") else self.tree_core.node_by_id(node_id)
            if node is not None and node is not self.tree_core.root_node:
                self.rf_rr.on_request(node, req)

    def _evict_components(self, request_by_type: dict, tracker: dict, available_size_targets: Any = None,
                          **kwargs: Any) -> None:
        super()._evict_components(request_by_type, tracker, available_size_targets, **kwargs)
        if self.rf_rr.pending is not None:
            self._finish_unit(tracker)

    def _finish_unit(self, tracker: dict) -> None:
        """A walk stopped mid-unit (SGLang's target was reached): cut the exposed stateless ends too, through
        SGLang's own walk protocol (start / next / leaf / end), so frees and counters stay SGLang's."""
        self.rf_rr.finish_only = True
        try:
            self.tree_core.evict_device_start(FULL, 0)
            try:
                while True:
                    node_id, _ = self._evict_device_next_node(FULL, tracker)
                    if node_id is None:
                        break
                    backup = self._evict_device_leaf(node_id, tracker)
                    assert backup is None, "RR-Evict runs without HiCache write-back"
            finally:
                self.tree_core.evict_device_end(FULL)
        finally:
            self.rf_rr.finish_only = False


def evict_tokens(cache: RadixFlowCache, num_tokens: int) -> int:
    """Convenience for tools and tests: reclaim `num_tokens` KV tokens through SGLang's public evict()."""
    return int(cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted)
