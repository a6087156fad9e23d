"""The scheduling half of a round record: what the prefill pass decided, and what happened to promises since.

A pass that admitted nothing launches no round, so it has no record of its own: its counts join the next pass record
(`carry_empty_pass`), with `empty_passes` saying how many such passes there were.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from sglang_radixflow.cache.promises import PromiseTable

# counts an empty pass carries to the next record: record field -> PassStats field
CARRIED = {"blocked_skips": "blocked_skips", "fragment_skips": "fragment_skips", "producer_holds": "held",
           "cut_holds": "cut_held", "adopted_producers": "adopted", "chunk_room_cuts": "room_cuts"}


@dataclass
class PassStats:
    """What one prefill scheduling pass did (one per round that scanned the queue)."""

    round_id: int
    waiting: int
    blocked_skips: int = 0
    fragment_skips: int = 0
    stopped_on_blocked: bool = False
    producers: int = 0
    prefix_requests: int = 0
    adopted: int = 0  # in-flight requests adopted as producers (promises registered for them this pass)
    held: int = 0  # Ready non-producers passed over for producers behind them (producer_rows), then offered again
    cut_held: int = 0  # requests the budget would cut, passed over for whole ones behind (chunk_last), then offered
    room_cuts: int = 0  # a chunked request's next chunk cut to the pool's room, or parked (decode headroom spent it)
    admitted_reqs: list[Any] = field(default_factory=list, repr=False)
    token_hit_sum: int = 0
    state_hit_sum: int = 0
    first_selection_wait_s: list[float] = field(default_factory=list)


class PassRecords:
    def __init__(self, promises: PromiseTable) -> None:
        self.promises = promises
        self._promises_reported = (0, 0, 0)  # promise counters at the last round record
        self._reasons_reported: dict[str, int] = {}  # cancel reasons at the last round record
        self._holds_reported = 0  # the admission gate's hold count at the last pass record
        self._carried: dict[str, int] = {}  # counts of passes that admitted nothing, for the next pass record

    def carry_empty_pass(self, stats: PassStats) -> None:
        """A pass that admitted nothing: when it deferred or held requests (e.g. every one Blocked on an in-flight
        producer) its counts join the next pass record. (Passes over an empty queue or a full batch count nothing.)"""
        counts = {name: getattr(stats, attr) for name, attr in CARRIED.items()}
        if not any(counts.values()):
            return
        counts["empty_passes"] = 1
        for name, value in counts.items():
            self._carried[name] = self._carried.get(name, 0) + value

    def pass_record(self, stats: PassStats, row_budget: int, token_budget: Optional[int], waiting_after: list[Any],
                    gate_holds: int, is_blocked: Callable[[Any], bool]) -> dict[str, Any]:
        """`gate_holds`: the admission gate's hold count so far; `is_blocked`: whether a waiting request is blocked by
        an open promise (for the avoidable bubble: the scan stopped on a Blocked request with rows left and a
        request behind it was not blocked)."""
        bubble = (
            stats.stopped_on_blocked
            and len(stats.admitted_reqs) < row_budget
            and any(not is_blocked(r) for r in waiting_after)
        )
        holds, self._holds_reported = gate_holds - self._holds_reported, gate_holds
        carried, self._carried = self._carried, {}
        record = {
            "row_budget": row_budget, "token_budget": token_budget, "waiting": stats.waiting,
            "admission_holds": holds,  # scheduler steps that held arrivals since the previous pass record
            "blocked_skips": stats.blocked_skips, "fragment_skips": stats.fragment_skips,
            "producer_holds": stats.held, "cut_holds": stats.cut_held, "chunk_room_cuts": stats.room_cuts,
            "deferred": len(waiting_after), "producers": stats.producers,
            "prefix_requests": stats.prefix_requests, "adopted_producers": stats.adopted,
            "avoidable_bubble": bool(bubble), "token_hit_sum": stats.token_hit_sum,
            "state_hit_sum": stats.state_hit_sum, "admitted": [str(r.rid) for r in stats.admitted_reqs],
            "first_selection_wait_s": stats.first_selection_wait_s, "empty_passes": 0,
        }
        for name, value in carried.items():
            record[name] += value
        return record

    def promise_record(self) -> dict[str, Any]:
        """Promises open now, and registered / published / cancelled since the previous round record. Publication
        and most cancellations happen while a round's results are processed, after its record: they show in the
        next round's, whatever its kind."""
        c = self.promises.counters
        now = (c.registered, c.published, c.cancelled)
        reg0, pub0, can0 = self._promises_reported
        self._promises_reported = now
        record: dict[str, Any] = {
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
