"""`radixflow bench multi-candidate`: the paper's multi-candidate scoring measurement on real SGLang servers.

For each model and each arm: a fresh server (radixflow backend with RADIXFLOW_ARM=<arm> and a trace, or SGLang's
default cache for `sglang`), a warm-up that shares no prefix with the workload, the open-loop workload, then stop.
The budgets S (rows per prefill round) and T (tokens per prefill round) are the same server flags for every arm:
calibrated once on the `sglang` arm on a held-out slice (or fixed, e.g. in --quick), then frozen.
Everything is saved per arm; summary.json and report.md are rebuilt from those files (bench/report.py). What a run
is asked for: bench/options.py.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench import remote, report
from sglang_radixflow.bench.fleet import SETTLE_S, run_fleet
from sglang_radixflow.bench.client import OpenLoopClient, RequestRecord, post_generate
from sglang_radixflow.bench.frontend import (
    FRONTEND_PATHS, FrontendClient, TextQuestion, frontend_ideal_reuse, text_questions, word_lexicon,
)
from sglang_radixflow.bench.options import BenchOptions, model_dir
from sglang_radixflow.bench.score import ScoreClient
from sglang_radixflow.bench.progress import Log, print_progress
from sglang_radixflow.bench.server import SGLangServer, live_servers, overlap_flags
from sglang_radixflow.bench.workload_file import Encode, read_workload_file, tokenizer_encode
from sglang_radixflow.bench.workloads import Question, Request, Workload, held_out, make_workload, warmup_prompts
from sglang_radixflow.models import ARCHS

# Server flags the bench sets itself (budget_args, the arm's cache, --hybrid-strategy, --overlap-schedule, the
# server's own address and model): --server-args may not repeat them.
OWNED_SERVER_FLAGS: tuple[str, ...] = (
    "--prefill-max-requests", "--max-running-requests", "--chunked-prefill-size", "--max-prefill-tokens",
    "--max-total-tokens", "--radix-cache-backend", "--mamba-radix-cache-strategy", "--disable-overlap-schedule",
    "--model-path", "--host", "--port",
)
RUNNING_PER_ROW_BUDGET = 2  # the round being planned and the one still in flight under the overlap scheduler


def budget_args(S: int, T: int, kv_tokens: Optional[int]) -> list[str]:
    """Server flags for the budgets. S bounds every prefill batch (--prefill-max-requests). The running set is 2S
    (--max-running-requests): with one output token a request is done after its prefill round, but SGLang's overlap
    scheduler (on for full attention; hybrids on CPU run without it) plans the next pass before that round's results
    are processed, so its rows still count as running then; a running set of S would leave the next round S minus
    them (rounds alternating 7, 1, 7, 1 at S = 8). T is the chunk size and the prefill cap. The last
    --max-total-tokens wins over the CPU default (argparse keeps the last value)."""
    return [
        "--prefill-max-requests", str(S), "--max-running-requests", str(RUNNING_PER_ROW_BUDGET * S),
        "--chunked-prefill-size", str(T), "--max-prefill-tokens", str(T),
        *(["--max-total-tokens", str(kv_tokens)] if kv_tokens is not None else []),
    ]


def make_server(model_path: Path, arm: str, S: int, T: int, opts: BenchOptions, log_path: Path,
                trace_path: Optional[Path]) -> SGLangServer:
    args = budget_args(S, T, opts.kv_tokens) + list(opts.extra_server_args) + overlap_flags(opts.overlap_schedule)
    threads = {"OMP_NUM_THREADS": str(opts.server_threads)} if opts.server_threads > 0 else {}
    if arm == "sglang":  # SGLang's default cache: no radixflow code in the scheduling path, no trace
        return SGLangServer(str(model_path), radix_cache=None, extra_args=args, env=threads, log_path=log_path,
                            mamba_strategy=opts.mamba_strategy)
    env = {**threads, "RADIXFLOW_ARM": arm}
    if trace_path is not None:
        env["RADIXFLOW_TRACE"] = str(trace_path.resolve())  # the server runs in another directory
    return SGLangServer(str(model_path), radix_cache="radixflow", extra_args=args, env=env, log_path=log_path,
                        mamba_strategy=opts.mamba_strategy)


def warm_up(url: str, timeout_s: float) -> None:
    """A cold prompt, then 4 siblings together (the consumer path), on prompts no workload request shares."""
    prompts = warmup_prompts()
    post_generate(url, prompts[0], "warmup-0", timeout_s)
    threads = [threading.Thread(target=post_generate, args=(url, p, f"warmup-{i + 1}", timeout_s))
               for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _last_round(trace_path: Optional[Path]) -> int:
    if trace_path is None or not trace_path.is_file():
        return -1
    return max((int(r["round"]) for r in report.read_jsonl(trace_path) if r.get("kind") == "round"), default=-1)


def _progress(tag: str, log: Log, total: int) -> Callable[[RequestRecord, int, int], None]:
    step = max(1, total // 8)
    errors = [0]
    start = time.perf_counter()

    def on_done(rec: RequestRecord, done: int, n: int) -> None:
        errors[0] += rec.error is not None
        if done % step == 0 or done == n:
            log(f"  [{tag}] {done}/{n} requests done, {errors[0]} errors, {time.perf_counter() - start:.1f}s")

    return on_done


def run_arm(model: str, model_path: Path, arm: str, requests: Sequence[Request], S: int, T: int, opts: BenchOptions,
            out_dir: Path, log: Log = print_progress, traced: bool = True,
            questions: Optional[Sequence[TextQuestion | Question]] = None) -> list[dict[str, Any]]:
    """One fresh server, warm-up, the workload, stop. Writes <arm>.{server.log,trace.jsonl,requests.jsonl,run.json}
    (+ <arm>.questions.jsonl on a frontend path). `questions`: None sends `requests` raw (also calibration's way);
    otherwise the programs' inputs of a frontend path, or the workload's questions on the score path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"{arm}.server.log"
    trace_path = out_dir / f"{arm}.trace.jsonl" if traced and arm != "sglang" else None
    if trace_path is not None:
        trace_path.unlink(missing_ok=True)  # the trace sink appends
    tag = f"{model}/{arm}"
    server = make_server(model_path, arm, S, T, opts, log_path, trace_path)
    log(f"[{tag}] starting server (S={S}, T={T}) ...")
    t0 = time.perf_counter()
    try:
        server.start()
        log(f"[{tag}] server up in {time.perf_counter() - t0:.0f}s on {server.url}; warming up")
        warm_up(server.url, opts.request_timeout_s)
        time.sleep(SETTLE_S)
        run: dict[str, Any] = {
            "model": model, "arm": arm, "model_path": str(model_path), "command": server.command(),
            "env": dict(server.env), "S": S, "T": T,
            "log_start": os.path.getsize(log_path), "warmup_last_round": _last_round(trace_path),
            "loadavg_start": os.getloadavg()[0],  # the machine may be shared: timings are only as clean as this
            **code_version(),  # per arm: the code a server imported at its start
        }
        w0 = time.perf_counter()
        records = send_workload(server.url, tag, arm, requests, questions, opts, out_dir, log)
        run["wall_s"] = time.perf_counter() - w0
        time.sleep(SETTLE_S)
        run["log_end"] = os.path.getsize(log_path)
        run["loadavg_end"] = os.getloadavg()[0]
        run["server_exit"] = server.proc.poll() if server.proc is not None else None
    finally:
        server.stop()
    report.write_jsonl(out_dir / f"{arm}.requests.jsonl", records)
    (out_dir / f"{arm}.run.json").write_text(json.dumps(run, indent=2) + "\n")
    errors = sum(r["error"] is not None for r in records)
    lat = [r["latency_s"] for r in records if r["latency_s"] is not None]
    log(f"[{tag}] done: {len(records) - errors}/{len(records)} completed, mean latency "
        f"{(sum(lat) / len(lat)) if lat else float('nan'):.3f}s, server stopped")
    return records


def send_workload(url: str, tag: str, arm: str, requests: Sequence[Request],
                  questions: Optional[Sequence[TextQuestion | Question]], opts: BenchOptions, out_dir: Path,
                  log: Log, routed: bool = False) -> list[dict[str, Any]]:
    """The workload, open loop, on the path of the run: the request records (one per branch request). `routed`:
    through a gateway, each request keyed by its document."""
    if questions is None:
        log(f"[{tag}] sending {len(requests)} requests ({len({r.qid for r in requests})} questions, open loop)")
        client = OpenLoopClient(url, opts.request_timeout_s, on_done=_progress(tag, log, len(requests)), routed=routed)
        return [r.to_dict() for r in client.run(requests)]
    if opts.path == "score":
        log(f"[{tag}] sending {len(questions)} /v1/score calls (one per question, open loop)")
        scorer = ScoreClient(url, opts.request_timeout_s, on_done=_progress(tag, log, len(requests)))
        return [r.to_dict() for r in scorer.run(questions)]
    log(f"[{tag}] running {len(questions)} sgl.function programs ({opts.path} path, open loop)")
    fe = FrontendClient(url, opts.path, on_done=_progress(tag, log, len(questions)), timeout_s=opts.request_timeout_s)
    qrecs = fe.run(questions)
    report.write_jsonl(out_dir / f"{arm}.questions.jsonl", (q.to_dict() for q in qrecs))
    return [r for q, rec in zip(questions, qrecs) for r in rec.request_records(q)]


def run_gateway_arm(model: str, model_path: Path, arm: str, requests: Sequence[Request], S: int, T: int,
                    opts: BenchOptions, out_dir: Path, log: Log = print_progress) -> list[dict[str, Any]]:
    """`run_arm` on opts.fleet: N workers of the arm behind the gateway (bench/fleet.py). Writes <label>.run.json,
    <label>.requests.jsonl, <label>.gateway.log and per worker <label>.w<i>.{server.log,trace.jsonl}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    label = opts.fleet.label(arm)
    tag = f"{model}/{label}"
    run: dict[str, Any] = {"model": model, "arm": arm, "label": label, "model_path": str(model_path), "S": S, "T": T,
                           **code_version()}
    log(f"[{tag}] starting {opts.fleet.workers} workers (S={S}, T={T}) and the gateway ...")
    records = run_fleet(
        opts.fleet, label, out_dir, run,
        make_worker=lambda log_path, trace: make_server(model_path, arm, S, T, opts, log_path, trace),
        traced=arm != "sglang", warm_up=lambda url: warm_up(url, opts.request_timeout_s),
        send=lambda url: send_workload(url, tag, label, requests, None, opts, out_dir, log, routed=True),
        last_round=_last_round, log=log)
    report.write_jsonl(out_dir / f"{label}.requests.jsonl", records)
    (out_dir / f"{label}.run.json").write_text(json.dumps(run, indent=2) + "\n")
    errors = sum(r["error"] is not None for r in records)
    log(f"[{tag}] done: {len(records) - errors}/{len(records)} completed, servers and gateway stopped")
    return records


def run_remote_arm(model: str, url: str, arm: str, facts: dict[str, Any], requests: Sequence[Request],
                   opts: BenchOptions, out_dir: Path, log: Log = print_progress,
                   questions: Optional[Sequence[TextQuestion | Question]] = None) -> list[dict[str, Any]]:
    """`run_arm` for a server already running at `url` (bench/remote.py): the same warm-up and workload; instead of
    its log, its radixflow counters before and after (when it exports them)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{model}/{arm}"
    log(f"[{tag}] server at {url} ({facts.get('radix_cache_backend') or 'default'} cache, not started here); "
        "flushing its cache and warming up")
    # A second run against the same server would otherwise start from the first one's documents.
    remote.flush_cache(url)
    warm_up(url, opts.request_timeout_s)
    time.sleep(SETTLE_S)
    run: dict[str, Any] = {
        "model": model, "arm": arm, "url": url, "server": facts, "S": facts.get("S"), "T": facts.get("T"),
        "metrics_start": remote.scrape(url), "loadavg_start": os.getloadavg()[0], **code_version(),
    }
    w0 = time.perf_counter()
    records = send_workload(url, tag, arm, requests, questions, opts, out_dir, log)
    run["wall_s"] = time.perf_counter() - w0
    time.sleep(SETTLE_S)
    run["metrics_end"] = remote.scrape(url)
    run["loadavg_end"] = os.getloadavg()[0]
    report.write_jsonl(out_dir / f"{arm}.requests.jsonl", records)
    (out_dir / f"{arm}.run.json").write_text(json.dumps(run, indent=2) + "\n")
    errors = sum(r["error"] is not None for r in records)
    log(f"[{tag}] done: {len(records) - errors}/{len(records)} completed")
    return records


def remote_arms(facts: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """Arm names for --url servers given without --arms: `radixflow` or `sglang`, by each server's cache backend."""
    arms = tuple("radixflow" if remote.is_radixflow(f) else "sglang" for f in facts)
    if len(set(arms)) < len(arms):
        raise ValueError(f"--url: {len(arms)} servers read as arms {', '.join(arms)}; name them with --arms")
    return arms


def remote_budgets(facts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """budgets.json of a --url run: the servers' own S and T (the round lower bound's), from the first arm's."""
    S, T = facts[0].get("S"), facts[0].get("T")
    if not S or not T:
        raise ValueError(f"{facts[0]['url']}: /server_info has no prefill budgets (S={S}, T={T})")
    differ = [f["url"] for f in facts if (f.get("S"), f.get("T")) != (S, T)]
    note = f"; servers with other budgets: {', '.join(differ)}" if differ else ""
    return {"S": S, "T": T, "calibrated_on": f"read from the servers' /server_info{note}", "calibration": []}


def calibrate(opts: BenchOptions, log: Log = print_progress) -> dict[str, Any]:
    """S, T for the `sglang` arm on a held-out slice: the grid point with the lowest mean latency (ties: fewer
    prefill rounds, then the smaller budgets). Done once, on the first model; the result is frozen for all arms."""
    model = opts.models[0]
    model_path = model_dir(opts, model)
    params = held_out(opts.workload, opts.calibration_questions)
    requests = make_workload(params).requests()
    cal_dir = opts.out / "calibration"
    results = []
    for S, T in opts.calibration_grid:
        sub = cal_dir / f"S{S}-T{T}"
        records = run_arm(model, model_path, "sglang", requests, S, T, opts, sub, log)  # raw path
        run = json.loads((sub / "sglang.run.json").read_text())
        prefill = report.parse_prefill_lines(report.log_window(sub / "sglang.server.log", run["log_start"],
                                                               run["log_end"]))
        lat = [r["latency_s"] for r in records if r["latency_s"] is not None]
        results.append({
            "S": S, "T": T, "latency_mean_s": (sum(lat) / len(lat)) if lat else None,
            "errors": sum(r["error"] is not None for r in records), "prefill_rounds": len(prefill),
        })
    ok = [r for r in results if r["latency_mean_s"] is not None and r["errors"] == 0]
    if not ok:
        raise RuntimeError(f"calibration failed on every grid point: {results}")
    best = min(ok, key=lambda r: (r["latency_mean_s"], r["prefill_rounds"], r["S"], r["T"]))
    grid = ", ".join(f"({s},{t})" for s, t in opts.calibration_grid)
    return {
        "S": best["S"], "T": best["T"],
        "calibrated_on": (
            f"sglang arm, {model}, {params.questions} held-out questions (stream {params.stream}, seed {params.seed}, "
            f"{params.rate} questions/s); grid (S,T) in {grid}; lowest mean latency"
        ),
        "calibration": results,
    }


def code_version() -> dict[str, Any]:
    """The plugin's git commit and whether the tree had edits (best-effort: numbers belong to a code state)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"git_head": None, "git_dirty": None}
    return {"git_head": head or None, "git_dirty": bool(dirty) if head else None}


def run_bench(opts: BenchOptions, log: Log = print_progress) -> dict[str, Any]:
    out = opts.out
    running_before = set(live_servers())  # servers of this process the bench did not start (tests: --url targets)
    facts = [remote.server_facts(url) for url in opts.urls]  # ConnectionError names a server that does not answer
    models = opts.models
    if facts and opts.model_path is None:  # the served model's directory name, as a tiny model's arch names it
        models = (Path(str(facts[0]["model_path"])).name or "model",)
    arms = opts.arms or remote_arms(facts)
    workload = load_workload(opts, models[0])
    out.mkdir(parents=True, exist_ok=True)
    requests = workload.requests()
    desc = workload.describe()
    log(f"workload: {desc['questions']} questions, {desc['requests']} requests, "
        + (f"from {desc['source']}" if desc.get("source") else f"stream {desc['stream']}, order {desc['order']}")
        + f", {desc['rate']} questions/s, seed {desc['seed']}, {desc['documents']} documents, "
        f"ideal reuse ratio {desc['ideal_reuse_ratio']:.4f}")
    frontend: dict[str, Any] = {"path": opts.path}
    if opts.path in FRONTEND_PATHS:
        frontend.update(frontend_workload(workload, model_dir(opts, models[0])))
        log(f"frontend path {opts.path}: {frontend['text_mapping']}; ideal reuse of the choice requests "
            f"{frontend['ideal_reuse_ratio']:.4f}")
    (out / "workload.json").write_text(json.dumps({
        **desc, **frontend, "models": list(models), "arms": list(arms), "urls": list(opts.urls),
        "model_path": str(opts.model_path) if opts.model_path is not None else None, "kv_tokens": opts.kv_tokens,
        "quick": opts.quick, "server_threads": opts.server_threads, "hybrid_strategy": opts.mamba_strategy,
        "overlap_schedule": "off" if opts.overlap_off else "on", "server_args": list(opts.extra_server_args),
        "max_running_per_row_budget": RUNNING_PER_ROW_BUDGET, "workers": opts.fleet.workers,
        "router": opts.fleet.router, "reference": opts.reference if opts.fleet.gateway else None, **code_version(),
    }, indent=2) + "\n")
    report.write_jsonl(out / "workload.requests.jsonl", workload.request_table())

    if facts:
        budgets = remote_budgets(facts)
    elif opts.budgets is not None:
        S, T = opts.budgets
        budgets = {"S": S, "T": T, "calibrated_on": "fixed", "calibration": []}
    else:
        log(f"calibrating S, T on the sglang arm ({opts.calibration_questions} held-out questions, "
            f"{len(opts.calibration_grid)} grid points)")
        budgets = calibrate(opts, log)
    (out / "budgets.json").write_text(json.dumps(budgets, indent=2) + "\n")
    S, T = int(budgets["S"]), int(budgets["T"])
    log(f"budgets frozen: S={S}, T={T} ({budgets['calibrated_on']})")

    t0 = time.perf_counter()
    for model in models:
        questions: Optional[Sequence[TextQuestion | Question]] = None
        if opts.path in FRONTEND_PATHS:
            questions = text_questions(workload, word_lexicon(model_dir(opts, model)))
        elif opts.path == "score":
            questions = workload.questions
        for i, arm in enumerate(arms):
            if facts:
                run_remote_arm(model, opts.urls[i], arm, facts[i], requests, opts, out / model, log, questions)
                continue
            if opts.reference or not opts.fleet.gateway:
                run_arm(model, model_dir(opts, model), arm, requests, S, T, opts, out / model, log,
                        questions=questions)
            if opts.fleet.gateway:
                run_gateway_arm(model, model_dir(opts, model), arm, requests, S, T, opts, out / model, log)
    leftover = set(live_servers()) - running_before
    assert not leftover, f"servers left running: {sorted(leftover)}"
    summary = report.write_report(out)
    log(f"all arms done in {time.perf_counter() - t0:.0f}s; wrote {out}/summary.json and {out}/report.md")
    return summary


def load_workload(opts: BenchOptions, model: str) -> Workload:
    """The generated workload, or the user's file (text in it encoded with `model`'s tokenizer, loaded on demand)."""
    if opts.workload_file is None:
        return make_workload(opts.workload)
    encoder: list[Encode] = []

    def encode(text: str, specials: bool) -> list[int]:
        if not encoder:
            if opts.model_path is None and model not in ARCHS:
                raise ValueError(f"{opts.workload_file}: text needs the served model's tokenizer: add --model-path DIR")
            encoder.append(tokenizer_encode(model_dir(opts, model)))
        return encoder[0](text, specials)

    return read_workload_file(opts.workload_file, opts.workload, encode)


def frontend_workload(workload: Any, model_path: Path) -> dict[str, Any]:
    """workload.json entries of a frontend path: what is measured are the choice requests, so the ideal reuse is
    theirs (the token workload's own ideal is kept under another name)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    questions = text_questions(workload, word_lexicon(model_path))
    return {
        "token_workload_ideal_reuse_ratio": workload.ideal_reuse_ratio(),
        "ideal_reuse_ratio": frontend_ideal_reuse(questions, lambda t: tok(t)["input_ids"]),
        "text_mapping": "each token id -> one whole-word token of the model's tokenizer (bench/frontend.py)",
    }
