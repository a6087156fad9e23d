"""Holds: requests the skip scan passes over (producer rows, chunk-last) and offers again later in the same pass.

They are offered again once the scan is S positions past the first of them, after HOLD_RUN_LIMIT more held in a row,
or at the end of the queue. For one pass SGLang's waiting queue is a `HoldingQueue`, whose scan yields the held
requests a second time; every request still goes through SGLang's checks and the adder. See docs/design.md.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

# A run of this many more held in a row shows the queue ahead holds nothing a hold looks for: offer the held ones.
# The smallest run that keeps the bench's replay instances at their round bound.
HOLD_RUN_LIMIT = 8
CUT_HOLDS = "rf_cut_holds"  # per-request attribute: passes that held it because it would be cut (chunk_last)


class Holds:
    """One pass's held requests (a fresh instance per pass)."""

    def __init__(self, lookahead: int) -> None:
        self.lookahead = max(1, lookahead)  # the pass's row budget S
        self.held: list[Any] = []
        self.first_at: Optional[int] = None  # scan position of the first hold
        self.over = False  # the held requests were offered: no more holds in this pass
        self.run = 0  # requests held in a row (an admission breaks the run)
        self.with_cut: dict[int, Any] = {}  # waiting siblings of a held cut producer: held when the scan reaches them
        self.position = 0  # scan position of the request the adder is examining
        self.scan: Optional[object] = None  # the iteration of the queue that is SGLang's scan
        self.yielding: Optional[object] = None  # the iteration that yielded last

    @property
    def scanning(self) -> bool:
        """Whether the request being examined came from the scan's own iteration of a HoldingQueue (only that one
        offers held requests again)."""
        return self.scan is not None and self.scan is self.yielding

    def can_hold(self) -> bool:
        return self.scanning and not self.over

    def hold(self, req: Any) -> None:
        if self.first_at is None:
            self.first_at = self.position
        self.held.append(req)
        self.run += 1

    def note_examined(self) -> None:
        """The adder was handed a request: the iteration that yielded it is the scan."""
        if self.scan is None:
            self.scan = self.yielding

    def note_admitted(self) -> None:
        self.run = 0

    def due(self, position: int) -> bool:
        assert self.first_at is not None or not self.held
        return bool(self.held) and (position - self.first_at > self.lookahead or self.run > HOLD_RUN_LIMIT)

    def offer(self) -> list[Any]:
        held, self.held = self.held, []
        self.over = True
        self.with_cut.clear()  # siblings not reached yet are examined like any request from here on
        return held


class HoldingQueue(list):
    """SGLang's waiting queue for one pass: equal to it as a list; the scan's iteration also yields the held
    requests again when they are due. Any other iteration (sorting, the rebuild after the scan) sees the list."""

    def __init__(self, waiting: list[Any], holds: Holds) -> None:
        super().__init__(waiting)
        self.holds = holds

    def __iter__(self) -> Iterator[Any]:
        if self.holds.scan is not None:  # the scan is known: a later iteration (SGLang's rebuild) sees the list
            return list.__iter__(self)
        return self._iterate(object())

    def _iterate(self, me: object) -> Iterator[Any]:
        holds = self.holds
        for position, req in enumerate(list.__iter__(self)):
            if holds.scan is me and holds.due(position):
                yield from holds.offer()  # (still `yielding`: nothing else iterates during the scan)
            holds.position, holds.yielding = position, me
            yield req
        if holds.scan is me and holds.held:
            yield from holds.offer()


def install(scheduler: Any, holds: Holds) -> HoldingQueue:
    """Put a HoldingQueue in place of scheduler.waiting_queue for one pass."""
    assert isinstance(scheduler.waiting_queue, list), "SGLang's waiting queue is a list"
    queue = HoldingQueue(scheduler.waiting_queue, holds)
    scheduler.waiting_queue = queue
    return queue


def uninstall(scheduler: Any, queue: HoldingQueue) -> None:
    """Back to a plain list, unless SGLang already replaced the queue (it rebuilds it whenever it admits)."""
    if scheduler.waiting_queue is queue:
        scheduler.waiting_queue = list(list.__iter__(queue))
