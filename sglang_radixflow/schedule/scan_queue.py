"""SGLang's waiting queue, as its prefill scan sees it under state-ready traversal.

SGLang's scan (`for req in self.waiting_queue` in Scheduler._get_new_batch_prefill_raw) matches every request it
reaches before asking the adder (~20 us each on CPU), and a skipping traversal reaches several Blocked siblings per
producer. Requests the pass has already proven Blocked (SchedulingState._mark_consumers, _mark_in_flight), and
during chunk-last's look-past those proven to be cut (SchedulingState.screen_cuts), are hidden from the scan's
iteration, so SGLang spends nothing on them; every other list operation, and every iteration that is not the scan,
sees the whole queue.
"""
from __future__ import annotations

from typing import Any, Iterator

from sglang_radixflow.schedule.state import SchedulingState


class ScanQueue(list):
    """A list equal to the waiting queue; iterations that start while `state.screens_scan()` holds skip the
    requests the state marks Blocked as the iteration reaches them."""

    def __init__(self, waiting: list[Any], state: SchedulingState) -> None:
        super().__init__(waiting)
        self._state = state

    def __iter__(self) -> Iterator[Any]:
        plain = list.__iter__(self)
        return self._state.screen(plain, self) if self._state.screens_scan() else plain


def install(scheduler: Any, state: SchedulingState) -> Any:
    """Put a ScanQueue in place of scheduler.waiting_queue for one pass; returns it (for `uninstall`)."""
    assert isinstance(scheduler.waiting_queue, list), "SGLang's waiting queue is a list"
    queue = ScanQueue(scheduler.waiting_queue, state)
    scheduler.waiting_queue = queue
    return queue


def uninstall(scheduler: Any, queue: ScanQueue) -> None:
    """Back to a plain list, unless SGLang already replaced the queue (it rebuilds it whenever it admits)."""
    if scheduler.waiting_queue is queue:
        scheduler.waiting_queue = list.copy(queue)
