"""Scheduling state kept next to the cache: the promise table, per-pass scratch, and per-round counters.

One instance per RadixFlowCache (one per scheduler / TP rank). Every decision reads only what all TP ranks share
(the replicated waiting queue, the tree, the round counter), never wall-clock time, so ranks agree.
"""
from __future__ import annotations

import collections
import functools
import itertools
import logging
import operator
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from sglang_radixflow.cache.promises import (
    Promise, PromiseTable, as_tokens, common_prefix_with, tokens_share_more_than,
)
from sglang_radixflow.cache.tree import REQ_TOKEN_HIT
from sglang_radixflow.cache.tree import token_hit as token_hit_of  # methods name their ĥ arguments token_hit
from sglang_radixflow.config import RadixFlowConfig
from sglang_radixflow.observe.meta import note_admitted_metas
from sglang_radixflow.observe.rounds import RoundRecorder
from sglang_radixflow.observe.trace import TraceWriter
from sglang_radixflow.schedule.admission import AdmissionGate
from sglang_radixflow.schedule.producers import (
    INDEX_PREFIX,
    SIBLING_KEY,
    ProducerPlan,
    PublishMode,
    SiblingIndex,
    is_cache_only,
    key_limit,
    namespace_of,
    native_branch,
    plan_cache_only,
    plan_producer,
    request_tokens,
    sibling_key,
)

logger = logging.getLogger("sglang_radixflow")
assert SIBLING_KEY == "rf_sibling_key", "examine reads sibling_key's per-request cache by this name"
DEFER_COUNT = "rf_defer_rounds"  # per-request attribute: rounds this request was deferred as Blocked
SLOT_WAITS = "rf_slot_waits"  # per-request attribute: passes a would-be producer waited for the chunk slot
SLOT_WAIT_FACTOR = 4  # slot waits are bounded at this multiple of max_defer_rounds (the slot frees every round)
# The skip scan looks S positions past its first held request (chunk-last: a cut one, looking for whole ones that fit
# the budget left; producer rows: a Ready non-producer, looking for producers). This many more held in a row show the
# queue ahead holds nothing it looks for, and the held ones are offered at once. Without it a pass over a long queue
# matched S more requests, every one held (chunk-last: 2.5x native's pass at S = 64 with 1000 waiting; producer rows:
# 129 matched for 64 admitted on a queue of Ready consumers); 8 keeps every replay round count of the calibrated S = 8
# (2 to 6 cost mc-cold or mc-mixed a round).
HOLD_RUN_LIMIT = 8
# Which of the adder's checks could change what happens to a request it is handed (SchedulingState.examine); PLAIN:
# none, SGLang's admission alone decides.
PLAIN, MAY_BLOCK, MAY_PLAN, MAY_FRAGMENT = 0, 1, 2, 4
CUT_HOLDS = "rf_cut_holds"  # per-request attribute: passes that offered it last because it would be cut (chunk_last)
FRAG_SKIPS = "rf_fragment_skips"  # per-request attribute: rounds it was deferred to avoid a small fragment
FULL_ATTENTION_FRAGMENT_MIN = 64  # tokens; hybrids use their checkpoint grid
NEVER = float("inf")  # a threshold no count reaches


_QUEUE_ENTRY_TIME = operator.attrgetter("time_stats.wait_queue_entry_time")
_POSITIVE = functools.partial(operator.lt, 0.0)


_EXTEND_END = operator.attrgetter("extend_end")
_PREFIX_LEN = operator.attrgetter("prefix_len")
_SKIPS_TREE = operator.attrgetter("skip_radix_cache_insert")
_UNKEYED = object()  # a request whose sibling key was never taken (no cached key)


def lands_under_token_ids(reqs: list[Any]) -> list[Any]:
    """The requests whose KV enters the tree under their token ids (no session, no multimodal or embedding input, not
    barred from the tree), in C: those an in-flight sibling can adopt."""
    for name in ("session", "multimodal_inputs", "input_embeds"):
        reqs = list(itertools.compress(reqs, map(operator.is_, map(operator.attrgetter(name), reqs),
                                                 itertools.repeat(None))))
    return list(itertools.compress(reqs, map(operator.not_, map(_SKIPS_TREE, reqs))))


def first_selection_waits(began: float, admitted: Sequence[Any]) -> list[float]:
    """Seconds from entering SGLang's waiting queue (perf_counter) to the pass that began at `began` and selected
    them, for the admitted requests that recorded an entry (0 when the clock read at `began` was earlier). Computed
    in C, whatever the number of requests (once per pass, instead of in note_admitted's per-request work)."""
    entered = filter(_POSITIVE, filter(None, map(_QUEUE_ENTRY_TIME, admitted)))  # no entry: 0.0 (or None)
    return list(map(max, map(operator.sub, itertools.repeat(began), entered), itertools.repeat(0.0)))


@dataclass
class PassStats:
    """What one prefill scheduling pass did (one per round that scanned the queue)."""

    round_id: int
    waiting: int
    blocked_skips: int = 0
    screened: int = 0  # of the blocked skips, those screened out of SGLang's scan (never matched)
    fragment_skips: int = 0
    stopped_on_blocked: bool = False
    producers: int = 0
    prefix_requests: int = 0
    adopted: int = 0  # in-flight requests adopted as producers (promises registered for them this pass)
    held: int = 0  # Ready non-producers passed over for producers behind them (producer_rows), then offered again
    cut_held: int = 0  # requests the budget would cut, passed over for whole ones behind (chunk_last), then offered
    admitted_reqs: list[Any] = field(default_factory=list, repr=False)
    _admitted_ids: set[int] = field(default_factory=set, repr=False)
    token_hit_sum: int = 0
    state_hit_sum: int = 0
    first_selection_wait_s: list[float] = field(default_factory=list)

    @property
    def admitted_ids(self) -> set[int]:
        """ids of admitted_reqs (siblings no longer waiting), brought up to date when a plan asks: passes that plan
        nothing never build it."""
        ids, admitted = self._admitted_ids, self.admitted_reqs
        if len(ids) != len(admitted):  # each request is admitted once per pass: the new ones are the tail
            ids.update(map(id, admitted[len(ids):]))
        return ids


class SchedulingState:
    def __init__(
        self, config: RadixFlowConfig, mode: PublishMode, cache_chunk: int,
        state_ready_len: Optional[Callable[[Any, Any], int]] = None, trace: Optional[TraceWriter] = None,
        path_len: Optional[Callable[[Any, Any], int]] = None, page_size: int = 1,
    ) -> None:
        self.config = config
        self.page_size = page_size  # the tree's unit: boundaries and partial promises are whole pages
        self._path_len = path_len  # the tree's held path length (RadixFlowCache.path_len); None: not screened
        self.gate = AdmissionGate(config.admission, config.hold_ms, state_ready_len or (lambda ns, toks: 0))
        self._state_ready_len = state_ready_len  # the tree's read-only walk (RadixFlowCache.state_ready_len), or None
        self.recorder = RoundRecorder(trace or TraceWriter(None))
        self.pending_pass: Optional[tuple] = None  # (batch, PassStats, S, T, waiting after) until run_batch
        self.mode = mode
        self.cache_chunk = max(1, cache_chunk)
        self.fragment_min_tokens = self.cache_chunk if mode is not PublishMode.KV else FULL_ATTENTION_FRAGMENT_MIN
        self.promises = PromiseTable(head_len=INDEX_PREFIX)  # indexed by the sibling key's tokens
        self._promises_reported = (0, 0, 0)  # promise counters at the last round record (promise_record)
        self._reasons_reported: dict[str, int] = {}  # cancel reasons at the last round record
        self._holds_reported = 0  # the gate's hold count at the last prefill-pass record
        self._carried: dict[str, int] = {}  # counts of passes that admitted nothing, for the next pass record
        self.traversal = config.traversal
        self.disabled_reason: Optional[str] = None
        self.prefix_requests = config.prefix_requests  # switched off where SGLang's features make it unsafe
        self.current: Optional[PassStats] = None
        self._pass_began = 0.0  # perf_counter at begin_pass: the first-selection time of the requests it admits
        self._index = SiblingIndex()  # persistent: each pass only indexes what arrived / drops what left
        self._sibling_groups = self._index.groups_view()  # read by `examine` for every request
        self._indexed = self._index.indexed_view()  # read by `note_admitted` for every request
        self._index_fresh = False
        # Nothing shared in this pass (decided when the pass indexes the queue, `index_waiting`): every request the
        # scan examines is PLAIN until a promise is registered or producer rows could hold one (`examine`).
        self._nothing_shared = False
        self._waiting: list[Any] = []
        # Waiting requests this pass has proven Blocked (_mark_consumers, _mark_in_flight): the scan skips them
        # without SGLang matching them (scan_queue.ScanQueue). Cleared at every pass boundary.
        self._known_blocked: dict[int, Any] = {}
        # Whether the scan may have anything to skip, hold or offer again (a known-Blocked request, held ones, a cut
        # screen): set where those are added, cleared when the held ones are offered and nothing is known-Blocked.
        self._screen_busy = False
        self._screened: list[Any] = []  # skipped by the screen since the last request SGLang examined
        self._examined = 0  # requests SGLang handed to the adder (identifies the scan's own iteration)
        self._examined_at_begin = 0  # _examined when this pass began: an iteration starting later is not the scan
        # Held requests: passed over by the scan and offered again once it has looked `lookahead` requests past the
        # first held one. Producer rows (config.producer_rows = R): a Ready non-producer beyond S - R admitted
        # non-producers. Chunk-last (config.chunk_last): a request the rest of the token budget would cut.
        self._row_budget: Optional[int] = None
        self._token_budget: Optional[int] = None
        self._scanning = False  # the scan's own iteration is under way (only it can offer held requests again)
        self._held: list[Any] = []
        self._first_hold_at: Optional[int] = None  # queue position of the first held request; -1: holds are over
        # Producer rows: queue positions up to here are proven Ready non-producers (`_producer_hold_is_futile`).
        self._proven_through = -1
        self._hold_run = 0  # requests held in a row (chunk_last, producer rows): HOLD_RUN_LIMIT
        # Waiting siblings of a cut request that share what it would compute (chunk_last): held with it, unmatched.
        self._held_with: dict[int, Any] = {}
        # chunk_last's look-past, once a cut request is held: the adder's proof that a request would be cut too
        # (RadixFlowPrefillAdder._provably_cut). Such requests are held at their positions without SGLang matching
        # them; their hold counts once SGLang examines the next request, as for the screened Blocked ones.
        self.cut_screening = True  # off: every request of the look-past is matched (the A/B of tests and benches)
        self._cut_screen: Optional[Callable[[Any], bool]] = None
        self._cut_screened: list[Any] = []
        self._scan_pos = 0  # queue position of the request the scan is on
        self._scan_queue: Optional[Sequence[Any]] = None  # the queue the scan iterates (when `screen` was given it)
        self._non_producers = 0
        self._fragment_checks = PLAIN  # MAY_FRAGMENT while a pass runs with the fragmentation extension on
        # Producer rows: admitted non-producers from which a Ready one may be held (S - R; beyond any pass when off).
        self._producer_hold_from = NEVER
        # Admitted requests may be adopted while in flight (full attention and extra_buffer hybrids, traversal on).
        self._tracks_in_flight = False
        # Full attention and extra_buffer hybrids: requests admitted by recent passes whose round's KV (and tracked
        # state) has not entered the tree yet, by sibling key (id -> (request, extend end, pass round)). Under SGLang's
        # overlap scheduler a pass runs before the previous round's results are processed, so a sibling that arrived
        # just after its producer's pass would recompute the prefix in flight; it adopts that request as its producer
        # instead (`_adopt`).
        self._unlanded: dict[tuple, dict[int, tuple[Any, int, int]]] = {}
        # This pass's admissions tracked in flight at its end, in C (`_track_quiet`): admitted while nothing was
        # shared (`index_waiting`), or whose `examine` found no other request with its sibling key, or proved that
        # none shares past its hit (`_none_shares_past`). No request adopts them before they are tracked.
        self._quiet: list[Any] = []
        # The sibling keys of the quiet admissions that share their key with other requests (proven alone): a
        # request on such a key that may adopt (its own proof failed) first has the quiet ones tracked
        # (`_flush_quiet`), so that adoption reads the table the per-request path would have built.
        self._quiet_keys: set[tuple] = set()
        self._alone: Any = None  # the request `examine` last found no request of the pass could adopt
        self._alone_key: Optional[tuple] = None  # its sibling key when other requests have it (proven alone)
        # Per pass, sibling key -> (the key's waiting requests by id, as the index holds them; token position -> the
        # tokens found there in two or more of those and the key's in-flight requests): `_none_shares_past`.
        self._repeated: dict[tuple, tuple[Mapping[int, Any], dict[int, set[int]]]] = {}
        self._read_per_pass()

    def _read_per_pass(self) -> None:
        """What `examine` reads for every request, taken once per pass (the table and the config may be replaced
        between passes): the promise table's live index (`may_serve`, inlined) and min_gain - 1."""
        self._promised_heads, self._short_promises = self.promises.serving_index()
        self._min_gain_less_one = self.config.min_gain_tokens - 1

    # ---- pass life cycle (called around Scheduler._get_new_batch_prefill_raw) ----
    def disable_traversal(self, reason: str) -> None:
        if self.traversal != "native":
            logger.warning("sglang-radixflow: state-ready traversal disabled: %s", reason)
        self.traversal, self.disabled_reason = "native", reason

    def disable_hold(self, reason: str) -> None:
        if self.gate.mode != "native":
            logger.warning("sglang-radixflow: admission hold disabled: %s", reason)
        self.gate.mode = "native"

    def make_inert(self, reason: str) -> None:
        """SGLang's own scheduling throughout — no traversal (hence no producers or prefix requests), no admission
        hold, no fragment deferral — for a cache that can publish nothing (every wait would be for nothing)."""
        self.disable_traversal(reason)
        self.disable_hold(reason)
        self.config = replace(self.config, fragmentation=False)

    def begin_pass(self, round_id: int, waiting: list[Any], row_budget: Optional[int] = None,
                   token_budget: Optional[int] = None) -> None:
        self.promises.expire(round_id, self.config.promise_max_age_rounds)
        self._read_per_pass()
        self.current = PassStats(round_id=round_id, waiting=len(waiting))
        self._pass_began = time.perf_counter()
        self._waiting = waiting
        self._examined_at_begin = self._examined
        self._row_budget = row_budget
        self._token_budget = token_budget
        self._scanning = False
        self._scan_queue = None
        self._held = []
        self._first_hold_at = None
        self._proven_through = -1
        self._hold_run = 0
        self._held_with = {}
        self._cut_screen = None
        self._cut_screened = []
        self._non_producers = 0
        self._fragment_checks = MAY_FRAGMENT if self.config.fragmentation else PLAIN
        rows = self.config.producer_rows
        self._producer_hold_from = row_budget - min(rows, row_budget - 1) if rows and row_budget is not None else NEVER
        self._tracks_in_flight = self.mode is not PublishMode.CHUNK_END and self.traversal != "native"
        self._index_fresh = False
        self._nothing_shared = False
        self._known_blocked = {}
        self._repeated = {}
        self._screen_busy = False
        self._screened = []
        self._alone = None
        self._forget_landed(round_id)
        self._mark_in_flight()

    def index_waiting(self, waiting: list[Any]) -> None:
        """Bring the sibling index up to `waiting` now (normally done lazily by the first plan of a pass), and decide
        whether nothing is shared in this pass: the traversal is on without the fragmentation extension, no promise
        is open, and no waiting request shares its sibling key with another waiting or in-flight request or is
        cache-only. Then no request can be Blocked (`blocking_promise` needs a promise or an in-flight request on its
        key; the pass's own admissions have keys no other waiting request has) or plan (`plan` needs a waiting
        sibling, `plan_cache_only` a cache-only request), until a promise is registered (`_register`, `_adopt`)."""
        assert not self._quiet, "a pass indexes before its first admission (plans_nothing reads the in-flight table)"
        self._index.refresh(waiting)
        self._index_fresh = True
        self._nothing_shared = (
            self.traversal != "native" and not self._fragment_checks and not self.promises
            and self._index.plans_nothing(self._unlanded)
        )

    def note_queue_after_pass(self, admitted: list[Any], remaining: list[Any]) -> None:
        """SGLang rebuilt its queue after a pass: `remaining`, the queue less `admitted`. Keeps the sibling index's
        snapshot current when this pass had indexed the queue (otherwise its older snapshot is still exact)."""
        if self._index_fresh:
            self._index.left(admitted, remaining)

    def end_pass(self) -> Optional[PassStats]:
        stats, self.current = self.current, None
        if stats is not None and stats.admitted_reqs:
            admitted = stats.admitted_reqs
            stats.first_selection_wait_s = first_selection_waits(self._pass_began, admitted)
            # ĥ and h of the pass's matches (SGLang matches a request once per pass; nothing after the adder moves
            # its prefix_len before the round runs): token_hit_of and prefix_len of each, in C
            token_hits = list(map(getattr, admitted, itertools.repeat(REQ_TOKEN_HIT), itertools.repeat(0)))
            state_hits = list(map(_PREFIX_LEN, admitted))
            assert set(map(type, state_hits)) <= {int}, "Req.prefix_len is an int once matched"
            stats.token_hit_sum, stats.state_hit_sum = sum(token_hits), sum(state_hits)
            note_admitted_metas(admitted, token_hits, state_hits)  # each request's ĥ and h in its response
        self._quiet_keys.clear()  # (before tracking: a request without a cached key takes the per-request path)
        quiet, self._quiet, self._alone = self._quiet, [], None
        if quiet:
            assert stats is not None
            self._track_quiet(quiet, stats.round_id)
        self._waiting = []
        self._nothing_shared = False
        self._known_blocked = {}
        self._screen_busy = False
        self._screened = []  # the scan ended before examining another request: they were never reached
        self._held = []  # still queued: SGLang removes only what it admitted
        self._held_with = {}
        self._cut_screen = None
        self._cut_screened = []  # never followed by an examined request: SGLang's scan ended before them
        self._scanning = False
        self._scan_queue = None
        return stats

    @property
    def active(self) -> bool:
        return self.traversal != "native" and self.current is not None

    # ---- verdicts ----
    def screens_scan(self) -> bool:
        """Whether an iteration of the waiting queue starting now may skip known-Blocked requests: a pass is on, it
        skips (not stop), and SGLang has examined no request yet in this pass (its pass has one scan: an iteration
        starting after it examined one, like the rebuild of the queue after the scan, is not the scan, and iterates
        the plain list). Which of the iterations starting earlier is the scan is settled inside `screen`."""
        return self.current is not None and self.traversal == "skip" and self._examined == self._examined_at_begin

    def screen(self, requests: Iterator[Any], queue: Optional[Sequence[Any]] = None) -> Iterator[Any]:
        """`requests` (an iteration of `queue`, the waiting queue, when given) less those proven Blocked (within their
        deferral bound), with nothing staged to undo.

        Only SGLang's scan may skip anything: it is the iteration during which SGLang hands the requests it yields to
        the adder (`examine`). Until that happens the iteration yields everything, so the other iterations of
        the queue (policy sorting, SGLang rebuilding the queue after the scan) always see every request.
        SGLang checks its pass budget before each request it examines and ends the scan when it is spent; skipping
        admits nothing, so those checks answer alike for a run of skipped requests and the next one examined. The
        skipped ones are therefore counted as Blocked (note_blocked, which moves their deferral bound) only once
        SGLang goes on to examine the next request; a queue that ends on skipped requests yields its last one so that
        SGLang's checks decide there too (it then gets add_one_req's own verdict).
        Producer rows: the requests `holds_for_producers` passed over are yielded again once the scan is `_lookahead`
        positions past the first of them, or at the end of the queue, so they still get the rows left in this pass.
        Chunk-last's held requests likewise; the siblings held with a cut one (`holds_cut`), and the requests the
        adder proves would be cut too (`screen_cuts`), are held at their own positions without being matched."""
        known, held_with = self._known_blocked, self._held_with
        bound = self.config.max_defer_rounds
        start, scan = self._examined, False
        run: list[Any] = []  # skipped since the last request yielded
        for pos, req in enumerate(requests):
            self._scan_pos = pos
            if scan:
                if not (run or self._screen_busy):
                    yield req  # nothing to skip, hold or offer again here: the common case, kept short
                    continue
            elif self._examined != start:
                scan = self._scanning = True
                self._scan_queue = queue
            if self._held and (pos - self._first_hold_at > self._lookahead() or self._hold_run > HOLD_RUN_LIMIT):
                self._screened.extend(run)
                run = []
                yield from self._offer_held()
            if scan and known and id(req) in known and getattr(req, DEFER_COUNT, 0) < bound:
                run.append(req)
                continue
            if scan and held_with and id(req) in held_with:
                self._hold_cut(held_with.pop(id(req)))
                continue
            if scan and self._cut_screen is not None and self._cut_screen(req):
                self._hold(req)
                self._hold_run += 1
                self._cut_screened.append(req)
                continue
            if run:
                self._screened.extend(run)
                run = []
            yield req
        if self._held:
            self._screened.extend(run)
            yield from self._offer_held()
        elif run:
            self._screened.extend(run[:-1])
            yield run[-1]

    def _lookahead(self) -> int:
        """Queue positions the scan passes (examined or screened out alike, so that screening changes nothing) after
        the first held request before offering the held ones again."""
        return self._row_budget or 1

    def _offer_held(self) -> Iterator[Any]:
        held, self._held = self._held, []
        self._first_hold_at = -1  # no more holds this pass
        self._cut_screen = None
        self._held_with.clear()  # siblings not reached yet are matched like any request from here on
        self._screen_busy = bool(self._known_blocked)
        yield from held

    def holds_for_producers(self, req: Any) -> bool:
        """Whether the scan should pass over this Ready non-producer for producers behind it (producer_rows): it would
        take one of the last R rows. Only during the scan's own iteration, which offers it again (_offer_held) S
        positions later, or after HOLD_RUN_LIMIT more held in a row (no producer among them); never a cache-only
        request (it exists to leave its states). Off (R = 0) it costs one attribute read per request."""
        if not self._would_hold_for_producers(req):
            return False
        if self._first_hold_at is None and self._producer_hold_is_futile():
            return False  # no producer could come before it is offered again: FCFS admits the same requests now
        self._hold(req)
        self._hold_run += 1
        assert self.current is not None
        self.current.held += 1
        return True

    def _producer_hold_is_futile(self) -> bool:
        """Whether holding the request the scan is on (the pass's first hold) would change nothing: every request the
        hold's window would reach before offering it again (`_lookahead` positions, or HOLD_RUN_LIMIT more holds,
        counted as `screen` counts them) is proven to be a Ready non-producer that would be held too
        (`_held_non_producer`), or the queue ends first. The held requests would then be offered in queue order and
        take the rows left, as FCFS gives them now; the hold would only cost SGLang a match of each (and of the
        first ones twice). Decided only with nothing skipped in the window (no known-Blocked request). Positions
        proven stay proven for the pass (later admissions add no promise and only requests already checked)."""
        queue = self._scan_queue
        if queue is None or self._known_blocked or self._fragment_checks or self._state_ready_len is None:
            return False  # (a fragment deferral, like a Blocked verdict, is no hold: the window would move)
        pos, lookahead, run = self._scan_pos, self._lookahead(), self._hold_run + 1  # + this request's hold
        for ahead in range(pos + 1, len(queue)):
            if ahead - pos > lookahead or run > HOLD_RUN_LIMIT:
                return True  # `screen` would offer the held request here
            if ahead > self._proven_through:
                if not self._held_non_producer(queue[ahead]):
                    return False
                self._proven_through = ahead
            run += 1
        return True  # the queue ends: offered at its end

    def _held_non_producer(self, req: Any) -> bool:
        """Whether `req`, examined now, would be held for producers as a Ready non-producer, proven without SGLang
        matching it: SGLang's scan hands it to the adder (no pooled readout or LoRA adapter to check), no open
        promise could block it, it is not cache-only, and every other request sharing its sibling key (waiting, or
        in flight for adoption) shares no more of its path than h + min_gain - 1 tokens, h a lower bound of its
        state-ready hit: what the tree holds state-ready on its path (`state_ready_len`), within its key limit (on a
        hybrid not trusted past it: the match stops at the last state before it). So `plan_producer` would find no
        boundary and `_adopt` nothing to adopt. (Unless a state on its path is evicted before its match, which a
        hybrid's copy-on-write at another request's match can do when the mamba pool is full: a request that then
        turns out a producer gets the rows FCFS gives it, as with R = 0.)"""
        if is_cache_only(req) or req.token_indices_to_pool is not None or req.lora_id is not None:
            return False
        key = sibling_key(req)
        if self.promises.may_serve(key):
            return False
        if not self._index_fresh:
            self.index_waiting(self._waiting)
        group = self._index.group_with(req)
        in_flight = self._unlanded.get(key) if key is not None and self._unlanded else None
        if not group and not in_flight:
            return True  # nobody to plan for or adopt: the common case of a queue with nothing shared
        tokens = request_tokens(req)
        assert self._state_ready_len is not None
        hit = self._state_ready_len(namespace_of(req), tokens)
        limit = key_limit(req, tokens)
        if hit > limit:
            if self.mode is not PublishMode.KV:
                return False
            hit = limit  # full attention: the match stops at the limit, inside a published node
        last = hit + self.config.min_gain_tokens - 1  # the token a consumer or an adopted request must share
        if self._none_shares_past(req, key, tokens, last):
            return True
        others = [*group, *(other for other, _, _ in in_flight.values())] if in_flight else group
        return not any(
            other is not req and tokens_share_more_than(tokens, request_tokens(other), last) for other in others
        )

    def holds_cut(self, req: Any, extend: int, plan: Optional[ProducerPlan] = None, token_hit: int = 0,
                  provably_cut: Optional[Callable[[Any], bool]] = None) -> bool:
        """Whether the scan should pass over `req`, which the rest of the pass's token budget would cut into a chunk
        (chunk_last). SGLang's chunk takes whatever budget is left and ends the scan, so every whole request behind
        it waits a round; held, `req` is offered again once the scan has looked `_lookahead` positions further (or at
        the end of the queue, or after HOLD_RUN_LIMIT more held in a row) and is cut then from what the whole ones
        left. A request that fits one full budget (`extend` <= T) would need next round anyway: cut now, its rest
        continues first next round; not admitted at all, it keeps its place in the queue. A longer one is never held
        (a smaller first chunk could cost it a round). At most max_defer_rounds passes per request.

        `plan`: req's producer plan, if it has one (`token_hit`: its ĥ). Its waiting siblings that share at least
        min_gain tokens of its prefix past what the tree holds are held with it, unmatched (`screen`): admitted
        before it they would compute that prefix once more, and one as big would be cut too.

        `provably_cut` (the adder's proof, when it holds in this pass): a hold the look-past cannot use is not made
        (`_look_past_is_futile`)."""
        if not self.config.chunk_last or not self._scanning or self._first_hold_at == -1:
            return False
        if self._token_budget is None or extend > self._token_budget:
            return False
        if getattr(req, CUT_HOLDS, 0) >= self.config.max_defer_rounds:
            return False
        if plan is None and provably_cut is not None and self._look_past_is_futile(provably_cut):
            return False
        self._hold_cut(req)
        if plan is not None:
            need = token_hit + self.config.min_gain_tokens
            for sib, served in self._consumers(plan):
                if served >= need and getattr(sib, CUT_HOLDS, 0) < self.config.max_defer_rounds:
                    self._held_with[id(sib)] = sib
        return True

    def _look_past_is_futile(self, provably_cut: Callable[[Any], bool]) -> bool:
        """Whether every request the look-past would reach before offering the cut request again is proven cut too
        (or the queue ends first): the scan would hold them all, unmatched, and then cut the held request from the
        same budget, as SGLang does now. Such a hold changes nothing but costs a second match of the held request and
        a hold on each of the others (moving their bounds): it is not made. Decided only for the pass's first hold
        with nothing else to skip or hold in the window (no known-Blocked request, no sibling held with it), where
        the window is exactly what `screen` would walk: `_lookahead` positions or HOLD_RUN_LIMIT more holds."""
        queue = self._scan_queue
        if (
            not self.cut_screening or queue is None or self._first_hold_at is not None or self._known_blocked
            or self._held_with
        ):
            return False
        pos, lookahead, run = self._scan_pos, self._lookahead(), self._hold_run + 1  # + the cut request's hold
        for ahead in range(pos + 1, len(queue)):
            if ahead - pos > lookahead or run > HOLD_RUN_LIMIT:
                return True  # `screen` would offer the held request here
            if not provably_cut(queue[ahead]):
                return False  # SGLang would examine this one: it may fit what is left
            run += 1
        return True  # the queue ends: offered at its end

    def _would_hold_for_producers(self, req: Any) -> bool:
        return (
            self._non_producers >= self._producer_hold_from and self._scanning and self._first_hold_at != -1
            and not is_cache_only(req)
        )

    def screen_cuts(self, provably_cut: Callable[[Any], bool]) -> None:
        """A cut request is held (chunk_last): until the held ones are offered again, the scan holds the requests
        `provably_cut` proves would be cut too without SGLang matching them (~20 us each, and a look-past over a
        queue of long prompts finds nothing but those)."""
        if self.cut_screening and self._cut_screen is None and self._first_hold_at not in (None, -1):
            self._cut_screen = provably_cut
            self._screen_busy = True

    def is_plain_for_cut(self, req: Any, length: int) -> bool:
        """Whether radixflow's own verdicts would pass `req` (`length` tokens, nothing matched yet) to SGLang's
        admission, and a cut of it be held: nothing can block it (no open promise or in-flight request under its
        sibling key), it plans nothing (no waiting sibling, not cache-only), producer rows would not hold it, no
        fragment deferral, and holds_cut would hold it (length within T, hold bound not reached)."""
        if self.config.fragmentation or self._token_budget is None or length > self._token_budget:
            return False
        if getattr(req, CUT_HOLDS, 0) >= self.config.max_defer_rounds or is_cache_only(req):
            return False
        if self._would_hold_for_producers(req):
            return False
        if not self._index_fresh:
            self.index_waiting(self._waiting)
        if self._nothing_shared:
            return True  # no promise, and no request in flight or waiting shares its key
        candidates, in_flight = self._open_on(sibling_key(req))
        return not candidates and not in_flight and not self._index.group_with(req)

    def _hold_cut(self, req: Any) -> None:
        setattr(req, CUT_HOLDS, getattr(req, CUT_HOLDS, 0) + 1)
        self._hold(req)
        self._hold_run += 1  # siblings held with a cut request count too, as when each was matched and cut
        assert self.current is not None
        self.current.cut_held += 1

    def _hold(self, req: Any) -> None:
        if self._first_hold_at is None:
            self._first_hold_at = self._scan_pos
        self._held.append(req)
        self._screen_busy = True

    def _count_screened(self) -> None:
        """SGLang examines a request: the requests screened out just before it count as Blocked (or cut-held)."""
        if self._cut_screened:
            for req in self._cut_screened:
                setattr(req, CUT_HOLDS, getattr(req, CUT_HOLDS, 0) + 1)
            assert self.current is not None
            self.current.cut_held += len(self._cut_screened)
            self._cut_screened.clear()
        if self._screened:
            for req in self._screened:
                self.note_blocked(req)
            assert self.current is not None
            self.current.screened += len(self._screened)
            self._screened.clear()

    def examine(self, req: Any) -> int:
        """SGLang hands `req` to the adder (add_one_req): count it, and the requests screened just before it. Which
        of the adder's checks could change what happens to it, in O(1):
        - MAY_BLOCK: the traversal is on and an open promise could serve its sibling key (or a short promise is open),
          or a request in flight shares that key and may share more than its hit (`blocking_promise` may find
          something);
        - MAY_PLAN: it is cache-only, or the traversal is on and a sibling waits beside it and may share more than its
          hit (`plan` may find a boundary), or producer rows could hold it;
        - MAY_FRAGMENT: the fragmentation extension is on.
        PLAIN (none): SGLang's admission alone decides, as the full checks would. Runs for every request the scan
        examines, so it is kept to a few lookups, and in a pass with nothing shared (`index_waiting`) to one test
        (until producer rows could hold a request)."""
        self._examined += 1
        if self._cut_screened or self._screened:
            self._count_screened()
        if self._nothing_shared and self._non_producers < self._producer_hold_from:
            return PLAIN  # the pass's common case (index_waiting): a queue with nothing shared costs this only
        checks = self._fragment_checks
        if req.sampling_params.max_new_tokens == 0 and not req.return_logprob:  # is_cache_only, inlined
            checks |= MAY_PLAN
        if self.traversal == "native":  # nothing blocks, nothing is planned or held
            return checks
        try:
            key = req.rf_sibling_key  # sibling_key's per-request cache, read inline: the common case
        except AttributeError:
            key = sibling_key(req)
        if self._short_promises or key in self._promised_heads:  # promises.may_serve, inlined
            checks |= MAY_BLOCK
        in_flight = key in self._unlanded  # (None is never a key of either table)
        if checks & MAY_PLAN:
            if key in self._quiet_keys:
                in_flight = self._flush_quiet_for(key)
            return checks | MAY_BLOCK if in_flight else checks
        if not self._index_fresh:
            self.index_waiting(self._waiting)
        group = self._sibling_groups.get(key)  # another indexed request shares its key: in O(1), inlined
        siblings = group is not None and (len(group) > 1 or id(req) not in group)
        if siblings or in_flight:
            # A consumer of what the tree already holds state-ready: no sibling or in-flight request can serve it, or
            # be served by it, past its hit (plan_producer and _adopt would find nothing), when none shares the one
            # token a consumer would have to (position h + min_gain - 1). Proven for the whole group at once. (With
            # nothing state-ready, siblings share more than that as a rule: no proof is tried.)
            state_hit = req.prefix_len
            assert state_hit.__class__ is int, "Req.prefix_len is an int once matched"
            if not state_hit or not self._none_shares_past(req, key, None, state_hit + self._min_gain_less_one):
                if key in self._quiet_keys:  # it may adopt a quiet one: the table as the per-request path leaves it
                    in_flight = self._flush_quiet_for(key)
                checks |= (MAY_BLOCK if in_flight else PLAIN) | (MAY_PLAN if siblings else PLAIN)
            else:
                # Tracked at the end of the pass if admitted (`note_admitted`): a request proven alone adopts none of
                # the pass's admissions (it shares its token at h + min_gain - 1 with no other), and one whose proof
                # fails has the quiet ones on its key tracked first (above).
                self._alone, self._alone_key = req, key
        elif group is not None:
            # The only indexed request with its key, none in flight: no other request of the pass has its key.
            self._alone, self._alone_key = req, None
        if not checks & MAY_PLAN and self._non_producers >= self._producer_hold_from \
                and self._would_hold_for_producers(req):
            checks |= MAY_PLAN
        return checks

    def _none_shares_past(self, req: Any, key: tuple, tokens: Optional[Sequence[int]], last: int) -> bool:
        """Whether no other request with sibling key `key`, waiting or in flight, shares more than `last` tokens with
        `req` (a waiting request; `tokens`: its request_tokens, None to read them here): proven when req's token at
        index `last` occurs in no other of them. The tokens that occur twice or more at `last` are collected once per
        key, position and pass (`_repeated_at`), so a group's members cost one set lookup each instead of a comparison
        with every other member. False: not proven."""
        if tokens is None:  # request_tokens' common case (no output yet) inlined: one token is read, of any sequence
            tokens = request_tokens(req) if req.output_ids else req.origin_input_ids
        if last >= len(tokens):
            return True  # nothing shares more tokens than it has
        memo = self._repeated.get(key)
        if memo is None:
            assert self._index_fresh, "callers index the queue first (examine, _held_non_producer)"
            memo = self._repeated[key] = (self._index.members(key), {})
        if id(req) not in memo[0]:
            return False  # counted with the others only when indexed (a request SGLang's queue does not hold)
        by_position = memo[1]
        repeated = by_position.get(last)
        if repeated is None:
            repeated = by_position[last] = self._repeated_at(key, memo[0], last)
        return tokens[last] not in repeated

    def _repeated_at(self, key: tuple, waiting: Mapping[int, Any], last: int) -> set[int]:
        """The tokens at index `last` of two or more of the requests with sibling key `key` that wait (`waiting`: the
        index's, which keeps this pass's admissions until it ends) or are in flight. A request admitted later in the
        pass that the index does not hold (a prefix request) drops the key's sets (`note_admitted`)."""
        at: dict[int, int] = {}  # by id: a request both waiting and in flight counts once
        for rid, other in waiting.items():
            # request_tokens' common case (no output yet) inlined: one token is read, of any sequence
            other_tokens = request_tokens(other) if other.output_ids else other.origin_input_ids
            if last < len(other_tokens):
                at[rid] = other_tokens[last]
        for rid, (other, _, _) in self._unlanded.get(key, {}).items():
            if rid not in at:  # admitted by this pass: counted as waiting already
                other_tokens = request_tokens(other)
                if last < len(other_tokens):
                    at[rid] = other_tokens[last]
        tokens = list(at.values())
        seen = set(tokens)
        if len(seen) == len(tokens):
            return set()  # every token once: the common case, decided in C
        seen.clear()
        repeated: set[int] = set()
        for token in tokens:
            (repeated if token in seen else seen).add(token)
        return repeated

    def blocking_promise(self, req: Any) -> Optional[Promise]:
        """The open promise `req` should wait for, or None (also past the deferral bound)."""
        # `_adopt` reads the in-flight table: `examine` tracked the quiet admissions on its key first, unless it proved
        # the request alone (it then adopts none of them).
        assert req is self._alone or not self._quiet_keys or sibling_key(req) not in self._quiet_keys
        if not self.active or not (self.promises or self._unlanded):
            return None
        # A promise with b >= INDEX_PREFIX can block only a request whose first INDEX_PREFIX tokens are its own
        # (b <= key_limit < len(tokens), so such a request always has a sibling key, the table's head key).
        key = sibling_key(req)
        candidates, in_flight = self._open_on(key)
        if not candidates and not in_flight:
            return None
        if getattr(req, DEFER_COUNT, 0) >= self.config.max_defer_rounds:
            return None  # bounded deferral: run from h
        tokens = request_tokens(req)
        state_hit = int(req.prefix_len)
        limit = None  # key_limit: asks SGLang, so only when a candidate needs it
        promise = None
        if candidates:
            limit = key_limit(req, tokens)
            promise = self.promises.blocking(
                namespace_of(req), tokens, state_hit, limit, self.config.min_gain_tokens,
                exclude_rid=str(req.rid), candidates=candidates,
            )
        if promise is None and in_flight:
            promise = self._adopt(req, tokens, state_hit, limit, in_flight)
        return promise

    def _open_on(self, key: Optional[tuple]) -> tuple[Any, Any]:
        """What could block a request with this sibling key: the open promises indexed under it, and the in-flight
        requests it could adopt (None if none)."""
        return self.promises.candidates(key), self._unlanded.get(key) if key is not None and self._unlanded else None

    # ---- adoption: in-flight requests as producers (full attention, extra_buffer hybrids) ----
    def on_landed(self, req: Any) -> None:
        """The request's KV entered the tree (checkpoint) or it left (release): nothing left to adopt."""
        if self._unlanded:
            key = sibling_key(req)
            group = self._unlanded.get(key) if key is not None else None
            if group is not None and group.pop(id(req), None) is not None and not group:
                del self._unlanded[key]

    def _forget_landed(self, round_id: int) -> None:
        """Drop entries older than the previous pass: their round's results were processed under either event
        loop, so whatever they will ever land is in the tree (or was evicted since: then nothing is coming)."""
        for key, group in list(self._unlanded.items()):
            for stale in [i for i, (_, _, admitted_in) in group.items() if admitted_in < round_id - 1]:
                del group[stale]
            if not group:
                del self._unlanded[key]

    def _adopt(self, req: Any, tokens: Any, state_hit: int, limit: Optional[int],
               in_flight: dict[int, tuple[Any, int, int]]) -> Optional[Promise]:
        """A promise for the in-flight request that will land the most of `req`'s useful prefix, past its hit by at
        least min_gain, published when it lands, cancelled if that request is released first. Full attention: for
        the request's whole extend (a partial promise serves every later sibling its shared part too). extra_buffer
        hybrid: for the one state SGLang snapshots inside the extend, which `req` must share whole. `limit`: req's
        key_limit, or None (worked out here if an in-flight request shares more than req's hit)."""
        need = state_hit + self.config.min_gain_tokens
        last = need - 1  # the last token an adoptable request must share (need >= min_gain >= 1)
        if last >= len(tokens):
            return None
        partial = self.mode is PublishMode.KV
        best: Optional[tuple[Any, int, int]] = None  # (request, what it serves req, boundary of its promise)
        for other, end, _ in in_flight.values():
            if other is req:
                continue
            if not partial:
                end = self._tracked_in_extend(other)
            if end < need:
                continue
            other_tokens = request_tokens(other)
            if not tokens_share_more_than(tokens, other_tokens, last):
                continue  # a sibling that shares only what req already has (a consumer's case), without the search
            if limit is None:
                limit = key_limit(req, tokens)
            shared = min(common_prefix_with(as_tokens(tokens).tobytes(), other_tokens), end, limit)
            shared -= shared % self.page_size
            if shared >= need and (partial or shared == end) and (best is None or shared > best[1]):
                best = (other, shared, end - end % self.page_size)
        if best is None:
            return None
        producer, _, boundary = best
        self.on_landed(producer)  # from now on its promise stands for it
        self._nothing_shared = False
        assert self.current is not None
        promise = self.promises.register(
            namespace_of(producer), request_tokens(producer)[:boundary], boundary, str(producer.rid),
            self.current.round_id, partial=partial, page_size=self.page_size,
        )
        self.current.adopted += 1
        return promise

    @staticmethod
    def _tracked_in_extend(req: Any) -> int:
        """extra_buffer: where the state SGLang snapshots inside the request's in-flight extend sits (set by its
        prepare_for_extend, after the pass that admitted it), or 0 when the extend snapshots none (shorter than the
        grid: SGLang keeps its older value, which lies at or before the extend's start, already in the tree)."""
        tracked = req.kv.mamba_last_track_seqlen
        return int(tracked) if tracked is not None and tracked > int(req.prefix_len) else 0

    def note_blocked(self, req: Any, counter: str = DEFER_COUNT) -> None:
        """A Blocked verdict: count it on the request (its own bound) and in the pass."""
        setattr(req, counter, getattr(req, counter, 0) + 1)
        assert self.current is not None
        self.current.blocked_skips += 1
        if self.traversal == "stop":
            self.current.stopped_on_blocked = True

    def note_slot_wait(self, req: Any) -> None:
        self.note_blocked(req, counter=SLOT_WAITS)  # bounded separately: the chunk slot frees every round

    def pending_boundary(self, req: Any) -> Optional[int]:
        """The boundary a chunked producer still has to reach (its next chunk must end there), if any."""
        ahead = [p.boundary for p in self.promises.for_producer(str(req.rid)) if p.boundary > int(req.prefix_len)]
        return min(ahead) if ahead else None

    def note_prefix_request(self, req: Any, prefix: Any) -> None:
        """req's prefix runs as the prefix request `prefix` this round; req itself waits (counted as a deferral) and,
        like its siblings, is a consumer of the prefix's promise."""
        assert self.current is not None
        self.current.prefix_requests += 1
        if self.traversal == "skip" and req.token_indices_to_pool is None:
            for promise in self.promises.for_producer(str(prefix.rid)):
                promise.consumers = (*promise.consumers, (req, promise.boundary))
        setattr(req, DEFER_COUNT, getattr(req, DEFER_COUNT, 0) + 1)

    def note_fragment_skip(self, req: Any) -> None:
        setattr(req, FRAG_SKIPS, getattr(req, FRAG_SKIPS, 0) + 1)
        assert self.current is not None
        self.current.fragment_skips += 1

    # ---- producers ----
    def plan(self, req: Any, token_hit: int = 0) -> Optional[ProducerPlan]:
        if not self.active:
            return None
        if not self._index_fresh:  # lazily: passes that plan nothing never touch the index
            self.index_waiting(self._waiting)
        siblings = self._index.group_with(req)  # req among them: plan_producer skips it
        if not siblings:  # the common case on a queue without sharing: nothing to plan
            return None
        tokens = request_tokens(req)
        assert self.current is not None
        return plan_producer(
            req, tokens, siblings, min_gain=self.config.min_gain_tokens, mode=self.mode,
            cache_chunk=self.cache_chunk, excluded=self.current.admitted_ids, token_hit=token_hit,
            page_size=self.page_size, branch=native_branch(req) if self.mode is PublishMode.TRACK else None,
        )

    def plan_cache_only(self, req: Any, token_hit: int) -> Optional[ProducerPlan]:
        if not self.active or self.mode is PublishMode.KV:  # full attention: the KV is usable anywhere already
            return None
        return plan_cache_only(
            req, request_tokens(req), token_hit=token_hit, min_gain=self.config.min_gain_tokens, mode=self.mode,
            cache_chunk=self.cache_chunk, branch=native_branch(req) if self.mode is PublishMode.TRACK else None,
        )

    def note_admitted(self, req: Any, plan: Optional[ProducerPlan]) -> None:
        # Runs for every admitted request: kept to plain statements (the pass's own cost, bench_sched_overhead.py).
        # (ĥ and h of the pass's admissions are summed and written to their responses at end_pass, in C.)
        current = self.current
        self._hold_run = 0  # admitted (a whole request; past S - R rows a producer): the run of held ones is broken
        current.admitted_reqs.append(req)
        # In flight, a waiting sibling may adopt it (`_adopt`): its KV up to the end of this round's extend (on
        # extra_buffer hybrids also the one state SGLang snapshots inside it) enters the tree when its results are
        # processed (`on_landed`). Adoption is a Blocked verdict (traversal only); a no_buffer extend leaves its state
        # only where it ends, past what its siblings share.
        if self._tracks_in_flight:
            if self._nothing_shared and id(req) in self._indexed:
                # No other waiting request has its sibling key (index_waiting): none adopts it in this pass. Tracked
                # with the pass's other such admissions at end_pass, in C (`_track_quiet`).
                self._quiet.append(req)
            elif self._alone is req and plan is None:
                # `examine` found no other request with its key (none adopts it), or proved that none shares past its
                # hit: a request that may adopt it has it tracked first (`_flush_quiet`).
                self._quiet.append(req)
                if self._alone_key is not None:  # others have its key: one that may adopt flushes first
                    self._quiet_keys.add(self._alone_key)
            else:
                self._track_in_flight(req, current.round_id)
        if plan is None:
            self._non_producers += 1  # producer rows: S - R of these before Ready ones are held
            return
        if plan.mode is PublishMode.CHUNK_END and req.extend_end > plan.boundary:
            return  # its chunk passed b (no chunk slot): no state at b, no promise
        if plan.mode is PublishMode.TRACK:
            req.mamba_branching_seqlen = plan.boundary  # read by prepare_for_extend, after admission
        tokens = request_tokens(req)
        promises = self._register(req, tokens, plan)
        self.current.producers += 1
        if self.traversal == "skip" and req.token_indices_to_pool is None:
            promises[0].consumers = self._consumers(plan)
            # ĥ of this pass's match (add_one_req does not match again)
            self._mark_consumers(req, tokens, promises[0], token_hit_of(req))

    def _track_in_flight(self, req: Any, round_id: int) -> None:
        """Track an admitted request in flight (`_unlanded`) for adoption. Not one whose KV lands elsewhere or not at
        all (`lands_under_token_ids`), or has no sibling key."""
        if req.session is None and not req.skip_radix_cache_insert and req.multimodal_inputs is None \
                and req.input_embeds is None:
            try:
                key = req.rf_sibling_key  # sibling_key's per-request cache, read inline (examine read it)
            except AttributeError:
                key = sibling_key(req)
            if key is not None:
                assert key not in self._quiet_keys, "the quiet admissions on its key are tracked first (_flush_quiet)"
                group = self._unlanded.get(key)
                if group is None:
                    group = self._unlanded[key] = {}
                rid = id(req)
                repeated = self._repeated.get(key)
                if repeated is not None and rid not in repeated[0]:
                    del self._repeated[key]  # in flight now, and counted by none of `_none_shares_past`'s sets
                end = req.extend_end
                assert end.__class__ is int, "Req.extend_end is an int once admitted"
                group[rid] = (req, end, round_id)

    def _track_quiet(self, reqs: list[Any], round_id: int) -> None:
        """`_track_in_flight` for the pass's quiet admissions (`_quiet`), in C: the same table, each request appended
        to its sibling key's group in admission order. They are indexed (so `_none_shares_past`'s sets already count
        them). Where a key was never cached, each is tracked on its own."""
        reqs = lands_under_token_ids(reqs)
        keys = list(map(getattr, reqs, itertools.repeat(SIBLING_KEY), itertools.repeat(_UNKEYED)))
        if _UNKEYED in keys:
            for req in reqs:
                self._track_in_flight(req, round_id)
            return
        ends = list(map(_EXTEND_END, reqs))
        assert set(map(type, ends)) <= {int}, "Req.extend_end is an int once admitted"
        assert None not in keys, "sibling_key caches a key only when the prompt has one"
        groups = map(self._unlanded.setdefault, keys, iter(dict, None))  # key -> {id: (request, extend end, round)}
        collections.deque(map(dict.__setitem__, groups, map(id, reqs), zip(reqs, ends, itertools.repeat(round_id))),
                          maxlen=0)

    def _flush_quiet_for(self, key: tuple) -> bool:
        """A request with sibling key `key` may adopt one of the quiet admissions: track them now; whether a request
        in flight has that key."""
        self._flush_quiet()
        return key in self._unlanded

    def _flush_quiet(self) -> None:
        """Track the quiet admissions so far now (a request that may adopt one of them is being examined)."""
        assert self.current is not None
        self._quiet_keys.clear()  # (before tracking: a request without a cached key takes the per-request path)
        quiet, self._quiet = self._quiet, []
        if quiet:
            self._track_quiet(quiet, self.current.round_id)

    def note_continuation(self, req: Any) -> None:
        """SGLang continues its chunked request in this pass. Requests that arrived after it was planned may share its
        path past what it has computed so far: it becomes their producer (adopted), so that they wait for its next
        chunk instead of the first of them producing the same prefix beside it. Full attention publishes the KV its
        chunk lands; a no_buffer hybrid's chunk is cut at b (`pending_boundary`), where its state lands; an
        extra_buffer hybrid snapshots b inside the continuation (b is on the grid counted from where the chunk before
        stopped, which SGLang requires of `mamba_branching_seqlen`; the adder keeps a chunk that stops short of b on
        that grid too: `_track_continuation_limit`)."""
        if not self.active or self.pending_boundary(req) is not None:
            return
        plan = self.plan(req, int(req.prefix_len))  # None at once while no sibling waits (the common case)
        if plan is None:
            return
        tokens = request_tokens(req)
        if plan.mode is PublishMode.CHUNK_END and self._path_len is not None:
            # The tree may hold more of its path than its own chunks (another request put it there): a branch point
            # known to the tree, where plan_producer caps b on a no_buffer hybrid.
            held = self._path_len(namespace_of(req), tokens)
            if held > int(req.prefix_len):
                plan = self.plan(req, held)
                if plan is None:
                    return
        if plan.mode is PublishMode.TRACK:
            req.mamba_branching_seqlen = plan.boundary  # read by prepare_for_extend, after this pass
        promises = self._register(req, tokens, plan)
        assert self.current is not None
        self.current.adopted += 1
        if self.traversal == "skip" and req.token_indices_to_pool is None:
            promises[0].consumers = self._consumers(plan)
            if self._path_len is not None:
                self._mark(promises[0], self._path_len(promises[0].namespace, promises[0].tokens))

    def _register(self, req: Any, tokens: Any, plan: ProducerPlan) -> list[Promise]:
        """The promises of a producer's plan, b first (partial on full attention: each sibling is served its shared
        part)."""
        assert self.current is not None
        self._nothing_shared = False  # its siblings may be Blocked on these from now on
        return [
            self.promises.register(
                namespace_of(req), tokens[:boundary], boundary, str(req.rid), self.current.round_id,
                partial=plan.mode is PublishMode.KV, page_size=self.page_size,
            )
            for boundary in (plan.boundary, *plan.later)
        ]

    @staticmethod
    def _consumers(plan: ProducerPlan) -> tuple[tuple[Any, int], ...]:
        """(sibling, tokens the plan's promise serves it) for every sibling it serves: b for a sibling that starts
        with the whole promised prefix, and on full attention (partial promises) the shared part for the others.
        (SGLang's scan passes over readouts of another pooling mode: those are left to its own checks.)"""
        partial = plan.mode is PublishMode.KV
        result = []
        for sib, shared in plan.shared:
            served = min(shared, plan.boundary) if partial else (plan.boundary if shared >= plan.boundary else 0)
            if served > 0 and sib.token_indices_to_pool is None:
                result.append((sib, served))
        return tuple(result)

    def _mark_consumers(self, producer: Any, tokens: Any, promise: Promise, token_hit: int) -> None:
        """Mark the consumers that the promise just registered provably Blocks, so the scan skips them unmatched.

        The producer's hit ĥ is below its key limit, so it is the tree's whole match of its path. A consumer whose
        first `served` tokens are the producer's, with served >= ĥ + min_gain > ĥ, matches the same path and stops at
        the same place (the tree does not hold those `served` tokens): its h <= ĥ, so `blocking_promise` would find
        served >= h + min_gain, i.e. Blocked. The tree only shrinks during a pass (inserts follow the forward), which
        keeps this true until the scan reaches the consumer."""
        if token_hit >= key_limit(producer, tokens):
            return
        self._mark(promise, token_hit)

    def _mark_in_flight(self) -> None:
        """At the start of a pass: mark the consumers of promises still in flight from earlier rounds (a chunked
        producer, or the overlap scheduler publishing one round late). The same proof as `_mark_consumers`, with the
        length of the promised prefix the tree holds now (an upper bound of any consumer's match on it) in place of
        the producer's hit."""
        if self.traversal != "skip" or self._path_len is None or not self.promises:
            return
        for promise in self.promises.open_promises():
            if promise.consumers:
                self._mark(promise, self._path_len(promise.namespace, promise.tokens))

    def _mark(self, promise: Promise, held: int) -> None:
        need = held + self.config.min_gain_tokens
        known = self._known_blocked
        for consumer, served in promise.consumers:
            if served >= need:
                known[id(consumer)] = consumer
                self._screen_busy = True

    def carry_empty_pass(self, stats: PassStats) -> None:
        """A pass that admitted nothing launches no round, so it has no record of its own: when it deferred requests
        (every one Blocked, e.g. on an in-flight producer) its counts join the next pass record, with `empty_passes`
        saying how many such passes there were. (Passes over an empty queue or a full batch count nothing.)"""
        if not (stats.blocked_skips or stats.fragment_skips or stats.adopted or stats.held or stats.cut_held):
            return
        carried = self._carried
        for name, value in (("blocked_skips", stats.blocked_skips), ("blocked_screened", stats.screened),
                            ("fragment_skips", stats.fragment_skips), ("producer_holds", stats.held),
                            ("cut_holds", stats.cut_held),
                            ("adopted_producers", stats.adopted), ("empty_passes", 1)):
            carried[name] = carried.get(name, 0) + value

    def pass_record(self, stats: PassStats, row_budget: int, token_budget: Optional[int], waiting_after: list[Any]
                    ) -> dict[str, Any]:
        """The prefill-pass half of a round record (see observe/rounds.py), with the counts of the passes since the
        previous record that admitted nothing (`carry_empty_pass`)."""
        bubble = (
            stats.stopped_on_blocked
            and len(stats.admitted_reqs) < row_budget
            and any(self.blocking_promise_unbounded(r) is None for r in waiting_after)
        )
        holds, self._holds_reported = self.gate.holds - self._holds_reported, self.gate.holds
        carried, self._carried = self._carried, {}
        record = {
            "row_budget": row_budget, "token_budget": token_budget, "waiting": stats.waiting,
            "admission_holds": holds,  # scheduler steps that held arrivals since the previous pass record
            "blocked_skips": stats.blocked_skips, "blocked_screened": stats.screened,
            "fragment_skips": stats.fragment_skips, "producer_holds": stats.held, "cut_holds": stats.cut_held,
            "deferred": len(waiting_after), "producers": stats.producers,
            "prefix_requests": stats.prefix_requests, "adopted_producers": stats.adopted,
            "avoidable_bubble": bool(bubble), "token_hit_sum": stats.token_hit_sum,
            "state_hit_sum": stats.state_hit_sum, "admitted": [str(r.rid) for r in stats.admitted_reqs],
            "first_selection_wait_s": stats.first_selection_wait_s, "empty_passes": 0,
        }
        for name, value in carried.items():
            record[name] += value
        return record

    def promise_record(self) -> dict[str, int]:
        """Promises open now, and registered / published / cancelled since the previous round record. Publication
        and most cancellations happen while a round's results are processed, after its record: they show in the
        next round's, whatever its kind."""
        c = self.promises.counters
        now = (c.registered, c.published, c.cancelled)
        reg0, pub0, can0 = self._promises_reported
        self._promises_reported = now
        record = {
            "promises_open": len(self.promises), "promises_registered_delta": now[0] - reg0,
            "promises_published_delta": now[1] - pub0, "promises_cancelled_delta": now[2] - can0,
        }
        if now[2] != can0:  # why, only on the rounds that cancelled something
            before = self._reasons_reported
            record["promises_cancelled_reasons"] = {
                why: n - before.get(why, 0) for why, n in c.cancel_reasons.items() if n != before.get(why, 0)
            }
            self._reasons_reported = dict(c.cancel_reasons)
        return record

    def blocking_promise_unbounded(self, req: Any) -> Optional[Promise]:
        tokens = request_tokens(req)
        return self.promises.blocking(
            namespace_of(req), tokens, int(getattr(req, "prefix_len", 0) or 0), key_limit(req, tokens),
            self.config.min_gain_tokens, exclude_rid=str(req.rid),
        )

    # ---- publication (called by the cache) ----
    def on_checkpoint(self, req: Any, up_to: int, ready_len: "callable", round_id: int) -> None:
        """The producer's prefix up to `up_to` just entered the tree: publish what it reached, cancel what it passed."""
        for promise in self.promises.for_producer(str(req.rid)):
            if up_to < promise.boundary:
                continue
            if ready_len(promise) >= promise.boundary:
                self.promises.publish(promise, round_id)
            else:
                self.promises.cancel(promise, round_id, "passed the boundary without a state")

    def on_release(self, req: Any, round_id: int) -> None:
        self.on_landed(req)  # gone: nothing of it left to adopt
        self.promises.cancel_producer(str(req.rid), round_id, "producer released before publishing")
