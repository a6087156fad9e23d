#!/usr/bin/env python
"""Repeat `radixflow bench multi-candidate` K times and pool the arms' numbers.

On a shared 2-core CPU one run's mean latency is noisy at the overloading rates the bench uses: a few milliseconds
of interference early on decide whether a queue builds, and the same arm's mean moved 0.13-0.39 s between runs made
back to back. Rounds and reuse move much less. This runs the bench K times back to back. Every repetition starts
fresh servers for every arm; the bench runs its arms one after the other, so every second repetition reverses the
`--arms` order (unless --fixed-order) and no arm always runs first. It then reports per model and arm the mean and
median over repetitions of each run's mean latency, its P95, rounds, prefill rounds and both reuse ratios, and, per
pair of arms, in how many repetitions the first had the lower mean latency.

    python scripts/mc_repeats.py --out runs/mc-rep --reps 5 -- --models nemotron_h,qwen3 --questions 32 --rate 24 \\
        --stream mixed --arms prefix-stop,radixflow --budgets 8,2048
    python scripts/mc_repeats.py --out runs/mc-rep --aggregate-only    # rebuild repeats.md / repeats.json
    python scripts/mc_repeats.py --out runs/mc-rep --reps 4 --fixed-order -- ...   # the arms' order as given, always

Output: OUT/rep1 ... OUT/repK (complete bench directories), OUT/repeats.json, OUT/repeats.md.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from itertools import combinations
from pathlib import Path
from typing import Any, Optional

from sglang_radixflow.bench.server import stop_servers_on_sigterm

METRICS: tuple[tuple[str, str], ...] = (
    ("latency_mean_s", "mean latency (s)"),
    ("latency_p95_s", "P95 latency (s)"),
    ("rounds", "rounds"),
    ("prefill_rounds", "prefill rounds"),
    ("reuse_ratio", "reuse ratio"),
    ("computed_reuse_ratio", "computed reuse"),
)


def arm_value(arm: dict[str, Any], key: str) -> Optional[float]:
    value = arm.get(key, (arm.get("extra") or {}).get(key))
    return None if value is None else float(value)


def aggregate(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool K bench summaries (same arms): per arm, each metric's values, mean and median over repetitions; per
    model and pair of arms, the repetitions in which each had the lower mean latency."""
    if not summaries:
        raise ValueError("no repetition to aggregate")
    keys = [k for k in summaries[0]["arms"] if all(k in s["arms"] for s in summaries)]
    arms: dict[str, Any] = {}
    for key in keys:
        row: dict[str, Any] = {}
        for metric, _ in METRICS:
            values = [arm_value(s["arms"][key], metric) for s in summaries]
            present = [v for v in values if v is not None]
            row[metric] = {"values": values, "mean": statistics.fmean(present) if present else None,
                           "median": statistics.median(present) if present else None}
        arms[key] = row
    wins: dict[str, Any] = {}
    by_model: dict[str, list[str]] = {}
    for key in keys:
        by_model.setdefault(key.split("/")[0], []).append(key)
    for model, model_keys in by_model.items():
        for a, b in combinations(model_keys, 2):
            la, lb = arms[a]["latency_mean_s"]["values"], arms[b]["latency_mean_s"]["values"]
            pairs = [(x, y) for x, y in zip(la, lb) if x is not None and y is not None]
            wins[f"{a} vs {b}"] = {"first_lower": sum(x < y for x, y in pairs),
                                   "second_lower": sum(y < x for x, y in pairs), "repetitions": len(pairs)}
    return {"kind": "multi-candidate-repeats", "repetitions": len(summaries), "arms": arms, "latency_wins": wins}


def format_report(agg: dict[str, Any], command: list[str]) -> str:
    fmt = lambda v: "n/a" if v is None else (f"{v:.3f}" if abs(v) < 10 else f"{v:.0f}")  # noqa: E731
    lines = [f"# multi-candidate bench, {agg['repetitions']} repetitions", "",
             "`radixflow bench multi-candidate " + " ".join(command) + "`, each repetition a full run with fresh servers.",
             "Per metric: mean / median over repetitions of each run's value, then the values in order.", ""]
    lines += ["| model / arm | " + " | ".join(label for _, label in METRICS) + " |",
              "|---|" + "---|" * len(METRICS)]
    for key, row in agg["arms"].items():
        cells = []
        for metric, _ in METRICS:
            m = row[metric]
            cells.append(f"{fmt(m['mean'])} / {fmt(m['median'])} ({', '.join(fmt(v) for v in m['values'])})")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "Lower mean latency, repetitions won:", ""]
    for pair, w in agg["latency_wins"].items():
        first, second = pair.split(" vs ")
        lines.append(f"- {first} {w['first_lower']}, {second} {w['second_lower']} (of {w['repetitions']})")
    return "\n".join(lines) + "\n"


def write(out: Path, command: list[str]) -> dict[str, Any]:
    reps = sorted((p for p in out.glob("rep*") if (p / "summary.json").is_file()), key=lambda p: int(p.name[3:]))
    agg = aggregate([json.loads((p / "summary.json").read_text()) for p in reps])
    agg["command"] = command
    (out / "repeats.json").write_text(json.dumps(agg, indent=1))
    (out / "repeats.md").write_text(format_report(agg, command))
    return agg


def arms_for(bench_args: list[str], repetition: int) -> list[str]:
    """The bench's arguments for repetition k (from 1): every even one with its `--arms` list reversed (without
    `--arms` the bench's default arms run in its own order every time)."""
    args = list(bench_args)
    if repetition % 2 == 1:
        return args
    for i, arg in enumerate(args):
        if arg == "--arms" and i + 1 < len(args):
            args[i + 1] = ",".join(reversed(args[i + 1].split(",")))
        elif arg.startswith("--arms="):
            args[i] = "--arms=" + ",".join(reversed(arg.removeprefix("--arms=").split(",")))
    return args


def run_bench(cmd: list[str]) -> None:
    """Run one repetition; if this script is stopped (Ctrl-C, SIGTERM), stop the bench with SIGTERM so that it stops
    its servers (subprocess.run would SIGKILL it, leaving them running)."""
    bench = subprocess.Popen(cmd)
    try:
        code = bench.wait()
    except BaseException:
        bench.terminate()
        bench.wait(timeout=120)
        raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--aggregate-only", action="store_true")
    ap.add_argument("--fixed-order", action="store_true", help="every repetition runs the arms in the order given")
    args = ap.parse_args(own)
    out = Path(args.out)
    if args.aggregate_only:
        saved = out / "repeats.json"
        command = json.loads(saved.read_text()).get("command", []) if saved.is_file() else []
        print(format_report(write(out, command), command))
        return 0
    if args.reps < 1:
        ap.error(f"--reps needs an integer >= 1, got {args.reps}")
    if not bench_args or "--out" in bench_args:
        ap.error("give the bench's arguments after `--` (without --out: each repetition writes OUT/repK)")
    out.mkdir(parents=True, exist_ok=True)
    radixflow = shutil.which("radixflow") or "radixflow"
    stop_servers_on_sigterm()  # SIGTERM here becomes an exception, passed on to the bench below
    for k in range(1, args.reps + 1):
        rep = out / f"rep{k}"
        print(f"[mc_repeats] repetition {k}/{args.reps} -> {rep}", flush=True)
        rep_args = bench_args if args.fixed_order else arms_for(bench_args, k)
        run_bench([radixflow, "bench", "multi-candidate", "--out", str(rep), *rep_args])
    print(format_report(write(out, bench_args), bench_args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
