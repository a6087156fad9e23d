"""FULL and MAMBA tree components that stamp what they publish and refuse what is not yet published.

The stamp lives in `ComponentData.metadata[PUB_ROUND]` (a free dict SGLang keeps per node and component).
Invariant: along any root-to-leaf path FULL stamps never decrease (a child is inserted after its parent; a split's
new parent inherits the child's stamp), so a valid deep node implies valid ancestors and the KV prefix it covers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

if TYPE_CHECKING:
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeNode

    from sglang_radixflow.cache.clock import RoundClock

PUB_ROUND = "radixflow_pub_round"


def stamp_of(node: "UnifiedTreeNode", component_type: object) -> Optional[int]:
    return node.component_data[component_type].metadata.get(PUB_ROUND)


def _clock(component: object) -> "RoundClock":
    clock = getattr(component.cache, "rf_clock", None)  # type: ignore[attr-defined]
    assert clock is not None, "radixflow components must belong to a RadixFlowCache"
    return clock


def _published_validator(
    base: Callable[["UnifiedTreeNode"], bool], component_type: object, scheduling: int
) -> Callable[["UnifiedTreeNode"], bool]:
    def valid(node: "UnifiedTreeNode") -> bool:
        if not base(node):
            return False
        stamp = node.component_data[component_type].metadata.get(PUB_ROUND)  # stamp_of, inlined: once per node
        # No stamp: data that entered outside radixflow's insert path (e.g. a HiCache load-back), computed earlier.
        return stamp is None or stamp < scheduling

    return valid


_STATELESS_VALIDATORS = (FullComponent.create_match_validator, MambaComponent.create_match_validator)


class _PublishedMatch:
    """create_match_validator for FULL and MAMBA: SGLang's validator, refused on nodes not yet published.

    SGLang asks for a validator once per match (and radixflow once per classification or eviction walk), each within
    one round. SGLang's FULL and MAMBA validators are stateless (unlike SWA's, which counts a window along the walk),
    so the validator of the round being scheduled is made once per round and match mode and reused: a match then
    costs one read of the round."""

    _rf_validators: Optional[dict] = None  # match_device_only -> (round being scheduled, validator)

    def create_match_validator(self, match_device_only: bool = False) -> Callable[["UnifiedTreeNode"], bool]:
        try:
            scheduling = self.cache.rf_clock.scheduling()  # type: ignore[attr-defined]
        except AttributeError:
            scheduling = _clock(self).scheduling()  # names what is wrong
        made = self._rf_validators
        if made is None:
            made = self._rf_validators = {}
        entry = made.get(match_device_only)
        if entry is not None and entry[0] == scheduling:
            return entry[1]
        base = super().create_match_validator  # type: ignore[misc]
        assert base.__func__ in _STATELESS_VALIDATORS, "SGLang's validator below must be stateless to be reused"
        valid = _published_validator(base(match_device_only), self.component_type, scheduling)
        made[match_device_only] = (scheduling, valid)
        return valid


class RadixFlowFullComponent(_PublishedMatch, FullComponent):
    """FULL KV: a path node is a usable match only once the round that computed it has ended."""

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions) -> None:  # noqa: ANN001
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        # New KV nodes of this insert form the unstamped bottom of the path (stamps are monotone from the root).
        stamp = _clock(self).last_launched()
        root = self.tree_core.root_node
        while node is not None and node is not root and stamp_of(node, self.component_type) is None:
            node.component_data[self.component_type].metadata[PUB_ROUND] = stamp
            node = node.parent

    def redistribute_on_node_split(self, new_parent: "UnifiedTreeNode", child: "UnifiedTreeNode") -> None:
        super().redistribute_on_node_split(new_parent, child)
        stamp = stamp_of(child, self.component_type)
        if stamp is not None:  # the prefix was published together with the child it is cut from
            new_parent.component_data[self.component_type].metadata[PUB_ROUND] = stamp


class RadixFlowMambaComponent(_PublishedMatch, MambaComponent):
    """MAMBA state snapshots: stamped when committed to a node, usable from the next round on."""

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions) -> None:  # noqa: ANN001
        ct = self.component_type
        before = node.component_data[ct].value
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        after = node.component_data[ct].value
        # SGLang keeps an existing state (result.mamba_exist) and frees the new one: the old stamp stays valid.
        if after is not None and after is not before:
            node.component_data[ct].metadata[PUB_ROUND] = _clock(self).last_launched()

    def redistribute_on_node_split(self, new_parent: "UnifiedTreeNode", child: "UnifiedTreeNode") -> None:
        super().redistribute_on_node_split(new_parent, child)
        # SGLang leaves the prefix node without a state; it must not inherit a stamp either.
        assert new_parent.component_data[self.component_type].value is None, "SGLang changed split semantics"
        new_parent.component_data[self.component_type].metadata.pop(PUB_ROUND, None)
