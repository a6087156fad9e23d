"""`radixflow` command line: make-model, demo, bench (multi-candidate, replay, agent), report.

Serving itself is SGLang's own command, with the plugin installed:
  python -m sglang.launch_server --model-path DIR --radix-cache radixflow [--radix-eviction-policy rr]
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _cmd_make_model(args: argparse.Namespace) -> int:
    from sglang_radixflow.models import make_model

    path = make_model(args.arch, args.out, seed=args.seed)
    print(f"wrote {args.arch} (seed {args.seed}) to {path}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from sglang_radixflow.bench.demo import run_demo

    table = run_demo(args.out, args.models_root)
    print("\n" + table)
    print(f"\nreport: {args.out}/report.md, figures: {args.out}/fig3_rounds_latency.png, "
          f"{args.out}/fig4_distributions.png; summary.json, per-arm server logs and traces: {args.out}/<model>/")
    return 0


def _cmd_bench_multi_candidate(args: argparse.Namespace) -> int:
    from sglang_radixflow.bench import multi_candidate_cli

    return multi_candidate_cli.main(args)


def _cmd_bench_replay(args: argparse.Namespace) -> int:
    from sglang_radixflow.bench import replay

    return replay.main(args)


def _cmd_bench_agent(args: argparse.Namespace) -> int:
    from sglang_radixflow.bench import agent_cli

    return agent_cli.main(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from sglang_radixflow.bench.rebuild import NotABenchDir, rebuild_report

    try:
        print(rebuild_report(args.dir))
    except NotABenchDir as err:
        print(f"radixflow report: {err}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sglang_radixflow.models import ARCHS

    from sglang_radixflow import __version__

    parser = argparse.ArgumentParser(prog="radixflow", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sglang-radixflow {__version__} (for SGLang 0.5.23)")
    sub = parser.add_subparsers(dest="command", required=True)

    mm = sub.add_parser("make-model", help="write a tiny random-initialised model + tokenizer")
    mm.add_argument("--arch", required=True, choices=ARCHS)
    mm.add_argument("--out", required=True, help="output directory")
    mm.add_argument("--seed", type=int, default=0, help="weights and tokenizer seed (default: %(default)s)")
    mm.set_defaults(func=_cmd_make_model)

    demo = sub.add_parser(
        "demo", help="short comparison: sglang / prefix-stop / radixflow on the tiny hybrid and the control")
    demo.add_argument("--out", default="runs/demo", help="output directory (default: runs/demo)")
    demo.add_argument("--models-root", default="runs/models",
                      help="where tiny models are made/reused (default: %(default)s)")
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser("bench", help="the paper's measurements on real servers")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    mc = bench_sub.add_parser("multi-candidate", help="multi-candidate scoring: arms x models, open-loop arrivals")
    from sglang_radixflow.bench.multi_candidate_cli import add_arguments

    add_arguments(mc)
    mc.set_defaults(func=_cmd_bench_multi_candidate)
    rp = bench_sub.add_parser("replay", help="fixed-batch replay on SGLang's real prefill pass: rounds vs lower bound")
    from sglang_radixflow.bench import replay

    replay.add_arguments(rp)
    rp.set_defaults(func=_cmd_bench_replay)
    ag = bench_sub.add_parser("agent", help="agent trajectories: RR-Evict vs lru / tlru (TTFT, missed tokens)")
    from sglang_radixflow.bench.agent_cli import add_arguments as add_agent_arguments

    add_agent_arguments(ag)
    ag.set_defaults(func=_cmd_bench_agent)

    rep = sub.add_parser("report", help="rebuild DIR's summary.json, report.md and figures from its saved records")
    rep.add_argument("dir", help="output directory of a bench (multi-candidate, replay or agent)")
    rep.set_defaults(func=_cmd_report)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from sglang_radixflow.bench.server import attach_option_values, stop_servers_on_sigterm

    args = build_parser().parse_args(attach_option_values(sys.argv[1:] if argv is None else argv,
                                                         ("--server-args", "--router-args")))

    stop_servers_on_sigterm()
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
