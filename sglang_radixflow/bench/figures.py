"""PNG figures of the benches, in the style of the paper's Figures 3 and 4 (matplotlib, headless).

- fig3_rounds_latency.png: per model, the change of prefill rounds and of mean latency of each arm against the
  baseline arm (the paper's Figure 3, left), and the cost identity's round gain vs cost drift per arm (right);
- fig4_distributions.png: per model, the distribution of round fullness (rows / S per prefill round) and of request
  latency per arm (the paper's Figure 4);
- replay_rounds.png (replay bench): rounds vs the lower bound and empty slots per arm and instance.

Only matplotlib's object API is used (Figure + Agg canvas): no pyplot state, no display needed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

FIG3 = "fig3_rounds_latency.png"
FIG4 = "fig4_distributions.png"
REPLAY_FIG = "replay_rounds.png"


def _figure(rows: int, cols: int, width: float = 12.0, row_height: float = 3.6) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as err:  # the `bench` extra brings it
        raise RuntimeError("figures need matplotlib: pip install 'sglang-radixflow[bench]'") from err
    fig = Figure(figsize=(width, row_height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _change(value: Optional[float], base: Optional[float]) -> Optional[float]:
    """Relative change in percent (negative = fewer rounds / lower latency than the baseline)."""
    if value is None or not base:
        return None
    return 100.0 * (value - base) / base


def _ecdf(ax: Any, values: Sequence[float], label: str) -> None:
    xs = sorted(values)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=label)


def rounds_latency_figure(summary: Mapping[str, Any], path: Path, baseline: str = "sglang") -> Path:
    """Figure 3: per-arm round and latency change vs `baseline`, and round gain vs cost drift."""
    models = _models(summary)
    fig, axes = _figure(len(models), 2)
    for row, model in enumerate(models):
        arms = {k.split("/", 1)[1]: a for k, a in summary["arms"].items() if a["model"] == model}
        base_arm = baseline if baseline in arms else next(iter(arms))
        base = arms[base_arm]
        others = [a for a in arms if a != base_arm]
        ax = axes[row][0]
        width = 0.38
        xs = range(len(others))
        rounds = [_change(arms[a]["prefill_rounds"], base["prefill_rounds"]) or 0.0 for a in others]
        lat = [_change(arms[a]["latency_mean_s"], base["latency_mean_s"]) or 0.0 for a in others]
        ax.bar([x - width / 2 for x in xs], rounds, width, label="prefill rounds")
        ax.bar([x + width / 2 for x in xs], lat, width, label="mean latency")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(list(xs), others, rotation=15)
        ax.set_ylabel(f"change vs {base_arm} (%)")
        ax.set_title(f"{model}: rounds and latency vs {base_arm} "
                     f"({base['prefill_rounds']} rounds, {base['latency_mean_s'] or 0:.3f} s)")
        ax.legend(fontsize=8)

        ax = axes[row][1]
        ids = {k.split("/", 1)[1]: v for k, v in summary.get("cost_identity", {}).items() if k.startswith(model + "/")}
        if ids:
            names = list(ids)
            xs = range(len(names))
            ax.bar([x - width / 2 for x in xs], [ids[n]["round_gain_s"] for n in names], width,
                   label="round gain (K0−K1)·c̄0")
            ax.bar([x + width / 2 for x in xs], [ids[n]["cost_drift_s"] for n in names], width,
                   label="cost drift K1·(c̄1−c̄0)")
            ax.plot(list(xs), [ids[n]["total_s"] for n in names], "kD", label="T_host,0 − T_host,1")
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_xticks(list(xs), names, rotation=15)
            ax.set_ylabel("host time (s)")
            ax.set_title(f"{model}: cost identity vs {next(iter(ids.values()))['baseline'].split('/', 1)[1]}")
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no cost identity (needs traced arms)", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
    fig.savefig(path, dpi=110)
    return path


def distributions_figure(rows_by_arm: Mapping[str, Mapping[str, Sequence[int]]],
                         latency_by_arm: Mapping[str, Mapping[str, Sequence[float]]], S: int, path: Path) -> Path:
    """Figure 4: per model, ECDF of round fullness (rows / S of each prefill round) and of request latency per arm.

    rows_by_arm / latency_by_arm: {model: {arm: values}}."""
    models = list(rows_by_arm)
    fig, axes = _figure(len(models), 2)
    for row, model in enumerate(models):
        ax = axes[row][0]
        for arm, rows in rows_by_arm[model].items():
            _ecdf(ax, [r / S for r in rows], f"{arm} (mean {sum(rows) / max(1, len(rows)):.2f} rows)")
        ax.set_xlabel(f"round fullness: rows / S (S = {S})")
        ax.set_ylabel("fraction of prefill rounds ≤ x")
        ax.set_xlim(0, 1.05)
        ax.set_title(f"{model}: round fullness")
        ax.legend(fontsize=8)
        ax = axes[row][1]
        for arm, lat in latency_by_arm.get(model, {}).items():
            _ecdf(ax, lat, arm)
        ax.set_xlabel("client latency (s)")
        ax.set_ylabel("fraction of requests ≤ x")
        ax.set_title(f"{model}: latency")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def replay_figure(summary: Mapping[str, Any], path: Path) -> Path:
    """Rounds (bars) against the lower bound (markers) and empty slots, per instance and arm."""
    names = list(summary["instances"])
    fig, axes = _figure(1, len(names), width=4.5 * len(names), row_height=3.8)
    for col, name in enumerate(names):
        inst = summary["instances"][name]
        arms = list(inst["arms"])
        xs = range(len(arms))
        ax = axes[0][col]
        ax.bar(list(xs), [inst["arms"][a]["rounds"] for a in arms], 0.6, label="rounds K")
        ax.plot(list(xs), [inst["arms"][a]["lower_bound"] for a in arms], "kD", label="lower bound")
        ax.axhline(inst["floor"], color="gray", linestyle="--", linewidth=0.8, label="floor (any arm)")
        for x, a in zip(xs, arms):
            ax.annotate(f"{inst['arms'][a]['empty_slots']} empty", (x, inst["arms"][a]["rounds"]),
                        ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), arms, rotation=15)
        ax.set_title(f"{name} (S={inst['S']}, T={inst['T']})")
        ax.set_ylabel("prefill rounds")
        ax.legend(fontsize=7, loc="lower right")
    fig.savefig(path, dpi=110)
    return path


def _models(summary: Mapping[str, Any]) -> list[str]:
    models: list[str] = []
    for a in summary["arms"].values():
        if a["model"] not in models:
            models.append(a["model"])
    return models


def multi_candidate_figures(out: Path, summary: dict[str, Any], loaded: Mapping[tuple[str, str], dict[str, Any]],
                            baseline: str) -> list[Path]:
    """Figures 3 and 4 of a multi-candidate run from its summary and per-arm records (SGLang's prefill log lines,
    client latencies); `baseline`: the arm the others are compared with."""
    rows: dict[str, dict[str, list[int]]] = {}
    lat: dict[str, dict[str, list[float]]] = {}
    for (model, arm), data in loaded.items():
        rows.setdefault(model, {})[arm] = [p["seqs"] for p in data["prefill"]]
        lat.setdefault(model, {})[arm] = [float(r["latency_s"]) for r in data["requests"] if not r.get("error")]
    return [
        rounds_latency_figure(summary, out / FIG3, baseline=baseline),
        distributions_figure(rows, lat, int(summary["budgets"]["S"]), out / FIG4),
    ]
