"""`radixflow demo`: the short version of the paper's comparison on real SGLang servers, in a few minutes on a CPU.

Makes the tiny models if missing, then runs the multi-candidate bench (bench/runner.py) with a short workload:
arms `sglang`, `prefix-stop`, `radixflow` on the tiny hybrid (nemotron_h) and the full-attention control (qwen3), one
fresh server per model x arm, and prints one table (rounds, rows per round, latency, reuse, token hits ĥ vs
state-ready hits h). The full report (summary.json, report.md, figures, per-arm logs and traces) is in the output
directory; `radixflow report DIR` rebuilds it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench.options import BenchOptions
from sglang_radixflow.bench.runner import run_bench
from sglang_radixflow.bench.workloads import WorkloadParams

DEMO_ARMS: tuple[str, ...] = ("sglang", "prefix-stop", "radixflow")
DEMO_MODELS: tuple[str, ...] = ("nemotron_h", "qwen3")
# 8 questions x 4 candidates arriving faster than the CPU serves them: a queue forms, so scheduling shows.
DEMO_WORKLOAD = WorkloadParams(questions=8, stream="mixed", rate=16.0, seed=0)
DEMO_BUDGETS = (8, 2048)


def demo_options(out: Path, models_root: Path, models: Sequence[str] = DEMO_MODELS,
                 arms: Sequence[str] = DEMO_ARMS, workload: WorkloadParams = DEMO_WORKLOAD) -> BenchOptions:
    return BenchOptions(
        out=out, workload=workload, models=tuple(models), arms=tuple(arms), budgets=DEMO_BUDGETS,
        kv_tokens=16384, models_root=models_root, quick=True,
    )


def _num(x: Any, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


def format_table(summary: dict[str, Any]) -> str:
    head = (f"{'model / arm':<24} {'rounds':>6} {'rows/round':>10} {'latency s':>9} {'p95 s':>7} {'reuse':>7} "
            f"{'computed':>8} {'Σĥ token hits':>13} {'Σh state-ready':>14}")
    lines = [head, "-" * len(head)]
    for key, a in summary["arms"].items():
        reuse = _num(a["reuse_ratio"] and 100 * a["reuse_ratio"], "{:.1f}%")
        computed = a.get("extra", {}).get("computed_reuse_ratio")
        computed = _num(computed and 100 * computed, "{:.1f}%")
        lines.append(
            f"{key:<24} {a['prefill_rounds']:>6} {_num(a['rows_per_round'], '{:.2f}'):>10} "
            f"{_num(a['latency_mean_s'], '{:.3f}'):>9} {_num(a['latency_p95_s'], '{:.3f}'):>7} {reuse:>7} {computed:>8} "
            f"{_num(a['token_hit_tokens'], '{}'):>13} {_num(a['state_ready_hit_tokens'], '{}'):>14}"
        )
    w = summary["workload"]
    lines.append(f"(ideal reuse of this workload: {100 * w['ideal_reuse_ratio']:.1f}%; S, T = "
                 f"{summary['budgets']['S']}, {summary['budgets']['T']}; ĥ/h come from the radixflow trace, so "
                 "the sglang arm has none; reuse = clients' Σ cached / Σ prompt, computed = 1 − the server's new "
                 "tokens / Σ prompt, which also charges radixflow's prefix requests)")
    return "\n".join(lines)


def run_demo(out: Optional[str] = None, models_root: Optional[str] = None,
             log: Callable[[str], None] = print) -> str:
    out_dir = Path(out or "runs/demo")
    root = Path(models_root) if models_root else Path("runs/models")
    summary = run_bench(demo_options(out_dir, root), log)
    table = format_table(summary)
    (out_dir / "demo.txt").write_text(table + "\n")
    return table
