"""Run SGLang's real prefill scheduling pass (Scheduler._get_new_batch_prefill_raw) in-process on CPU.

Real pieces: the scheduler method itself, SchedulePolicy, the PrefillAdder (ours or SGLang's), Req, the cache and
pools from SGLang's test kit. Stubbed: only what runs after admission and needs a model (ScheduleBatch.init_new /
prepare_for_extend and the prefill stats), plus the scheduler attributes the pass reads (a namespace).
"""
from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any, Optional, Sequence
from unittest import mock

from sglang.srt.managers import scheduler as scheduler_module
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
from sglang.srt.sampling.sampling_params import SamplingParams

from sglang_radixflow.config import load_config
from sglang_radixflow.schedule.adder import RadixFlowPrefillAdder
from sglang_radixflow.schedule.binding import run_prefill_pass
from tests.unit.cache.helpers import build_radixflow


def make_request(rid: str, tokens: Sequence[int], max_new_tokens: int = 1, cache_salt: Optional[str] = None) -> Req:
    req = Req(
        rid=rid, origin_input_text="", origin_input_ids=array("q", tokens),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=max_new_tokens), cache_salt=cache_salt,
    )
    return req


class PassHarness:
    """One scheduler (fake self) over a real RadixFlowCache; `run_pass()` is one prefill scheduling pass."""

    def __init__(self, components, arm: str = "radixflow", token_budget: int = 4096, rows: int = 16,
                 admission: str = "native", **cfg: Any):
        """admission: the arm's admission is replaced (native by default) so that a pass never holds."""
        self.cache, self.allocator, self.pool = build_radixflow(components, **cfg)
        self.cache.configure(load_config({"RADIXFLOW_ARM": arm, "RADIXFLOW_ADMISSION": admission}))
        self.forward_ct = 0
        self.cache.rf_clock.bind(lambda: self.forward_ct)
        self.traversal = self.cache.rf_sched.traversal
        self.sched = SimpleNamespace(
            grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False),
            enable_priority_preemption=False, is_hybrid_swa=False, waiting_queue=[], chunked_req=None,
            min_free_slots_delayer=None, get_num_allocatable_reqs=lambda *a, **k: rows,
            policy=SchedulePolicy("fcfs", self.cache, False, False, False), processed_tokens_counter=0,
            dynamic_chunk_sizer=None, chunked_prefill_size=token_budget,
            tp_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=object(), prefill_aware_swa=False)),
            get_prefill_adder_class=lambda: RadixFlowPrefillAdder if self.traversal != "native" else PrefillAdder,
            page_size=1, tree_cache=self.cache, token_to_kv_pool_allocator=self.allocator,
            new_token_ratio_tracker=SimpleNamespace(current=0.5), max_prefill_tokens=token_budget,
            is_mixed_chunk=False, priority_scheduling_preemption_threshold=0, max_prefill_bs=rows,
            max_running_requests=rows, dllm_config=None, enable_lora=False, req_to_token_pool=self.pool,
            enable_hicache_storage=False, enable_lmcache=False, truncation_align_size=None,
            enable_hierarchical_cache=False, enable_unified_cache_external_linker=False, model_config=None,
            enable_overlap=False, spec_algorithm=None, hisparse_coordinator=None,
            load_inquirer=SimpleNamespace(_get_num_pending_tokens=lambda **k: 0),
            forward_ct=0, enable_priority_scheduling=False,
        )
        self.sched._add_request_to_queue = self.sched.waiting_queue.append

    def submit(self, *reqs: Req) -> None:
        for req in reqs:  # what Scheduler._add_request_to_queue does
            req.time_stats.set_wait_queue_entry_time()
            self.sched.waiting_queue.append(req)

    def run_pass(self) -> list[Req]:
        """One prefill pass; returns the admitted requests (the batch of this round)."""
        admitted: list[Req] = []

        def init_new(reqs, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            admitted.extend(reqs)
            return SimpleNamespace(prepare_for_extend=lambda: None)

        self.sched.forward_ct = self.forward_ct
        with mock.patch.object(scheduler_module.ScheduleBatch, "init_new", side_effect=init_new), mock.patch.object(
            scheduler_module.PrefillStats, "from_adder", return_value=None
        ):
            run_prefill_pass(
                scheduler_module.Scheduler._get_new_batch_prefill_raw, self.sched, self.cache.rf_sched,
                None, ScheduleBatch(reqs=[]),
            )
        return admitted

    @property
    def waiting(self) -> list[Req]:
        return self.sched.waiting_queue
