"""RadixFlowPrefillAdder: SGLang's PrefillAdder with state-ready traversal.

At each scan position: Blocked (an open promise covers this request's useful prefix) -> undo what
`init_next_round_input` staged and return CONTINUE (skip: the scan goes on) or OTHER (stop: the prefix-stop
baseline). Otherwise SGLang's own admission decides (Ready, or its NO_TOKEN / OTHER: native handling). An admitted
request may become a producer; under no_buffer its extend is cut at the boundary so its state lands there.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Optional

from sglang.srt.managers import schedule_policy
from sglang.srt.managers.schedule_batch import Req, ReqKvInfo
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, _PrefillAdmission
from sglang.srt.mem_cache.prefill_budget import PrefillBudget

from sglang_radixflow.cache.tree import REQ_STATE_HIT, REQ_TOKEN_HIT, token_hit
from sglang_radixflow.schedule.prefix_request import can_split, make_prefix_request
from sglang_radixflow.schedule.producers import ProducerPlan, PublishMode, is_cache_only, namespace_of, request_tokens
from sglang_radixflow.schedule.state import (
    DEFER_COUNT, FRAG_SKIPS, MAY_BLOCK, MAY_FRAGMENT, MAY_PLAN, SLOT_WAIT_FACTOR, SLOT_WAITS,
)

# SGLang internals this module relies on (fail loudly on upgrade):
assert {"prefix_len", "extend_len", "max_new_tokens", "is_chunked", "replay_len"} <= {
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
# What _provably_cut reads of SGLang's admission (add_one_req, _select_prefill_admission, budget checks).
assert {"_IS_HIP", "CLIP_MAX_NEW_TOKENS", "get_exec"} <= set(vars(schedule_policy)), "schedule_policy internals"
assert list(inspect.signature(PrefillAdder._select_prefill_admission).parameters) == [
    "self", "req", "total_tokens", "host_hit_length", "swa_host_hit_length", "truncation_align_size", "has_chunked_req",
], "PrefillAdder._select_prefill_admission's parameters (the override spells them out)"
assert all(callable(getattr(PrefillAdder, name, None)) for name in (
    "_mamba_gap_budget_for_req", "_request_slot_reserve_for_req",
)), "PrefillAdder's admission helpers"


def can_take_match(producer: Any, boundary: int, page_size: int) -> bool:
    """Whether the producer's match is exactly the one its prefix request (its first `boundary` tokens) would make.
    It is when the producer's walk stopped on the tree itself (its token hit below its own key limit) before the
    prefix request's limit (b - 1): a key of its first b tokens then stops at the same node, with the same hits and
    the same state to copy. Device-only matches of token keys (no host hits, no dLLM), page size 1."""
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
    walk, and on hybrids a second mamba slot allocation), and leave the producer as `release_staged` would."""
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
    _rf_plan: Optional[ProducerPlan] = None
    _rf_producer: Any = None  # while a prefix request is selected: its producer (the request the scan holds)
    _rf_producer_plan: Optional[ProducerPlan] = None  # and the producer's plan
    _rf_cut_held: bool = False  # the request being added was held by chunk_last (the scan offers it again)
    # add_one_req's arguments in this pass (SGLang passes the same ones every time), recorded for the requests it
    # checks and at a chunked admission: what the verdicts past PLAIN read
    _rf_has_chunked: bool = False
    _rf_align: Optional[int] = None

    def add_one_req(self, req: Any, has_chunked_req: bool, truncation_align_size: Optional[int]):
        # Runs for every request the scan examines: the common case (nothing open on its sibling key, no sibling
        # waiting: PLAIN) is kept to a few lookups on top of SGLang's own add_one_req.
        sched = self.tree_cache.rf_sched
        checks = sched.examine(req)
        if checks:
            self._rf_has_chunked, self._rf_align = has_chunked_req, truncation_align_size
            plan = self._checked(req, sched, checks, has_chunked_req, truncation_align_size)
            if plan.__class__ is AddReqResult:
                return plan
            self._rf_plan = plan
            try:
                result = PrefillAdder.add_one_req(self, req, has_chunked_req, truncation_align_size)
            finally:
                self._rf_plan = None
        else:
            plan = None
            result = PrefillAdder.add_one_req(self, req, has_chunked_req, truncation_align_size)
        can_run = self.can_run_list
        if can_run and can_run[-1] is req:
            sched.note_admitted(req, plan)
        elif self._rf_cut_held:
            self._rf_cut_held = False
            release_staged(req, self.tree_cache)
        return result

    @property
    def _rf_may_chunk(self) -> bool:
        """Whether the request being added may become this pass's chunked request (SGLang tracks one)."""
        return not self._rf_has_chunked and self.new_chunked_req is None

    def _checked(self, req: Any, sched: Any, checks: int, has_chunked_req: bool,
                 truncation_align_size: Optional[int]) -> "Optional[ProducerPlan] | AddReqResult":
        """radixflow's verdicts for a request `SchedulingState.examine` did not pass as PLAIN: Blocked (skip: CONTINUE,
        stop: OTHER), a fragment deferral, or its producer plan (None: none) or hold."""
        if checks & MAY_BLOCK and sched.blocking_promise(req) is not None:
            sched.note_blocked(req)
            release_staged(req, self.tree_cache)
            return AddReqResult.OTHER if sched.traversal == "stop" else AddReqResult.CONTINUE
        if checks & MAY_FRAGMENT and self._would_fragment(req, sched):
            sched.note_fragment_skip(req)
            release_staged(req, self.tree_cache)
            return AddReqResult.CONTINUE
        if checks & MAY_PLAN:
            return self._plan_or_hold(req, sched, has_chunked_req, truncation_align_size)
        return None

    def _plan_or_hold(self, req: Any, sched: Any, has_chunked_req: bool, truncation_align_size: Optional[int]
                      ) -> "Optional[ProducerPlan] | AddReqResult":
        """A Ready request's producer plan (None: no producer), or the scan's result when this pass does not admit it
        as it is: it waits for the chunk slot, a prefix request goes in its place, or producer rows hold it."""
        plan = self._plan(req, sched, token_hit(req))
        if plan is not None:
            if self._producer_slot_busy(req, plan, sched):
                # RADIXFLOW_PRODUCER_SLOT_WAIT: its state at b can only be published by cutting its chunk there, and
                # SGLang tracks one chunked request at a time: wait for the slot instead of letting every sibling
                # recompute the prefix. More reuse, but at most one new hybrid producer per round (off by default:
                # by the paper's definitions its siblings are Ready, nothing is being produced for them).
                sched.note_slot_wait(req)
                release_staged(req, self.tree_cache)
                return AddReqResult.OTHER if sched.traversal == "stop" else AddReqResult.CONTINUE
            if self._needs_prefix_request(req, plan, sched):
                return self._admit_prefix_request(req, plan, sched, has_chunked_req, truncation_align_size)
        # RADIXFLOW_PRODUCER_ROWS: a Ready non-producer past S - R rows lets the scan look ahead for producers first
        # (the scan's iterator offers it again in this pass).
        elif sched.config.producer_rows and sched.holds_for_producers(req):
            release_staged(req, self.tree_cache)
            return AddReqResult.CONTINUE
        return plan

    def _needs_prefix_request(self, req: Any, plan: ProducerPlan, sched: Any) -> bool:
        """A no_buffer producer with siblings waiting publishes b through a prefix request whenever it can, even with
        SGLang's single chunk slot free: a producer cut at b would hold that slot, and then the request that should
        fill the rest of the token budget with a chunk cannot be chunked and the pass ends with the budget unspent.
        (Rows are the same either way: prefix then producer, or chunk then continuation.) The cut remains for
        producers that cannot be split, and when prefix requests are off."""
        return (
            plan.mode is PublishMode.CHUNK_END
            and plan.siblings > 0
            and sched.prefix_requests
            and plan.boundary < len(req.origin_input_ids)
            and getattr(req, DEFER_COUNT, 0) < sched.config.max_defer_rounds  # past its bound it runs from h
            and can_split(req)
        )

    def _admit_prefix_request(self, req: Any, plan: ProducerPlan, sched: Any, has_chunked_req: bool,
                              truncation_align_size: Optional[int]):
        """Admit a prefix request for req's first b tokens in req's place; req waits (Blocked on it next round)."""
        prefix = make_prefix_request(req, plan.boundary)
        if can_take_match(req, plan.boundary, self.tree_cache.page_size):
            take_match(prefix, req)  # the same match: the producer's walk stopped before b
        else:
            release_staged(req, self.tree_cache)
            prefix.init_next_round_input(self.tree_cache)
        # chunk_last holds the producer, which is in the queue, not its prefix request
        self._rf_producer, self._rf_producer_plan = req, plan
        try:
            result = super().add_one_req(prefix, has_chunked_req, truncation_align_size)
        finally:
            self._rf_producer, self._rf_producer_plan = None, None
        if self.can_run_list and self.can_run_list[-1] is prefix:
            sched.note_admitted(prefix, plan)
            sched.note_prefix_request(req, prefix)
            return result
        self._rf_cut_held = False
        release_staged(prefix, self.tree_cache)  # not admitted (budget, or held): it never existed
        return result

    def _plan(self, req: Any, sched: Any, hit: int) -> Optional[ProducerPlan]:
        if is_cache_only(req):
            plan = sched.plan_cache_only(req, hit)
            if plan is not None:
                return plan
        # no_buffer hybrids publish a state at b by cutting the producer's chunk there (SGLang's single chunk slot)
        # or, with the slot taken, through a prefix request; with neither, planning would be wasted work.
        if (
            sched.mode is PublishMode.CHUNK_END
            and not self._rf_may_chunk
            and not sched.config.producer_slot_wait
            and not sched.prefix_requests
        ):
            return None
        return sched.plan(req, hit)

    def _producer_slot_busy(self, req: Any, plan: ProducerPlan, sched: Any) -> bool:
        # A cache-only request exists to leave its states: it always waits for the chunk slot (bounded).
        return (
            (sched.config.producer_slot_wait or (plan.siblings == 0 and is_cache_only(req)))
            and plan.mode is PublishMode.CHUNK_END
            and plan.boundary < len(req.full_untruncated_fill_ids)
            and not self._rf_may_chunk
            and getattr(req, SLOT_WAITS, 0) < SLOT_WAIT_FACTOR * sched.config.max_defer_rounds
            and getattr(req, DEFER_COUNT, 0) < sched.config.max_defer_rounds  # past its bound it runs from h
        )

    def add_chunked_req(self, req: Any):
        """A producer whose first chunk stopped short of its boundary (token budget) continues with a chunk cut at
        b, so that its state lands exactly there. A chunked request that was no producer becomes one first when
        siblings have arrived since (`note_continuation`)."""
        sched = self.tree_cache.rf_sched
        sched.note_continuation(req)
        # Full attention needs no cut: its KV is usable at any length once in the tree.
        cut = sched.pending_boundary(req) if sched.mode is not PublishMode.KV else None
        if cut is not None:
            limit: Optional[int] = cut - int(req.prefix_len)
            if sched.mode is PublishMode.TRACK:
                limit = self._track_continuation_limit(limit, sched.cache_chunk)
            if limit is not None:
                self.chunked_req_limit = limit if self.chunked_req_limit is None else min(self.chunked_req_limit, limit)
        return super().add_chunked_req(req)

    def _track_continuation_limit(self, to_boundary: int, grid: int) -> Optional[int]:
        """extra_buffer: SGLang snapshots b inside the continuation (`mamba_branching_seqlen` stays set, and b is on
        the grid counted from where the chunk before it stopped: `_track_admission`), so a continuation that reaches
        b runs on uncut. One the budget stops short of b ends on that grid too, for the same reason."""
        budget = self.rem_chunk_tokens
        if budget is None or budget >= to_boundary:
            return None
        aligned = budget - budget % grid
        return aligned if aligned > 0 else None

    def _would_fragment(self, req: Any, sched: Any) -> bool:
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

    def _select_prefill_admission(self, req: Any, *, total_tokens: int, host_hit_length: int,
                                  swa_host_hit_length: int, truncation_align_size: Optional[int],
                                  has_chunked_req: bool = False):
        # SGLang's keyword-only parameters spelled out (asserted at import): no kwargs dict per examined request.
        admission = PrefillAdder._select_prefill_admission(
            self, req, total_tokens=total_tokens, host_hit_length=host_hit_length,
            swa_host_hit_length=swa_host_hit_length, truncation_align_size=truncation_align_size,
            has_chunked_req=has_chunked_req,
        )
        if admission.__class__ is AddReqResult:
            return admission
        if admission.is_chunked:
            # what _holds_cut and _provably_cut read (add_one_req records them only for requests it checks)
            self._rf_has_chunked, self._rf_align = has_chunked_req, truncation_align_size
            if self.new_chunked_req is not None or has_chunked_req:
                # SGLang tracks ONE chunked request per pass. Natively a chunk always spends the rest of the budget, so
                # a second one never arises; after a chunk cut at a producer boundary budget is left, and a second
                # chunked admission would replace the first. End the scan as native budget exhaustion would.
                return AddReqResult.OTHER
            if self._holds_cut(req, admission):
                return AddReqResult.CONTINUE
        plan = self._rf_plan
        if plan is None:
            return admission
        if plan.mode is PublishMode.TRACK:
            return self._track_admission(admission, plan)
        if plan.mode is not PublishMode.CHUNK_END:
            return admission
        end = admission.prefix_len + admission.extend_len
        if not (admission.prefix_len < plan.boundary < end and self._rf_may_chunk):
            return admission
        # Cut the producer's extend at b: with no_buffer its state is stored at the end of the chunk, i.e. at b.
        return dataclasses.replace(
            admission, extend_len=plan.boundary - admission.prefix_len, max_new_tokens=0, is_chunked=True
        )

    def _holds_cut(self, req: Any, admission: _PrefillAdmission) -> bool:
        """RADIXFLOW_CHUNK_LAST: SGLang cut this admission to the budget left: the scan holds the request (a prefix
        request's producer) and offers it again after whole requests behind it had their turn. Not when the cut is
        at or past a producer's boundary b (no_buffer: its extend is cut at b anyway, and b fits), and never for a
        request with a host-tier hit (HiCache): SGLang selects it a second time after queueing its load-back, and a
        request passed over then would leave that load without its consumer."""
        plan = self._rf_plan
        if (
            plan is not None and plan.mode is PublishMode.CHUNK_END and self._rf_may_chunk
            and admission.prefix_len < plan.boundary <= admission.prefix_len + admission.extend_len
        ):
            return False
        if req.host_hit_length:
            return False
        extend = len(req.full_untruncated_fill_ids) - admission.prefix_len
        held, held_plan = (req, plan) if self._rf_producer is None else (self._rf_producer, self._rf_producer_plan)
        sched = self.tree_cache.rf_sched
        provable = self._can_prove_cuts()
        self._rf_cut_held = sched.holds_cut(
            held, extend, held_plan, token_hit(held), provably_cut=self._provably_cut if provable else None,
        )
        if self._rf_cut_held and provable:
            sched.screen_cuts(self._provably_cut)
        return self._rf_cut_held

    def _can_prove_cuts(self) -> bool:
        """Whether `_provably_cut` can stand in for SGLang's admission in this pass: a device-only tree of page size 1
        (its path length bounds any match), the plain token budget (admission fails only past `remaining_total`),
        chunked prefill on, and none of the features that change the chunk (dLLM, truncation alignment, SWA replay,
        the AMD tile budget)."""
        cache = self.tree_cache
        return (
            cache.page_size == 1
            and getattr(cache, "cache_controller", "unknown") is None
            and not cache.disable
            and type(self.memory_budget) is PrefillBudget
            and self.rem_chunk_tokens is not None
            and self.dllm_config is None
            and self._rf_align is None
            and not schedule_policy._IS_HIP
            and not schedule_policy.get_exec().features.enable_encoder_swa_bounded_replay
        )

    def _provably_cut(self, req: Any) -> bool:
        """Whether examining `req` now would end in a chunk_last hold, known without matching it: the tree holds
        nothing of its path (so its match would hit nothing, and touch no node's LRU position: a request with a cached
        prefix is always matched, as SGLang's scan would refresh that prefix), radixflow's own verdicts pass it on
        (`is_plain_for_cut`), SGLang's memory checks pass it (its prompt, output budget and reserves fit
        `remaining_total`; a state slot is free), and its prompt is longer than the chunk budget, so SGLang cuts it.
        Requests whose match is keyed by more than their token ids (multimodal, input embeddings, sessions) are always
        matched."""
        limit = self.rem_chunk_tokens
        if (
            limit is None or limit <= 0 or self.new_chunked_req is not None or self._rf_has_chunked
            or req.session is not None or req.multimodal_inputs is not None or req.input_embeds is not None
            or req.token_indices_to_pool is not None
            or (self.can_run_list and self.can_run_list[0].token_indices_to_pool is not None)
            or (self.prefill_max_requests is not None and len(self.can_run_list) >= self.prefill_max_requests)
        ):
            return False
        length = len(req.origin_input_ids) + len(req.output_ids)  # SGLang's full_untruncated_fill_ids, its extend
        if length <= limit or not self.tree_cache.rf_sched.is_plain_for_cut(req, length):
            return False
        if self.tree_cache.path_len(namespace_of(req), request_tokens(req)):
            return False
        # add_one_req's own total (its max_new expression, which SGLang does not factor out), at a hit of 0.
        max_new = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0),
                      schedule_policy.CLIP_MAX_NEW_TOKENS)
        gap = self._mamba_gap_budget_for_req(req, include_host_hit=True)
        if self.rem_mamba_slots is not None and gap // self._mamba_slot_cost > self.rem_mamba_slots:
            return False
        total = length + max_new + self.per_req_token_overhead + gap + self._request_slot_reserve_for_req(
            req, extend_input_len=length - req.prefix_len,  # its prefill_tokens: prefix_len + this = length
        )
        return total < self.memory_budget.remaining_total

    def _track_admission(self, admission: _PrefillAdmission, plan: ProducerPlan) -> "_PrefillAdmission | AddReqResult":
        """extra_buffer: SGLang snapshots a state inside an extend only on the cache-chunk grid counted from that
        extend's start, and b is on the grid counted from this one. A producer chunk that stops short of b (token
        budget) must end on the grid too, or b is off the grid of its continuation and the promise fails ("passed the
        boundary without a state": its siblings waited for nothing). The budget the rounding leaves (less than one
        grid) goes unused; with less than one grid left the producer starts next round."""
        if not admission.is_chunked or admission.prefix_len + admission.extend_len >= plan.boundary:
            return admission
        grid = self.tree_cache.rf_sched.cache_chunk
        aligned = admission.extend_len - admission.extend_len % grid
        if aligned <= 0:
            return AddReqResult.OTHER
        return dataclasses.replace(admission, extend_len=aligned)
