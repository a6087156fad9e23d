"""Goodput under a latency objective (`radixflow bench multi-candidate --sweep-rates R1,R2,... --slo-p95 S|auto`).

The multi-candidate bench runs once per offered rate (each in OUT/rate-<R>/, a complete bench directory: servers,
summary.json, report.md), the same workload and fixed budgets otherwise. An arm's goodput is the highest swept rate
up to which every rate kept the P95 request latency within the SLO with no error (a rate that passes above a failing
one does not count: noise is not capacity). `auto` sets the SLO per model to twice the `sglang` arm's P95 at the
lowest rate (native SGLang at light load). Written: OUT/goodput.json, OUT/goodput.md, OUT/goodput.png.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench.progress import Log, print_progress

SLO_AUTO_FACTOR = 2.0
BASELINES = ("sglang", "prefix-stop")  # goodput ratios are reported against these arms where they ran


def parse_rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(sorted({float(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ValueError(f"--sweep-rates {text!r}: expected a comma list of questions/s, e.g. 2,4,8") from None
    if not rates or rates[0] <= 0:
        raise ValueError(f"--sweep-rates {text!r}: rates must be positive")
    return rates


def parse_slo(text: str) -> Optional[float]:
    """Seconds, or None for `auto`."""
    if text == "auto":
        return None
    try:
        slo = float(text)
    except ValueError:
        raise ValueError(f"--slo-p95 {text!r}: seconds (e.g. 0.5) or auto") from None
    if not slo > 0:
        raise ValueError(f"--slo-p95 {text!r}: must be positive")
    return slo


def run_sweep(opts: Any, rates: Sequence[float], slo_s: Optional[float], run_bench: Callable[..., dict],
              log: Log = print_progress) -> dict[str, Any]:
    """One bench per rate (opts: options.BenchOptions with fixed budgets), then the goodput summary."""
    if opts.budgets is None and not opts.urls:
        raise ValueError("--sweep-rates: fix the budgets (--budgets S,T or --quick), so every rate runs the same servers")
    if slo_s is None and "sglang" not in opts.arms:
        raise ValueError("--slo-p95 auto is 2x the sglang arm's P95 at the lowest rate: add sglang to --arms")
    summaries = {}
    for rate in rates:
        log(f"== offered rate {rate:g} questions/s ==")
        sub = replace(opts, out=opts.out / f"rate-{rate:g}", workload=replace(opts.workload, rate=rate))
        summaries[rate] = run_bench(sub, log)
    result = goodput(summaries, slo_s)
    write(opts.out, result)
    return result


def goodput(summaries: dict[float, dict[str, Any]], slo_s: Optional[float]) -> dict[str, Any]:
    """{rate: summary} -> per arm (model/arm) its per-rate latencies, the SLO, its goodput and ratios."""
    rates = sorted(summaries)
    keys = list(summaries[rates[0]]["arms"])
    slo: dict[str, float] = {}
    for key in keys:
        model = key.split("/", 1)[0]
        if slo_s is not None:
            slo[model] = slo_s
        elif model not in slo:
            p95 = summaries[rates[0]]["arms"].get(f"{model}/sglang", {}).get("latency_p95_s")
            if p95 is None:
                raise ValueError(f"--slo-p95 auto: no sglang P95 for {model} at {rates[0]:g} questions/s")
            slo[model] = SLO_AUTO_FACTOR * p95
    arms: dict[str, Any] = {}
    for key in keys:
        model = key.split("/", 1)[0]
        rows = []
        for rate in rates:
            a = summaries[rate]["arms"].get(key, {})
            p95, errors = a.get("latency_p95_s"), a.get("errors")
            rows.append({"rate": rate, "latency_p95_s": p95, "latency_mean_s": a.get("latency_mean_s"),
                         "errors": errors, "prefill_rounds": a.get("prefill_rounds"),
                         "within_slo": p95 is not None and errors == 0 and p95 <= slo[model]})
        best = 0.0
        for row in rows:
            if not row["within_slo"]:
                break
            best = row["rate"]
        arms[key] = {"slo_p95_s": slo[model], "goodput_qps": best, "rates": rows}
    for key, arm in arms.items():
        model = key.split("/", 1)[0]
        for base in BASELINES:
            other = arms.get(f"{model}/{base}")
            if other is not None and not key.endswith(f"/{base}"):
                arm[f"vs_{base}"] = arm["goodput_qps"] / other["goodput_qps"] if other["goodput_qps"] else None
    first = summaries[rates[0]]
    return {"kind": "goodput", "rates": rates, "slo": "auto" if slo_s is None else slo_s,
            "slo_auto_factor": SLO_AUTO_FACTOR if slo_s is None else None, "workload": first["workload"],
            "budgets": first["budgets"], "arms": arms}


def format_goodput(result: dict[str, Any]) -> str:
    w = result["workload"]
    group = f"{w.get('candidates')} candidates" + (" + the anchor" if w.get("anchor") else "")
    slo = ("2x the sglang arm's P95 at the lowest rate" if result["slo"] == "auto" else f"{result['slo']} s")
    lines = ["# Goodput under a P95 latency SLO", "",
             f"Groups of {group}, stream `{w.get('stream')}`, {w.get('questions')} questions per rate, budgets S,T = "
             f"{result['budgets']['S']},{result['budgets']['T']}; SLO: {slo}. Goodput = the highest offered rate up to "
             "which every swept rate kept P95 within the SLO with no error. Each rate's full report: rate-<R>/report.md.",
             "", "| arm | SLO s | goodput q/s | vs sglang | vs prefix-stop | " + " | ".join(
                 f"P95 s @ {r:g}" for r in result["rates"]) + " |",
             "|---|---|---|---|---|" + "---|" * len(result["rates"])]
    for key, a in result["arms"].items():
        cells = [f"{r['latency_p95_s']:.3f}{'' if r['within_slo'] else ' ✗'}" if r["latency_p95_s"] is not None
                 else "—" for r in a["rates"]]
        ratio = lambda v: "—" if v is None else f"{v:.2f}x"  # noqa: E731
        lines.append(f"| {key} | {a['slo_p95_s']:.3f} | {a['goodput_qps']:g} | {ratio(a.get('vs_sglang'))} | "
                     f"{ratio(a.get('vs_prefix-stop'))} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", "✗: P95 over the SLO, or errors, at that rate."]) + "\n"


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "goodput.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "goodput.md").write_text(format_goodput(result))
    figure(result, out / "goodput.png")


def figure(result: dict[str, Any], path: Path) -> None:
    """P95 latency against the offered rate per arm, one panel per model, the SLO as a line."""
    from sglang_radixflow.bench.figures import _figure

    models = sorted({k.split("/", 1)[0] for k in result["arms"]})
    fig, axes = _figure(1, len(models), width=5.5 * len(models))
    for ax, model in zip(axes[0], models):
        for key, a in result["arms"].items():
            if key.split("/", 1)[0] != model:
                continue
            pts = [(r["rate"], r["latency_p95_s"]) for r in a["rates"] if r["latency_p95_s"] is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key.split("/", 1)[1])
            slo = a["slo_p95_s"]
        ax.axhline(slo, color="grey", linestyle="--", label="SLO")
        ax.set_title(model)
        ax.set_xlabel("offered rate (questions/s)")
        ax.set_ylabel("P95 request latency (s)")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
