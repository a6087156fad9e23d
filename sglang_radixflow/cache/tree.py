"""RadixFlowCache: SGLang's UnifiedRadixCache on the Python tree core, with published-round stamps and ĥ / h.

For every match made on behalf of a request it records
- ĥ (`req.rf_token_hit`): the token-level FULL-KV match the index finds (`MatchResult.full_kv_hit_length`);
- h  (`req.rf_state_hit`): the state-ready match, the deepest node where every component is present AND was
  published before the round being scheduled (`MatchResult.device_prefix_len` under our validators).
On full-attention models h = ĥ; on hybrids ĥ > h whenever the state at the matched boundary is missing. Everything
else is SGLang's own behaviour, unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_radixflow.cache.clock import RoundClock
from sglang_radixflow.cache.components import RadixFlowFullComponent, RadixFlowMambaComponent
from sglang_radixflow.config import RadixFlowConfig
from sglang_radixflow.observe.trace import TraceWriter, rank_trace_path

# Our component hooks run only on SGLang's Python tree core (the Rust core calls none of them).
PYTHON_TREE_CORE = "python"
REQ_TOKEN_HIT = "rf_token_hit"
REQ_STATE_HIT = "rf_state_hit"


def prepare_params(params: CacheInitParams) -> CacheInitParams:
    """Install our components and force the Python tree core (in place, before the cache is built)."""
    override: dict[Any, Any] = dict(params.component_registry_override or {})
    for ct, cls in ((ComponentType.FULL, RadixFlowFullComponent), (ComponentType.MAMBA, RadixFlowMambaComponent)):
        existing = override.get(ct)
        if existing is not None and issubclass(existing, cls):
            continue  # a radixflow refinement (e.g. RR-Evict's components) is already installed
        assert existing is None or issubclass(cls, existing), (
            f"another {ct} component ({existing}) is already installed; radixflow cannot combine with it"
        )
        override[ct] = cls
    params.component_registry_override = override
    params.tree_core_backend = PYTHON_TREE_CORE
    return params


class RadixFlowCache(UnifiedRadixCache):
    def __init__(self, params: CacheInitParams) -> None:
        self.rf_clock = RoundClock()  # components read it from their first match on
        self.rf_config = RadixFlowConfig()
        self.rf_trace = TraceWriter(None)
        prepare_params(params)
        super().__init__(params)
        assert self._tree_core_backend == PYTHON_TREE_CORE, self._tree_core_backend
        for ct, cls in ((ComponentType.FULL, RadixFlowFullComponent), (ComponentType.MAMBA, RadixFlowMambaComponent)):
            if ct in self.components:
                assert isinstance(self.components[ct], cls), f"{ct} component is {type(self.components[ct])}"

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        result = super().match_prefix(params)
        if params.req is not None:
            setattr(params.req, REQ_TOKEN_HIT, int(result.full_kv_hit_length))
            setattr(params.req, REQ_STATE_HIT, int(result.device_prefix_len))
        return result

    def configure(self, config: RadixFlowConfig, tp_rank: int = 0) -> None:
        from sglang_radixflow.schedule.producers import PublishMode
        from sglang_radixflow.schedule.state import SchedulingState

        self.rf_config = config
        self.rf_trace = TraceWriter(rank_trace_path(config.trace_path, tp_rank))
        if self.rf_trace.active:
            _assert_retraction_count()
        mamba = self.components.get(ComponentType.MAMBA)
        if mamba is None:
            mode, chunk = PublishMode.KV, 1
        else:
            mode = PublishMode.TRACK if self.enable_mamba_extra_buffer else PublishMode.CHUNK_END
            chunk = int(mamba.mamba_cache_chunk_size)
            if mode is PublishMode.TRACK:
                _assert_tracked_seqlen_field()
        self.rf_sched = SchedulingState(
            config, mode, chunk, state_ready_len=self.state_ready_len, trace=self.rf_trace,
            path_len=self.path_len if self.page_size == 1 else None, page_size=int(self.page_size),
        )

    def state_ready_len(self, namespace: Any, tokens: Any) -> int:
        """Deepest position on `tokens`' path where every component is present and published (a node boundary, or
        on full-attention caches any position inside a published node). Read-only:
        unlike match_prefix it splits no node and refreshes no LRU (so classifying never changes the tree)."""
        validators = self.tree_core._create_match_validators(None, match_device_only=True)
        kv_only = ComponentType.MAMBA not in self.components
        ready = 0
        for node, depth, matched in self._path(namespace, tokens):
            if matched < len(node.key):
                # The path continues inside this node. Full-attention KV is usable at any length (SGLang splits the
                # node on a match); a state exists only at a node's end.
                if kv_only and matched and all(valid(node) for valid in validators):
                    ready = depth + matched
                break
            if all(valid(node) for valid in validators):
                ready = depth + matched
        return ready

    def path_len(self, namespace: Any, tokens: Any) -> int:
        """How many of `tokens`' first tokens the tree holds as a path in `namespace`, whatever the nodes hold: an
        upper bound of what any match of a key starting with those tokens returns. Read-only, like state_ready_len.
        Page size 1 only (the caller's proofs compare it with unaligned lengths)."""
        assert self.page_size == 1, "path_len compares token counts, not pages"
        held = 0
        for _, depth, matched in self._path(namespace, tokens):
            held = depth + matched
        return held

    def _path(self, namespace: Any, tokens: Any) -> Iterator[tuple[Any, int, int]]:
        """The nodes along `tokens`' page-aligned key in `namespace`: (node, depth before it, tokens of the key it
        holds); the last one may hold only part of the key's remainder (the path continues inside it)."""
        extra_key, cache_salt = namespace
        key = RadixKey(token_ids=tokens, extra_key=extra_key, cache_salt=cache_salt).page_aligned(self.page_size)
        core = self.tree_core
        page_size = core.page_size
        raw, total = key.token_ids, len(key)
        node, depth = core.root_node, 0
        while depth < total:
            child = node.children.get(key.child_key_at(depth, page_size))
            if child is None:
                return
            held = child.key
            whole = len(held)
            # A node on a shared path usually matches whole: one C-level comparison of its raw tokens instead of
            # SGLang's search. Equal raw arrays of its length mean a whole match (a node key with a limit or a bigram
            # view has more raw tokens than its length, never equal); anything else takes SGLang's match_at.
            if depth + whole <= total and held.token_ids == raw[depth:depth + whole]:
                matched = whole
            else:
                matched = held.match_at(key, depth, page_size=page_size)
            yield child, depth, matched
            if matched < whole:
                return
            node, depth = child, depth + matched

    def checkpoint_into_tree(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        super().checkpoint_into_tree(req, up_to=up_to, **kwargs)
        sched = getattr(self, "rf_sched", None)
        if sched is not None:
            sched.on_landed(req)
            if sched.promises:
                sched.on_checkpoint(
                    req, up_to, lambda p: self.state_ready_len(p.namespace, p.tokens), self.rf_clock.last_launched()
                )

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        sched = getattr(self, "rf_sched", None)
        if sched is not None:
            sched.on_release(req, self.rf_clock.last_launched())
        if self.rf_trace.active:
            self.rf_trace.write(
                "request", rid=str(req.rid), prompt_len=len(req.origin_input_ids), token_hit=token_hit(req),
                state_hit=state_hit(req), cached_tokens=int(req.cached_tokens), round=self.rf_clock.last_launched(),
                # SGLang's decode retraction releases a request before requeueing it (and counts it only after this
                # call): such a request writes a record per release, its final one holding its last admission's hits
                retractions=int(req.retraction_count),
            )


def _assert_tracked_seqlen_field() -> None:
    # Adoption on extra_buffer hybrids reads where SGLang snapshots a state inside an in-flight extend
    # (schedule.in_flight.tracked_in_extend): prepare_for_extend records it on the request's KV record.
    from sglang.srt.managers.schedule_batch import ReqKvInfo

    assert "mamba_last_track_seqlen" in {f.name for f in dataclasses.fields(ReqKvInfo)}, (
        "SGLang's ReqKvInfo no longer records mamba_last_track_seqlen"
    )


def _assert_retraction_count() -> None:
    # Request records carry how often SGLang retracted the request: Req.reset_for_retract counts it.
    from sglang.srt.managers.schedule_batch import Req

    assert "retraction_count" in Req.reset_for_retract.__code__.co_names, (
        "SGLang's Req.reset_for_retract no longer counts retractions (retraction_count)"
    )


def token_hit(req: object) -> int:
    """ĥ of the request's last match (0 before any match)."""
    return int(getattr(req, REQ_TOKEN_HIT, 0))


def state_hit(req: object) -> int:
    """h of the request's last match (0 before any match)."""
    return int(getattr(req, REQ_STATE_HIT, 0))
