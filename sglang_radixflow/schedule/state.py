"""Scheduling state kept next to the cache: config, the promise table, the in-flight table, and the current pass.

One instance per RadixFlowCache (one per scheduler / TP rank). Every decision reads only what all TP ranks share
(the replicated waiting queue, the tree, the round counter), never wall-clock time, so ranks agree.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from sglang_radixflow.cache.promises import Promise, PromiseTable
from sglang_radixflow.cache.tree import REQ_TOKEN_HIT
from sglang_radixflow.config import RadixFlowConfig
from sglang_radixflow.observe.meta import note_hits
from sglang_radixflow.observe.pass_records import PassRecords, PassStats
from sglang_radixflow.observe.rounds import RoundRecorder
from sglang_radixflow.observe.trace import TraceWriter
from sglang_radixflow.schedule.admission import AdmissionGate
from sglang_radixflow.schedule.blocked import DEFER_COUNT, BlockingRules, blocked_on
from sglang_radixflow.schedule.holds import CUT_HOLDS, Holds
from sglang_radixflow.schedule.in_flight import Adoption, InFlightTable
from sglang_radixflow.schedule.producers import (
    ProducerPlan, PublishMode, is_cache_only, namespace_of, native_branch, plan_cache_only, plan_producer,
    request_tokens,
)
from sglang_radixflow.schedule.siblings import INDEX_PREFIX, SiblingIndex

logger = logging.getLogger("sglang_radixflow")
SLOT_WAITS = "rf_slot_waits"  # per-request attribute: passes a would-be producer waited for the chunk slot
SLOT_WAIT_FACTOR = 4  # slot waits are bounded at this multiple of max_defer_rounds (the slot frees every round)
FRAG_SKIPS = "rf_fragment_skips"  # per-request attribute: rounds it was deferred to avoid a small fragment
FULL_ATTENTION_FRAGMENT_MIN = 64  # tokens; hybrids use their checkpoint grid


@dataclass
class Pass:
    """One prefill scheduling pass (Scheduler._get_new_batch_prefill_raw), from begin_pass to end_pass."""

    stats: PassStats
    row_budget: Optional[int]
    token_budget: Optional[int]
    holds: Holds
    began: float = field(default_factory=time.perf_counter)  # the first-selection time of what it admits
    admitted_ids: set[int] = field(default_factory=set)
    non_producers: int = 0  # admitted; producer rows hold Ready ones past S - R of these


class SchedulingState:
    def __init__(
        self, config: RadixFlowConfig, mode: PublishMode, cache_chunk: int,
        state_ready_len: Optional[Callable[[Any, Any], int]] = None, trace: Optional[TraceWriter] = None,
        path_len: Optional[Callable[[Any, Any], int]] = None, page_size: int = 1,
    ) -> None:
        self.config = config
        self.mode = mode
        self.cache_chunk = max(1, cache_chunk)
        self.page_size = page_size  # the tree's unit: boundaries and partial promises are whole pages
        self.fragment_min_tokens = self.cache_chunk if mode is not PublishMode.KV else FULL_ATTENTION_FRAGMENT_MIN
        self._path_len = path_len  # the tree's held path length (RadixFlowCache.path_len), page size 1 only
        # Full attention: a late sibling uses the first one's KV from the round a hold would give it (docs/design.md)
        admission = "native" if mode is PublishMode.KV and config.admission == "flex" else config.admission
        self.gate = AdmissionGate(admission, config.hold_ms, state_ready_len or (lambda ns, toks: 0),
                                  config.min_gain_tokens)
        self.recorder = RoundRecorder(trace or TraceWriter(None))
        self.promises = PromiseTable(head_len=INDEX_PREFIX)  # indexed by the sibling key's tokens
        self.records = PassRecords(self.promises)
        self.in_flight = InFlightTable()
        self.siblings = SiblingIndex()
        self.traversal = config.traversal
        self.disabled_reason: Optional[str] = None
        self.prefix_requests = config.prefix_requests  # switched off where SGLang's features make it unsafe
        self.current: Optional[Pass] = None
        self.pending_pass: Optional[tuple] = None  # (batch, PassStats, S, T, waiting after) until run_batch

    # ---- configuration ----
    def disable_traversal(self, reason: str) -> None:
        if self.traversal != "native":
            logger.warning("sglang-radixflow: state-ready traversal disabled: %s", reason)
        self.traversal, self.disabled_reason = "native", reason

    def disable_hold(self, reason: str) -> None:
        if self.config.admission != "native":
            logger.warning("sglang-radixflow: admission hold disabled: %s", reason)
        self.gate.mode = "native"

    def make_inert(self, reason: str) -> None:
        """SGLang's own scheduling throughout — no traversal (hence no producers or prefix requests), no admission
        hold, no fragment deferral — for a cache that can publish nothing (every wait would be for nothing)."""
        self.disable_traversal(reason)
        self.disable_hold(reason)
        self.config = replace(self.config, fragmentation=False)

    @property
    def rules(self) -> BlockingRules:
        return BlockingRules(self.config.min_gain_tokens, self.config.max_defer_rounds,
                             partial=self.mode is PublishMode.KV, page_size=self.page_size)

    # ---- pass life cycle (called around Scheduler._get_new_batch_prefill_raw) ----
    def begin_pass(self, round_id: int, waiting: list[Any], row_budget: Optional[int] = None,
                   token_budget: Optional[int] = None) -> None:
        self.promises.expire(round_id, self.config.promise_max_age_rounds)
        self.in_flight.forget_before(round_id - 1)
        self.current = Pass(PassStats(round_id=round_id, waiting=len(waiting)), row_budget, token_budget,
                            Holds(lookahead=row_budget or 1))
        if self.traversal != "native":
            self.siblings.sync(waiting)

    def end_pass(self, remaining: list[Any]) -> Optional[PassStats]:
        """The pass is over and SGLang's queue is `remaining`: the hits of what it admitted, summed and written to
        each response's meta channel."""
        current, self.current = self.current, None
        if current is None:
            return None
        stats = current.stats
        if self.traversal != "native":
            self.siblings.left(stats.admitted_reqs, remaining)
        for req in stats.admitted_reqs:
            # SGLang matches a request once per pass, and nothing after the adder moves its prefix_len
            token_hit, state_hit = int(getattr(req, REQ_TOKEN_HIT, 0)), int(req.prefix_len)
            stats.token_hit_sum += token_hit
            stats.state_hit_sum += state_hit
            note_hits(req, token_hit, state_hit)
            entered = req.time_stats.wait_queue_entry_time  # perf_counter; 0 or None: never recorded
            if entered and entered > 0:
                stats.first_selection_wait_s.append(max(current.began - entered, 0.0))
        return stats

    @property
    def active(self) -> bool:
        return self.traversal != "native" and self.current is not None

    def siblings_of(self, req: Any) -> list[Any]:
        """req's waiting siblings not admitted in this pass."""
        assert self.current is not None
        admitted = self.current.admitted_ids
        group = self.siblings.group(self.siblings.key_of(req))
        return [sib for sib in group if sib is not req and id(sib) not in admitted]

    # ---- verdicts ----
    def blocking_promise(self, req: Any) -> Optional[Promise]:
        """The promise `req` waits for in this pass (an in-flight request it adopts gets one), or None: Ready."""
        if not self.active:
            return None
        blocker = blocked_on(req, self.siblings.key_of(req), self.promises, self.in_flight, self.rules)
        if isinstance(blocker, Adoption):
            return self._adopt(blocker)
        return blocker

    def is_blocked_by_promise(self, req: Any) -> bool:
        """Whether an open promise blocks `req`, whatever its deferral count (the record's avoidable bubble)."""
        blocker = blocked_on(req, self.siblings.key_of(req), self.promises, self.in_flight, self.rules, bounded=False)
        return isinstance(blocker, Promise)

    def _adopt(self, adoption: Adoption) -> Promise:
        """A promise for the in-flight request, published when it lands, cancelled if it is released first."""
        producer, boundary = adoption.producer, adoption.boundary
        self.in_flight.landed(producer)  # from now on its promise stands for it
        assert self.current is not None
        self.current.stats.adopted += 1
        return self.promises.register(
            namespace_of(producer), request_tokens(producer)[:boundary], boundary, str(producer.rid),
            self.current.stats.round_id, partial=self.mode is PublishMode.KV, page_size=self.page_size,
        )

    def note_blocked(self, req: Any, counter: str = DEFER_COUNT) -> None:
        """A Blocked verdict: count it on the request (its own bound) and in the pass."""
        setattr(req, counter, getattr(req, counter, 0) + 1)
        assert self.current is not None
        self.current.stats.blocked_skips += 1
        if self.traversal == "stop":
            self.current.stats.stopped_on_blocked = True

    def note_fragment_skip(self, req: Any) -> None:
        setattr(req, FRAG_SKIPS, getattr(req, FRAG_SKIPS, 0) + 1)
        assert self.current is not None
        self.current.stats.fragment_skips += 1

    # ---- holds (the skip scan's own iteration only: holds.HoldingQueue) ----
    def holds_for_producers(self, req: Any) -> bool:
        """Producer rows: whether the scan passes over this Ready non-producer, which would take one of the last R
        rows, for producers behind it. Never a cache-only request (it exists to leave its states)."""
        current = self.current
        assert current is not None
        rows, budget = self.config.producer_rows, current.row_budget
        if not rows or budget is None or is_cache_only(req) or not current.holds.can_hold():
            return False
        if current.non_producers < budget - min(rows, budget - 1):
            return False
        current.holds.hold(req)
        current.stats.held += 1
        return True

    def holds_cut(self, req: Any, extend: int, plan: Optional[ProducerPlan] = None, token_hit: int = 0) -> bool:
        """Chunk-last: whether the scan passes over `req`, which the rest of the token budget would cut, so that whole
        requests behind it go first. A held producer's siblings it serves past ĥ (`token_hit`) are held with it."""
        current = self.current
        assert current is not None
        if not self.config.chunk_last or not current.holds.can_hold():
            return False
        if current.token_budget is None or extend > current.token_budget:
            return False
        if getattr(req, CUT_HOLDS, 0) >= self.config.max_defer_rounds:
            return False
        self.hold_cut(req)
        if plan is not None:
            need = token_hit + self.config.min_gain_tokens
            for sib, served in plan.consumers():
                if served >= need and getattr(sib, CUT_HOLDS, 0) < self.config.max_defer_rounds:
                    current.holds.with_cut[id(sib)] = sib
        return True

    def held_with_cut(self, req: Any) -> bool:
        """Whether `req` is a sibling of a held cut producer (`holds_cut`): it is held too."""
        return self.current is not None and id(req) in self.current.holds.with_cut

    def hold_cut(self, req: Any) -> None:
        assert self.current is not None
        if not self.current.stats.cut_held:
            # Natively the pass cuts this request and ends: only its chunk is delayed, so only it spends its bound
            setattr(req, CUT_HOLDS, getattr(req, CUT_HOLDS, 0) + 1)
        self.current.holds.with_cut.pop(id(req), None)
        self.current.holds.hold(req)
        self.current.stats.cut_held += 1

    # ---- producers ----
    def plan(self, req: Any, token_hit: int = 0) -> Optional[ProducerPlan]:
        if not self.active:
            return None
        siblings = self.siblings_of(req)
        if not siblings:
            return None
        return plan_producer(
            req, siblings, min_gain=self.config.min_gain_tokens, mode=self.mode, cache_chunk=self.cache_chunk,
            token_hit=token_hit, page_size=self.page_size,
            branch=native_branch(req) if self.mode is PublishMode.TRACK else None,
        )

    def plan_cache_only(self, req: Any, token_hit: int) -> Optional[ProducerPlan]:
        if not self.active or self.mode is PublishMode.KV:  # full attention: the KV is usable anywhere already
            return None
        return plan_cache_only(
            req, token_hit=token_hit, min_gain=self.config.min_gain_tokens, mode=self.mode,
            cache_chunk=self.cache_chunk, branch=native_branch(req) if self.mode is PublishMode.TRACK else None,
        )

    def note_admitted(self, req: Any, plan: Optional[ProducerPlan]) -> None:
        """`req` is in this pass's batch; with a plan it is a producer and registers its promises."""
        current = self.current
        assert current is not None
        current.holds.note_admitted()  # a whole request: the run of held ones is broken
        current.stats.admitted_reqs.append(req)
        current.admitted_ids.add(id(req))
        if self.mode is not PublishMode.CHUNK_END and self.traversal != "native":
            # a later sibling may adopt it in flight (full attention, extra_buffer hybrids; see docs/design.md)
            self.in_flight.track(req, self.siblings.key_of(req), current.stats.round_id)
        if plan is None:
            current.non_producers += 1
            return
        if plan.mode is PublishMode.CHUNK_END and req.extend_end > plan.boundary:
            return  # its chunk passed b (no chunk slot): no state at b, no promise
        if plan.mode is PublishMode.TRACK:
            req.mamba_branching_seqlen = plan.boundary  # read by prepare_for_extend, after admission
        self._register(req, plan)
        current.stats.producers += 1

    def note_prefix_request(self, req: Any) -> None:
        """req's first b tokens run as a prefix request this round; req itself waits (counted as a deferral)."""
        assert self.current is not None
        self.current.stats.prefix_requests += 1
        setattr(req, DEFER_COUNT, getattr(req, DEFER_COUNT, 0) + 1)

    def note_continuation(self, req: Any) -> None:
        """SGLang continues its chunked request: siblings that arrived since it was planned wait for its next chunk
        (it becomes their producer) instead of the first of them producing the same prefix beside it."""
        if not self.active or self.pending_boundary(req) is not None:
            return
        plan = self.plan(req, int(req.prefix_len))
        if plan is None:
            return
        if plan.mode is PublishMode.CHUNK_END and self._path_len is not None:
            # The tree may hold more of its path than its own chunks (another request put it there): a branch point
            # known to the tree, where plan_producer caps b on a no_buffer hybrid.
            held = self._path_len(namespace_of(req), request_tokens(req))
            if held > int(req.prefix_len):
                plan = self.plan(req, held)
                if plan is None:
                    return
        if plan.mode is PublishMode.TRACK:
            req.mamba_branching_seqlen = plan.boundary  # read by prepare_for_extend, after this pass
        self._register(req, plan)
        assert self.current is not None
        self.current.stats.adopted += 1

    def _register(self, req: Any, plan: ProducerPlan) -> None:
        """The promises of a producer's plan (partial on full attention: each sibling is served its shared part)."""
        assert self.current is not None
        tokens = request_tokens(req)
        for boundary in (plan.boundary, *plan.later):
            self.promises.register(
                namespace_of(req), tokens[:boundary], boundary, str(req.rid), self.current.stats.round_id,
                partial=plan.mode is PublishMode.KV, page_size=self.page_size,
            )

    def pending_boundary(self, req: Any) -> Optional[int]:
        """The boundary a chunked producer still has to reach (its next chunk must end there), if any."""
        ahead = [p.boundary for p in self.promises.for_producer(str(req.rid)) if p.boundary > int(req.prefix_len)]
        return min(ahead) if ahead else None

    # ---- records ----
    def pass_record(self, stats: PassStats, row_budget: int, token_budget: Optional[int], waiting_after: list[Any]
                    ) -> dict[str, Any]:
        return self.records.pass_record(stats, row_budget, token_budget, waiting_after, self.gate.holds,
                                        self.is_blocked_by_promise)

    # ---- publication (called by the cache) ----
    def on_checkpoint(self, req: Any, up_to: int, ready_len: Callable[[Promise], int], round_id: int) -> None:
        """The producer's prefix up to `up_to` just entered the tree: publish what it reached, cancel what it passed."""
        for promise in self.promises.for_producer(str(req.rid)):
            if up_to < promise.boundary:
                continue
            if ready_len(promise) >= promise.boundary:
                self.promises.publish(promise, round_id)
            else:
                self.promises.cancel(promise, round_id, "passed the boundary without a state")

    def on_landed(self, req: Any) -> None:
        """The request's KV entered the tree (checkpoint) or it left (release): nothing left to adopt."""
        self.in_flight.landed(req)

    def on_release(self, req: Any, round_id: int) -> None:
        self.on_landed(req)  # gone: nothing of it left to adopt
        self.promises.cancel_producer(str(req.rid), round_id, "producer released before publishing")
