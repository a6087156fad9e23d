"""RR-Evict's bookkeeping: which trajectory each tree node belongs to, and the rotation over trajectories.

Trajectory identity (FULL `metadata[TRAJ]` of a node; only leaves are read at eviction time):
- `session:<id>` when the request carries SGLang's `session_id` (it reaches the insert as InsertParams.session_id),
  else `routing:<key>` when it carries a `routing_key`;
- otherwise the leaf path: a new end continues the trajectory of the nearest tagged ancestor when the path down from
  that ancestor is a single chain (the ancestor was this path's end, e.g. the previous turn); anything else starts a
  new trajectory `path:<n>`. A leaf that a cut exposes joins the cut trajectory unless it already has a tag.
Splits keep the tail node (and its tag) in place; the new prefix node is untagged until a cut exposes it. SGLang
0.5.23's tree never merges nodes, so the rotation only has to survive splits and exposures.

Rotation: each trajectory key holds its place (a counter, larger = further back); the trajectory that loses a unit
moves to the back; a new trajectory joins at the back. Which idle trajectory is next (`order`):
- `share` (default): the one retaining the largest fraction of its longest length (its peak depth), the rotation
  breaking ties. This is the paper's ideal round robin, every idle trajectory holding the same fraction
  h = (m - n_a)/(n*s): a plain cursor cuts every idle trajectory at the same *rate*, so what an agent keeps falls
  with how long it has been idle, and the agent that comes back (the longest idle) holds much less than h (about
  2h - 1 under a cyclic schedule; tests/unit/cache/test_rr_evict.py measures both);
- `cursor`: the plain rotation, the front idle trajectory next (kept for the ablation).
Keys are assigned in insert order and ties are broken by rotation position and SGLang's node ids (a per-process
counter that advances identically on every TP rank), never by set or id() order: every rank decides the same.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

from sglang_radixflow.evict.strategy import ORDERS

if TYPE_CHECKING:
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore, UnifiedTreeNode

TRAJ = "radixflow_traj"
DEPTH = "radixflow_depth"
FULL = ComponentType.FULL
_PRUNE_MIN = 256  # rotation entries before dead trajectories are first swept


def traj_of(node: "UnifiedTreeNode") -> Optional[str]:
    return node.component_data[FULL].metadata.get(TRAJ)


def depth_of(node: "UnifiedTreeNode") -> int:
    """Tokens from the root to the end of `node`, cached on the node (FULL metadata[DEPTH]).

    A node's end depth never changes: a split shortens the tail node's key from the front and gives the new prefix
    node fresh metadata (SGLang 0.5.23 copies none), and the tree never merges. So the walk reads each path once
    and every later call is O(1) (the rotation asks for it once per candidate per unit)."""
    chain = []
    depth = 0
    while node is not None and node.key is not None and node.parent is not None:
        cached = node.component_data[FULL].metadata.get(DEPTH)
        if cached is not None:
            depth = cached
            break
        chain.append(node)
        node = node.parent
    for n in reversed(chain):
        depth += len(n.key)
        n.component_data[FULL].metadata[DEPTH] = depth
    return depth


DEFAULT_BLOCK_TOKENS = 16


def default_block(page_size: int) -> int:
    """RR-Evict's tail unit when none is given: 16 tokens, rounded up to whole pages (the tree cuts only pages)."""
    return -(-DEFAULT_BLOCK_TOKENS // page_size) * page_size


class RoundRobinEvictor:
    """Rotation, trajectory tags and the unit in progress; one per cache, shared by the FULL and MAMBA walks."""

    def __init__(self, block_tokens: int, page_size: int, order: str = "share") -> None:
        self.page_size = page_size
        self.block = self.check_block(block_tokens, page_size)
        self.order = self.check_order(order)
        # The rotation, as each key's place in it (larger = further back): a walk ranks only the trajectories it
        # can cut by their place, instead of iterating the whole rotation (which keeps gone ones until pruned).
        self.position: dict[str, int] = {}
        self._moves = 0
        self.peak: dict[str, int] = {}  # longest path length (tokens) each trajectory reached
        self._paths = 0
        self._prune_at = _PRUNE_MIN
        # (trajectory, last victim) of a hybrid unit a walk was stopped in; finished right after that walk
        self.pending: Optional[tuple[str, "UnifiedTreeNode"]] = None
        self.finish_only = False
        self.units = 0  # completed-or-started units, for tests and logs
        self.victims = 0

    @staticmethod
    def check_block(block_tokens: int, page_size: int) -> int:
        if block_tokens <= 0 or block_tokens % page_size:
            raise ValueError(
                f"RR-Evict block={block_tokens} is invalid; allowed: a positive multiple of the page size ({page_size})"
            )
        return block_tokens

    @staticmethod
    def check_order(order: str) -> str:
        if order not in ORDERS:
            raise ValueError(f"RR-Evict order={order!r} is invalid; allowed: {', '.join(ORDERS)}")
        return order

    # ---- identity ----
    def tag(self, node: "UnifiedTreeNode", key: str) -> None:
        node.component_data[FULL].metadata[TRAJ] = key
        if key not in self.position:
            self.to_back(key)  # a new trajectory joins at the back
        self.peak[key] = max(self.peak.get(key, 0), depth_of(node))

    def to_back(self, key: str) -> None:
        self._moves += 1
        self.position[key] = self._moves

    @property
    def rotation(self) -> list[str]:
        """The keys front to back (for tests and logs; walks read `position`)."""
        return sorted(self.position, key=self.position.__getitem__)

    def new_path_key(self) -> str:
        self._paths += 1
        return f"path:{self._paths}"

    def on_insert(self, node: "UnifiedTreeNode", root: "UnifiedTreeNode", session_id: Optional[str]) -> None:
        """An insert ended at `node` (FULL commit hook)."""
        if node is root:
            return
        if session_id:
            self.tag(node, f"session:{session_id}")
            return
        if traj_of(node) is not None:
            return
        cur = node.parent
        while cur is not None and cur is not root and len(cur.children) == 1:
            key = traj_of(cur)
            if key is not None:  # this path's previous end: same trajectory
                self.tag(node, key)
                return
            cur = cur.parent
        self.tag(node, self.new_path_key())

    def on_request(self, node: "UnifiedTreeNode", req: Any) -> None:
        """A request's checkpoint moved its path end to `node`: a session / routing key names the trajectory."""
        session = getattr(req, "session_id", None)
        routing = getattr(req, "routing_key", None)
        if session:
            self.tag(node, f"session:{session}")
        elif routing:
            self.tag(node, f"routing:{routing}")

    def maybe_prune(self, core: "UnifiedTreeCore") -> None:
        """Forget trajectories none of whose nodes is left (amortised: only when the rotation has doubled)."""
        if len(self.position) < self._prune_at:
            return
        arena = core._node_arena
        assert isinstance(arena, dict), "SGLang changed UnifiedTreeCore._node_arena"
        alive = {traj_of(n) for n in arena.values()}
        for key in [k for k in self.position if k not in alive]:
            del self.position[key]
            self.peak.pop(key, None)
        self._prune_at = max(_PRUNE_MIN, 2 * len(self.position))
