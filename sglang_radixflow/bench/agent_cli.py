"""Command line of `radixflow bench agent`: options -> AgentBenchOptions -> agent.run."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Optional

from sglang_radixflow.bench.fleet import add_fleet_arguments, fleet_from_args
from sglang_radixflow.bench.agent import (
    APIS, DEFAULT_MODELS, DEFAULT_SEEDS, HYBRID_CHUNK, OWNED_SERVER_FLAGS, POLICIES, AgentBenchOptions, run,
)
from sglang_radixflow.bench.agent_workload import RETURN_ORDERS, AgentParams
from sglang_radixflow.bench.model_args import add_model_arguments, models_from_args
from sglang_radixflow.bench.server import HYBRID_STRATEGY_FLAGS, HYBRID_STRATEGY_HELP, add_overlap_argument, parse_server_args
from sglang_radixflow.models import MAX_POSITIONS, read_model_config


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
    p.add_argument("--api", choices=APIS, default="generate",
                   help="how each turn is sent: generate (/generate with token ids, the default) or chat (SGLang's "
                        "OpenAI /v1/chat/completions with the turns as text, an agent framework's way; the servers get "
                        "--enable-cache-report)")
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
    p.add_argument("--seed", type=int, default=0, help="first schedule seed (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="schedules per arm (seed, seed+1, ...), pooled (default: %(default)s)")
    p.add_argument("--rr-block", type=int, default=16,
                   help="RR-Evict tail block on full-attention paths, passed as --radix-eviction-policy-config "
                        "'{\"block\": N}' (default: %(default)s)")
    p.add_argument("--hybrid-chunk", type=int, default=HYBRID_CHUNK,
                   help="--chunked-prefill-size on hybrid models, for every policy "
                        "(a no_buffer hybrid keeps a state per chunk; default: %(default)s)")
    p.add_argument("--hybrid-strategy", choices=tuple(HYBRID_STRATEGY_FLAGS), default="no_buffer",
                   help=HYBRID_STRATEGY_HELP + " (default: %(default)s)")
    add_overlap_argument(p)
    # agents: by trajectory, new ones dealt in turn (cache_aware pins them all to the system prompt's worker)
    add_fleet_arguments(p, "sticky_round_robin")


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
        workload_file=Path(args.workload) if args.workload else None, api=args.api,
        policies=tuple(p for p in args.policies.split(",") if p), models_root=Path(args.models_root),
        rr_block=args.rr_block, hybrid_chunk=args.hybrid_chunk, mamba_strategy=args.hybrid_strategy, seeds=args.seeds,
        overlap_schedule=args.overlap_schedule, fleet=fleet_from_args(args), reference=not args.no_reference,
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
