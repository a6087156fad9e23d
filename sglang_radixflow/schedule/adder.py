"""RadixFlowPrefillAdder: SGLang's PrefillAdder with state-ready traversal.

`add_one_req` decides per request, in this order: Blocked -> held with a cut sibling -> would fragment -> its
producer plan (wait for the chunk slot, a prefix request, or a producer-rows hold) -> SGLang's own admission, where a
producer's extend is cut at its boundary and chunk-last may hold a request SGLang would cut. See docs/design.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from sglang.srt.managers.schedule_batch import Req, ReqKvInfo
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, _PrefillAdmission

from sglang_radixflow.cache.tree import REQ_STATE_HIT, REQ_TOKEN_HIT, token_hit
from sglang_radixflow.schedule.blocked import DEFER_COUNT
from sglang_radixflow.schedule.prefix_request import can_split, make_prefix_request
from sglang_radixflow.schedule.producers import ProducerPlan, PublishMode, is_cache_only
from sglang_radixflow.schedule.state import FRAG_SKIPS, SLOT_WAIT_FACTOR, SLOT_WAITS, SchedulingState

# SGLang internals this module relies on (fail loudly on upgrade):
assert {"prefix_len", "extend_len", "max_new_tokens", "is_chunked"} <= {
    f.name for f in dataclasses.fields(_PrefillAdmission)
}
# What a match (Req.init_next_round_input: SGLang's match_kv_cache, the mamba component's copy-on-write, our
# match_prefix's hits) stages on a request, besides its fill ids: a producer hands these to its prefix request.
MATCH_REQ_FIELDS = ("prefix_len", "last_node", "last_host_node", "best_match_node", "host_hit_length",
                    "swa_host_hit_length", "mamba_host_hit_length", "swa_branching_seqlen", "mamba_branching_seqlen",
                    REQ_TOKEN_HIT, REQ_STATE_HIT)
MATCH_KV_FIELDS = ("cache_protected_len", "mamba_pool_idx", "mamba_cow_src_index", "mamba_needs_clear")
assert set(MATCH_KV_FIELDS) <= {f.name for f in dataclasses.fields(ReqKvInfo)}
assert callable(getattr(Req, "_compute_max_prefix_len", None)), "SGLang's Req caps a match at its input length - 1"
# The live prefill budget: with the running batch's decode headroom (total) and without it (current).
assert all(isinstance(getattr(PrefillAdder, name, None), property) for name in ("rem_total_tokens", "cur_rem_tokens"))


def can_take_match(producer: Any, boundary: int, page_size: int) -> bool:
    """Whether the producer's match is the one its prefix request would make: its walk stopped on the tree before
    b - 1 (device-only token keys, page size 1), so a walk of its first b tokens stops at the same node."""
    hit = token_hit(producer)
    return (
        page_size == 1
        and hit < boundary - 1
        and hit < producer._compute_max_prefix_len(len(producer.full_untruncated_fill_ids))
        and not producer.host_hit_length
        and not producer.mamba_host_hit_length
        and not producer.swa_host_hit_length
        and not producer.is_dllm()
    )


def take_match(prefix: Any, producer: Any) -> None:
    """Stage on the prefix request the match its producer made in this pass (instead of matching again: a second
    walk, and on hybrids a second mamba slot), and leave the producer as `release_staged` would."""
    prefix.refresh_fill_ids()
    for name in MATCH_REQ_FIELDS:
        setattr(prefix, name, getattr(producer, name))
    prefix.num_matched_prefix_tokens = min(
        prefix.prefix_len + prefix.host_hit_length,
        prefix._compute_max_prefix_len(len(prefix.full_untruncated_fill_ids)),
    )
    for name in MATCH_KV_FIELDS:
        setattr(prefix.kv, name, getattr(producer.kv, name))
    producer.kv.mamba_pool_idx = None  # the slot is the prefix request's now
    producer.kv.mamba_cow_src_index = None
    producer.kv.mamba_needs_clear = False


def release_staged(req: Any, tree_cache: Any) -> None:
    """Undo what init_next_round_input staged for a request that is not admitted (mirrors scheduler.py's own
    cleanup for rejected requests): the COW source (unlocked while waiting: it may be evicted) and the COW slot."""
    kv = req.kv
    kv.mamba_cow_src_index = None
    kv.mamba_needs_clear = False
    if kv.holds_mamba and not getattr(req, "session", None):
        tree_cache.req_to_token_pool.mamba_allocator.free(kv.mamba_pool_idx.unsqueeze(-1))
        kv.mamba_pool_idx = None


class RadixFlowPrefillAdder(PrefillAdder):
    _rf_plan: Optional[ProducerPlan] = None  # the plan of the request SGLang's admission is deciding on
    _rf_held: Any = None  # the request chunk-last holds if SGLang cuts this admission (a prefix request's producer)
    _rf_cut_held = False  # chunk-last held the request being added
    _rf_has_chunked = False  # add_one_req's has_chunked_req in this pass
    _rf_parked = False  # SGLang's chunked request waits this pass for KV (`add_chunked_req`)

    @property
    def _rf(self) -> SchedulingState:
        return self.tree_cache.rf_sched

    def _defer(self, req: Any) -> AddReqResult:
        """req waits: undo its match; the skip scan goes on, prefix-stop ends here."""
        release_staged(req, self.tree_cache)
        return AddReqResult.OTHER if self._rf.traversal == "stop" else AddReqResult.CONTINUE

    def add_one_req(self, req: Any, has_chunked_req: bool, truncation_align_size: Optional[int]):
        if self._rf_parked:
            # A batch that runs without the parked chunk would count it a middle chunk it never ran (SGLang bumps
            # inflight_middle_chunks per batch), and the budget is spent anyway.
            return AddReqResult.NO_TOKEN
        sched = self._rf
        sched.current.holds.note_examined()
        self._rf_has_chunked = has_chunked_req
        if sched.blocking_promise(req) is not None:
            sched.note_blocked(req)
            return self._defer(req)
        if sched.held_with_cut(req):
            sched.hold_cut(req)
            release_staged(req, self.tree_cache)
            return AddReqResult.CONTINUE
        if sched.config.fragmentation and self._would_fragment(req, sched):
            sched.note_fragment_skip(req)
            release_staged(req, self.tree_cache)
            return AddReqResult.CONTINUE
        plan = self._plan(req, sched)
        if plan is not None and self._waits_for_chunk_slot(req, plan, sched):
            # Its state at b can only be published by cutting its chunk there, and SGLang tracks one chunked request
            # at a time: it waits for the slot instead of letting every sibling recompute the prefix (bounded).
            sched.note_blocked(req, counter=SLOT_WAITS)  # bounded separately: the chunk slot frees every round
            return self._defer(req)
        if plan is not None and self._needs_prefix_request(req, plan, sched):
            return self._admit_prefix_request(req, plan, has_chunked_req, truncation_align_size)
        if plan is None and sched.holds_for_producers(req):
            release_staged(req, self.tree_cache)
            return AddReqResult.CONTINUE
        return self._admit(req, plan, req, has_chunked_req, truncation_align_size)

    def _admit(self, req: Any, plan: Optional[ProducerPlan], held: Any, has_chunked_req: bool,
               truncation_align_size: Optional[int]):
        """SGLang's own admission of `req` with its plan; `held`: the request chunk-last holds if the admission is
        cut (req itself, or the producer of a prefix request)."""
        self._rf_plan, self._rf_held, self._rf_cut_held = plan, held, False
        try:
            result = PrefillAdder.add_one_req(self, req, has_chunked_req, truncation_align_size)
        finally:
            self._rf_plan, self._rf_held = None, None
        if self.can_run_list and self.can_run_list[-1] is req:
            self._rf.note_admitted(req, plan)
        elif self._rf_cut_held:
            release_staged(req, self.tree_cache)
        return result

    def _plan(self, req: Any, sched: SchedulingState) -> Optional[ProducerPlan]:
        if is_cache_only(req):
            plan = sched.plan_cache_only(req, token_hit(req))
            if plan is not None:
                return plan
        # no_buffer hybrids publish a state at b by cutting the producer's chunk there (SGLang's single chunk slot),
        # or with the slot taken through a prefix request; with neither there is nothing to plan for.
        if (
            sched.mode is PublishMode.CHUNK_END and not self._may_chunk
            and not sched.config.producer_slot_wait and not sched.prefix_requests
        ):
            return None
        return sched.plan(req, token_hit(req))

    @property
    def _may_chunk(self) -> bool:
        """Whether the request being added may become this pass's chunked request (SGLang tracks one)."""
        return not self._rf_has_chunked and self.new_chunked_req is None

    def _waits_for_chunk_slot(self, req: Any, plan: ProducerPlan, sched: SchedulingState) -> bool:
        """RADIXFLOW_PRODUCER_SLOT_WAIT (off by default: by the paper's definitions its siblings are Ready, nothing is
        produced for them), and always for a cache-only request: it exists to leave its states."""
        bound = sched.config.max_defer_rounds
        return (
            (sched.config.producer_slot_wait or (plan.siblings == 0 and is_cache_only(req)))
            and plan.mode is PublishMode.CHUNK_END
            and plan.boundary < len(req.full_untruncated_fill_ids)
            and not self._may_chunk
            and getattr(req, SLOT_WAITS, 0) < SLOT_WAIT_FACTOR * bound
            and getattr(req, DEFER_COUNT, 0) < bound  # past its bound it runs from h
        )

    def _needs_prefix_request(self, req: Any, plan: ProducerPlan, sched: SchedulingState) -> bool:
        """A no_buffer producer with siblings waiting publishes b through a prefix request whenever it can, even with
        the chunk slot free: cut at b it would take the slot from the request that should fill the token budget."""
        return (
            plan.mode is PublishMode.CHUNK_END
            and plan.siblings > 0
            and sched.prefix_requests
            and plan.boundary < len(req.origin_input_ids)
            and getattr(req, DEFER_COUNT, 0) < sched.config.max_defer_rounds  # past its bound it runs from h
            and can_split(req)
        )

    def _admit_prefix_request(self, req: Any, plan: ProducerPlan, has_chunked_req: bool,
                              truncation_align_size: Optional[int]):
        """Admit a prefix request for req's first b tokens in req's place; req waits (Blocked on it next round)."""
        prefix = make_prefix_request(req, plan.boundary)
        if can_take_match(req, plan.boundary, self.tree_cache.page_size):
            take_match(prefix, req)  # the same match: the producer's walk stopped before b
        else:
            release_staged(req, self.tree_cache)
            prefix.init_next_round_input(self.tree_cache)
        result = self._admit(prefix, plan, req, has_chunked_req, truncation_align_size)
        if self.can_run_list and self.can_run_list[-1] is prefix:
            self._rf.note_prefix_request(req)
        else:
            release_staged(prefix, self.tree_cache)  # not admitted (budget, or held): it never existed
        return result

    def _would_fragment(self, req: Any, sched: SchedulingState) -> bool:
        """The remaining budget would cut `req` into a fragment below one checkpoint grid (it would publish no
        state): leave it for a later round, where it starts a chunk, while later requests may still fit. Bounded."""
        remaining = self.rem_chunk_tokens
        extend = len(req.full_untruncated_fill_ids) - int(req.prefix_len)
        return (
            remaining is not None
            and bool(self.can_run_list)
            and 0 < remaining < extend
            and remaining < sched.fragment_min_tokens
            and getattr(req, FRAG_SKIPS, 0) < sched.config.max_defer_rounds
        )

    def _select_prefill_admission(self, req: Any, **kwargs: Any):
        admission = PrefillAdder._select_prefill_admission(self, req, **kwargs)
        if isinstance(admission, AddReqResult):
            return admission
        if admission.is_chunked:
            if self.new_chunked_req is not None or self._rf_has_chunked:
                # SGLang tracks ONE chunked request per pass. Natively a chunk spends the rest of the budget, so a
                # second one never arises; after a chunk cut at a producer boundary budget is left, and a second
                # chunked admission would replace the first. End the scan as native budget exhaustion would.
                return AddReqResult.OTHER
            if self._holds_cut(req, admission):
                return AddReqResult.CONTINUE
        plan = self._rf_plan
        if plan is None:
            return admission
        if plan.mode is PublishMode.TRACK:
            return self._track_admission(admission, plan)
        end = admission.prefix_len + admission.extend_len
        if plan.mode is not PublishMode.CHUNK_END or not (admission.prefix_len < plan.boundary < end
                                                         and self._may_chunk):
            return admission
        # Cut the producer's extend at b: with no_buffer its state is stored at the end of the chunk, i.e. at b.
        return dataclasses.replace(
            admission, extend_len=plan.boundary - admission.prefix_len, max_new_tokens=0, is_chunked=True
        )

    def _holds_cut(self, req: Any, admission: _PrefillAdmission) -> bool:
        """Chunk-last: SGLang cut this admission to the budget left. Not held when the cut is at or past a no_buffer
        producer's b (cut there anyway), nor with a host-tier hit (SGLang selects it again after its load-back)."""
        plan = self._rf_plan
        if (
            plan is not None and plan.mode is PublishMode.CHUNK_END and self._may_chunk
            and admission.prefix_len < plan.boundary <= admission.prefix_len + admission.extend_len
        ):
            return False
        if req.host_hit_length:
            return False
        extend = len(req.full_untruncated_fill_ids) - admission.prefix_len
        held = self._rf_held if self._rf_held is not None else req
        self._rf_cut_held = self._rf.holds_cut(held, extend, plan, token_hit(held))
        return self._rf_cut_held

    def _track_admission(self, admission: _PrefillAdmission, plan: ProducerPlan) -> "_PrefillAdmission | AddReqResult":
        """extra_buffer: a producer chunk that stops short of b ends on the snapshot grid, or b would be off the grid
        of its continuation; with less than one grid left it starts next round."""
        if not admission.is_chunked or admission.prefix_len + admission.extend_len >= plan.boundary:
            return admission
        grid = self._rf.cache_chunk
        aligned = admission.extend_len - admission.extend_len % grid
        if aligned <= 0:
            return AddReqResult.OTHER
        return dataclasses.replace(admission, extend_len=aligned)

    def add_chunked_req(self, req: Any):
        """A producer's continuation is cut at its pending b, so that its state lands there (a chunked request
        becomes a producer first when siblings arrived since: `note_continuation`)."""
        sched = self._rf
        sched.note_continuation(req)
        room = self._room_when_budget_spent()
        if room is not None:
            sched.current.stats.room_cuts += 1  # counted in the round record (chunk_room_cuts)
        if room is not None and room <= 0:
            return self._park(req)
        # Full attention needs no cut: its KV is usable at any length once in the tree.
        cut = sched.pending_boundary(req) if sched.mode is not PublishMode.KV else None
        if cut is not None:
            limit: Optional[int] = cut - int(req.prefix_len)
            if sched.mode is PublishMode.TRACK:
                limit = self._track_continuation_limit(limit, sched.cache_chunk, room)
                if limit == 0:
                    return self._park(req)
            if limit is not None:
                self._limit_chunk(limit)
        if room is not None:
            self._limit_chunk(room)
        return super().add_chunked_req(req)

    def _room_when_budget_spent(self) -> Optional[int]:
        """The KV the pool can still give this chunk when decode headroom has spent the budget (SGLang then lets a
        continuation through at full size and its allocation fails); None otherwise."""
        if self.rem_total_tokens > 0:
            return None
        return int(self.cur_rem_tokens) - self.page_size

    def _park(self, req: Any) -> Any:
        """SGLang's parked chunk (extend_end stays at prefix_len): it waits a pass while the running requests decode
        and free KV; nothing else is admitted in this pass."""
        self._rf_parked = True
        return req

    def _limit_chunk(self, limit: int) -> None:
        self.chunked_req_limit = limit if self.chunked_req_limit is None else min(self.chunked_req_limit, limit)

    def _track_continuation_limit(self, to_boundary: int, grid: int, room: Optional[int]) -> Optional[int]:
        """extra_buffer: a continuation that reaches b runs uncut (SGLang snapshots b in it); one the budget stops
        short of b ends on the grid; 0 when the pool's room is less than one grid step."""
        budget = self.rem_chunk_tokens
        if room is not None:
            budget = room if budget is None else min(budget, room)
        if budget is None or budget >= to_boundary:
            return None
        aligned = budget - budget % grid
        if aligned > 0:
            return aligned
        return 0 if room is not None and room < grid else None
