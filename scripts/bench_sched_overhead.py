#!/usr/bin/env python
"""CPU cost of ONE prefill scheduling pass: radixflow (state-ready traversal) vs native SGLang.

The pass is SGLang's real `Scheduler._get_new_batch_prefill_raw` over real SGLang classes (policy, PrefillAdder or
RadixFlowPrefillAdder, Req, ScheduleBatch.init_new, RadixFlowCache on the Python tree core, CPU pools), wrapped by
radixflow's pass hook, as the unit-test harness runs it (tests/unit/schedule/harness.py). The batch's allocation
(prepare_for_extend) is outside the timed region in every variant. Each sample: a fresh scheduler with an empty
tree, a waiting queue, one timed pass (GC off). Medians over the repeats of process CPU time
(process_time) and wall time (perf_counter).

Variants: native = RADIXFLOW_ARM=sglang (SGLang's PrefillAdder); rf = RADIXFLOW_ARM=radixflow with native admission
(the traversal alone); rf+flex = the radixflow arm as deployed, its admission gate included (requests arrived 1 s
ago: the gate releases on its deadline, i.e. what a loaded server sees).
Each sample's timed pass is the scheduler's second: an untimed first pass over N requests admitted and ran its
round (the synchronous loop), and as many new requests arrived, so N wait again. --in-flight: that round was launched, never processed, as under
SGLang's overlap scheduler (the first pass's promises are still open: their consumers are Blocked in flight).
SGLang's FCFS policy also re-touches the first 128 waiting prefixes on one pass in 32 (same work in every variant):
the timed pass is one of the other 31 unless --refresh.

Queue (`--queue groups`, default): groups of 4 candidates (a shared document of 300-500 tokens + a 20-token question,
then a distinct 8-24 token answer), siblings arriving together, with unrelated 150-400-token requests in between (~1
in 5 requests). `--queue unrelated`: only the unrelated requests (nothing shared: radixflow's hooks alone).
`--queue consumers`: the groups queue with every document + question already published in the tree (a state at its
end on hybrids): the pass after the producers' round, where every sibling is a Ready consumer.
Budgets S = 64 rows, T = 16384 tokens: a pass admits a few dozen requests.

    python scripts/bench_sched_overhead.py [--sizes 10 100 1000] [--repeats 21] [--config full hybrid]
                                           [--slot-wait] [--in-flight] [--producer-rows R] [--chunk-last 0|1]
    python scripts/bench_sched_overhead.py --profile 1000     # cProfile of the radixflow pass
    python scripts/bench_sched_overhead.py --drain 1000       # every pass until a queue of 1000 drains
    python scripts/bench_sched_overhead.py --drain 1000 --profile 0   # ... radixflow's code vs SGLang's in it

--drain N: one pass is not the same work in every variant (radixflow's reaches past Blocked siblings and admits other
requests; native's recomputes each shared document beside its siblings, so its queue takes more passes to drain).
This times every pass (CPU, same region as one pass) while the harness runs rounds until N requests drain (SGLang's
own allocation and result processing between passes, untimed; the synchronous loop: each round's results are
processed before the next pass): passes, total pass CPU, CPU per request served, prefill tokens computed.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from sglang_radixflow.cpu import boot  # noqa: E402

boot.install()  # SGLang's CPU engine + our CPU runtime, as tests/conftest.py does

from sglang.srt.managers import scheduler as scheduler_module  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402

from sglang_radixflow.schedule.binding import run_prefill_pass  # noqa: E402
from tests.unit.cache.helpers import FULL, HYBRID, CacheDriver  # noqa: E402
from tests.unit.schedule.harness import PassHarness, make_request  # noqa: E402

S, T = 64, 16384
CONFIGS = {"full": FULL, "hybrid": HYBRID}
VARIANTS = {"native": ("sglang", "native"), "rf": ("radixflow", "native"), "rf+flex": ("radixflow", "flex")}
SLOT_WAIT = [False]  # --slot-wait: RADIXFLOW_PRODUCER_SLOT_WAIT=1 for the radixflow variants
IN_FLIGHT = [False]  # --in-flight: the timed pass follows one whose round has not been processed (overlap scheduler)
REFRESH = [False]  # --refresh: time the pass in which SGLang's policy re-touches the first 128 waiting prefixes
# --producer-rows / --chunk-last: the radixflow variants' RADIXFLOW_PRODUCER_ROWS / RADIXFLOW_CHUNK_LAST (None: the
# arm's default), to price each feature on its own
FEATURES: dict[str, Any] = {"producer_rows": None, "chunk_last": None}


# --mamba-slots (--drain, hybrid): the mamba pool, rows of the running requests and the tree's states together. A hit
# on a state copies it into a fresh slot (SGLang's copy-on-write at match time), evicting a tree state when none is
# free: a smaller pool makes every hit pay an eviction.
MAMBA_SLOTS = [8 * S]
QUEUE = ["groups"]  # --queue: groups (candidates sharing a document) | unrelated (nothing shared) | consumers


def make_queue(n: int, seed: int = 0, shared_prefixes: Optional[list[list[int]]] = None) -> list[Req]:
    """The waiting queue; `shared_prefixes` collects each group's document + question."""
    rng = random.Random(seed)
    tok = lambda k: [rng.randrange(100, 50_000) for _ in range(k)]  # noqa: E731
    reqs: list[Req] = []
    group = 0
    while len(reqs) < n:
        if QUEUE[0] == "unrelated" or rng.random() < 0.2:
            reqs.append(make_request(f"u{len(reqs)}", tok(rng.randint(150, 400))))
            continue
        shared = tok(rng.randint(300, 500)) + tok(20)  # document + question
        if shared_prefixes is not None:
            shared_prefixes.append(shared)
        for c in range(4):
            if len(reqs) < n:
                reqs.append(make_request(f"g{group}c{c}", shared + tok(rng.randint(8, 24))))
        group += 1
    return reqs


def publish(h: PassHarness, prefixes: list[list[int]]) -> None:
    """`--queue consumers`: every group's document + question is in the tree, with a state at its end on hybrids,
    published (the pass after the producers' round: every sibling is a Ready consumer)."""
    driver = CacheDriver(h.cache, h.allocator, h.pool)
    for prefix in prefixes:
        driver.insert(prefix)
    h.forward_ct += 1  # the inserting round has ended: its stamps are published


def new_harness(config: str, variant: str, n: int, mamba_slots: int) -> PassHarness:
    """A scheduler over an empty tree for a queue of n requests (`--queue consumers`: room for the published
    prefixes too)."""
    arm, admission = VARIANTS[variant]
    consumers = QUEUE[0] == "consumers"
    return PassHarness(
        CONFIGS[config], arm=arm, admission=admission, token_budget=T, rows=S,
        kv_size=32768 + (160 * n if consumers else 0), max_num_reqs=S + 8,
        mamba_cache_size=mamba_slots + (n // 4 if consumers else 0), max_context_len=2048, slot_wait=SLOT_WAIT[0],
        **(FEATURES if variant != "native" else {}),
    )


def fill(h: PassHarness, n: int) -> list[Req]:
    """The queue of n requests, waiting in `h` (their documents published first under `--queue consumers`)."""
    prefixes: list[list[int]] = []
    queue = make_queue(n, shared_prefixes=prefixes)
    if QUEUE[0] == "consumers":
        publish(h, prefixes)
    h.submit(*queue)
    for req in queue:  # arrived a while ago: a flex gate releases on its deadline
        req.time_stats.wait_queue_entry_time -= 1.0
    return queue


def prepared(config: str, variant: str, n: int) -> PassHarness:
    """A scheduler whose timed pass is its second, with n waiting: the first pass (untimed) admitted and ran its
    round, as on a server pass after pass, and new requests arrived in place of those it admitted. With --in-flight
    that round is launched, not processed."""
    h = new_harness(config, variant, n, S + 16)
    fill(h, n)
    with model_free():
        first = one_pass(h)[0]
    h.sched.chunked_req = None  # a chunk the first pass may leave is dropped (never continued)
    if first is not None and not IN_FLIGHT[0]:
        h.execute(first)
    arrivals = make_queue(n - len(h.waiting), seed=7)  # new documents (not published under --queue consumers)
    for req in arrivals:
        req.rid = f"new-{req.rid}"
    h.submit(*arrivals)
    for req in arrivals:
        req.time_stats.wait_queue_entry_time -= 1.0
    # SGLang's FCFS policy re-touches (LRU) the prefixes of the first 128 waiting requests on one pass in
    # WAITING_PREFIX_REFRESH_INTERVAL (32). Time the common pass unless asked.
    assert hasattr(h.sched.policy, "_waiting_prefix_refresh_calls"), "SGLang's waiting-prefix refresh counter"
    h.sched.policy._waiting_prefix_refresh_calls = 0 if REFRESH[0] else 1
    return h


def one_pass(h: PassHarness) -> Any:
    return run_prefill_pass(
        scheduler_module.Scheduler._get_new_batch_prefill_raw, h.sched, h.cache.rf_sched, None, ScheduleBatch(reqs=[]),
    )


def model_free() -> Any:
    """The pass's model-bound steps, stubbed as in the harness."""
    stack = mock.patch.multiple(ScheduleBatch, prepare_for_extend=lambda batch: None)
    stats = mock.patch.object(scheduler_module.PrefillStats, "from_adder", return_value=None)

    class Both:
        def __enter__(self) -> None:
            stack.__enter__()
            stats.__enter__()

        def __exit__(self, *exc: Any) -> None:
            stats.__exit__(*exc)
            stack.__exit__(*exc)

    return Both()


def timed_pass(h: PassHarness) -> tuple[float, float, int]:
    """(wall s, cpu s, admitted) of one pass; only the pass itself is inside the timed region."""
    with model_free():
        gc.collect()
        gc.disable()
        try:
            w0, c0 = time.perf_counter(), time.process_time()
            batch, _ = one_pass(h)
            w1, c1 = time.perf_counter(), time.process_time()
        finally:
            gc.enable()
    return w1 - w0, c1 - c0, len(batch.reqs) if batch is not None else 0


@dataclass
class Sample:
    wall: float
    cpu: float
    admitted: int
    visits: int


def count_visits(config: str, variant: str, n: int) -> int:
    """Requests the pass examined (init_next_round_input calls), from a separate untimed pass."""
    h = prepared(config, variant, n)
    calls = [0]
    orig = Req.init_next_round_input

    def counting(self: Req, *a: Any, **k: Any) -> Any:
        calls[0] += 1
        return orig(self, *a, **k)

    with mock.patch.object(Req, "init_next_round_input", counting), model_free():
        one_pass(h)
    return calls[0]


def measure(config: str, n: int, repeats: int, warmup: int = 2) -> dict[str, Sample]:
    """All variants, interleaved sample by sample so that load from other processes hits them alike."""
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpus: dict[str, list[float]] = {v: [] for v in VARIANTS}
    admitted: dict[str, int] = {}
    for i in range(warmup + repeats):
        for v in VARIANTS:
            wall, cpu, admitted[v] = timed_pass(prepared(config, v, n))
            if i >= warmup:
                walls[v].append(wall)
                cpus[v].append(cpu)
    return {
        v: Sample(statistics.median(walls[v]), statistics.median(cpus[v]), admitted[v], count_visits(config, v, n))
        for v in VARIANTS
    }


def table(configs: list[str], sizes: list[int], repeats: int) -> None:
    ms = lambda s: f"{s * 1e3:8.3f}"  # noqa: E731
    state = QUEUE[0] + (", after a pass still in flight" if IN_FLIGHT[0] else "")
    print(f"\none prefill pass, {state} queue, S={S} rows, T={T} tokens, "
          f"median of {repeats}: CPU ms (ratio to native) | wall ms | admitted / examined requests")
    print(f"{'config':7} {'N':>5} | {'native':>8} {'rf':>8} {'':7} {'rf+flex':>8} {'':7} | {'native':>8} {'rf':>8}"
          f" {'rf+flex':>8} | {'native':>7} {'rf':>7} {'rf+flex':>7}")
    for config in configs:
        for n in sizes:
            s = measure(config, n, repeats)
            nat = s["native"]
            print(f"{config:7} {n:5d} | {ms(nat.cpu)} {ms(s['rf'].cpu)} ({s['rf'].cpu / nat.cpu:4.2f}x)"
                  f" {ms(s['rf+flex'].cpu)} ({s['rf+flex'].cpu / nat.cpu:4.2f}x) |"
                  f" {ms(nat.wall)} {ms(s['rf'].wall)} {ms(s['rf+flex'].wall)} |"
                  + "".join(f" {x.admitted:>3}/{x.visits:<3}" for x in s.values()), flush=True)


@dataclass
class Drain:
    passes: int
    cpu: float  # s, every pass together
    tokens: int  # prefill tokens computed (extend lengths)


def drained(config: str, variant: str, n: int, prof: Optional[cProfile.Profile] = None) -> Drain:
    """Pass + round until the queue of n requests drains; only the passes are timed (and profiled, with `prof`)."""
    from sglang_radixflow.bench import passes as passes_module

    # the pool holds a round's rows and the states the tree keeps for the next rounds' hits
    h = new_harness(config, variant, n, MAMBA_SLOTS[0])
    fill(h, n)
    spent = [0.0]
    timed_call = passes_module.run_prefill_pass

    def timed(*a: Any, **k: Any) -> Any:
        c0 = time.process_time()
        if prof is not None:
            prof.enable()
        try:
            return timed_call(*a, **k)
        finally:
            if prof is not None:
                prof.disable()
            spent[0] += time.process_time() - c0

    passes = tokens = 0
    gc.collect()
    gc.disable()
    try:
        with mock.patch.object(passes_module, "run_prefill_pass", timed):
            while h.waiting or h.sched.chunked_req is not None:
                assert passes < 4 * n, f"{variant}: queue not drained after {passes} passes"
                admitted = h.run_pass()
                passes += 1
                assert admitted, f"{variant}: a pass admitted nothing with {len(h.waiting)} waiting"
                tokens += sum(int(r.extend_len) for r in admitted)
                h.execute()
    finally:
        gc.enable()
    h.assert_idle_invariants()
    return Drain(passes, spent[0], tokens)


def drain_table(configs: list[str], n: int, repeats: int) -> None:
    print(f"\ndrain: {QUEUE[0]} queue of {n}, S={S} rows, T={T} tokens, synchronous loop; median of {repeats} "
          "(variants alternated): passes | CPU ms of all passes (ratio to native) | CPU us per request | "
          "prefill tokens computed")
    for config in configs:
        runs: dict[str, list[Drain]] = {v: [] for v in VARIANTS}
        for _ in range(repeats):
            for v in VARIANTS:
                runs[v].append(drained(config, v, n))
        base = statistics.median(d.cpu for d in runs["native"])
        for v, ds in runs.items():
            cpu = statistics.median(d.cpu for d in ds)
            print(f"  {config:7} {v:8} | {ds[0].passes:4d} passes | {cpu * 1e3:9.2f} ms ({cpu / base:4.2f}x) | "
                  f"{cpu / n * 1e6:7.1f} us | {ds[0].tokens:8d} tokens", flush=True)


def drain_profile(config: str, n: int) -> None:
    """Where the drain's pass CPU goes: radixflow's own functions (and the builtins they call) vs SGLang's (cProfile
    self time, so the split holds though cProfile inflates both)."""
    print(f"\ndrain profile: {QUEUE[0]} queue of {n}, {config}: self time in radixflow's code / all, ms (cProfile)")
    for v in VARIANTS:
        prof = cProfile.Profile()
        drained(config, v, n, prof)
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        ours = lambda path: "sglang_radixflow" in path  # noqa: E731
        own = 0.0
        for (path, _, _), (_, _, self_time, _, callers) in stats.items():
            if ours(path):
                own += self_time
            elif path == "~":  # a builtin (len, getattr, bytes.startswith, ...): its time goes to whoever called it
                own += sum(by[2] for (caller, _, _), by in callers.items() if ours(caller))
        total = sum(row[2] for row in stats.values())
        print(f"  {v:8} {own * 1e3:8.1f} / {total * 1e3:8.1f}  (SGLang's code {(total - own) * 1e3:8.1f})")


def profile(config: str, n: int, top: int = 30) -> None:
    h = prepared(config, "rf+flex", n)
    prof = cProfile.Profile()
    with model_free():
        prof.runcall(one_pass, h)
    print(f"\ncProfile, rf+flex pass, {config}, N={n}")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--config", nargs="+", choices=sorted(CONFIGS), default=["full", "hybrid"])
    ap.add_argument("--slot-wait", action="store_true", help="RADIXFLOW_PRODUCER_SLOT_WAIT=1 (hybrid no_buffer)")
    ap.add_argument("--in-flight", action="store_true",
                    help="time the pass after an unprocessed one (overlap scheduler: its promises still open)")
    ap.add_argument("--queue", choices=("groups", "unrelated", "consumers"), default="groups",
                    help="groups: candidates sharing documents (default); unrelated: nothing shared; consumers: "
                         "groups whose document + question is already published (the pass after their producers')")
    ap.add_argument("--refresh", action="store_true",
                    help="time SGLang's 1-in-32 pass that re-touches the first 128 waiting prefixes")
    ap.add_argument("--producer-rows", type=int, default=None, metavar="R",
                    help="RADIXFLOW_PRODUCER_ROWS for the radixflow variants (default: the arm's, 2)")
    ap.add_argument("--chunk-last", type=int, choices=(0, 1), default=None,
                    help="RADIXFLOW_CHUNK_LAST for the radixflow variants (default: the arm's, 1)")
    ap.add_argument("--profile", type=int, default=None, metavar="N",
                    help="cProfile the radixflow pass at size N (with --drain: split the drain's CPU, N unused)")
    ap.add_argument("--drain", type=int, default=None, metavar="N",
                    help="time every pass while a queue of N requests drains (rounds run in between)")
    ap.add_argument("--mamba-slots", type=int, default=MAMBA_SLOTS[0],
                    help=f"--drain on the hybrid: mamba pool size (default {MAMBA_SLOTS[0]})")
    args = ap.parse_args(argv)
    SLOT_WAIT[0] = args.slot_wait
    IN_FLIGHT[0] = args.in_flight
    REFRESH[0] = args.refresh
    QUEUE[0] = args.queue
    if args.drain is not None and (args.in_flight or args.refresh):
        ap.error("--drain runs the synchronous loop from a queue of new requests and refreshes as SGLang's policy "
                 "does: it takes neither --in-flight nor --refresh")
    if args.mamba_slots < S + 16:
        ap.error(f"--mamba-slots {args.mamba_slots}: a round's {S} rows need at least {S + 16} slots")
    MAMBA_SLOTS[0] = args.mamba_slots
    FEATURES.update(producer_rows=args.producer_rows,
                    chunk_last=None if args.chunk_last is None else bool(args.chunk_last))
    if args.drain is not None:
        if args.profile is not None:  # --drain N --profile: where the drain's pass CPU goes
            for config in args.config:
                drain_profile(config, args.drain)
            return 0
        drain_table(args.config, args.drain, max(1, args.repeats))
        return 0
    if args.profile is not None:
        for config in args.config:
            profile(config, args.profile)
        return 0
    table(args.config, args.sizes, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
