"""Glue between SGLang's Scheduler and the scheduling state (called from the few-line hooks in plugin.py)."""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from sglang_radixflow.schedule import holds
from sglang_radixflow.schedule.state import SchedulingState

logger = logging.getLogger("sglang_radixflow")


# A skipped request has already consumed a storage prefetch span / triggered a preemption (scheduler.py).
UNSAFE_FOR_SKIPPING = {
    "enable_hicache_storage": "HiCache storage prefetch spans are consumed before admission",
    "enable_lmcache": "LMCache prefetch spans are consumed before admission",
    "enable_priority_preemption": "priority preemption may already have evicted running requests",
}


def switch_off_unsafe_skipping(scheduler: Any, sched: SchedulingState) -> None:
    """Before every pass (SGLang can attach HiCache storage to a running server): the traversal steps aside for good
    once a feature it cannot skip past is on."""
    for flag, why in UNSAFE_FOR_SKIPPING.items():
        assert isinstance(getattr(scheduler, flag, None), bool), f"Scheduler.{flag} is the flag radixflow reads"
        if sched.traversal != "native" and getattr(scheduler, flag):
            sched.disable_traversal(f"--{flag.replace('_', '-')} is on: {why}")


def bind_scheduler(scheduler: Any) -> None:
    """First scheduling step: the cache's clock follows forward_ct; unsafe features switch skipping off."""
    cache = scheduler.tree_cache
    assert isinstance(scheduler.forward_ct, int), "Scheduler.forward_ct is the round counter radixflow reads"
    cache.rf_clock.bind(lambda: scheduler.forward_ct)
    sched: SchedulingState = cache.rf_sched
    assert isinstance(getattr(cache, "disable", None), bool), "UnifiedRadixCache.disable is --disable-radix-cache"
    if cache.disable:  # SGLang still builds the tree then, but it stores nothing: no promise could ever be kept
        sched.make_inert("--disable-radix-cache is on: the tree stores nothing, so no prefix can be published")
    switch_off_unsafe_skipping(scheduler, sched)
    from sglang.srt.disaggregation.utils import DisaggregationMode

    if sched.prefix_requests and getattr(scheduler, "disaggregation_mode", DisaggregationMode.NULL) != (
        DisaggregationMode.NULL
    ):
        # A prefix request would be sent to a decode instance like any finished prefill.
        logger.warning("sglang-radixflow: prefix requests disabled: PD disaggregation is on")
        sched.prefix_requests = False
    assert hasattr(scheduler, "prefill_delayer"), "Scheduler.prefill_delayer (None unless --enable-prefill-delayer)"
    if scheduler.prefill_delayer is not None:
        sched.disable_hold("SGLang's prefill delayer is on")
    from sglang.srt.runtime_context import get_observability

    sched.recorder.enable_metrics(bool(get_observability().enable_metrics))
    logger.info(
        "sglang-radixflow: bound to scheduler (arm=%s traversal=%s admission=%s publish=%s)",
        sched.config.arm, sched.traversal, sched.gate.mode, sched.mode.value,
    )


def budgets(scheduler: Any, running_batch: Any) -> tuple[int, Optional[int]]:
    """(S, T): rows a prefill round may take now, and its token budget (chunked prefill size, else the cap)."""
    from sglang.srt.runtime_context import get_schedule

    rows = int(scheduler.get_num_allocatable_reqs(len(running_batch.reqs), running_batch=running_batch))
    for cap in (getattr(scheduler, "max_prefill_bs", 0), get_schedule().prefill_max_requests):
        if cap:
            rows = min(rows, int(cap))
    chunk = scheduler.chunked_prefill_size
    tokens = chunk if chunk is not None and chunk > 0 else scheduler.max_prefill_tokens
    return rows, tokens


def _decide_once(scheduler: Any, hold: bool) -> bool:
    """TP ranks must agree: rank 0's wall-clock decision is broadcast to the others."""
    if getattr(scheduler, "tp_size", 1) <= 1:
        return hold
    import torch
    import torch.distributed as dist

    flag = torch.tensor([int(hold)], dtype=torch.int32)
    group = scheduler.tp_cpu_group
    dist.broadcast(flag, src=dist.get_global_rank(group, 0), group=group)
    return bool(flag.item())


def run_prefill_pass(orig: Callable[..., Any], scheduler: Any, sched: SchedulingState, *args: Any, **kwargs: Any):
    """One call of Scheduler._get_new_batch_prefill_raw: admission hold, then the pass with its scratch."""
    running_batch = args[1] if len(args) > 1 else kwargs["running_batch"]
    waiting = scheduler.waiting_queue
    rows, tokens = budgets(scheduler, running_batch)
    if sched.gate.mode != "native" and waiting and scheduler.chunked_req is None:
        busy = not running_batch.is_empty() or len(getattr(scheduler, "result_queue", ()) or ()) > 0
        decision = sched.gate.decide(waiting=waiting, worker_busy=busy, row_budget=rows, token_budget=tokens)
        if sched.gate.settle(decision, _decide_once(scheduler, decision.hold)):
            return None, running_batch
    switch_off_unsafe_skipping(scheduler, sched)
    sched.begin_pass(scheduler.forward_ct + 1, waiting, rows, tokens)
    # Holds need the scan's own iteration (skip traversal; with LoRA on, SGLang's scan passes over requests whose
    # adapter cannot load before the adder sees them, so nothing is held).
    held_scan = sched.traversal == "skip" and not getattr(scheduler, "enable_lora", False)
    queue = holds.install(scheduler, sched.current.holds) if held_scan else None
    try:
        result = orig(scheduler, *args, **kwargs)
    finally:
        if queue is not None:
            holds.uninstall(scheduler, queue)
        stats = sched.end_pass(scheduler.waiting_queue)
    if stats is not None:  # whether the holds gather siblings (schedule/admission.py)
        sched.gate.note_pass(bool(stats.producers or stats.prefix_requests or stats.adopted or stats.blocked_skips))
    new_batch = result[0] if isinstance(result, tuple) else None
    if stats is not None and new_batch is not None:
        sched.pending_pass = (new_batch, stats, rows, tokens, scheduler.waiting_queue)
    elif stats is not None:
        sched.records.carry_empty_pass(stats)
    return result

