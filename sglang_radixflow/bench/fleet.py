"""Several servers: one arm of a bench on N workers behind SGLang's gateway (`--workers N --router POLICY`).

Each worker is a server of the arm as one server runs it (its own log and trace); the gateway (bench/gateway.py) sits
in front, the workload goes through the gateway, and every response names the worker that served it. RadixFlow's
gains are per worker: siblings share a producer only on the worker they reach, so the split by worker (requests,
prefill rounds, tokens computed) is what the report adds.
"""
from __future__ import annotations

import os
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench.gateway import Gateway, check_router, smg_version
from sglang_radixflow.bench.progress import Log
from sglang_radixflow.bench.server import SGLangServer

SETTLE_S = 1.0  # SGLang writes a batch's log line after streaming its outputs: let it land before taking offsets


@dataclass(frozen=True)
class Fleet:
    workers: int = 1
    router: str = "none"  # `none`: one server, no gateway
    router_args: tuple[str, ...] = ()  # extra `smg launch` flags

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers {self.workers}: must be >= 1")
        if self.workers > 1:
            check_router(self.router)
        elif self.router != "none" or self.router_args:
            what = f"--router {self.router}" if self.router != "none" else "--router-args"
            raise ValueError(f"{what} with one worker: give --workers N (N >= 2) for a gateway")

    @property
    def gateway(self) -> bool:
        return self.workers > 1

    def label(self, arm: str) -> str:
        """The run's name in files and summaries: the arm itself on one server, `<arm>@<N>x<router>` otherwise."""
        return f"{arm}@{self.workers}x{self.router}" if self.gateway else arm


def arm_of(label: str) -> tuple[str, str]:
    """(arm, fleet suffix) of a run label: `radixflow@2xcache_aware` -> (`radixflow`, `@2xcache_aware`)."""
    arm, at, rest = label.partition("@")
    return arm, at + rest


def run_fleet(fleet: Fleet, label: str, out_dir: Path, run: dict[str, Any],
              make_worker: Callable[[Path, Optional[Path]], SGLangServer], traced: bool,
              warm_up: Callable[[str], None], send: Callable[[str], list[dict[str, Any]]],
              last_round: Callable[[Optional[Path]], int], log: Log) -> list[dict[str, Any]]:
    """Start the workers and the gateway, warm every worker directly (the gateway's first picks must not find one
    cold) and then the gateway, send the workload through the gateway, stop everything (also on error or SIGTERM).
    Fills `run` with the gateway's and each worker's files and log offsets; returns the request records."""
    workers = []
    for i in range(fleet.workers):
        trace = out_dir / f"{label}.w{i}.trace.jsonl" if traced else None
        if trace is not None:
            trace.unlink(missing_ok=True)  # the trace sink appends
        workers.append(make_worker(out_dir / f"{label}.w{i}.server.log", trace))
    gateway: Optional[Gateway] = None
    try:
        t0 = time.perf_counter()
        start_all(workers)
        gateway = Gateway([w.url for w in workers], fleet.router, out_dir / f"{label}.gateway.log",
                          fleet.router_args).start()
        log(f"[{label}] {fleet.workers} workers and the gateway ({fleet.router}) up in {time.perf_counter() - t0:.0f}s "
            f"on {gateway.url}; warming up each worker, then the gateway")
        for w in workers:
            warm_up(w.url)
        # The gateway's first requests are slow (its own lazy set-up): unwarmed, a question's siblings reached the
        # worker more than a 5 ms admission hold apart, and the first one ran alone.
        warm_up(gateway.url)
        time.sleep(SETTLE_S)
        run.update({
            "workers": fleet.workers, "router": fleet.router, "command": workers[0].command(),
            "env": dict(workers[0].env),
            "gateway": {"url": gateway.url, "command": gateway.launched[1:], "smg_version": smg_version()},
            "worker_runs": [worker_view(w, last_round) for w in workers],
            "loadavg_start": os.getloadavg()[0],
        })
        w0 = time.perf_counter()
        records = send(gateway.url)
        run["wall_s"] = time.perf_counter() - w0
        time.sleep(SETTLE_S)
        for view, w in zip(run["worker_runs"], workers):
            view["log_end"] = os.path.getsize(w.log_path)
            view["server_exit"] = w.proc.poll() if w.proc is not None else None
        run["loadavg_end"] = os.getloadavg()[0]
    finally:
        if gateway is not None:
            gateway.stop()
        for w in workers:
            w.stop()
    return records


def start_all(servers: Sequence[SGLangServer]) -> None:
    """Start the servers side by side (most of a start is waiting on its own processes); the first error is raised
    once all have returned, and the caller stops every one of them."""
    errors: list[BaseException] = []

    def start(server: SGLangServer) -> None:
        try:
            server.start()
        except BaseException as err:  # re-raised below, in the caller's thread
            errors.append(err)

    threads = [threading.Thread(target=start, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:  # SIGTERM while waiting: each start still ends (launched or not) before the caller stops them all
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def worker_view(server: SGLangServer, last_round: Callable[[Optional[Path]], int]) -> dict[str, Any]:
    """Where a worker's records are and where the workload's part of its log begins."""
    trace = server.env.get("RADIXFLOW_TRACE")
    return {
        "url": server.url, "log": Path(server.log_path).name, "log_start": os.path.getsize(server.log_path),
        "trace": Path(trace).name if trace else None, "warmup_last_round": last_round(Path(trace) if trace else None),
    }


def worker_split(requests: Sequence[dict[str, Any]], views: Sequence[dict[str, Any]],
                 prefill: Sequence[Sequence[dict[str, int]]]) -> list[dict[str, Any]]:
    """Per worker: the requests the gateway sent it, its prefill rounds and the tokens it computed (its log), and its
    computed reuse (1 - computed / prompt tokens of its requests)."""
    out = []
    for view, lines in zip(views, prefill):
        mine = [r for r in requests if r.get("worker") == view["url"]]
        prompt = sum(int(r["prompt_len"]) for r in mine)
        computed = sum(p["new"] for p in lines)
        out.append({
            "url": view["url"], "requests": len(mine), "errors": sum(bool(r.get("error")) for r in mine),
            "prompt_tokens": prompt, "prefill_rounds": len(lines), "computed_tokens": computed,
            "computed_reuse_ratio": (1.0 - computed / prompt) if prompt else None,
        })
    unrouted = [r for r in requests if r.get("worker") not in {v["url"] for v in views}]
    if unrouted:  # errors the gateway answered itself, or a response without the header
        out.append({"url": None, "requests": len(unrouted), "errors": sum(bool(r.get("error")) for r in unrouted)})
    return out


def split_lines(label: str, split: Sequence[dict[str, Any]]) -> list[str]:
    """report.md rows of one run's per-worker split."""
    rows = []
    for i, w in enumerate(split):
        if w["url"] is None:
            rows.append(f"| {label} | (not routed) | {w['requests']} | {w['errors']} | | | |")
            continue
        reuse = w["computed_reuse_ratio"]
        rows.append(f"| {label} | w{i} {w['url']} | {w['requests']} | {w['errors']} | {w['prefill_rounds']} | "
                    f"{w['computed_tokens']} / {w['prompt_tokens']} | "
                    f"{'—' if reuse is None else f'{100 * reuse:.2f}%'} |")
    return rows


SPLIT_HEAD = ("| run | worker | requests | errors | prefill rounds | computed / prompt tokens | computed reuse |\n"
              "|---|---|---|---|---|---|---|")


def add_fleet_arguments(parser: Any, default_router: str) -> None:
    """--workers, --router, --router-args, --no-reference of the benches. `default_router`: the gateway policy that
    suits the bench's traffic (cache_aware for documents; sticky_round_robin, by trajectory, for agents:
    docs/deployment.md)."""
    from sglang_radixflow.bench.gateway import ROUTERS, TESTED_SMG_VERSION

    parser.add_argument("--workers", type=int, default=1,
                        help="servers per arm (default 1); N >= 2 starts N workers behind SGLang's gateway `smg` "
                             f"(pip install -e \".[scale]\": smg {TESTED_SMG_VERSION}) and reports each worker's share")
    parser.set_defaults(default_router=default_router)
    parser.add_argument("--router", choices=ROUTERS, default=None,
                        help=f"the gateway's routing policy with --workers N (default: {default_router}); "
                             "requests carry their document's (multi-candidate) or trajectory's (agent) "
                             "X-SMG-Routing-Key, which `manual` and `sticky_round_robin` (smg's round_robin with "
                             "--sticky-sessions) route by")
    parser.add_argument("--router-args", default="",
                        help="extra `smg launch` flags, shell-quoted, e.g. \"--cache-threshold 0.5\" (the bench already "
                             "adds --assignment-mode min_group to manual and --sticky-sessions to "
                             "sticky_round_robin)")
    parser.add_argument("--no-reference", action="store_true",
                        help="with --workers N: skip each arm's one-server reference run")


def fleet_from_args(args: Any) -> Fleet:
    """ValueError for --router or --router-args without a gateway (--workers 1)."""
    try:
        extra = tuple(shlex.split(args.router_args))
    except ValueError as err:
        raise ValueError(f"--router-args {args.router_args!r}: {err}") from None
    router = args.router or (args.default_router if args.workers > 1 else "none")
    return Fleet(args.workers, router, extra)
