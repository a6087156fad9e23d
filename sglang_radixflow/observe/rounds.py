"""Per-round records: JSONL ($RADIXFLOW_TRACE), Prometheus counters (--enable-metrics), a periodic log summary.

A round is one worker call (run_batch). Prefill rounds carry what their scheduling pass decided.
`avoidable_bubble` is counted where it is certain: the scan stopped on a Blocked request (prefix-stop) while rows
were left and a later waiting request was not blocked by any promise (SGLang's budget check is not re-run for it).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from sglang_radixflow.observe.trace import TraceWriter

logger = logging.getLogger("sglang_radixflow")
SUMMARY_EVERY_PREFILL_ROUNDS = 200


@dataclass
class RoundTotals:
    rounds: int = 0
    prefill_rounds: int = 0
    rows: int = 0
    tokens: int = 0
    blocked_skips: int = 0
    avoidable_bubbles: int = 0
    host_time_s: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)


class RoundRecorder:
    def __init__(self, trace: TraceWriter, enable_metrics: bool = False) -> None:
        self.trace = trace
        self.totals = RoundTotals()
        self._metrics: Optional[dict[str, Any]] = None
        self._enable_metrics = enable_metrics

    def enable_metrics(self, on: bool) -> None:
        self._enable_metrics = on

    def record(self, record: dict[str, Any]) -> None:
        t = self.totals
        t.rounds += 1
        kind = record["kind_of_round"]
        t.by_kind[kind] = t.by_kind.get(kind, 0) + 1
        t.host_time_s += record["host_time_s"]
        if kind in ("prefill", "mixed"):
            t.prefill_rounds += 1
            t.rows += record["rows"]
            t.tokens += record["tokens"]
            t.blocked_skips += record.get("blocked_skips", 0)
            t.avoidable_bubbles += int(record.get("avoidable_bubble", False))
            if t.prefill_rounds % SUMMARY_EVERY_PREFILL_ROUNDS == 0:
                self.log_summary()
        self.trace.write("round", **record)
        self._export(record)

    def log_summary(self) -> None:
        t = self.totals
        pr = max(t.prefill_rounds, 1)
        logger.info(
            "sglang-radixflow: rounds=%d prefill=%d rows/round=%.2f tokens/round=%.1f blocked_skips=%d "
            "avoidable_bubbles=%d host_time=%.2fs",
            t.rounds, t.prefill_rounds, t.rows / pr, t.tokens / pr, t.blocked_skips, t.avoidable_bubbles,
            t.host_time_s,
        )

    def summary(self) -> dict[str, Any]:
        return asdict(self.totals)

    def _export(self, record: dict[str, Any]) -> None:
        if not self._enable_metrics:
            return
        if self._metrics is None:
            # Created lazily in the scheduler process: the multiprocess directory is set up before it is spawned.
            from prometheus_client import Counter

            self._metrics = {
                "rounds": Counter("radixflow_rounds", "Worker calls by kind", ["kind"]),
                "rows": Counter("radixflow_prefill_rows", "Requests in prefill rounds"),
                "tokens": Counter("radixflow_prefill_tokens", "Tokens computed in prefill rounds"),
                "blocked": Counter("radixflow_blocked_skips", "Blocked requests deferred by the traversal"),
                "bubbles": Counter("radixflow_avoidable_bubbles", "Prefill rounds with an avoidable bubble"),
                "host": Counter("radixflow_host_time_seconds", "Host time of worker calls"),
                "promises": Counter("radixflow_promises", "Producer promises by outcome", ["outcome"]),
            }
        m = self._metrics
        m["rounds"].labels(kind=record["kind_of_round"]).inc()
        m["host"].inc(record["host_time_s"])
        if record["kind_of_round"] in ("prefill", "mixed"):
            m["rows"].inc(record["rows"])
            m["tokens"].inc(record["tokens"])
            m["blocked"].inc(record.get("blocked_skips", 0))
            m["bubbles"].inc(int(record.get("avoidable_bubble", False)))
        for outcome in ("registered", "published", "cancelled"):  # on any round: promises close between passes
            delta = record.get(f"promises_{outcome}_delta", 0)
            if delta:
                m["promises"].labels(outcome=outcome).inc(delta)


def run_batch(orig: Callable[..., Any], scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """One worker call (Scheduler.run_batch): host time c(B_t) and the round record, with what the prefill pass that
    built the batch decided (SchedulingState.pending_pass)."""
    sched = scheduler.tree_cache.rf_sched
    start = time.perf_counter()
    result = orig(scheduler, batch, *args, **kwargs)
    host_time = time.perf_counter() - start
    sched.gate.forget_demands()
    mode = batch.forward_mode
    kind = "mixed" if mode.is_mixed() else "prefill" if mode.is_extend() else "decode" if mode.is_decode() else "idle"
    record: dict[str, Any] = {
        "round": int(scheduler.forward_ct), "kind_of_round": kind, "rows": len(batch.reqs),
        "tokens": int(batch.extend_num_tokens or 0) if kind in ("prefill", "mixed") else len(batch.reqs),
        "host_time_s": host_time,
    }
    pending = sched.pending_pass
    if pending is not None and pending[0] is batch:
        sched.pending_pass = None
        _, stats, row_budget, token_budget, waiting_after = pending
        record.update(sched.pass_record(stats, row_budget, token_budget, waiting_after))
    record.update(sched.records.promise_record())
    rr = getattr(scheduler.tree_cache, "rf_rr", None)
    if rr is not None:  # RR-Evict: tail units cut so far (cumulative), so a trace shows that eviction happened
        record["rr_units_total"] = rr.units
    sched.recorder.record(record)
    return result
