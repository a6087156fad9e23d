"""The scheduler round clock that published-round stamps are read against.

Round t is the t-th worker call (`Scheduler.forward_ct` after run_batch increments it). Whatever lands in the tree
while the scheduler's last launched round is t is stamped t and is usable from round t+1 on: a scan in round t never
sees round t's own results. In a live server the clock reads `Scheduler.forward_ct`; unbound (unit tests, tools) it
is a plain counter advanced by `advance()`.
"""
from __future__ import annotations

from typing import Callable, Optional


class RoundClock:
    def __init__(self) -> None:
        self._source: Optional[Callable[[], int]] = None
        self._count = 0

    def bind(self, source: Callable[[], int]) -> None:
        """Follow a live scheduler: `source()` returns its last launched round (forward_ct)."""
        self._source = source

    @property
    def bound(self) -> bool:
        return self._source is not None

    def advance(self) -> int:
        """Unbound clocks only: one more round was launched."""
        assert self._source is None, "a clock bound to a scheduler advances with it"
        self._count += 1
        return self._count

    def last_launched(self) -> int:
        """The round a result landing now belongs to (its publication stamp)."""
        return self._source() if self._source is not None else self._count

    def scheduling(self) -> int:
        """The round being scheduled now: stamps < this value are published. (Read once per match: last_launched
        inlined.)"""
        source = self._source
        return (source() if source is not None else self._count) + 1
