"""`radixflow bench multi-candidate`: the paper's multi-candidate scoring measurement on real SGLang servers.

For each model and each arm: a fresh server (radixflow backend with RADIXFLOW_ARM=<arm> and a trace, or SGLang's
default cache for `sglang`), a warm-up that shares no prefix with the workload, the open-loop workload, then stop.
The budgets S (rows per prefill round) and T (tokens per prefill round) are the same server flags for every arm:
calibrated once on the `sglang` arm on a held-out slice (or fixed, e.g. in --quick), then frozen.
Everything is saved per arm; summary.json and report.md are rebuilt from those files (bench/report.py).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench import report
from sglang_radixflow.bench.client import OpenLoopClient, RequestRecord, post_generate
from sglang_radixflow.bench.frontend import (
    FRONTEND_PATHS, FrontendClient, TextQuestion, frontend_ideal_reuse, text_questions, word_lexicon,
)
from sglang_radixflow.bench.score import ScoreClient
from sglang_radixflow.bench.progress import Log, print_progress
from sglang_radixflow.bench.server import (
    HYBRID_STRATEGY_FLAGS, HYBRID_STRATEGY_HELP, SGLangServer, add_overlap_argument, check_hybrid_strategy,
    check_overlap_schedule, live_servers, overlap_flags, overlap_off, parse_server_args,
)
from sglang_radixflow.bench.workloads import (
    Question, Request, WorkloadParams, held_out, make_workload, warmup_prompts,
)
from sglang_radixflow.config import ARMS
from sglang_radixflow.models import ARCHS, ensure_model

DEFAULT_ARMS: tuple[str, ...] = ("sglang", "prefix-stop", "radixflow")
DEFAULT_MODELS: tuple[str, ...] = ("nemotron_h", "qwen3")
# S mirrors the paper's Nemotron S = 16; T is its 8192 scaled like the QuALITY documents (x 0.25).
QUICK_BUDGETS: tuple[int, int] = (16, 2048)
CALIBRATION_GRID: tuple[tuple[int, int], ...] = ((8, 2048), (16, 2048), (16, 4096), (32, 4096))
# How a question reaches the server: raw /generate per branch, an SGLang frontend program (bench/frontend.py), or one
# call of SGLang's scoring endpoint (bench/score.py).
PATHS: tuple[str, ...] = ("raw", *FRONTEND_PATHS, "score")

@dataclass(frozen=True)
class BenchOptions:
    out: Path
    workload: WorkloadParams
    models: tuple[str, ...] = DEFAULT_MODELS
    arms: tuple[str, ...] = DEFAULT_ARMS
    budgets: Optional[tuple[int, int]] = None  # (S, T); None: calibrate on the sglang arm
    calibration_questions: int = 8
    calibration_grid: tuple[tuple[int, int], ...] = CALIBRATION_GRID
    kv_tokens: int = 32768  # KV pool: large enough that the workload's documents are not evicted mid-run
    models_root: Path = Path("runs/models")
    request_timeout_s: float = 600.0
    quick: bool = False
    # torch intra-op threads per server (OMP_NUM_THREADS; 0: torch's default). 1 by default: on a small shared CPU,
    # multi-threaded ops swing by 10x with other load (OpenMP threads spin and get descheduled), single-threaded
    # ones do not, and every arm gets the same setting.
    server_threads: int = 1
    extra_server_args: tuple[str, ...] = field(default_factory=tuple)
    path: str = "raw"  # one of PATHS
    # hybrids: SGLang's mamba radix-cache strategy (bench/server.py): no_buffer, or extra_buffer (GPU default; Mamba-2)
    mamba_strategy: str = "no_buffer"
    overlap_schedule: str = "auto"  # SGLang's overlap scheduler: auto (off on CPU, see overlap_off), on, off

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path={self.path!r}; allowed: {', '.join(PATHS)}")
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; allowed: {', '.join(ARMS)}")
        if not self.arms or not self.models:
            raise ValueError("need at least one arm and one model")
        unknown = [m for m in self.models if m not in ARCHS]
        if unknown:
            raise ValueError(f"unknown model(s) {', '.join(unknown)}; allowed: {', '.join(ARCHS)}")
        if self.budgets is not None and min(self.budgets) < 1:
            raise ValueError(f"budgets S,T = {self.budgets}: both must be positive integers")
        for name in ("kv_tokens", "calibration_questions"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if self.server_threads < 0:
            raise ValueError(f"--server-threads {self.server_threads}: must be >= 0 (0: torch's default)")
        check_hybrid_strategy(self.mamba_strategy)
        check_overlap_schedule(self.overlap_schedule)

    @property
    def overlap_off(self) -> bool:
        """Whether every server runs with --disable-overlap-schedule (server.overlap_off)."""
        return overlap_off(self.overlap_schedule)


# Server flags the bench sets itself (budget_args, the arm's cache, --hybrid-strategy, --overlap-schedule, the
# server's own address and model): --server-args may not repeat them.
OWNED_SERVER_FLAGS: tuple[str, ...] = (
    "--prefill-max-requests", "--max-running-requests", "--chunked-prefill-size", "--max-prefill-tokens",
    "--max-total-tokens", "--radix-cache-backend", "--mamba-radix-cache-strategy", "--disable-overlap-schedule",
    "--model-path", "--host", "--port",
)
RUNNING_PER_ROW_BUDGET = 2  # the round being planned and the one still in flight under the overlap scheduler


def budget_args(S: int, T: int, kv_tokens: int) -> list[str]:
    """Server flags for the budgets. S bounds every prefill batch (--prefill-max-requests). The running set is 2S
    (--max-running-requests): with one output token a request is done after its prefill round, but SGLang's overlap
    scheduler (on for full attention; hybrids on CPU run without it) plans the next pass before that round's results
    are processed, so its rows still count as running then; a running set of S would leave the next round S minus
    them (rounds alternating 7, 1, 7, 1 at S = 8). T is the chunk size and the prefill cap. The last
    --max-total-tokens wins over the CPU default (argparse keeps the last value)."""
    return [
        "--prefill-max-requests", str(S), "--max-running-requests", str(RUNNING_PER_ROW_BUDGET * S),
        "--chunked-prefill-size", str(T), "--max-prefill-tokens", str(T),
        "--max-total-tokens", str(kv_tokens),
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


def warm_up(server: SGLangServer, timeout_s: float) -> None:
    """A cold prompt, then 4 siblings together (the consumer path), on prompts no workload request shares."""
    prompts = warmup_prompts()
    post_generate(server.url, prompts[0], "warmup-0", timeout_s)
    threads = [threading.Thread(target=post_generate, args=(server.url, p, f"warmup-{i + 1}", timeout_s))
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


SETTLE_S = 1.0  # SGLang writes a batch's log line after streaming its outputs: let it land before taking offsets


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
        warm_up(server, opts.request_timeout_s)
        time.sleep(SETTLE_S)
        run: dict[str, Any] = {
            "model": model, "arm": arm, "model_path": str(model_path), "command": server.command(),
            "env": dict(server.env), "S": S, "T": T,
            "log_start": os.path.getsize(log_path), "warmup_last_round": _last_round(trace_path),
            "loadavg_start": os.getloadavg()[0],  # the machine may be shared: timings are only as clean as this
            **code_version(),  # per arm: the code a server imported at its start
        }
        w0 = time.perf_counter()
        if questions is None:
            log(f"[{tag}] sending {len(requests)} requests ({len({r.qid for r in requests})} questions, open loop)")
            client = OpenLoopClient(server.url, opts.request_timeout_s, on_done=_progress(tag, log, len(requests)))
            records = [r.to_dict() for r in client.run(requests)]
        elif opts.path == "score":
            log(f"[{tag}] sending {len(questions)} /v1/score calls (4 items each, open loop)")
            scorer = ScoreClient(server.url, opts.request_timeout_s, on_done=_progress(tag, log, len(requests)))
            records = [r.to_dict() for r in scorer.run(questions)]
        else:
            log(f"[{tag}] running {len(questions)} sgl.function programs ({opts.path} path, open loop)")
            fe = FrontendClient(server.url, opts.path, on_done=_progress(tag, log, len(questions)),
                                timeout_s=opts.request_timeout_s)
            qrecs = fe.run(questions)
            report.write_jsonl(out_dir / f"{arm}.questions.jsonl", (q.to_dict() for q in qrecs))
            records = [r for q, rec in zip(questions, qrecs) for r in rec.request_records(q)]
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


def calibrate(opts: BenchOptions, log: Log = print_progress) -> dict[str, Any]:
    """S, T for the `sglang` arm on a held-out slice: the grid point with the lowest mean latency (ties: fewer
    prefill rounds, then the smaller budgets). Done once, on the first model; the result is frozen for all arms."""
    model = opts.models[0]
    model_path = ensure_model(model, opts.models_root)
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
    out.mkdir(parents=True, exist_ok=True)
    workload = make_workload(opts.workload)
    requests = workload.requests()
    desc = workload.describe()
    log(f"workload: {desc['questions']} questions x 4 = {desc['requests']} requests, stream {desc['stream']}, "
        f"order {desc['order']}, {desc['rate']} questions/s, seed {desc['seed']}, {desc['documents']} documents, "
        f"ideal reuse ratio {desc['ideal_reuse_ratio']:.4f}")
    frontend: dict[str, Any] = {"path": opts.path}
    if opts.path in FRONTEND_PATHS:
        frontend.update(frontend_workload(workload, ensure_model(opts.models[0], opts.models_root)))
        log(f"frontend path {opts.path}: {frontend['text_mapping']}; ideal reuse of the choice requests "
            f"{frontend['ideal_reuse_ratio']:.4f}")
    (out / "workload.json").write_text(json.dumps({
        **desc, **frontend, "models": list(opts.models), "arms": list(opts.arms), "kv_tokens": opts.kv_tokens,
        "quick": opts.quick, "server_threads": opts.server_threads, "hybrid_strategy": opts.mamba_strategy,
        "overlap_schedule": "off" if opts.overlap_off else "on", "server_args": list(opts.extra_server_args),
        "max_running_per_row_budget": RUNNING_PER_ROW_BUDGET, **code_version(),
    }, indent=2) + "\n")
    report.write_jsonl(out / "workload.requests.jsonl", workload.request_table())

    if opts.budgets is not None:
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
    for model in opts.models:
        model_path = ensure_model(model, opts.models_root)
        questions: Optional[Sequence[TextQuestion | Question]] = None
        if opts.path in FRONTEND_PATHS:
            questions = text_questions(workload, word_lexicon(model_path))
        elif opts.path == "score":
            questions = workload.questions
        for arm in opts.arms:
            run_arm(model, model_path, arm, requests, S, T, opts, out / model, log, questions=questions)
    leftover = live_servers()
    assert not leftover, f"servers left running: {leftover}"
    summary = report.write_report(out)
    log(f"all arms done in {time.perf_counter() - t0:.0f}s; wrote {out}/summary.json and {out}/report.md")
    return summary


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


def options_from_args(args: Any) -> BenchOptions:
    """CLI namespace -> options (--quick fills in what was not given)."""
    quick = bool(args.quick)
    questions = args.questions or (16 if quick else 64)
    params = WorkloadParams(
        questions=questions, stream=args.stream, order=args.order, rate=args.rate, seed=args.seed,
        doc_scale=args.doc_scale,
    )
    budgets: Optional[tuple[int, int]] = None
    if args.budgets:
        budgets = parse_budgets(args.budgets)
    elif quick:
        budgets = QUICK_BUDGETS
    split = lambda v: tuple(x.strip() for x in v.split(",") if x.strip())  # noqa: E731
    return BenchOptions(
        out=Path(args.out), workload=params, models=split(args.models), arms=split(args.arms), budgets=budgets,
        calibration_questions=args.calibration_questions, calibration_grid=parse_grid(args.calibration_grid),
        kv_tokens=args.kv_tokens,
        models_root=Path(args.models_root), quick=quick, server_threads=args.server_threads, path=args.path,
        mamba_strategy=args.hybrid_strategy, overlap_schedule=args.overlap_schedule,
        extra_server_args=parse_server_args(args.server_args, OWNED_SERVER_FLAGS),
    )


def parse_budgets(text: str) -> tuple[int, int]:
    """"8,2048" -> (8, 2048)."""
    try:
        s, t = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--budgets {text!r}: expected S,T (rows, tokens per prefill round), e.g. 8,2048") from None
    return s, t


def parse_grid(text: str) -> tuple[tuple[int, int], ...]:
    """"8x2048,16x4096" -> ((8, 2048), (16, 4096))."""
    grid = []
    for item in text.split(","):
        s, _, t = item.strip().partition("x")
        if not s or not t:
            raise ValueError(f"calibration grid item {item!r}: expected SxT, e.g. 16x2048")
        try:
            grid.append((int(s), int(t)))
        except ValueError:
            raise ValueError(f"calibration grid item {item!r}: expected SxT, e.g. 16x2048") from None
    return tuple(grid)


def add_arguments(parser: Any) -> None:
    """Options of `radixflow bench multi-candidate` (cli.py adds the subcommand and calls main)."""
    from sglang_radixflow.bench.workloads import ORDERS, STREAMS

    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help=f"a real run of a few minutes: 16 questions, budgets fixed at S,T={QUICK_BUDGETS}")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma list of tiny model archs")
    parser.add_argument("--questions", type=int, default=0, help="questions (x4 requests); default 16 quick, 64 full")
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrival rate, questions/s (default 4)")
    parser.add_argument("--stream", choices=STREAMS, default="mixed")
    parser.add_argument("--order", choices=ORDERS, default="forward")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--doc-scale", type=float, default=1.0,
                        help="keep this leading fraction of every document, in (0, 1] (default 1); below 1 a CPU "
                             "round's cost is less dominated by its tokens, as on a GPU")
    parser.add_argument("--budgets", default="", help="S,T: fix the budgets instead of calibrating")
    parser.add_argument("--calibration-questions", type=int, default=8, help="held-out questions per grid point")
    parser.add_argument("--calibration-grid", default=",".join(f"{s}x{t}" for s, t in CALIBRATION_GRID),
                        help="S x T points tried on the sglang arm when --budgets is not given")
    parser.add_argument("--kv-tokens", type=int, default=32768, help="--max-total-tokens of every server")
    parser.add_argument("--models-root", default="runs/models", help="where tiny models are made/reused")
    parser.add_argument("--path", choices=PATHS, default="raw",
                        help="raw: /generate per branch; select / fork: one sgl.function program per question "
                             "(sgl.select over the candidates, or fork + gen), via sgl.RuntimeEndpoint; score: one "
                             "call of SGLang's /v1/score per question (query = document + question, items = the "
                             "candidates)")
    parser.add_argument("--hybrid-strategy", choices=tuple(HYBRID_STRATEGY_FLAGS), default="no_buffer",
                        help=HYBRID_STRATEGY_HELP)
    add_overlap_argument(parser)
    parser.add_argument("--server-args", default="",
                        help="extra SGLang server flags for every arm's server, shell-quoted, e.g. "
                             "\"--schedule-policy lpm\" (not the flags the bench sets from its own options)")
    parser.add_argument("--server-threads", type=int, default=1,
                        help="OMP_NUM_THREADS of every server (default 1: stable timings on a shared CPU; 0: torch's)")


def main(args: Any) -> int:
    try:  # bad options end here, before any directory is written or server started
        opts = options_from_args(args)
    except ValueError as err:
        raise SystemExit(f"radixflow bench multi-candidate: {err}") from None
    try:
        summary = run_bench(opts)
    finally:
        leftover = live_servers()
        if leftover:  # pragma: no cover - run_arm stops its server in a finally
            print(f"warning: servers still running: {leftover}", file=sys.stderr)
    print((opts.out / "report.md").read_text())
    return 0 if all(a["errors"] == 0 for a in summary["arms"].values()) else 1
