"""`radixflow bench agent`: RR-Evict vs SGLang's lru / tlru on multi-turn agent trajectories, real servers.

For each model and each policy: a fresh server (radixflow backend, `--radix-eviction-policy <policy>`, the same KV
capacity, the same build), a warm-up, the seeded agent workload (bench/agent_workload.py) driven by n_a worker threads
(a closed loop per agent: turn t starts from turn t-1's prompt + output), then stop. Per request: TTFT (streamed, time
to the first chunk), SGLang's cached_tokens, and missed tokens = tokens of the agent's own earlier turns recomputed
instead of reused (prompt_{t-1} + output_{t-1} - 1, minus what was cached, floored at 0; the last generated token never
has KV). Statistics are over return turns (t >= 1): the first turn is cold for every policy.
Requests carry `session_id = s<seed>-agent-<i>`, which RR-Evict uses as the trajectory identity. Several seeded
schedules run back to back on one server (cache flushed in between) and the statistics pool them.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_radixflow.bench.agent_workload import (
    RETURN_ORDERS, AgentParams, AgentWorkload, dispatch_times, live_counts, make_agent_workload,
)
from sglang_radixflow.bench.progress import Log, print_progress
from sglang_radixflow.bench.report import (
    mean, overlap_note, percentile, read_jsonl, request_records, trace_metrics, write_jsonl,
)
from sglang_radixflow.bench.server import (
    HYBRID_STRATEGY_FLAGS, HYBRID_STRATEGY_HELP, SGLangServer, add_overlap_argument, check_hybrid_strategy,
    check_overlap_schedule, live_servers, overlap_flags, overlap_off, parse_server_args,
)
from sglang_radixflow.bench.model_args import add_model_arguments, models_from_args
from sglang_radixflow.bench.workload_file import read_agent_file, tokenizer_encode
from sglang_radixflow.models import ARCHS, MAX_POSITIONS, ensure_model, is_hybrid_model, read_model_config

POLICIES: tuple[str, ...] = ("lru", "tlru", "rr")
DEFAULT_MODELS: tuple[str, ...] = ("nemotron_h", "qwen3")
# T-LRU needs its two knobs (SGLang refuses threshold <= next_prompt_estimate): a turn's new tokens are the estimate,
# and a few turns' worth the threshold.
TLRU_TURNS = 4
# --chunked-prefill-size, the same for every policy (see server_args). Only a hybrid needs the states that chunking
# leaves; on a full-attention model chunks would only add prefill rounds.

HYBRID_CHUNK = 128
# Server flags the agent bench sets itself (server_args, the cache, the overlap loop, the server's own address).
OWNED_SERVER_FLAGS: tuple[str, ...] = (
    "--radix-eviction-policy", "--radix-eviction-policy-config", "--max-total-tokens", "--max-running-requests",
    "--chunked-prefill-size", "--max-mamba-cache-size", "--radix-cache-backend", "--disable-overlap-schedule",
    "--model-path", "--host", "--port",
)
DEFAULT_CHUNK = 4096
TARGETS = {"missed_p99": 0.35, "ttft_p99": 0.25, "ttft_mean": 1.05}  # rr / lru, at most

@dataclass(frozen=True)
class AgentBenchOptions:
    out: Path
    params: AgentParams
    models: tuple[str, ...] = DEFAULT_MODELS
    policies: tuple[str, ...] = POLICIES
    models_root: Path = Path("runs/models")
    rr_block: int = 16
    hybrid_chunk: int = HYBRID_CHUNK  # --chunked-prefill-size on hybrid models (a state every chunk)
    mamba_strategy: str = "no_buffer"  # hybrids' --mamba-radix-cache-strategy on CPU (see bench/server.py)
    # schedules (params.seed, +1, ...) run back to back on each server, the cache flushed in between: one seeded
    # schedule makes lru's mean a lottery (its misses are few and whole), so statistics pool several
    seeds: int = 1
    request_timeout_s: float = 600.0
    server_threads: int = 1  # OMP_NUM_THREADS per server (see bench/runner.py)
    extra_server_args: tuple[str, ...] = ()
    overlap_schedule: str = "auto"  # SGLang's overlap scheduler: auto (off on a CPU: server.overlap_off), on, off
    model_path: Optional[Path] = None  # the user's own model directory (`models` is then its one name)
    workload_file: Optional[Path] = None  # the user's trajectories (bench/workload_file.py) instead of generated ones

    def __post_init__(self) -> None:
        bad = [p for p in self.policies if p not in POLICIES]
        if bad:
            raise ValueError(f"unknown policy(ies) {', '.join(bad)}; allowed: {', '.join(POLICIES)}")
        if not self.policies or not self.models:
            raise ValueError("need at least one policy and one model")
        if self.seeds < 1:
            raise ValueError(f"seeds={self.seeds} must be >= 1")
        if self.model_path is not None and not self.model_path.is_dir():
            raise ValueError(f"--model-path {self.model_path}: no such directory")
        unknown = [m for m in self.models if m not in ARCHS]
        if unknown and self.model_path is None:
            raise ValueError(f"unknown model(s) {', '.join(unknown)}; allowed: {', '.join(ARCHS)} "
                             "(or --model-path DIR for a model directory of your own)")
        for name in ("rr_block", "hybrid_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        check_hybrid_strategy(self.mamba_strategy)
        check_overlap_schedule(self.overlap_schedule)

    @property
    def overlap_off(self) -> bool:
        return overlap_off(self.overlap_schedule)

    def model_dir(self, model: str) -> Path:
        return self.model_path if self.model_path is not None else ensure_model(model, self.models_root)

    def workloads(self) -> list[AgentWorkload]:
        """One per seed: generated agents, or the file's trajectories under each seed's schedule."""
        params = [replace(self.params, seed=self.params.seed + i) for i in range(self.seeds)]
        if self.workload_file is None:
            return [make_agent_workload(p) for p in params]
        encode = tokenizer_encode(self.model_dir(self.models[0]))
        return [read_agent_file(self.workload_file, p, encode) for p in params]


def server_args(policy: str, params: AgentParams, chunk: int = DEFAULT_CHUNK, rr_block: int = 16) -> list[str]:
    # A no_buffer hybrid stores a mamba state only where an extend ends (each chunk of a chunked prefill, and the
    # finish). Whole prompts in one extend would leave the first turn (system + first message, most of a history)
    # as one stateless span: a hybrid path could then only be kept whole or lost whole there. Chunking every
    # policy's prefills alike leaves a state every `chunk` tokens.
    # A turn's extend longer than a chunk leaves a state per chunk, too (long --new-tokens).
    per_turn = -(-(params.new_tokens + params.new_jitter + params.gen_tokens) // chunk)
    states_per_agent = params.turns * per_turn + -(-(params.system_tokens + params.first_tokens) // chunk) + 2
    args = ["--radix-eviction-policy", policy, "--max-total-tokens", str(params.kv_tokens()),
            "--max-running-requests", str(params.active), "--chunked-prefill-size", str(chunk),
            # states are not what is scarce here: every chunk / turn may keep one (KV capacity m is the constraint)
            "--max-mamba-cache-size", str(params.agents * states_per_agent + 64)]
    if policy == "rr":
        args += ["--radix-eviction-policy-config", json.dumps({"block": rr_block})]
    if policy == "tlru":
        per_turn = params.new_tokens + params.gen_tokens
        args += ["--radix-eviction-policy-config",
                 json.dumps({"threshold": TLRU_TURNS * per_turn, "next_prompt_estimate": per_turn})]
    return args


def stream_generate(url: str, input_ids: Sequence[int], max_new_tokens: int, session: str, rid: str,
                    timeout_s: float) -> tuple[float, float, dict[str, Any]]:
    """(ttft_s, latency_s, last chunk) of one streamed /generate."""
    payload = {"input_ids": list(input_ids), "rid": rid, "session_id": session, "stream": True,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    ttft: Optional[float] = None
    last: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            body = line[len("data:"):].strip()
            if body == "[DONE]":
                break
            chunk = json.loads(body)
            if ttft is None:
                ttft = time.perf_counter() - start
            last = chunk
    latency = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("the stream carried no chunk")
    return ttft, latency, last


def drive(url: str, w: AgentWorkload, timeout_s: float, log: Log) -> list[dict[str, Any]]:
    """Run the schedule; each (agent, turn) waits for that agent's previous turn. Closed loop (mean_gap_ms = 0): n_a
    workers take the next turn as soon as they are free. Open loop: turn k is sent at its dispatch instant
    (agent_workload.dispatch_times), or when the agent's previous turn finishes if that is later."""
    p = w.params
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    done = {(a, t): threading.Event() for a, t in w.schedule}
    history: dict[int, list[int]] = {}  # agent -> prompt + output of its last finished turn
    prev_len: dict[int, int] = {}
    live = live_counts(w)
    start = time.perf_counter()

    def run_turn(idx: int, due_s: Optional[float]) -> None:
        a, t = w.schedule[idx]
        if t > 0:
            done[(a, t - 1)].wait()
        agent = w.agents[a]
        with lock:
            prompt = list(agent.first) if t == 0 else history[a] + agent.new[t - 1]
            reusable = 0 if t == 0 else max(0, prev_len[a] - 1)
        sent = time.perf_counter() - start
        rec: dict[str, Any] = {"agent": a, "turn": t, "prompt_len": len(prompt), "reusable": reusable,
                               "live": live[idx], "sent_s": sent}
        if due_s is not None:
            rec["late_s"] = max(0.0, sent - due_s)  # waited past its instant for the agent's previous turn
        try:
            ttft, latency, last = stream_generate(url, prompt, p.gen_tokens, f"s{p.seed}-agent-{a}",
                                                  f"s{p.seed}-a{a}-t{t}", timeout_s)
            meta = last.get("meta_info") or {}
            out = [int(x) for x in last.get("output_ids") or []]
            cached = int(meta.get("cached_tokens", 0))
            rec.update(ttft_s=ttft, latency_s=latency, cached_tokens=cached, output_len=len(out),
                       missed_tokens=max(0, reusable - cached) if t > 0 else 0, error=None)
            if len(out) != p.gen_tokens:
                rec["error"] = f"{len(out)} output tokens, expected {p.gen_tokens}"
        except (urllib.error.URLError, OSError, RuntimeError, ValueError) as err:
            out = []
            rec.update(error=f"{type(err).__name__}: {err}"[:300])
        with lock:
            history[a] = prompt + out
            prev_len[a] = len(prompt) + len(out)
            records.append(rec)
            n = len(records)
        done[(a, t)].set()
        if n % max(1, len(w.schedule) // 8) == 0 or n == len(w.schedule):
            log(f"    {n}/{len(w.schedule)} turns, {time.perf_counter() - start:.1f}s")

    times = dispatch_times(p, len(w.schedule))
    threads: list[threading.Thread] = []
    if times:  # open loop: one thread per turn, started at its instant
        for idx, due in enumerate(times):
            delay = start + due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            threads.append(threading.Thread(target=run_turn, args=(idx, due), daemon=True))
            threads[-1].start()
    else:
        cursor = [0]

        def worker() -> None:
            while True:
                with lock:
                    if cursor[0] >= len(w.schedule):
                        return
                    idx = cursor[0]
                    cursor[0] += 1
                run_turn(idx, None)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(p.active)]
        for th in threads:
            th.start()
    for th in threads:
        th.join()
    return sorted(records, key=lambda r: r["sent_s"])


def arm_server(model_path: Path, arch: str, policy: str, params: AgentParams, opts: AgentBenchOptions,
               env: dict[str, str], log_path: Path) -> SGLangServer:
    """The server of one arm (not started): radixflow backend, the policy, the arch's chunk and hybrid strategy."""
    chunk = opts.hybrid_chunk if is_hybrid_model(model_path) else DEFAULT_CHUNK
    args = (server_args(policy, params, chunk, opts.rr_block) + list(opts.extra_server_args)
            + overlap_flags(opts.overlap_schedule))
    return SGLangServer(str(model_path), radix_cache="radixflow", env=env, log_path=log_path,
                        mamba_strategy=opts.mamba_strategy, extra_args=args)


def run_arm(model_path: Path, arch: str, policy: str, workloads: Sequence[AgentWorkload], opts: AgentBenchOptions,
            log: Log) -> None:
    arm_dir = opts.out / arch / policy
    arm_dir.mkdir(parents=True, exist_ok=True)
    trace = (arm_dir / "trace.jsonl").resolve()
    trace.unlink(missing_ok=True)
    env = {"RADIXFLOW_TRACE": str(trace)}
    if opts.server_threads > 0:
        env["OMP_NUM_THREADS"] = str(opts.server_threads)
    server = arm_server(model_path, arch, policy, workloads[0].params, opts, env, arm_dir / "server.log")
    log(f"  [{arch}/{policy}] starting server")
    with server:
        warm = [5 + i for i in range(64)]
        stream_generate(server.url, warm, 2, "warmup", "warmup", opts.request_timeout_s)
        first_round = _last_round(trace)
        t0 = time.perf_counter()
        records: list[dict[str, Any]] = []
        for i, w in enumerate(workloads):
            if i:  # each schedule starts from an empty cache (and RR-Evict from an empty rotation)
                server.get("/flush_cache?timeout=30")
            records += [{**r, "seed": w.params.seed} for r in drive(server.url, w, opts.request_timeout_s, log)]
        wall = time.perf_counter() - t0
        time.sleep(1.0)  # let the idle memory check run once
        leak = "memory leak detected" in server.log_text()
    write_jsonl(arm_dir / "requests.jsonl", records)
    (arm_dir / "meta.json").write_text(json.dumps(
        {"model": str(model_path), "policy": policy, "wall_s": wall, "first_round": first_round,
         "server_args": server.command(), "idle_leak_reported": leak}, indent=1))
    log(f"  [{arch}/{policy}] {len(records)} turns in {wall:.1f}s")


def _last_round(trace: Path) -> int:
    if not trace.is_file():
        return -1
    return max((int(r["round"]) for r in read_jsonl(trace) if r.get("kind") == "round"), default=-1)


# ---------------------------------------------------------------- summary / report

def arm_summary(arch: str, policy: str, records: Sequence[dict[str, Any]], rounds: Sequence[dict[str, Any]],
                trace_requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in records if not r.get("error")]
    ret = [r for r in ok if r["turn"] > 0]
    ttft = [r["ttft_s"] for r in ret]
    missed = [float(r["missed_tokens"]) for r in ret]
    lat = [r["latency_s"] for r in ok]
    tm = trace_metrics(rounds, trace_requests) if rounds else {}
    rounds_n = tm.get("rounds")
    return {
        "model": arch, "policy": policy, "requests": len(records), "completed": len(ok),
        "errors": len(records) - len(ok),
        "rounds": rounds_n, "prefill_rounds": tm.get("prefill_rounds"),
        "rows_per_round": None, "tokens_per_round": None,
        "latency_mean_s": mean(lat), "latency_p50_s": percentile(lat, 50), "latency_p95_s": percentile(lat, 95),
        "latency_p99_s": percentile(lat, 99), "first_selection_wait_mean_s": tm.get("first_selection_wait_mean_s"),
        "reuse_ratio": (sum(r["cached_tokens"] for r in ok) / sum(r["prompt_len"] for r in ok)) if ok else None,
        "token_hit_tokens": tm.get("token_hit_tokens"), "state_ready_hit_tokens": tm.get("state_ready_hit_tokens"),
        "blocked_skips": tm.get("blocked_skips"), "avoidable_bubbles": tm.get("avoidable_bubbles"),
        "host_time_s": tm.get("host_time_s"), "host_cost_per_round_s": tm.get("host_cost_per_round_s"),
        "round_lower_bound": None, "first_token_agreement": None,
        "ttft_mean_s": mean(ttft), "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "missed_tokens_mean": mean(missed), "missed_tokens_p50": percentile(missed, 50),
        "missed_tokens_p99": percentile(missed, 99),
        "missed_fraction_mean": mean([r["missed_tokens"] / r["reusable"] for r in ret if r["reusable"]]),
        "return_turns": len(ret),
        **_steady(ret),
        **_alone(ok, ret),
        **_unmissed(ret),
    }


def _alone(ok: Sequence[dict[str, Any]], ret: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """TTFT of the return turns that ran alone: no other turn (of the same schedule) in flight when it was sent, and
    none sent before its first token. Their TTFT is the eviction policy's effect without queueing: on CPU a prefill
    costs in proportion to every token in its round, so concurrent turns add their work to each other's TTFT."""
    by_seed: dict[Any, list[dict[str, Any]]] = {}
    for r in ok:
        by_seed.setdefault(r.get("seed"), []).append(r)

    def overlaps(r: dict[str, Any], o: dict[str, Any]) -> bool:
        return (o["sent_s"] <= r["sent_s"] < o["sent_s"] + o["latency_s"]
                or r["sent_s"] <= o["sent_s"] < r["sent_s"] + r["ttft_s"])

    alone = [r for r in ret if not any(o is not r and overlaps(r, o) for o in by_seed[r.get("seed")])]
    ttft = [r["ttft_s"] for r in alone]
    return {"alone_turns": len(alone), "alone_ttft_mean_s": mean(ttft), "alone_ttft_p99_s": percentile(ttft, 99),
            "alone_missed_p99": percentile([float(r["missed_tokens"]) for r in alone], 99)}


def _unmissed(ret: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """TTFT of the return turns that eviction cost (almost) nothing: they recomputed at most one turn's output of
    their own history (a hybrid path cut back to its last prompt state). What every return would show if the policy's
    misses were free, queueing by other turns included: rr / lru TTFT P99 cannot fall much below this over lru's."""
    kept = [r for r in ret if r["missed_tokens"] <= r["output_len"]]
    return {"unmissed_turns": len(kept), "unmissed_ttft_p99_s": percentile([r["ttft_s"] for r in kept], 99)}


def _steady(ret: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The same statistics over return turns dispatched while more than m agents still had turns left: the regime
    n_a < m < n the analysis assumes. Near the end, finished agents' histories are dead weight that lru evicts first
    for free while rr cuts them and live agents alike; those turns are outside the regime."""
    st = [r for r in ret if r.get("in_regime")]
    ttft = [r["ttft_s"] for r in st]
    missed = [float(r["missed_tokens"]) for r in st]
    return {"steady_turns": len(st), "steady_ttft_mean_s": mean(ttft), "steady_ttft_p99_s": percentile(ttft, 99),
            "steady_missed_mean": mean(missed), "steady_missed_p99": percentile(missed, 99)}


def build_summary(out: Path) -> dict[str, Any]:
    workload = json.loads((out / "workload.json").read_text())
    arms: dict[str, Any] = {}
    for arch in workload["models"]:
        for policy in workload["policies"]:
            d = out / arch / policy
            if not (d / "requests.jsonl").is_file():
                continue
            meta = json.loads((d / "meta.json").read_text())
            trace = read_jsonl(d / "trace.jsonl") if (d / "trace.jsonl").is_file() else []
            first = int(meta.get("first_round", -1))
            rounds = [r for r in trace if r.get("kind") == "round" and int(r["round"]) > first]
            reqs = [r for r in request_records(trace) if not str(r.get("rid", "")).startswith("warmup")]
            cap = float(workload["workload"]["capacity"])
            recs = [{**r, "in_regime": r.get("live", 0) > cap} for r in read_jsonl(d / "requests.jsonl")]
            arm = arm_summary(arch, policy, recs, rounds, reqs)
            arm["wall_s"] = meta.get("wall_s")
            arm["idle_leak_reported"] = meta.get("idle_leak_reported")
            arms[f"{arch}/{policy}"] = arm
    return {"kind": "agent", "workload": workload["workload"],
            "budgets": {"S": workload["workload"]["active"], "T": 4096, "calibrated_on": "fixed"},
            "arms": arms, "cost_identity": {}, "targets": targets(arms)}


def targets(arms: dict[str, Any]) -> dict[str, Any]:
    """rr / lru ratios against the issue's targets, per model."""
    result: dict[str, Any] = {}
    for key, arm in arms.items():
        arch, policy = key.split("/")
        base = arms.get(f"{arch}/lru")
        if policy != "rr" or base is None:
            continue
        rows = {}
        for name, field in (("missed_p99", "missed_tokens_p99"), ("ttft_p99", "ttft_p99_s"), ("ttft_mean", "ttft_mean_s")):
            num, den = arm.get(field), base.get(field)
            ratio = None if num is None or not den else num / den
            rows[name] = {"rr": num, "lru": den, "ratio": ratio, "target": TARGETS[name],
                          "met": ratio is not None and ratio <= TARGETS[name]}
        result[arch] = rows
    return result


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _return_order_text(w: dict[str, Any]) -> str:
    order = w.get("return_order", "random")  # runs before the idle-time order had the random one
    if order == "idle-time":
        return f"return order idle-time (idle time CV {w['idle_cv']:g}: the longest-idle agent is usually next back)"
    return "return order random (memoryless returns)"


def _timing_text(w: dict[str, Any]) -> str:
    gap = float(w.get("mean_gap_ms", 0.0))  # runs before open-loop dispatch were closed loop
    if gap == 0:
        return f"closed loop ({w['active']} clients back to back: returns share prefill rounds)"
    return f"open loop (Poisson dispatch, mean gap {gap:g} ms)"


def format_report(summary: dict[str, Any]) -> str:
    w = summary["workload"]
    lines = [
        "# Agent benchmark: RR-Evict vs lru / tlru", "",
        f"n = {w['agents']} agents, n_a = {w['active']} active, m = {w['capacity']} trajectories of cache "
        f"({w['kv_tokens']} KV tokens), s = {w['idle_fraction_s']:.2f}, {w['turns']} turns per agent, "
        f"system prompt {w['system_tokens']}, first message {w['first_tokens']}, +{w['new_tokens']} tokens/turn, "
        f"{w['gen_tokens']} generated/turn, seeds {w.get('seeds', [w['seed']])} (pooled), "
        f"{_return_order_text(w)}, {_timing_text(w)}. "
        f"Hybrids: `--mamba-radix-cache-strategy {w.get('hybrid_strategy', 'no_buffer')}`, prefills chunked at "
        f"{w.get('hybrid_chunk', HYBRID_CHUNK)} tokens. SGLang's overlap scheduler "
        f"{overlap_note(w.get('overlap_schedule', 'on'))}. "
        f"Ideal RR: every idle trajectory keeps "
        f"h = (m - n_a)/(n s) = {w['ideal_retained_h']:.3f}, so a return recomputes q = {w['ideal_missed_fraction_q']:.3f} "
        f"of its history. Ideal reuse ratio {w['ideal_reuse_ratio']:.3f}.",
        "Statistics over return turns (turn >= 1). Missed tokens: tokens of the agent's own earlier turns recomputed. "
        "In-regime (summary.json steady_*): return turns dispatched while more than m agents still had turns left. "
        "Alone (summary.json alone_*): return turns with no other turn in flight from their send to their first token "
        "(the policy's effect on TTFT without queueing; on CPU concurrent prefills add their work to each other's TTFT).",
        "",
    ]
    models = sorted({a["model"] for a in summary["arms"].values()})
    for arch in models:
        lines += [f"## {arch}", "",
                  "| policy | TTFT mean (s) | TTFT P50 | TTFT P99 | missed mean | missed P50 | missed P99 | "
                  "missed share | reuse ratio | in-regime missed mean / P99 | alone: turns, TTFT P99 | errors | leak |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, a in summary["arms"].items():
            if a["model"] != arch:
                continue
            lines.append(
                f"| {a['policy']} | {_f(a['ttft_mean_s'])} | {_f(a['ttft_p50_s'])} | {_f(a['ttft_p99_s'])} | "
                f"{_f(a['missed_tokens_mean'], '{:.1f}')} | {_f(a['missed_tokens_p50'], '{:.1f}')} | "
                f"{_f(a['missed_tokens_p99'], '{:.1f}')} | {_f(a['missed_fraction_mean'])} | {_f(a['reuse_ratio'])} | "
                f"{_f(a.get('steady_missed_mean'), '{:.1f}')} / {_f(a.get('steady_missed_p99'), '{:.1f}')} | "
                f"{a.get('alone_turns', 'n/a')}, {_f(a.get('alone_ttft_p99_s'))} | {a['errors']} | "
                f"{'yes' if a.get('idle_leak_reported') else 'no'} |")
        t = summary["targets"].get(arch)
        if t:
            lines += ["", "| rr / lru | rr | lru | ratio | target | met |", "|---|---|---|---|---|---|"]
            for name, row in t.items():
                lines.append(f"| {name} | {_f(row['rr'])} | {_f(row['lru'])} | {_f(row['ratio'])} | "
                             f"<= {row['target']} | {'yes' if row['met'] else 'NO'} |")
            rr, lru = (summary["arms"].get(f"{arch}/{pol}", {}).get("alone_ttft_p99_s") for pol in ("rr", "lru"))
            if rr is not None and lru:
                lines += ["", f"Turns that ran alone (not a target): TTFT P99 rr / lru = {rr:.3f} / {lru:.3f} = "
                              f"{rr / lru:.2f}x."]
            floor = summary["arms"].get(f"{arch}/rr", {}).get("unmissed_ttft_p99_s")
            lru_p99 = summary["arms"].get(f"{arch}/lru", {}).get("ttft_p99_s")
            if floor is not None and lru_p99:
                turns = summary["arms"][f"{arch}/rr"]["unmissed_turns"]
                lines += ["", f"rr's returns that recomputed at most one turn's output ({turns}): TTFT P99 {floor:.3f}, "
                              f"{floor / lru_p99:.2f}x of lru's TTFT P99 (what the ratio would read if rr's misses "
                              "cost nothing)."]
        lines.append("")
    lines += ["![TTFT and missed tokens](agent_distributions.png)", ""]
    return "\n".join(lines)


def write_figure(out: Path, summary: dict[str, Any]) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = sorted({a["model"] for a in summary["arms"].values()})
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models)), squeeze=False)
    for i, arch in enumerate(models):
        for key, a in summary["arms"].items():
            if a["model"] != arch:
                continue
            recs = [r for r in read_jsonl(out / arch / a["policy"] / "requests.jsonl") if not r.get("error") and r["turn"] > 0]
            for j, field in enumerate(("ttft_s", "missed_tokens")):
                xs = sorted(float(r[field]) for r in recs)
                if xs:
                    axes[i][j].plot(xs, [(k + 1) / len(xs) for k in range(len(xs))], label=a["policy"])
        axes[i][0].set_title(f"{arch}: TTFT (return turns)")
        axes[i][0].set_xlabel("seconds")
        axes[i][1].set_title(f"{arch}: missed tokens (own history recomputed)")
        axes[i][1].set_xlabel("tokens")
        for ax in axes[i]:
            ax.set_ylabel("CDF")
            ax.axhline(0.99, color="grey", lw=0.5, ls=":")
            ax.legend()
    fig.tight_layout()
    path = out / "agent_distributions.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path) -> dict[str, Any]:
    summary = build_summary(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_figure(out, summary)
    (out / "report.md").write_text(format_report(summary))
    return summary


# ---------------------------------------------------------------- CLI

def run(opts: AgentBenchOptions, log: Log = print_progress) -> dict[str, Any]:
    opts.out.mkdir(parents=True, exist_ok=True)
    workloads = opts.workloads()
    (opts.out / "workload.json").write_text(json.dumps(
        {"workload": {**workloads[0].describe(), "rr_block": opts.rr_block, "hybrid_chunk": opts.hybrid_chunk,
                      "hybrid_strategy": opts.mamba_strategy,
                      "overlap_schedule": "off" if opts.overlap_off else "on",
                      "seeds": [w.params.seed for w in workloads],
                      "source": str(opts.workload_file) if opts.workload_file is not None else None},
         "models": list(opts.models), "policies": list(opts.policies),
         "model_path": str(opts.model_path) if opts.model_path is not None else None}, indent=1))
    for arch in opts.models:
        model_path = opts.model_dir(arch)
        for policy in opts.policies:
            run_arm(model_path, arch, policy, workloads, opts, log)
            assert not live_servers(), live_servers()
    return write_report(opts.out)


QUICK = dict(agents=12, active=3, capacity=10.0, turns=5, system_tokens=128, first_tokens=256, new_tokens=24,
             gen_tokens=4)


def _positive_int(text: str) -> int:
    """argparse type for token counts (argparse names the flag: `argument --first-tokens: needs ...`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"needs an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs an integer >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"needs a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"needs a number >= 0, got {value}")
    return value


def prompt_too_long(params: AgentParams, max_positions: int = MAX_POSITIONS, whose: str = "the tiny models'"
                    ) -> Optional[str]:
    """Why the longest prompt (+ its output) overflows the model's positions, or None if it fits. SGLang would only
    reject such a request mid-run, after servers have started."""
    longest = params.max_prompt_tokens() + params.gen_tokens
    if longest <= max_positions:
        return None
    return (f"the longest prompt + output is {longest} tokens, over {whose} {max_positions} positions: "
            f"lower --first-tokens / --new-tokens / --turns")


def positions_of(model_path: Path) -> int:
    """The context length of a model directory (its config's max_position_embeddings, or its text model's)."""
    config = read_model_config(model_path)
    n = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return int(n) if n else MAX_POSITIONS


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = AgentParams()
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quick", action="store_true", help="a smaller workload (a few minutes on 2 CPU cores)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma list of {', '.join(POLICIES)} (default: %(default)s)")
    add_model_arguments(p, DEFAULT_MODELS)
    p.add_argument("--workload", default=None,
                   help='your own trajectories instead of generated agents: a JSONL file, one {"turns": [...]} per '
                        "line, text or token ids (examples/agent_workload.jsonl); --active / --capacity / "
                        "--return-order / --seeds still set the schedule")
    p.add_argument("--server-args", default="",
                   help="extra SGLang server flags for every policy's server, shell-quoted (not the flags the bench "
                        "sets: " + ", ".join(OWNED_SERVER_FLAGS) + ")")
    p.add_argument("--agents", type=int, default=None, help=f"n (default {d.agents})")
    p.add_argument("--active", type=int, default=None, help=f"n_a (default {d.active})")
    p.add_argument("--capacity", type=float, default=None, help=f"m, in trajectories (default {d.capacity})")
    p.add_argument("--turns", type=int, default=None, help=f"turns per agent (default {d.turns})")
    p.add_argument("--first-tokens", type=_positive_int, default=None,
                   help=f"private first message per agent, tokens (default {d.first_tokens})")
    p.add_argument("--new-tokens", type=_positive_int, default=None,
                   help=f"user/tool tokens appended per turn, mean (default {d.new_tokens})")
    p.add_argument("--return-order", choices=RETURN_ORDERS, default=None,
                   help=f"who comes back next (default {d.return_order}; see bench/agent_workload.py)")
    p.add_argument("--idle-cv", type=_non_negative_float, default=None,
                   help=f"coefficient of variation of the idle time, idle-time order (default {d.idle_cv})")
    p.add_argument("--mean-gap-ms", type=_non_negative_float, default=None,
                   help="0: closed loop (n_a clients back to back, the default); > 0: open loop, turns sent at Poisson "
                        "instants with this mean gap (real tool / think time; see bench/agent_workload.py)")
    p.add_argument("--seed", type=int, default=0, help="first schedule seed")
    p.add_argument("--seeds", type=int, default=4, help="schedules per arm (seed, seed+1, ...), pooled")
    p.add_argument("--rr-block", type=int, default=16,
                   help="RR-Evict tail block on full-attention paths, passed as --radix-eviction-policy-config "
                        "'{\"block\": N}' (default: %(default)s)")
    p.add_argument("--hybrid-chunk", type=int, default=HYBRID_CHUNK,
                   help="--chunked-prefill-size on hybrid models, for every policy "
                        "(a no_buffer hybrid keeps a state per chunk)")
    p.add_argument("--hybrid-strategy", choices=tuple(HYBRID_STRATEGY_FLAGS), default="no_buffer",
                   help=HYBRID_STRATEGY_HELP)
    add_overlap_argument(p)


def params_from_args(args: argparse.Namespace) -> AgentParams:
    """The default (or --quick) workload with the flags given on top."""
    base = AgentParams(**QUICK) if args.quick else AgentParams()
    overrides = {k: getattr(args, k) for k in ("agents", "active", "capacity", "turns", "first_tokens", "new_tokens",
                                                "return_order", "idle_cv", "mean_gap_ms")
                 if getattr(args, k) is not None}
    return replace(base, seed=args.seed, **overrides)


def options_from_args(args: argparse.Namespace) -> AgentBenchOptions:
    """The bench's options; ValueError naming the bad flag."""
    params = params_from_args(args)
    models, model_path = models_from_args(args, DEFAULT_MODELS)
    if model_path is not None and not model_path.is_dir():
        raise ValueError(f"--model-path {model_path}: no such directory")
    too_long = (prompt_too_long(params) if model_path is None
                else prompt_too_long(params, positions_of(model_path), f"{model_path.name}'s"))
    if too_long:
        raise ValueError(too_long)
    return AgentBenchOptions(
        out=Path(args.out), params=params, models=models, model_path=model_path,
        workload_file=Path(args.workload) if args.workload else None,
        policies=tuple(p for p in args.policies.split(",") if p), models_root=Path(args.models_root),
        rr_block=args.rr_block, hybrid_chunk=args.hybrid_chunk, mamba_strategy=args.hybrid_strategy, seeds=args.seeds,
        overlap_schedule=args.overlap_schedule,
        extra_server_args=parse_server_args(args.server_args, OWNED_SERVER_FLAGS))


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:  # bad options end here, before any directory is written or server started
        opts = options_from_args(args)
    except ValueError as err:
        raise SystemExit(f"radixflow bench agent: {err}") from None
    try:
        summary = run(opts)
    except ValueError as err:  # a bad --workload file: its line and field
        raise SystemExit(f"radixflow bench agent: {err}") from None
    print((out / "report.md").read_text())
    return 1 if any(a["errors"] for a in summary["arms"].values()) else 0


__all__ = ["AgentBenchOptions", "add_arguments", "main", "options_from_args", "run", "write_report", "asdict"]
