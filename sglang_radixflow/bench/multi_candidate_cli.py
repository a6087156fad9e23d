"""Command line of `radixflow bench multi-candidate`: options -> BenchOptions -> runner.run_bench."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

from sglang_radixflow.bench.options import (
    CALIBRATION_GRID, DEFAULT_ARMS, DEFAULT_KV_TOKENS, DEFAULT_MODELS, PATHS, QUICK_BUDGETS, BenchOptions,
)
from sglang_radixflow.bench.runner import OWNED_SERVER_FLAGS, run_bench
from sglang_radixflow.bench.fleet import add_fleet_arguments, fleet_from_args
from sglang_radixflow.bench.goodput import parse_rates, parse_slo, run_sweep
from sglang_radixflow.bench.model_args import add_model_arguments, models_from_args
from sglang_radixflow.bench.server import on_cpu
from sglang_radixflow.bench.server import (
    HYBRID_STRATEGY_FLAGS, HYBRID_STRATEGY_HELP, add_overlap_argument, live_servers, parse_server_args,
)
from sglang_radixflow.bench.workloads import WorkloadParams
from sglang_radixflow.config import ARMS


def options_from_args(args: Any) -> BenchOptions:
    """CLI namespace -> options (--quick fills in what was not given)."""
    quick = bool(args.quick)
    workload_file = Path(args.workload) if args.workload else None
    # a workload file: all of its questions unless --questions caps them
    questions = args.questions or (10 ** 9 if workload_file else 16 if quick else 64)
    params = WorkloadParams(
        questions=questions, stream=args.stream, order=args.order, rate=args.rate, seed=args.seed,
        doc_scale=args.doc_scale, candidates=args.candidates, anchor=args.anchor,
    )
    budgets: Optional[tuple[int, int]] = None
    if args.budgets:
        budgets = parse_budgets(args.budgets)
    elif quick:
        budgets = QUICK_BUDGETS
    split = lambda v: tuple(x.strip() for x in v.split(",") if x.strip())  # noqa: E731
    models, model_path = models_from_args(args, DEFAULT_MODELS)
    urls = split(args.url or "")
    if urls and not args.budgets:
        budgets = None  # read from the servers
    return BenchOptions(
        out=Path(args.out), workload=params, models=models, budgets=budgets,
        arms=split(args.arms) if args.arms else () if urls else DEFAULT_ARMS,
        model_path=model_path, urls=urls, workload_file=workload_file,
        calibration_questions=args.calibration_questions, calibration_grid=parse_grid(args.calibration_grid),
        kv_tokens=args.kv_tokens if args.kv_tokens is not None else (
            None if model_path is not None and not on_cpu() else DEFAULT_KV_TOKENS),
        models_root=Path(args.models_root), quick=quick, server_threads=args.server_threads, path=args.path,
        mamba_strategy=args.hybrid_strategy, overlap_schedule=args.overlap_schedule,
        extra_server_args=parse_server_args(args.server_args, OWNED_SERVER_FLAGS),
        fleet=fleet_from_args(args), reference=not args.no_reference,
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
                        help="a real run of a few minutes: 16 questions, budgets fixed at S,T = %d,%d" % QUICK_BUDGETS)
    parser.add_argument("--arms", default=None,
                        help=f"comma list of {', '.join(ARMS)} (default: {','.join(DEFAULT_ARMS)}; with --url: "
                             "radixflow or sglang by each server's cache)")
    add_model_arguments(parser, DEFAULT_MODELS)
    parser.add_argument("--url", default=None,
                        help="measure servers that are already running, comma separated, one per arm in --arms "
                             "order (e.g. --arms sglang,radixflow --url http://h:30000,http://h:30001); nothing is "
                             "started, budgets are read from each server's /server_info")
    add_fleet_arguments(parser, "cache_aware")
    parser.add_argument("--workload", default=None,
                        help="your own questions instead of the generated ones: a JSONL file, one "
                             '{"context": ..., "candidates": [...]} per line, text or token ids '
                             "(examples/multi_candidate_workload.jsonl)")
    parser.add_argument("--sweep-rates", default=None,
                        help="goodput: run the bench at each of these rates (questions/s, comma list; budgets fixed: "
                             "--budgets or --quick) and report each arm's highest rate within --slo-p95 "
                             "(OUT/goodput.md, goodput.json, goodput.png; each rate in OUT/rate-<R>/)")
    parser.add_argument("--slo-p95", default="auto",
                        help="the goodput SLO on P95 request latency: seconds, or auto = 2x the sglang arm's P95 at "
                             "the lowest rate (default: %(default)s)")
    parser.add_argument("--candidates", type=int, default=4,
                        help="candidate requests per question (default: %(default)s)")
    parser.add_argument("--anchor", action="store_true",
                        help="each question's group also holds the document + question alone, first (groups of 1 "
                             "anchor + 9 candidates: --candidates 9 --anchor)")
    parser.add_argument("--questions", type=int, default=0,
                        help="questions (x4 requests); default 16 quick, 64 full, all of a --workload file")
    parser.add_argument("--rate", type=float, default=4.0, help="Poisson arrival rate, questions/s (default 4)")
    parser.add_argument("--stream", choices=STREAMS, default="mixed",
                        help="how documents are shared across questions (default: %(default)s)")
    parser.add_argument("--order", choices=ORDERS, default="forward",
                        help="the question sequence as drawn, or reversed (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="workload and arrivals seed (default: %(default)s)")
    parser.add_argument("--doc-scale", type=float, default=1.0,
                        help="keep this leading fraction of every document, in (0, 1] (default 1); below 1 a CPU "
                             "round's cost is less dominated by its tokens, as on a GPU")
    parser.add_argument("--budgets", default="", help="S,T: fix the budgets instead of calibrating")
    parser.add_argument("--calibration-questions", type=int, default=8, help="held-out questions per grid point (default: %(default)s)")
    parser.add_argument("--calibration-grid", default=",".join(f"{s}x{t}" for s, t in CALIBRATION_GRID),
                        help="S x T points tried on the sglang arm when --budgets is not given (default: %(default)s)")
    parser.add_argument("--kv-tokens", type=int, default=None,
                        help=f"--max-total-tokens of every server (default: {DEFAULT_KV_TOKENS}; with --model-path on "
                             "a GPU: SGLang's own sizing from memory)")
    parser.add_argument("--path", choices=PATHS, default="raw",
                        help="raw: /generate per branch; select / fork: one sgl.function program per question "
                             "(sgl.select over the candidates, or fork + gen), via sgl.RuntimeEndpoint; score: one "
                             "call of SGLang's /v1/score per question (query = document + question, items = the "
                             "candidates); default: %(default)s")
    parser.add_argument("--hybrid-strategy", choices=tuple(HYBRID_STRATEGY_FLAGS), default="no_buffer",
                        help=HYBRID_STRATEGY_HELP + " (default: %(default)s)")
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
    before = set(live_servers())
    try:
        if args.sweep_rates:
            if opts.fleet.gateway:
                raise ValueError("--sweep-rates with --workers: goodput is measured on one server per arm")
            result = run_sweep(opts, parse_rates(args.sweep_rates), parse_slo(args.slo_p95), run_bench)
            print((opts.out / "goodput.md").read_text())
            return 0 if all(r["errors"] == 0 for a in result["arms"].values() for r in a["rates"]) else 1
        summary = run_bench(opts)
    except (ValueError, ConnectionError) as err:  # a bad workload file, a server that does not answer
        raise SystemExit(f"radixflow bench multi-candidate: {err}") from None
    finally:
        leftover = set(live_servers()) - before
        if leftover:  # pragma: no cover - run_arm stops its server in a finally
            print(f"warning: servers still running: {sorted(leftover)}", file=sys.stderr)
    print((opts.out / "report.md").read_text())
    return 0 if all(a["errors"] == 0 for a in summary["arms"].values()) else 1
