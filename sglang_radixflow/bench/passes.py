"""Run SGLang's real prefill scheduling pass (Scheduler._get_new_batch_prefill_raw) in-process on CPU, and, round
after round, what SGLang does around it (used by `radixflow bench replay` and the scheduling unit tests).

Real pieces: the scheduler method itself, SchedulePolicy, the PrefillAdder (ours or SGLang's), Req, ScheduleBatch
(init_new, prepare_for_extend: rows, KV slots, prefix indices, mamba slots), the cache and pools from SGLang's test
kit, Scheduler.stash_chunked_request, SchedulerBatchResultProcessor.process_batch_result_prefill (finish checks,
release_kv_cache / checkpoint_kv_cache) and SchedulerInvariantChecker (pool accounting). Stubbed: only what needs a
model (the forward itself, sampling info, prefill stats), plus the scheduler attributes the pass reads (a namespace).
State contents are garbage: this harness checks scheduling and memory accounting, not outputs.
"""
from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any, Optional, Sequence
from unittest import mock

import torch
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.environ import envs
from sglang.srt.managers import scheduler as scheduler_module
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

from sglang_radixflow.bench.fragments import Fragment, RoundRecord
from sglang_radixflow.cache.tree import RadixFlowCache
from sglang_radixflow.config import load_config
from sglang_radixflow.schedule.adder import RadixFlowPrefillAdder
from sglang_radixflow.schedule.binding import run_prefill_pass

FULL: tuple[ComponentType, ...] = (ComponentType.FULL,)
HYBRID: tuple[ComponentType, ...] = (ComponentType.FULL, ComponentType.MAMBA)


def cache_config(components: Sequence[ComponentType], **overrides: object) -> Any:
    """SGLang's test-kit CacheConfig (pool sizes, layer split) with small defaults."""
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    base: dict[str, Any] = dict(
        components=tuple(components), kv_size=2048, mamba_cache_size=64, max_num_reqs=16, max_context_len=1024,
    )
    base.update(overrides)
    return CacheConfig(**base)


def build_cache(cache_class: type[UnifiedRadixCache], components: Sequence[ComponentType],
                eviction_policy_config: Optional[dict] = None, **cfg: object):
    """(cache, allocator, req_to_token_pool): SGLang's real pools wired by its own test kit
    (sglang/test/kits/unified_radix_cache/fixtures.build_fixture), with the device pinned to "cpu".
    eviction_policy_config: what `--radix-eviction-policy-config` puts in the cache's init params."""
    try:
        from sglang.test.kits.unified_radix_cache import fixtures
    except ImportError as err:  # pragma: no cover - the kit ships in the sglang 0.5.23 wheel
        raise RuntimeError(f"SGLang's test kit (sglang.test.kits) is needed for in-process passes: {err}") from err
    init_params = fixtures.CacheInitParams

    def with_policy_config(**kwargs: Any) -> Any:
        return init_params(**kwargs, eviction_policy_config=eviction_policy_config)

    with mock.patch.object(fixtures, "get_device", return_value="cpu"), mock.patch.object(
        fixtures, "UnifiedRadixCache", cache_class
    ), mock.patch.object(fixtures, "CacheInitParams", with_policy_config):
        cache, allocator, pool = fixtures.build_fixture(cache_config(components, **cfg), mamba_cache_chunk_size=1)
    assert type(cache) is cache_class
    return cache, allocator, pool


SAMPLED_TOKEN = 7  # what the "forward" samples for every request (below any test's vocabulary bound)
VOCAB_SIZE = 1 << 20  # request token ids must stay below it (SGLang's vocab-boundary checks)


def make_request(rid: str, tokens: Sequence[int], max_new_tokens: int = 1, cache_salt: Optional[str] = None) -> Req:
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens)
    params.normalize(None)  # the tokenizer manager does this before a request reaches the scheduler
    return Req(
        rid=rid, origin_input_text="", origin_input_ids=array("q", tokens), sampling_params=params,
        cache_salt=cache_salt, vocab_size=VOCAB_SIZE,
    )


class PassHarness:
    """One scheduler (fake self) over a real RadixFlowCache.

    `run_pass()` is one prefill scheduling pass (admission only); `execute()` runs the admitted batch as a round:
    allocation (prepare_for_extend), the forward (round clock), and SGLang's result processing. `run_rounds()` loops
    both until the queue drains."""

    def __init__(self, components, arm: str = "radixflow", token_budget: int = 4096, rows: int = 16,
                 admission: str = "native", slot_wait: bool = False, prefix_requests: bool = True,
                 producer_rows: Optional[int] = None, schedule_policy: str = "fcfs",
                 chunk_last: Optional[bool] = None, min_gain_tokens: Optional[int] = None, **cfg: Any):
        """admission: the arm's admission is replaced (native by default) so that a pass never holds.
        producer_rows, chunk_last, min_gain_tokens: RADIXFLOW_PRODUCER_ROWS, _CHUNK_LAST, _MIN_GAIN_TOKENS (None: the
        arm's default).
        schedule_policy: SGLang's --schedule-policy (its SchedulePolicy sorts the queue before each scan)."""
        self.cache, self.allocator, self.pool = build_cache(RadixFlowCache, components, **cfg)
        self.cache.configure(load_config({
            "RADIXFLOW_ARM": arm, "RADIXFLOW_ADMISSION": admission,
            "RADIXFLOW_PRODUCER_SLOT_WAIT": "1" if slot_wait else "0",
            "RADIXFLOW_PREFIX_REQUESTS": "1" if prefix_requests else "0",
            **({} if producer_rows is None else {"RADIXFLOW_PRODUCER_ROWS": str(producer_rows)}),
            **({} if chunk_last is None else {"RADIXFLOW_CHUNK_LAST": "1" if chunk_last else "0"}),
            **({} if min_gain_tokens is None else {"RADIXFLOW_MIN_GAIN_TOKENS": str(min_gain_tokens)}),
        }))
        self.forward_ct = 0
        self.cache.rf_clock.bind(lambda: self.forward_ct)
        self.rows = rows
        self.token_budget = token_budget
        self.hybrid = ComponentType.MAMBA in self.cache.components
        model_config = SimpleNamespace(
            vocab_size=VOCAB_SIZE, is_encoder_decoder=False, self_opened_think_start_ids=None, think_end_ids=None,
        )
        self.sched = SimpleNamespace(
            grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False),
            enable_priority_preemption=False, is_hybrid_swa=False, waiting_queue=[], chunked_req=None,
            min_free_slots_delayer=None, get_num_allocatable_reqs=lambda *a, **k: rows,
            policy=SchedulePolicy(schedule_policy, self.cache, False, False, False), processed_tokens_counter=0,
            dynamic_chunk_sizer=None, chunked_prefill_size=token_budget,
            tp_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=object(), prefill_aware_swa=False)),
            get_prefill_adder_class=lambda: (
                RadixFlowPrefillAdder if self.cache.rf_sched.traversal != "native" else PrefillAdder
            ),
            page_size=1, tree_cache=self.cache, token_to_kv_pool_allocator=self.allocator,
            new_token_ratio_tracker=SimpleNamespace(current=0.5), max_prefill_tokens=token_budget,
            is_mixed_chunk=False, priority_scheduling_preemption_threshold=0, max_prefill_bs=rows,
            max_running_requests=rows, dllm_config=None, enable_lora=False, req_to_token_pool=self.pool,
            enable_hicache_storage=False, enable_lmcache=False, truncation_align_size=None,
            enable_hierarchical_cache=False, enable_unified_cache_external_linker=False, model_config=model_config,
            enable_overlap=False, spec_algorithm=None, hisparse_coordinator=None,
            load_inquirer=SimpleNamespace(_get_num_pending_tokens=lambda **k: 0),
            forward_ct=0, enable_priority_scheduling=False, disaggregation_mode=DisaggregationMode.NULL,
        )
        # The pass rebinds waiting_queue; SGLang's re-queue paths (grammar, preemption) append to the current one.
        self.sched._add_request_to_queue = lambda req: self.sched.waiting_queue.append(req)
        self.batch: Optional[ScheduleBatch] = None  # admitted by the last pass, not executed yet
        self.last_batch: Optional[ScheduleBatch] = None  # the last executed round (Scheduler.last_batch)
        self.rounds: list[RoundRecord] = []
        # SGLang's own post-forward processing and pool accounting, built the way Scheduler builds them.
        self.processor = SchedulerBatchResultProcessor(
            is_generation=True, disaggregation_mode=DisaggregationMode.NULL, enable_overlap=False,
            enable_overlap_mlx=False, model_config=model_config, token_to_kv_pool_allocator=self.allocator,
            tree_cache=self.cache, hisparse_coordinator=None, req_to_token_pool=self.pool, decode_offload_manager=None,
            metrics_collector=None, metrics_reporter=None, draft_worker=None, model_worker=None,
            logprob_result_processor=None, output_streamer=SimpleNamespace(stream_output=lambda *a, **k: None),
            beam_coordinator=None, abort_request=None,
        )
        observer = SchedulerPoolStatsObserver(
            tree_cache=self.cache, token_to_kv_pool_allocator=self.allocator, req_to_token_pool=self.pool,
            session_controller=SimpleNamespace(sessions={}), hisparse_coordinator=None, is_hybrid_swa=False,
            is_hybrid_ssm=self.hybrid, enable_hisparse=False, full_tokens_per_layer=None, swa_tokens_per_layer=None,
            max_total_num_tokens=self.allocator.size,
        )
        self.invariants = SchedulerInvariantChecker(
            is_hybrid_swa=False, is_hybrid_ssm=self.hybrid, disaggregation_mode=DisaggregationMode.NULL, page_size=1,
            full_tokens_per_layer=None, swa_tokens_per_layer=None, max_total_num_tokens=self.allocator.size,
            tree_cache=self.cache, token_to_kv_pool_allocator=self.allocator, req_to_token_pool=self.pool,
            pool_stats_observer=observer, get_last_batch=lambda: self.last_batch, get_running_batch=lambda: None,
            get_chunked_req=lambda: self.sched.chunked_req, scheduler_stage_metrics=None,
        )

    def submit(self, *reqs: Req) -> None:
        for req in reqs:  # what Scheduler._add_request_to_queue does
            req.time_stats.set_wait_queue_entry_time()
            self.sched.waiting_queue.append(req)

    def run_pass(self, running: Optional[ScheduleBatch] = None) -> list[Req]:
        """One prefill pass; returns the admitted requests (the batch of this round). `running`: SGLang's running
        (decode) batch, whose requests' decode headroom the adder reserves (empty by default)."""
        chunked = self.sched.chunked_req
        # Scheduler.get_next_batch_to_run: the chunk that ran last round enters the tree before the next pass. A chunk
        # that was admitted but never executed (one-pass tests) holds no KV and has nothing to stash.
        if chunked is not None and chunked.kv.holds_kv and chunked.extend_end > chunked.prefix_len:
            scheduler_module.Scheduler.stash_chunked_request(self.sched, chunked)
        self.sched.forward_ct = self.forward_ct
        # The batch is SGLang's own (init_new); its allocation (prepare_for_extend) is deferred to execute(): nothing
        # touches the tree or the pools in between, so the order of effects is SGLang's.
        with mock.patch.object(ScheduleBatch, "prepare_for_extend", lambda batch: None), mock.patch.object(
            scheduler_module.PrefillStats, "from_adder", return_value=None
        ):
            result = run_prefill_pass(
                scheduler_module.Scheduler._get_new_batch_prefill_raw, self.sched, self.cache.rf_sched,
                None, running if running is not None else ScheduleBatch(reqs=[]),
            )
        self.batch = result[0]
        return list(self.batch.reqs) if self.batch is not None else []

    def execute(self, batch: Optional[ScheduleBatch] = None) -> RoundRecord:
        """Run an admitted batch as one round, as SGLang does after the pass: allocate, forward, process."""
        return self.finish(self.launch(batch))

    def launch(self, batch: Optional[ScheduleBatch] = None) -> tuple[ScheduleBatch, tuple[Fragment, ...]]:
        """The first half of a round: allocate the admitted batch and launch its forward (Scheduler.run_batch). With
        the overlap scheduler the next pass runs before this round's results are processed (`finish`)."""
        batch = batch if batch is not None else self.batch
        assert batch is not None, "no admitted batch to execute"
        fragments = tuple(Fragment(str(r.rid), int(r.prefix_len), int(r.extend_len)) for r in batch.reqs)
        # Rows, KV slots for the extend, the matched prefix's KV indices, mamba slots (alloc_for_extend).
        with mock.patch.object(SamplingBatchInfo, "from_schedule_batch", return_value=None):
            batch.prepare_for_extend()
        # Scheduler.run_batch: one worker call = one round. No forward runs: states stay garbage.
        self.forward_ct += 1
        batch.forward_iter = self.forward_ct
        if batch is self.batch:
            self.batch = None
        self.last_batch = batch  # Scheduler.last_batch: the round launched last (its KV is in use until processed)
        return batch, fragments

    def finish(self, launched: tuple[ScheduleBatch, tuple[Fragment, ...]]) -> RoundRecord:
        """The second half of a round: SGLang's result processing (cache inserts, publication), then its checks."""
        batch, fragments = launched
        result = GenerationBatchResult(
            next_token_ids=torch.full((len(batch.reqs),), SAMPLED_TOKEN, dtype=torch.int64),
        )
        # Finished at prefill -> release_kv_cache(checkpoint=True); a middle chunk waits for the next pass's stash.
        self.processor.process_batch_result_prefill(batch, result)
        for req, frag in zip(batch.reqs, fragments):
            # A request whose whole prompt ran must have finished (a middle chunk continues in a later round).
            assert req.finished() or frag.prefix_len + frag.extend_len < len(req.origin_input_ids), (
                f"{req.rid} needs decode rounds; this harness runs prefill-only workloads (max_new_tokens=1)"
            )
            # A request sampled (finished) before its prompt was fully computed would answer a truncated prompt.
            assert not req.finished() or frag.prefix_len + frag.extend_len == len(req.origin_input_ids), (
                f"{req.rid} finished after {frag.prefix_len + frag.extend_len} of {len(req.origin_input_ids)} "
                "prompt tokens (a middle chunk was processed as a last one)"
            )
        # The scheduler's per-step check (strict mode): KV slots conserved, no page both owned and free.
        with envs.SGLANG_CHECK_KV_PAGE_INVARIANTS.override(True), \
                envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE.override(True):
            self.invariants.self_check_during_busy()
        record = RoundRecord(int(batch.forward_iter), fragments)
        self.rounds.append(record)
        return record

    def run_rounds(self, max_rounds: int = 64) -> list[RoundRecord]:
        """Pass + execute until no request waits and no chunk is pending; the records of the rounds it ran."""
        start = len(self.rounds)
        while self.waiting or self.sched.chunked_req is not None:
            assert len(self.rounds) - start < max_rounds, f"queue not drained after {max_rounds} rounds"
            admitted = self.run_pass()
            assert admitted, f"a pass admitted nothing with {[r.rid for r in self.waiting]} waiting"
            self.execute()
        return self.rounds[start:]

    def assert_idle_invariants(self) -> None:
        """What Scheduler.on_idle checks once nothing runs: every KV slot and mamba slot is free or in the tree
        (available + evictable + protected == total), every request row is free, and the tree is consistent."""
        assert self.batch is None and self.sched.chunked_req is None and not self.waiting
        assert self.cache.full_protected_size() == 0, "a finished request still holds a tree lock"
        has_leak, messages = self.invariants._check_all_pools(self.invariants.pool_stats_observer.get_pool_stats())
        assert not has_leak, "\n".join(messages)
        with envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE.override(True):  # raise instead of warning
            self.invariants._check_req_pool()
        assert not self.allocator.verify_byte_accounting()
        self.cache.sanity_check()

    @property
    def waiting(self) -> list[Req]:
        return self.sched.waiting_queue
