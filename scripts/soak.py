"""Randomised soak of a radixflow server against native SGLang: every request completes, greedy outputs equal, nothing
leaks.

Each wave sends, concurrently and with small random delays, a seeded mix of what the scheduler's rarer paths see:
groups of siblings on a shared document (some documents repeat across waves, some exceed the token budget so
chunk-last and chunked producers run), `sgl.select`-shaped groups (a cache-only warm-up, then choices scored from
prompt length - 2), unrelated prompts, cache salts, 0 to --max-new output tokens; a fraction of the requests is
aborted at a random instant. The same prompts go to a native SGLang server with the same flags (the reference), in
the same waves. Checks, per wave and at the end:
- every request not aborted finishes, within the timeout (no stuck request), and is not reported as aborted;
- its greedy output tokens equal the reference's, and its prompt logprobs when asked for (within LOGPROB_TOL; float32
  model and conv state, as the serving tests);
- after the last wave, idle: the server is alive and serves, its log holds no "memory leak detected" (SGLang's idle
  check of KV and mamba slots) and no Python traceback, and no promise is left open;
- with --tp > 1: every rank's round records hold the same decisions.
The summary also counts the scheduler paths the waves went through (producers, Blocked skips, holds, ...).

    python scripts/soak.py --config hybrid --waves 20 [--arm radixflow|prefix-stop|radixflow+frag|timer5]
    python scripts/soak.py --config hybrid-extra-buffer|control|gdn ...
    python scripts/soak.py --config hybrid --max-new 40 --test-retract      # SGLang retracts decodes every 3 passes
    python scripts/soak.py --config hybrid --max-new 300 --max-total-tokens 4096 --stop-at-eos \
        --server-args '--schedule-conservativeness 0.02'                     # real pool-full retraction
Exit status 0 when every check held; the summary (JSON) names each failure.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from sglang_radixflow.bench.server import SGLangServer, ServerError, attach_option_values
from sglang_radixflow.models import ensure_model

LEAK = "memory leak detected"
RETRACTED = re.compile(r"#retracted_reqs: (\d+)")  # SGLang's log line when decode retracts (scheduler.py)
# per-round trace fields summed into the summary: which of the scheduler's paths the soak went through
PATH_COUNTERS = ("producers", "prefix_requests", "adopted_producers", "blocked_skips", "cut_holds",
                 "producer_holds", "admission_holds", "fragment_skips", "chunk_room_cuts", "deferred",
                 "promises_registered_delta",
                 "promises_published_delta", "promises_cancelled_delta")
FLOAT32 = ("--dtype", "float32")
FLOAT32_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# config -> (model, mamba strategy, extra server flags)
CONFIGS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "hybrid": ("nemotron_h", "no_buffer", ()),
    "hybrid-extra-buffer": ("nemotron_h", "extra_buffer", ()),
    "gdn": ("qwen3_next", "no_buffer", ()),
    "qwen3_5": ("qwen3_5", "no_buffer", ()),
    "qwen3_5-extra-buffer": ("qwen3_5", "extra_buffer", ()),
    "control": ("qwen3", "no_buffer", ("--disable-overlap-schedule",)),
    "control-overlap": ("qwen3", "no_buffer", ()),
}
ARMS = ("radixflow", "prefix-stop", "radixflow+frag", "timer5", "prefix-stop+flex")
VOCAB = (3, 2000)
LOGPROB_TOL = 2e-4  # as the serving tests: float32, a consumer resumed from a state vs native's whole prompt


@dataclass
class Send:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    delay_s: float
    abort_after_s: Optional[float] = None  # None: never aborted
    cache_salt: Optional[str] = None
    logprob_start: Optional[int] = None  # return_logprob with this logprob_start_len (select's choices)
    ignore_eos: bool = True  # False (--stop-at-eos): SGLang reserves decode room at its new-token ratio only

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input_ids": self.input_ids, "rid": self.rid,
            "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0.0,
                                "ignore_eos": self.ignore_eos},
        }
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        if self.logprob_start is not None:
            body["return_logprob"] = True
            body["logprob_start_len"] = self.logprob_start
        return body


@dataclass
class Outcome:
    output_ids: Optional[list[int]] = None
    finish: Optional[str] = None
    error: Optional[str] = None
    seconds: float = 0.0
    prompt_logprobs: Optional[list[float]] = None  # from logprob_start_len on, when asked for


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


def make_wave(rng: random.Random, wave: int, docs: list[list[int]], abort_fraction: float,
              long_doc: int, max_new: int, ignore_eos: bool = True) -> list[Send]:
    sends: list[Send] = []

    def rid(kind: str) -> str:
        # SGLang aborts every request whose rid STARTS with the rid given: no rid may be a prefix of another
        return f"soak-w{wave:03d}-{len(sends):03d}-{kind}"

    for _ in range(rng.randint(2, 5)):  # sibling groups
        if docs and rng.random() < 0.4:
            doc = rng.choice(docs)  # a document seen before (the tree may hold its KV without a state at its end)
        else:
            doc = tokens(rng, rng.choice([rng.randint(40, 400), rng.randint(400, 1200), long_doc]))
            docs.append(doc)
        salt = rng.choice([None, None, None, "tenant-a", "tenant-b"])
        question = tokens(rng, rng.randint(0, 30))
        start = rng.uniform(0.0, 0.05)
        for _ in range(rng.randint(2, 6)):
            sends.append(Send(rid("sib"), doc + question + tokens(rng, rng.randint(1, 24)), rng.randint(0, max_new),
                              start + rng.uniform(0.0, 0.02), cache_salt=salt))
    if rng.random() < 0.6:  # sgl.select's shape: a cache-only warm-up, then the choices scored from prompt_len - 2
        prefix = (rng.choice(docs) if docs and rng.random() < 0.3 else tokens(rng, rng.randint(200, 900)))
        prefix = prefix + tokens(rng, rng.randint(5, 20))
        start = rng.uniform(0.0, 0.05)
        sends.append(Send(rid("warm"), prefix, 0, start))
        for _ in range(rng.randint(2, 4)):
            choice = prefix + tokens(rng, rng.randint(1, 6))
            sends.append(Send(rid("choice"), choice, 0, start + rng.uniform(0.01, 0.1),
                              logprob_start=len(prefix) - 2))
    for _ in range(rng.randint(1, 6)):  # unrelated prompts
        sends.append(Send(rid("one"), tokens(rng, rng.randint(20, 1500)), rng.randint(1, max(1, max_new)),
                          rng.uniform(0.0, 0.08)))
    for s in sends:
        s.ignore_eos = ignore_eos
        if rng.random() < abort_fraction:
            s.abort_after_s = s.delay_s + rng.uniform(0.0, 0.3)
    return sends


def run_wave(server: SGLangServer, sends: list[Send], timeout_s: float, aborts: bool) -> dict[str, Outcome]:
    outcomes = {s.rid: Outcome() for s in sends}
    t0 = time.monotonic()

    def one(s: Send) -> None:
        time.sleep(max(0.0, t0 + s.delay_s - time.monotonic()))
        began = time.monotonic()
        out = outcomes[s.rid]
        try:
            res = server.post("/generate", s.payload(), timeout=timeout_s)
            out.output_ids = list(res.get("output_ids") or [])
            out.finish = (res["meta_info"].get("finish_reason") or {}).get("type")
            if s.logprob_start is not None:
                out.prompt_logprobs = [x[0] for x in res["meta_info"]["input_token_logprobs"] if x[0] is not None]
        except ServerError as err:
            out.error = str(err)[:300]
        except OSError as err:  # a timeout: the request is stuck
            out.error = f"{type(err).__name__}: {err}"
        out.seconds = time.monotonic() - began

    def abort(s: Send) -> None:
        time.sleep(max(0.0, t0 + (s.abort_after_s or 0.0) - time.monotonic()))
        try:
            server.post("/abort_request", {"rid": s.rid}, timeout=30)
        except (ServerError, OSError):
            pass

    threads = [threading.Thread(target=one, args=(s,)) for s in sends]
    if aborts:
        threads += [threading.Thread(target=abort, args=(s,)) for s in sends if s.abort_after_s is not None]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    return outcomes


def close(a: Optional[list[float]], b: Optional[list[float]]) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(abs(x - y) <= LOGPROB_TOL for x, y in zip(a, b))


def check_wave(sends: list[Send], got: dict[str, Outcome], ref: dict[str, Outcome]) -> list[str]:
    failures = []
    for s in sends:
        out, want = got[s.rid], ref[s.rid]
        if s.abort_after_s is not None:
            if out.error and "abort" not in out.error.lower() and "HTTP" not in out.error:
                failures.append(f"{s.rid}: aborted request ended with {out.error}")
            continue
        if out.error is not None:
            failures.append(f"{s.rid}: {out.error}")
        elif out.finish == "abort":
            failures.append(f"{s.rid}: reported aborted but nobody aborted it")
        elif want.error is None and want.output_ids != out.output_ids:
            failures.append(f"{s.rid}: output {out.output_ids} != native {want.output_ids}")
        elif want.error is None and not close(out.prompt_logprobs, want.prompt_logprobs):
            failures.append(f"{s.rid}: prompt logprobs {out.prompt_logprobs} != native {want.prompt_logprobs}")
    return failures


# What a round record says the scheduler decided (host times and waits are each rank's own clock).
DECISION_KEYS = ("round", "kind_of_round", "rows", "tokens", "admitted", "admission_holds", "blocked_skips", "deferred",
                 "producers", "prefix_requests", "cut_holds", "producer_holds", "token_hit_sum", "state_hit_sum",
                 "promises_open", "promises_registered_delta", "promises_published_delta", "promises_cancelled_delta")


def rank_divergence(traces: list[Path]) -> Optional[str]:
    """The first round whose decisions differ between tensor-parallel ranks; None when every rank decided alike."""
    decided = [[{k: r.get(k) for k in DECISION_KEYS} for r in map(json.loads, t.read_text().splitlines())
                if r.get("kind") == "round"] for t in traces]
    for i, rounds in enumerate(decided[1:], start=1):
        if len(rounds) != len(decided[0]):
            return f"rank {i} has {len(rounds)} rounds, rank 0 {len(decided[0])}"
        for a, b in zip(decided[0], rounds):
            if a != b:
                return f"round {a.get('round')}: rank 0 {a} != rank {i} {b}"
    return None


def trace_counters(trace: Path) -> tuple[dict[str, int], int]:
    """Sums of PATH_COUNTERS over the trace's round records (plus `rr_units`: RR-Evict's tail units cut, a running
    total in each record), and the promises still open after the last round."""
    sums = dict.fromkeys(PATH_COUNTERS, 0)
    sums["rr_units"] = 0
    still_open = 0
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") != "round":
            continue
        for key in PATH_COUNTERS:
            sums[key] += int(rec.get(key, 0))
        sums["rr_units"] = max(sums["rr_units"], int(rec.get("rr_units_total", 0)))
        still_open = int(rec.get("promises_open", 0))
    return sums, still_open


def trace_verdict(trace: Path) -> tuple[dict[str, int], list[str]]:
    """The paths the run took (trace_counters) and the trace's failures: none written (its checks would pass
    unseen), or promises still open when idle."""
    if not trace.is_file():
        return {}, [f"the radixflow server wrote no trace at {trace}"]
    paths, still_open = trace_counters(trace)
    return paths, [f"{still_open} promises still open when idle"] if still_open else []


def count_retracted(log: str, tp: int) -> int:
    """Requests SGLang's decode retracted, from its log (at TP > 1 every rank logs the same retraction: rank 0's)."""
    lines = log.splitlines() if tp == 1 else [line for line in log.splitlines() if " TP0] " in line]
    return sum(int(n) for line in lines for n in RETRACTED.findall(line))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="hybrid")
    ap.add_argument("--arm", choices=ARMS, default="radixflow")
    ap.add_argument("--waves", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tp", type=int, default=1,
                    help="--tp-size of both servers (gloo on CPU): the ranks must decide alike")
    ap.add_argument("--max-new", type=int, default=4, help="most output tokens a request asks for (more: decode "
                    "pressure, retraction)")
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="requests may stop at EOS (no ignore_eos): SGLang then reserves decode room for them at its "
                         "new-token ratio only, so a low --schedule-conservativeness over-admits and decode retracts")
    ap.add_argument("--test-retract", action="store_true",
                    help="SGLang's retraction test mode on both servers (SGLANG_TEST_RETRACT=1): decode retracts "
                         "requests every SGLANG_TEST_RETRACT_INTERVAL (3) forward passes, and they prefill again")
    ap.add_argument("--abort-fraction", type=float, default=0.1)
    ap.add_argument("--budgets", default="8,1024", help="S,T: --prefill-max-requests, chunked/max prefill tokens")
    ap.add_argument("--max-total-tokens", type=int, default=None,
                    help="KV pool size of both servers (default: the CPU flags' 8192); smaller: eviction, retraction")
    ap.add_argument("--server-args", default="",
                    help="more SGLang flags for both servers, e.g. '--page-size 16' or '--schedule-policy lpm'")
    ap.add_argument("--eviction", default=None, choices=("lru", "lfu", "slru", "tlru", "rr"),
                    help="--radix-eviction-policy of the radixflow server only (rr needs the radixflow backend; "
                         "the native reference keeps SGLang's lru: eviction changes no output)")
    ap.add_argument("--long-doc", type=int, default=2600, help="a document longer than T (chunked producers)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds a request may take before it is stuck")
    ap.add_argument("--models-root", default=str(Path.home() / ".cache" / "sglang-radixflow" / "models"))
    ap.add_argument("--out", default=None, help="folder for summary.json, the server logs and the trace (default: a "
                    "new temporary folder)")
    args = ap.parse_args(attach_option_values(sys.argv[1:] if argv is None else argv))

    model_name, strategy, flags = CONFIGS[args.config]
    model = str(ensure_model(model_name, args.models_root))
    rows, toks = (int(x) for x in args.budgets.split(","))
    budget_flags = ("--prefill-max-requests", str(rows), "--max-running-requests", str(2 * rows),
                    "--chunked-prefill-size", str(toks), "--max-prefill-tokens", str(toks))
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="radixflow-soak-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_pattern = out_dir / f"{args.arm}.rank{{tp_rank}}.trace.jsonl"
    traces = [Path(str(trace_pattern).format(tp_rank=r)) for r in range(args.tp)]
    tp_flags: tuple[str, ...] = ()
    tp_env: dict[str, str] = {}
    if args.tp > 1:
        cores = sorted(os.sched_getaffinity(0))  # SGLang refuses more ranks than NUMA nodes unless each has cores
        tp_flags = ("--tp-size", str(args.tp))
        tp_env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(cores[r % len(cores)]) for r in range(args.tp))}
    pool_flags = ("--max-total-tokens", str(args.max_total_tokens)) if args.max_total_tokens else ()
    more = tuple(shlex.split(args.server_args))
    server_env = {**FLOAT32_ENV, **tp_env, **({"SGLANG_TEST_RETRACT": "1"} if args.test_retract else {})}
    common = dict(extra_args=(*FLOAT32, *flags, *budget_flags, *tp_flags, *pool_flags, *more), mamba_strategy=strategy)
    ref = SGLangServer(model, radix_cache=None, env=server_env, **common,
                       log_path=out_dir / "native.log")
    rf_common = dict(common)
    if args.eviction:
        rf_common["extra_args"] = (*common["extra_args"], "--radix-eviction-policy", args.eviction)
    rf = SGLangServer(model, env={**server_env, "RADIXFLOW_ARM": args.arm,
                                  "RADIXFLOW_TRACE": str(trace_pattern)}, **rf_common,
                      log_path=out_dir / f"{args.arm}.log")
    rng = random.Random(args.seed)
    docs: list[list[int]] = []
    failures: list[str] = []
    sent = aborted = retracted = 0
    started = time.monotonic()
    try:
        ref.start()
        rf.start()
        for wave in range(args.waves):
            sends = make_wave(rng, wave, docs, args.abort_fraction, args.long_doc, args.max_new,
                              ignore_eos=not args.stop_at_eos)
            sent += len(sends)
            aborted += sum(s.abort_after_s is not None for s in sends)
            want = run_wave(ref, sends, args.timeout, aborts=False)
            got = run_wave(rf, sends, args.timeout, aborts=True)
            wave_failures = check_wave(sends, got, want)
            failures += [f"wave {wave}: {f}" for f in wave_failures]
            print(f"wave {wave}: {len(sends)} requests, {len(wave_failures)} failures, "
                  f"slowest {max(o.seconds for o in got.values()):.2f} s", flush=True)
        time.sleep(3.0)  # idle: SGLang's idle check runs
        try:
            rf.generate([5, 6, 7], 2)
        except (ServerError, OSError) as err:
            failures.append(f"after the waves the server does not serve: {err}")
        log = rf.log_text()
        retracted = count_retracted(log, args.tp)
        if LEAK in log:
            failures.append("SGLang's idle check reported a memory leak")
        if "Traceback" in log:
            failures.append("the server log holds a traceback: " + log[log.index("Traceback"):][:1500])
    finally:
        rf.stop()
        ref.stop()
    paths, trace_failures = trace_verdict(traces[0])
    failures += trace_failures
    if args.tp > 1:
        diverged = rank_divergence(traces) if all(t.is_file() for t in traces) else "a rank wrote no trace"
        if diverged:
            failures.append(f"tensor-parallel ranks decided differently: {diverged}")
    summary = {"config": args.config, "arm": args.arm, "eviction": args.eviction or "lru", "seed": args.seed,
               "waves": args.waves, "test_retract": args.test_retract, "stop_at_eos": args.stop_at_eos,
               "requests": sent, "aborted": aborted, "retracted": retracted,
               "seconds": round(time.monotonic() - started, 1), "paths": paths, "out": str(out_dir),
               "failures": failures}
    text = json.dumps(summary, indent=2)
    print(text)
    (out_dir / "summary.json").write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
