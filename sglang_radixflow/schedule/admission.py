"""Flexible admission: while the worker is idle, hold fresh arrivals a few ms before a prefill scan, so that siblings
arriving together are scanned together (one producer, deferred consumers).

`flex` releases as soon as the worker has work, the held requests fill the rows or (by remaining demand) the tokens
of a round, none has min_gain tokens left to compute, or the oldest has waited `hold_ms`; `timer` only on the
deadline. After QUIET_AFTER holds in a row that gathered nobody, idle arrivals are scanned at once, unless a sibling
was scanned at once less than `hold_ms` before. Rank 0 decides for every TP rank. See docs/design.md.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sglang_radixflow.schedule.producers import namespace_of, request_tokens
from sglang_radixflow.schedule.siblings import SiblingKey, sibling_key

QUIET_AFTER = 4  # holds in a row whose pass shared nothing before the gate stops holding
QUIET = "holds gather nobody"
NOTHING_TO_GAIN = "nothing to gain"


@dataclass(frozen=True)
class HoldDecision:
    hold: bool
    reason: str


def _arrival(req: Any) -> float:
    """When the request entered SGLang's waiting queue (perf_counter); unstamped counts as overdue: never held."""
    return float(getattr(req.time_stats, "wait_queue_entry_time", 0.0) or 0.0)


class AdmissionGate:
    def __init__(self, mode: str, hold_ms: float, state_ready_len: Callable[[Any, Any], int], min_gain: int):
        assert mode in ("native", "flex", "timer"), mode
        self.mode = mode
        self.hold_s = hold_ms / 1000.0
        self._state_ready_len = state_ready_len
        self.min_gain = min_gain  # the least a deferral may save (RadixFlowConfig.min_gain_tokens)
        self._demands: dict[str, int] = {}  # rid -> remaining tokens, valid until the next round runs
        self._holding = False
        self.holds = 0  # scheduler steps that held arrivals (the shared decision, see settle)
        self.releases: dict[str, int] = {}  # why holds ended (this rank's reason)
        self.barren_holds = 0  # holds in a row (up to now) whose pass shared nothing
        self._judging = False  # a hold just ended: the next pass says whether it gathered anything
        self._scanned_at_once: dict[SiblingKey, tuple[float, Any]] = {}  # once quiet: key -> (arrival, rid), the last

    def forget_demands(self) -> None:
        """A round ran: the tree changed, so cached demands are stale."""
        self._demands.clear()

    def decide(self, *, waiting: list[Any], worker_busy: bool, row_budget: int, token_budget: Optional[int],
               now: Optional[float] = None) -> HoldDecision:
        if self.mode == "native" or not waiting or self.hold_s <= 0:
            return HoldDecision(False, "native")
        # Cheapest tests first: on a loaded server (long queue, busy worker) this runs every step, so it must not
        # cost O(queue). In flex mode the O(n) tests below only run while n < row_budget.
        if self.mode == "flex":
            if worker_busy:
                return HoldDecision(False, "worker busy")
            if len(waiting) >= row_budget:
                return HoldDecision(False, "rows full")
        now = time.perf_counter() if now is None else now
        if now - min(map(_arrival, waiting)) >= self.hold_s:
            return HoldDecision(False, "deadline")
        if self.mode == "timer":
            return HoldDecision(True, "hold")
        demands = [self._demand(req) for req in waiting]
        if token_budget is not None and sum(demands) >= token_budget:
            return HoldDecision(False, "tokens full")
        if max(demands) < self.min_gain:
            # siblings share at most what each has left to compute: no producer could save anyone min_gain tokens
            return HoldDecision(False, NOTHING_TO_GAIN)
        if not self._holding and self.barren_holds >= QUIET_AFTER and not self._sibling_scanned_at_once(waiting, now):
            return HoldDecision(False, QUIET)
        return HoldDecision(True, "hold")

    def _sibling_scanned_at_once(self, waiting: list[Any], now: float) -> bool:
        """Once quiet: whether a waiting request's sibling (another request) was scanned at once less than hold_ms
        before it arrived; records the waiting ones as scanned at once (flex gets here with under S waiting)."""
        # scanned less than hold_ms ago, hence less than hold_ms before any waiting request arrived (arrivals <= now)
        recent = {key: seen for key, seen in self._scanned_at_once.items() if now - seen[0] < self.hold_s}
        arrivals = [(key, _arrival(req), req.rid) for req in waiting if (key := sibling_key(req)) is not None]
        met = any(key in recent and rid != recent[key][1] for key, _, rid in arrivals)
        # recorded after the check: siblings waiting together meet in this pass anyway
        recent.update((key, (at, rid)) for key, at, rid in arrivals)
        self._scanned_at_once = recent
        return met

    def _demand(self, req: Any) -> int:  # prompt minus state-ready hit
        rid = str(req.rid)
        if rid not in self._demands:
            tokens = request_tokens(req)
            self._demands[rid] = len(tokens) - self._state_ready_len(namespace_of(req), tokens)
        return self._demands[rid]

    def settle(self, decision: HoldDecision, hold: bool) -> bool:
        """Count what the scheduler does: `hold` is the decision all TP ranks share (rank 0's), `decision` this
        rank's own (only rank 0's is used). Returns `hold`."""
        if hold:
            self.holds += 1
        elif self._holding:
            reason = "rank 0" if decision.hold else decision.reason  # this rank would have held on
            self.releases[reason] = self.releases.get(reason, 0) + 1
            self._judging = True
        self._holding = hold
        return hold

    def note_pass(self, shared: bool) -> None:
        """A prefill pass ran: `shared` if it planned a producer, deferred a consumer or adopted an in-flight
        request (siblings were waiting together). The same on every TP rank."""
        if shared:
            self.barren_holds = 0
        elif self._judging:
            self.barren_holds += 1
        self._judging = False
