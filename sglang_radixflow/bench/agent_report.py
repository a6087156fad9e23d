"""Summary, report and figure of `radixflow bench agent` (bench/agent.py), rebuilt from its saved per-turn records:
TTFT and missed tokens over return turns, rr / lru against the targets, what the regime and timing were."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from sglang_radixflow.bench.fleet import arm_of
from sglang_radixflow.bench.report import mean, percentile, read_jsonl, request_records, trace_metrics
from sglang_radixflow.bench.report_md import overlap_note

TARGETS = {"missed_p99": 0.35, "ttft_p99": 0.25, "ttft_mean": 1.05}  # rr / lru, at most
# rr against the best of every other policy that ran, per metric (smaller is better), at most
BEST_OTHER_TARGETS = {"missed_tokens_p99": 0.5, "ttft_p99_s": 1.0}
HYBRID_CHUNK = 128  # bench/agent.py's default --hybrid-chunk (older runs' workload.json lack the key)


def arm_summary(arch: str, policy: str, records: Sequence[dict[str, Any]], rounds: Sequence[dict[str, Any]],
                trace_requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in records if not r.get("error")]
    ret = [r for r in ok if r["turn"] > 0]
    ttft = [r["ttft_s"] for r in ret]
    missed = [float(r["missed_tokens"]) for r in ret]
    lat = [r["latency_s"] for r in ok]
    tm = trace_metrics(rounds, trace_requests) if rounds else {}
    rounds_n = tm.get("rounds")
    return {
        "model": arch, "policy": policy, "requests": len(records), "completed": len(ok),
        "errors": len(records) - len(ok),
        "rounds": rounds_n, "prefill_rounds": tm.get("prefill_rounds"),
        "rows_per_round": None, "tokens_per_round": None,
        "latency_mean_s": mean(lat), "latency_p50_s": percentile(lat, 50), "latency_p95_s": percentile(lat, 95),
        "latency_p99_s": percentile(lat, 99), "first_selection_wait_mean_s": tm.get("first_selection_wait_mean_s"),
        "reuse_ratio": (sum(r["cached_tokens"] for r in ok) / sum(r["prompt_len"] for r in ok)) if ok else None,
        "token_hit_tokens": tm.get("token_hit_tokens"), "state_ready_hit_tokens": tm.get("state_ready_hit_tokens"),
        "blocked_skips": tm.get("blocked_skips"), "avoidable_bubbles": tm.get("avoidable_bubbles"),
        "host_time_s": tm.get("host_time_s"), "host_cost_per_round_s": tm.get("host_cost_per_round_s"),
        "round_lower_bound": None, "first_token_agreement": None,
        "ttft_mean_s": mean(ttft), "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "missed_tokens_mean": mean(missed), "missed_tokens_p50": percentile(missed, 50),
        "missed_tokens_p99": percentile(missed, 99),
        "missed_fraction_mean": mean([r["missed_tokens"] / r["reusable"] for r in ret if r["reusable"]]),
        "return_turns": len(ret),
        **_steady(ret),
        **_alone(ok, ret),
        **_unmissed(ret),
    }


def _alone(ok: Sequence[dict[str, Any]], ret: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """TTFT of the return turns that ran alone: no other turn (of the same schedule) in flight when it was sent, and
    none sent before its first token. Their TTFT is the eviction policy's effect without queueing: on CPU a prefill
    costs in proportion to every token in its round, so concurrent turns add their work to each other's TTFT."""
    by_seed: dict[Any, list[dict[str, Any]]] = {}
    for r in ok:
        by_seed.setdefault(r.get("seed"), []).append(r)

    def overlaps(r: dict[str, Any], o: dict[str, Any]) -> bool:
        return (o["sent_s"] <= r["sent_s"] < o["sent_s"] + o["latency_s"]
                or r["sent_s"] <= o["sent_s"] < r["sent_s"] + r["ttft_s"])

    alone = [r for r in ret if not any(o is not r and overlaps(r, o) for o in by_seed[r.get("seed")])]
    ttft = [r["ttft_s"] for r in alone]
    return {"alone_turns": len(alone), "alone_ttft_mean_s": mean(ttft), "alone_ttft_p99_s": percentile(ttft, 99),
            "alone_missed_p99": percentile([float(r["missed_tokens"]) for r in alone], 99)}


def _unmissed(ret: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """TTFT of the return turns that eviction cost (almost) nothing: they recomputed at most one turn's output of
    their own history (a hybrid path cut back to its last prompt state). What every return would show if the policy's
    misses were free, queueing by other turns included: rr / lru TTFT P99 cannot fall much below this over lru's."""
    kept = [r for r in ret if r["missed_tokens"] <= r["output_len"]]
    return {"unmissed_turns": len(kept), "unmissed_ttft_p99_s": percentile([r["ttft_s"] for r in kept], 99)}


def _steady(ret: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The same statistics over return turns dispatched while more than m agents still had turns left: the regime
    n_a < m < n the analysis assumes. Near the end, finished agents' histories are dead weight that lru evicts first
    for free while rr cuts them and live agents alike; those turns are outside the regime."""
    st = [r for r in ret if r.get("in_regime")]
    ttft = [r["ttft_s"] for r in st]
    missed = [float(r["missed_tokens"]) for r in st]
    return {"steady_turns": len(st), "steady_ttft_mean_s": mean(ttft), "steady_ttft_p99_s": percentile(ttft, 99),
            "steady_missed_mean": mean(missed), "steady_missed_p99": percentile(missed, 99)}


def build_summary(out: Path) -> dict[str, Any]:
    workload = json.loads((out / "workload.json").read_text())
    arms: dict[str, Any] = {}
    for arch in workload["models"]:
        for label in workload.get("runs") or workload["policies"]:  # runs: with the gateway's (bench/fleet.py)
            d = out / arch / label
            if not (d / "requests.jsonl").is_file():
                continue
            meta = json.loads((d / "meta.json").read_text())
            rounds: list[dict[str, Any]] = []
            reqs: list[dict[str, Any]] = []
            for view in meta.get("worker_runs") or [{"trace": "trace.jsonl", "first_round": meta.get("first_round")}]:
                trace = read_jsonl(d / view["trace"]) if (d / view["trace"]).is_file() else []
                first = int(view.get("first_round", -1))
                rounds += [r for r in trace if r.get("kind") == "round" and int(r["round"]) > first]
                reqs += [r for r in request_records(trace) if not str(r.get("rid", "")).startswith("warmup")]
            cap = float(meta.get("capacity") or workload["workload"]["capacity"])  # a gateway run's own (scaled)
            recs = [{**r, "in_regime": r.get("live", 0) > cap} for r in read_jsonl(d / "requests.jsonl")]
            arm = arm_summary(arch, arm_of(label)[0], recs, rounds, reqs)
            arm.update(label=label, workers=meta.get("workers", 1), router=meta.get("router", "none"))
            if meta.get("worker_runs") and len(meta["worker_runs"]) > 1:
                arm["per_worker"] = [worker_share(recs, v["url"]) for v in meta["worker_runs"]]
            arm["wall_s"] = meta.get("wall_s")
            arm["idle_leak_reported"] = meta.get("idle_leak_reported")
            arms[f"{arch}/{label}"] = arm
    return {"kind": "agent", "workload": workload["workload"],
            "budgets": {"S": workload["workload"]["active"], "T": 4096, "calibrated_on": "fixed"},
            "arms": arms, "cost_identity": {}, "targets": targets(arms), "vs_best_other": against_best(arms)}


def worker_share(records: Sequence[dict[str, Any]], url: str) -> dict[str, Any]:
    """One worker's part of a gateway run: the turns routed to it, the agents they came from, its misses."""
    mine = [r for r in records if r.get("worker") == url]
    ret = [r for r in mine if not r.get("error") and r["turn"] > 0]
    return {"url": url, "turns": len(mine), "agents": len({(r.get("seed"), r["agent"]) for r in mine}),
            "errors": sum(bool(r.get("error")) for r in mine),
            "missed_tokens_p99": percentile([float(r["missed_tokens"]) for r in ret], 99)}


def sections(arms: dict[str, Any]) -> list[str]:
    """`<arch>` or `<arch>@<N>x<router>`: one server per policy, or the gateway runs (arms keyed <arch>/<label>)."""
    keys: list[str] = []
    for key in arms:
        arch, label = key.split("/")
        section = arch + arm_of(label)[1]
        if section not in keys:
            keys.append(section)
    return keys


def _in(section: str, key: str) -> bool:
    arch, label = key.split("/")
    return arch + arm_of(label)[1] == section


def against_best(arms: dict[str, Any]) -> dict[str, Any]:
    """Per model (and gateway run) and metric: rr against the best (smallest) value among the other policies."""
    result: dict[str, Any] = {}
    for key, rr in arms.items():
        arch, label = key.split("/")
        section = arch + arm_of(label)[1]
        others = {arm_of(k.split("/")[1])[0]: a for k, a in arms.items() if _in(section, k) and k != key}
        if arm_of(label)[0] != "rr" or not others:
            continue
        rows = {}
        for field, target in BEST_OTHER_TARGETS.items():
            values = {p: a.get(field) for p, a in others.items() if a.get(field) is not None}
            if not values or rr.get(field) is None:
                continue
            best = min(values, key=values.__getitem__)
            ratio = rr[field] / values[best] if values[best] else None
            rows[field] = {"rr": rr[field], "best_other": best, "best_other_value": values[best], "ratio": ratio,
                           "target": target, "met": ratio is not None and ratio <= target}
        result[section] = rows
    return result


def targets(arms: dict[str, Any]) -> dict[str, Any]:
    """rr / lru ratios against the issue's targets, per model."""
    result: dict[str, Any] = {}
    for key, arm in arms.items():
        arch, label = key.split("/")
        policy, fleet = arm_of(label)
        base = arms.get(f"{arch}/lru{fleet}")
        if policy != "rr" or base is None:
            continue
        rows = {}
        for name, field in (("missed_p99", "missed_tokens_p99"), ("ttft_p99", "ttft_p99_s"), ("ttft_mean", "ttft_mean_s")):
            num, den = arm.get(field), base.get(field)
            ratio = None if num is None or not den else num / den
            rows[name] = {"rr": num, "lru": den, "ratio": ratio, "target": TARGETS[name],
                          "met": ratio is not None and ratio <= TARGETS[name]}
        result[arch + fleet] = rows
    return result


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _return_order_text(w: dict[str, Any]) -> str:
    order = w.get("return_order", "random")  # runs before the idle-time order had the random one
    if order == "idle-time":
        return f"return order idle-time (idle time CV {w['idle_cv']:g}: the longest-idle agent is usually next back)"
    return "return order random (memoryless returns)"


def _timing_text(w: dict[str, Any]) -> str:
    gap = float(w.get("mean_gap_ms", 0.0))  # runs before open-loop dispatch were closed loop
    if gap == 0:
        return f"closed loop ({w['active']} clients back to back: returns share prefill rounds)"
    return f"open loop (Poisson dispatch, mean gap {gap:g} ms)"


def format_report(summary: dict[str, Any]) -> str:
    w = summary["workload"]
    lines = [
        "# Agent benchmark: RR-Evict vs lru / tlru", "",
        f"n = {w['agents']} agents, n_a = {w['active']} active, m = {w['capacity']} trajectories of cache "
        f"({w['kv_tokens']} KV tokens), s = {w['idle_fraction_s']:.2f}, {w['turns']} turns per agent, "
        f"system prompt {w['system_tokens']}, first message {w['first_tokens']}, +{w['new_tokens']} tokens/turn, "
        f"{w['gen_tokens']} generated/turn, seeds {w.get('seeds', [w['seed']])} (pooled), "
        f"{_return_order_text(w)}, {_timing_text(w)}. "
        f"Hybrids: `--mamba-radix-cache-strategy {w.get('hybrid_strategy', 'no_buffer')}`, prefills chunked at "
        f"{w.get('hybrid_chunk', HYBRID_CHUNK)} tokens. SGLang's overlap scheduler "
        f"{overlap_note(w.get('overlap_schedule', 'on'))}. "
        f"Ideal RR: every idle trajectory keeps "
        f"h = (m - n_a)/(n s) = {w['ideal_retained_h']:.3f}, so a return recomputes q = {w['ideal_missed_fraction_q']:.3f} "
        f"of its history. Ideal reuse ratio {w['ideal_reuse_ratio']:.3f}.",
        "Statistics over return turns (turn >= 1). Missed tokens: tokens of the agent's own earlier turns recomputed. "
        "In-regime (summary.json steady_*): return turns dispatched while more than m agents still had turns left. "
        "Alone (summary.json alone_*): return turns with no other turn in flight from their send to their first token "
        "(the policy's effect on TTFT without queueing; on CPU concurrent prefills add their work to each other's TTFT).",
        "",
    ]
    for section in sections(summary["arms"]):
        arch, fleet = arm_of(section)
        a0 = next(a for k, a in summary["arms"].items() if _in(section, k))
        lines += [f"## {arch}" + (f" on {a0['workers']} workers behind SGLang's gateway (`--policy {a0['router']}`)"
                                  if fleet else ""), "",
                  "| policy | TTFT mean (s) | TTFT P50 | TTFT P99 | missed mean | missed P50 | missed P99 | "
                  "missed share | reuse ratio | in-regime missed mean / P99 | alone: turns, TTFT P99 | errors | leak |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, a in summary["arms"].items():
            if not _in(section, key):
                continue
            lines.append(
                f"| {a['policy']} | {_f(a['ttft_mean_s'])} | {_f(a['ttft_p50_s'])} | {_f(a['ttft_p99_s'])} | "
                f"{_f(a['missed_tokens_mean'], '{:.1f}')} | {_f(a['missed_tokens_p50'], '{:.1f}')} | "
                f"{_f(a['missed_tokens_p99'], '{:.1f}')} | {_f(a['missed_fraction_mean'])} | {_f(a['reuse_ratio'])} | "
                f"{_f(a.get('steady_missed_mean'), '{:.1f}')} / {_f(a.get('steady_missed_p99'), '{:.1f}')} | "
                f"{a.get('alone_turns', 'n/a')}, {_f(a.get('alone_ttft_p99_s'))} | {a['errors']} | "
                f"{'yes' if a.get('idle_leak_reported') else 'no'} |")
        t = summary["targets"].get(section)
        if t:
            lines += ["", "| rr / lru | rr | lru | ratio | target | met |", "|---|---|---|---|---|---|"]
            for name, row in t.items():
                lines.append(f"| {name} | {_f(row['rr'])} | {_f(row['lru'])} | {_f(row['ratio'])} | "
                             f"<= {row['target']} | {'yes' if row['met'] else 'NO'} |")
            rr, lru = (summary["arms"].get(f"{arch}/{pol}{fleet}", {}).get("alone_ttft_p99_s") for pol in ("rr", "lru"))
            if rr is not None and lru:
                lines += ["", f"Turns that ran alone (not a target): TTFT P99 rr / lru = {rr:.3f} / {lru:.3f} = "
                              f"{rr / lru:.2f}x."]
            floor = summary["arms"].get(f"{arch}/rr{fleet}", {}).get("unmissed_ttft_p99_s")
            lru_p99 = summary["arms"].get(f"{arch}/lru{fleet}", {}).get("ttft_p99_s")
            if floor is not None and lru_p99:
                turns = summary["arms"][f"{arch}/rr{fleet}"]["unmissed_turns"]
                lines += ["", f"rr's returns that recomputed at most one turn's output ({turns}): TTFT P99 {floor:.3f}, "
                              f"{floor / lru_p99:.2f}x of lru's TTFT P99 (what the ratio would read if rr's misses "
                              "cost nothing)."]
        best = (summary.get("vs_best_other") or {}).get(section)
        if best:
            lines += ["", "| rr / best other policy | rr | best other | its value | ratio | target | met |",
                      "|---|---|---|---|---|---|---|"]
            for name, row in best.items():
                lines.append(f"| {name} | {_f(row['rr'])} | {row['best_other']} | {_f(row['best_other_value'])} | "
                             f"{_f(row['ratio'])} | <= {row['target']} | {'yes' if row['met'] else 'NO'} |")
        shares = [(a["policy"], w) for k, a in summary["arms"].items() if _in(section, k) for w in a.get("per_worker", [])]
        if shares:
            lines += ["", "| policy | worker | turns | agents | errors | missed P99 |", "|---|---|---|---|---|---|"]
            lines += [f"| {pol} | {w['url']} | {w['turns']} | {w['agents']} | {w['errors']} | "
                      f"{_f(w['missed_tokens_p99'], '{:.1f}')} |" for pol, w in shares]
        lines.append("")
    lines += ["![TTFT and missed tokens](agent_distributions.png)", ""]
    return "\n".join(lines)


def write_figure(out: Path, summary: dict[str, Any]) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = sorted({a["model"] for a in summary["arms"].values()})
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.6 * len(models)), squeeze=False)
    for i, arch in enumerate(models):
        for key, a in summary["arms"].items():
            if a["model"] != arch:
                continue
            label = a.get("label", a["policy"])
            recs = [r for r in read_jsonl(out / arch / label / "requests.jsonl") if not r.get("error") and r["turn"] > 0]
            for j, field in enumerate(("ttft_s", "missed_tokens")):
                xs = sorted(float(r[field]) for r in recs)
                if xs:
                    axes[i][j].plot(xs, [(k + 1) / len(xs) for k in range(len(xs))], label=label)
        axes[i][0].set_title(f"{arch}: TTFT (return turns)")
        axes[i][0].set_xlabel("seconds")
        axes[i][1].set_title(f"{arch}: missed tokens (own history recomputed)")
        axes[i][1].set_xlabel("tokens")
        for ax in axes[i]:
            ax.set_ylabel("CDF")
            ax.axhline(0.99, color="grey", lw=0.5, ls=":")
            ax.legend()
    fig.tight_layout()
    path = out / "agent_distributions.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path) -> dict[str, Any]:
    summary = build_summary(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_figure(out, summary)
    (out / "report.md").write_text(format_report(summary))
    return summary
