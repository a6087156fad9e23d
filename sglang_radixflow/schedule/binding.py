"""Glue between SGLang's Scheduler and the scheduling state (called from the few-line hooks in plugin.py)."""
from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_radixflow.schedule.state import SchedulingState

logger = logging.getLogger("sglang_radixflow")


def bind_scheduler(scheduler: Any) -> None:
    """First scheduling step: the cache's clock follows forward_ct; unsafe features switch skipping off."""
    cache = scheduler.tree_cache
    assert isinstance(scheduler.forward_ct, int), "Scheduler.forward_ct is the round counter radixflow reads"
    cache.rf_clock.bind(lambda: scheduler.forward_ct)
    sched: SchedulingState = cache.rf_sched
    # A skipped request has already consumed a storage prefetch span / triggered a preemption (scheduler.py).
    for flag, why in (
        ("enable_hicache_storage", "HiCache storage prefetch spans are consumed before admission"),
        ("enable_lmcache", "LMCache prefetch spans are consumed before admission"),
        ("enable_priority_preemption", "priority preemption may already have evicted running requests"),
    ):
        if getattr(scheduler, flag, False):
            sched.disable_traversal(f"--{flag.replace('_', '-')} is on: {why}")
    logger.info(
        "sglang-radixflow: bound to scheduler (arm=%s traversal=%s publish=%s)",
        sched.config.arm, sched.traversal, sched.mode.value,
    )


def run_prefill_pass(orig: Callable[..., Any], scheduler: Any, sched: SchedulingState, *args: Any, **kwargs: Any):
    """One call of Scheduler._get_new_batch_prefill_raw with the pass scratch set up around it."""
    sched.begin_pass(scheduler.forward_ct + 1, scheduler.waiting_queue)
    try:
        return orig(scheduler, *args, **kwargs)
    finally:
        sched.end_pass()
