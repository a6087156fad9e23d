"""`radixflow bench agent`: RR-Evict vs SGLang's lru / tlru on multi-turn agent trajectories, real servers.

For each model and each policy: a fresh server (radixflow backend, `--radix-eviction-policy <policy>`, the same KV
capacity, the same build), a warm-up, the seeded agent workload (bench/agent_workload.py) driven by n_a worker threads
(a closed loop per agent: turn t starts from turn t-1's prompt + output), then stop. Per request: TTFT (streamed, time
to the first chunk), SGLang's cached_tokens, and missed tokens = tokens of the agent's own earlier turns recomputed
instead of reused (prompt_{t-1} + output_{t-1} - 1, minus what was cached, floored at 0; the last generated token never
has KV). Statistics are over return turns (t >= 1): the first turn is cold for every policy.
Requests carry `session_id = s<seed>-agent-<i>`, which RR-Evict uses as the trajectory identity. Several seeded
schedules run back to back on one server (cache flushed in between) and the statistics pool them.
With --workers N each policy also runs on N servers behind SGLang's gateway (bench/fleet.py), each with the one
server's KV pool, serving N times the generated agents and active clients (each worker in the one server's regime);
each turn carries its trajectory as the gateway's routing key.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench.agent_chat import CHAT_SERVER_FLAGS, ChatTurns
from sglang_radixflow.bench.agent_report import HYBRID_CHUNK, write_report
from sglang_radixflow.bench.client import routing_headers, sse_json
from sglang_radixflow.bench.fleet import Fleet, start_all
from sglang_radixflow.bench.gateway import ROUTED_WORKER_HEADER, Gateway
from sglang_radixflow.bench.agent_workload import (
    AgentParams, AgentWorkload, dispatch_times, live_counts, make_agent_workload,
)
from sglang_radixflow.bench.progress import Log, print_progress
from sglang_radixflow.bench.report import read_jsonl, write_jsonl
from sglang_radixflow.bench.server import (
    SGLangServer, check_hybrid_strategy, check_overlap_schedule, live_servers, overlap_flags, overlap_off,
)
from sglang_radixflow.bench.workload_file import read_agent_file, tokenizer_encode
from sglang_radixflow.models import ARCHS, ensure_model, is_hybrid_model

POLICIES: tuple[str, ...] = ("lru", "lfu", "slru", "tlru", "rr")  # every SGLang 0.5.23 recency/frequency policy
DEFAULT_MODELS: tuple[str, ...] = ("nemotron_h", "qwen3")
# T-LRU needs its two knobs (SGLang refuses threshold <= next_prompt_estimate): a turn's new tokens are the estimate,
# and a few turns' worth the threshold.
TLRU_TURNS = 4
# --chunked-prefill-size, the same for every policy (see server_args). Only a hybrid needs the states that chunking
# leaves; on a full-attention model chunks would only add prefill rounds.

APIS = ("generate", "chat")
# Server flags the agent bench sets itself (server_args, the cache, the overlap loop, the server's own address).
OWNED_SERVER_FLAGS: tuple[str, ...] = (
    "--radix-eviction-policy", "--radix-eviction-policy-config", "--max-total-tokens", "--max-running-requests",
    "--chunked-prefill-size", "--max-mamba-cache-size", "--radix-cache-backend", "--disable-overlap-schedule",
    "--enable-cache-report",
    "--model-path", "--host", "--port",
)
DEFAULT_CHUNK = 4096
DEFAULT_SEEDS = 4  # schedules pooled per arm (the CLI's --seeds default too)
WARMUP_PROMPT: tuple[int, ...] = tuple(5 + i for i in range(64))  # shares no token with the workload

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
    seeds: int = DEFAULT_SEEDS
    request_timeout_s: float = 600.0
    server_threads: int = 1  # OMP_NUM_THREADS per server (see bench/runner.py)
    extra_server_args: tuple[str, ...] = ()
    overlap_schedule: str = "auto"  # SGLang's overlap scheduler: auto (off on a CPU: server.overlap_off), on, off
    model_path: Optional[Path] = None  # the user's own model directory (`models` is then its one name)
    workload_file: Optional[Path] = None  # the user's trajectories (bench/workload_file.py) instead of generated ones
    api: str = "generate"  # how turns are sent: /generate with token ids, or the OpenAI chat API (bench/agent_chat.py)
    fleet: Fleet = Fleet()  # several workers behind the gateway; then `reference` also runs one server per policy
    reference: bool = True

    def __post_init__(self) -> None:
        bad = [p for p in self.policies if p not in POLICIES]
        if bad:
            raise ValueError(f"unknown policy(ies) {', '.join(bad)}; allowed: {', '.join(POLICIES)}")
        if not self.policies or not self.models:
            raise ValueError("need at least one policy and one model")
        if self.seeds < 1:
            raise ValueError(f"seeds={self.seeds} must be >= 1")
        if self.api not in APIS:
            raise ValueError(f"--api {self.api!r}; allowed: {', '.join(APIS)}")
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
        if self.fleet.gateway and self.api != "generate":
            raise ValueError(f"--workers with --api {self.api}: runs through a gateway use --api generate")

    def fleets(self) -> list[Fleet]:
        """One server per policy, and/or the gateway runs."""
        if not self.fleet.gateway:
            return [self.fleet]
        return ([Fleet()] if self.reference else []) + [self.fleet]

    @property
    def overlap_off(self) -> bool:
        return overlap_off(self.overlap_schedule)

    def model_dir(self, model: str) -> Path:
        return self.model_path if self.model_path is not None else ensure_model(model, self.models_root)

    def workloads(self, fleet: Fleet = Fleet()) -> list[AgentWorkload]:
        """One per seed: generated agents, or the file's trajectories under each seed's schedule. Behind a gateway
        of N workers, N times the generated agents, active clients and capacity (a file's trajectories as they are)."""
        n = fleet.workers
        base = replace(self.params, agents=self.params.agents * n, active=self.params.active * n,
                       capacity=self.params.capacity * n) if n > 1 and self.workload_file is None else self.params
        params = [replace(base, seed=base.seed + i) for i in range(self.seeds)]
        if self.workload_file is None:
            return [make_agent_workload(p) for p in params]
        encode = tokenizer_encode(self.model_dir(self.models[0]))
        return [read_agent_file(self.workload_file, p, encode) for p in params]


def server_args(policy: str, params: AgentParams, chunk: int = DEFAULT_CHUNK, rr_block: int = 16,
                kv_tokens: Optional[int] = None) -> list[str]:
    """`kv_tokens`: the KV pool (default: the workload's, params.kv_tokens())."""
    # A no_buffer hybrid stores a mamba state only where an extend ends (each chunk of a chunked prefill, and the
    # finish). Whole prompts in one extend would leave the first turn (system + first message, most of a history)
    # as one stateless span: a hybrid path could then only be kept whole or lost whole there. Chunking every
    # policy's prefills alike leaves a state every `chunk` tokens.
    # A turn's extend longer than a chunk leaves a state per chunk, too (long --new-tokens).
    per_turn = -(-(params.new_tokens + params.new_jitter + params.gen_tokens) // chunk)
    states_per_agent = params.turns * per_turn + -(-(params.system_tokens + params.first_tokens) // chunk) + 2
    kv = params.kv_tokens() if kv_tokens is None else kv_tokens
    args = ["--radix-eviction-policy", policy, "--max-total-tokens", str(kv),
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
    """(ttft_s, latency_s, last chunk) of one streamed /generate; through a gateway the last chunk's `worker` is the
    worker it names. The trajectory is the routing key (the gateway's `manual` and sticky sessions read it)."""
    payload = {"input_ids": list(input_ids), "rid": rid, "session_id": session, "stream": True, "routing_key": session,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json", **routing_headers(session)})
    start = time.perf_counter()
    ttft: Optional[float] = None
    last: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        worker = resp.headers.get(ROUTED_WORKER_HEADER)
        for chunk in sse_json(resp):
            if ttft is None:
                ttft = time.perf_counter() - start
            last = chunk
    last["worker"] = worker
    latency = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("the stream carried no chunk")
    return ttft, latency, last


def decoder(model_path: Path) -> Callable[[list[int]], str]:
    """Token ids -> text with the model's tokenizer (the chat API's messages)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


class GenerateTurns:
    """Turns as token ids through /generate (streamed): each prompt = the agent's last prompt + its output + the new
    tokens, so everything before the new tokens but the last output token is reusable."""

    def __init__(self, w: AgentWorkload) -> None:
        self.w = w
        self.history: dict[int, list[int]] = {}  # agent -> prompt + output of its last finished turn
        self.prev_len: dict[int, int] = {}

    def send(self, url: str, a: int, t: int, timeout_s: float) -> dict[str, Any]:
        p, agent = self.w.params, self.w.agents[a]
        prompt = list(agent.first) if t == 0 else self.history[a] + agent.new[t - 1]
        reusable = 0 if t == 0 else max(0, self.prev_len[a] - 1)
        rec: dict[str, Any] = {"prompt_len": len(prompt), "reusable": reusable}
        try:
            ttft, latency, last = stream_generate(url, prompt, p.gen_tokens, f"s{p.seed}-agent-{a}",
                                                  f"s{p.seed}-a{a}-t{t}", timeout_s)
            meta = last.get("meta_info") or {}
            out = [int(x) for x in last.get("output_ids") or []]
            cached = int(meta.get("cached_tokens", 0))
            rec.update(ttft_s=ttft, latency_s=latency, cached_tokens=cached, output_len=len(out),
                       missed_tokens=max(0, reusable - cached) if t > 0 else 0, error=None, worker=last["worker"])
            if len(out) != p.gen_tokens:
                rec["error"] = f"{len(out)} output tokens, expected {p.gen_tokens}"
        except (urllib.error.URLError, OSError, RuntimeError, ValueError) as err:
            out = []
            rec.update(error=f"{type(err).__name__}: {err}"[:300])
        self.history[a] = prompt + out
        self.prev_len[a] = len(prompt) + len(out)
        return rec


def drive(url: str, w: AgentWorkload, timeout_s: float, log: Log, turns: Optional[Any] = None
          ) -> list[dict[str, Any]]:
    """Run the schedule; each (agent, turn) waits for that agent's previous turn. Closed loop (mean_gap_ms = 0): n_a
    workers take the next turn as soon as they are free. Open loop: turn k is sent at its dispatch instant
    (agent_workload.dispatch_times), or when the agent's previous turn finishes if that is later. `turns`: how a
    turn is sent (GenerateTurns by default; agent_chat.ChatTurns: SGLang's OpenAI chat API)."""
    p = w.params
    turns = turns if turns is not None else GenerateTurns(w)
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    done = {(a, t): threading.Event() for a, t in w.schedule}
    live = live_counts(w)
    start = time.perf_counter()

    def run_turn(idx: int, due_s: Optional[float]) -> None:
        a, t = w.schedule[idx]
        if t > 0:
            done[(a, t - 1)].wait()  # an agent's turns run one at a time: its state in `turns` is its own
        sent = time.perf_counter() - start
        rec: dict[str, Any] = {"agent": a, "turn": t, "live": live[idx], "sent_s": sent}
        if due_s is not None:
            rec["late_s"] = max(0.0, sent - due_s)  # waited past its instant for the agent's previous turn
        rec.update(turns.send(url, a, t, timeout_s))
        with lock:
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
    """The server of one arm (not started): radixflow backend, the policy, the arch's chunk and hybrid strategy, and
    the one-server KV pool (opts.params') also behind a gateway."""
    chunk = opts.hybrid_chunk if is_hybrid_model(model_path) else DEFAULT_CHUNK
    kv = opts.params.kv_tokens() if opts.workload_file is None else None
    args = (server_args(policy, params, chunk, opts.rr_block, kv) + list(opts.extra_server_args)
            + overlap_flags(opts.overlap_schedule) + (list(CHAT_SERVER_FLAGS) if opts.api == "chat" else []))
    return SGLangServer(str(model_path), radix_cache="radixflow", env=env, log_path=log_path,
                        mamba_strategy=opts.mamba_strategy, extra_args=args)


def run_arm(model_path: Path, arch: str, policy: str, workloads: Sequence[AgentWorkload], opts: AgentBenchOptions,
            log: Log, fleet: Fleet = Fleet()) -> None:
    """One policy on one server (files server.log, trace.jsonl), or on fleet.workers servers behind the gateway
    (w<i>.server.log, w<i>.trace.jsonl, gateway.log), in OUT/<arch>/<label>/."""
    label = fleet.label(policy)
    arm_dir = opts.out / arch / label
    arm_dir.mkdir(parents=True, exist_ok=True)
    names = [""] if not fleet.gateway else [f"w{i}." for i in range(fleet.workers)]
    servers = []
    for name in names:
        trace = (arm_dir / f"{name}trace.jsonl").resolve()
        trace.unlink(missing_ok=True)
        env = {"RADIXFLOW_TRACE": str(trace)}
        if opts.server_threads > 0:
            env["OMP_NUM_THREADS"] = str(opts.server_threads)
        servers.append(arm_server(model_path, arch, policy, workloads[0].params, opts, env,
                                  arm_dir / f"{name}server.log"))
    log(f"  [{arch}/{label}] starting {len(servers)} server(s)" + (" and the gateway" if fleet.gateway else ""))
    gateway: Optional[Gateway] = None
    try:
        start_all(servers)
        for server in servers:
            stream_generate(server.url, WARMUP_PROMPT, 2, "warmup", "warmup", opts.request_timeout_s)
        if fleet.gateway:
            gateway = Gateway([s.url for s in servers], fleet.router, arm_dir / "gateway.log",
                              fleet.router_args).start()
            # its own first requests are slow (lazy set-up): not in the measured turns
            stream_generate(gateway.url, WARMUP_PROMPT, 2, "warmup", "warmup", opts.request_timeout_s)
        url = gateway.url if gateway is not None else servers[0].url
        views = [{"url": s.url, "log": f"{n}server.log", "trace": f"{n}trace.jsonl",
                  "first_round": _last_round(Path(s.env["RADIXFLOW_TRACE"]))} for n, s in zip(names, servers)]
        t0 = time.perf_counter()
        records: list[dict[str, Any]] = []
        for i, w in enumerate(workloads):
            if i:  # each schedule starts from an empty cache (and RR-Evict from an empty rotation)
                for server in servers:
                    server.get("/flush_cache?timeout=30")
            turns = ChatTurns(w, decoder(model_path)) if opts.api == "chat" else None
            records += [{**r, "seed": w.params.seed} for r in drive(url, w, opts.request_timeout_s, log, turns)]
        wall = time.perf_counter() - t0
        time.sleep(1.0)  # let the idle memory check run once
        leak = any("memory leak detected" in s.log_text() for s in servers)
        command = servers[0].command()
        gateway_command = gateway.launched[1:] if gateway is not None else None
    finally:
        if gateway is not None:
            gateway.stop()
        for server in servers:
            server.stop()
    write_jsonl(arm_dir / "requests.jsonl", records)
    (arm_dir / "meta.json").write_text(json.dumps(
        {"model": str(model_path), "policy": policy, "label": label, "workers": fleet.workers, "router": fleet.router,
         "agents": workloads[0].params.agents, "active": workloads[0].params.active,
         "capacity": workloads[0].params.capacity,
         "gateway_command": gateway_command, "wall_s": wall, "first_round": views[0]["first_round"],
         "worker_runs": views,
         "server_args": command, "idle_leak_reported": leak}, indent=1))
    log(f"  [{arch}/{label}] {len(records)} turns in {wall:.1f}s")


def _last_round(trace: Path) -> int:
    if not trace.is_file():
        return -1
    return max((int(r["round"]) for r in read_jsonl(trace) if r.get("kind") == "round"), default=-1)


def run(opts: AgentBenchOptions, log: Log = print_progress) -> dict[str, Any]:
    opts.out.mkdir(parents=True, exist_ok=True)
    workloads = opts.workloads()  # the one-server workload (workload.json); gateway runs scale it (workloads())
    (opts.out / "workload.json").write_text(json.dumps(
        {"workload": {**workloads[0].describe(), "rr_block": opts.rr_block, "hybrid_chunk": opts.hybrid_chunk,
                      "hybrid_strategy": opts.mamba_strategy,
                      "overlap_schedule": "off" if opts.overlap_off else "on",
                      "seeds": [w.params.seed for w in workloads],
                      "source": str(opts.workload_file) if opts.workload_file is not None else None,
                      "api": opts.api},
         "models": list(opts.models), "policies": list(opts.policies),
         "runs": [f.label(p) for p in opts.policies for f in opts.fleets()],
         "workers": opts.fleet.workers, "router": opts.fleet.router,
         "model_path": str(opts.model_path) if opts.model_path is not None else None}, indent=1))
    for arch in opts.models:
        model_path = opts.model_dir(arch)
        for policy in opts.policies:
            for fleet in opts.fleets():
                run_arm(model_path, arch, policy, opts.workloads(fleet), opts, log, fleet)
                assert not live_servers(), live_servers()
    return write_report(opts.out)
