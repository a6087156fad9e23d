"""Build summary.json and report.md of a multi-candidate bench from what the run saved (nothing is re-measured).

Saved layout (written by bench/runner.py):
    DIR/workload.json                     workload.describe(): every parameter, seed, ideal reuse ratio
    DIR/budgets.json                      {"S", "T", "calibrated_on", "calibration": [...]}
    DIR/<model>/<arm>.requests.jsonl      client records (bench/client.py RequestRecord)
    DIR/<model>/<arm>.server.log          the server's log; <arm>.run.json says which byte range is the workload
    DIR/<model>/<arm>.trace.jsonl         RADIXFLOW_TRACE (radixflow-backend arms only)
    DIR/<model>/<arm>.run.json            {"model", "arm", "log_start", "log_end", "warmup_last_round", ...}

Where each number comes from, so that arms are comparable:
- rounds, prefill_rounds, rows/round, tokens/round: SGLang's own "Prefill batch" log lines inside the workload's byte
  range, parsed the same way for every arm (the `sglang` arm has no radixflow trace). This workload generates one token
  per request, so every worker call is a prefill round (decode lines are only logged every 40 iterations anyway; the
  trace's own count, where there is one, is kept in `extra` as a cross-check).
- latency, completed, errors, reuse ratio (Σ meta_info.cached_tokens / Σ prompt tokens): the client records.
- token/state-ready hits, blocked skips, avoidable bubbles, first-selection wait, host time: the radixflow trace;
  null for `sglang` (SGLang's default cache has no such records).
- first-token agreement: output ids against the `sglang` arm of the same model (null for `sglang` itself).
- round_lower_bound: max(⌈W/T⌉, ⌈V/S⌉, D) for the fragments the arm executed: W = Σ new tokens, V = Σ rows (log),
  D = max over requests of ⌈(prompt − cached)/T⌉ (a request's own chunks run one per round). It ignores arrival times,
  so under open-loop arrivals it is far below K (the gap is mostly idle time between arrivals).
- cost identity: trace K (non-idle worker calls) and T_host of each arm against `prefix-stop` (the paper's native
  baseline) of the same model: round_gain = (K0 − K1)·c̄0, cost_drift = K1·(c̄1 − c̄0), total = gain − drift = T_host,0 −
  T_host,1.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from sglang_radixflow.bench import remote, report_md
from sglang_radixflow.bench.fleet import arm_of, worker_split
from sglang_radixflow.bench.client import first_token_agreement
from sglang_radixflow.schedule.prefix_request import PREFIX_RID_MARK

BASELINE_ARM = "sglang"  # first-token agreement
COST_BASELINE_ARM = "prefix-stop"  # cost identity (needs a trace)

PREFILL_LINE = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<new>\d+), #cached-token: (?P<cached>\d+),"
    r".*?#running-req: (?P<running>\d+), #queue-req: (?P<queue>\d+)"
)


# ---------------------------------------------------------------- loading

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")


def log_window(log_path: Path, start: int, end: Optional[int]) -> str:
    """The part of a server log written while the workload ran (byte offsets taken by the runner)."""
    if not log_path.is_file():
        return ""
    with open(log_path, "rb") as fh:
        fh.seek(start)
        data = fh.read(None if end is None else max(0, end - start))
    return data.decode(errors="replace")


def parse_prefill_lines(text: str) -> list[dict[str, int]]:
    return [{k: int(v) for k, v in m.groupdict().items()} for m in PREFILL_LINE.finditer(text)]


# ---------------------------------------------------------------- statistics

def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den else None


# ---------------------------------------------------------------- one arm

def log_metrics(prefill: Sequence[dict[str, int]]) -> dict[str, Any]:
    n = len(prefill)
    return {
        "prefill_rounds": n,
        "rows": sum(p["seqs"] for p in prefill),
        "tokens": sum(p["new"] for p in prefill),
        "cached": sum(p["cached"] for p in prefill),
        "queue_max": max((p["queue"] for p in prefill), default=0),
        "queue_mean": mean([p["queue"] for p in prefill]),
    }


def request_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace's request records, one per request: a request that SGLang retracted during decode is released (and
    recorded) once per retraction before its final release, whose record holds the hits of its last admission."""
    last: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("kind") == "request":
            last.pop(str(r.get("rid")), None)  # re-insert: the order of final releases
            last[str(r.get("rid"))] = r
    return list(last.values())


def trace_metrics(rounds: Sequence[dict[str, Any]], requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Round and request records of the workload (already filtered) -> the trace half of an arm's summary."""
    worked = [r for r in rounds if r.get("kind_of_round") != "idle"]  # K counts non-empty worker calls
    prefill = [r for r in worked if r.get("kind_of_round") in ("prefill", "mixed")]
    by_kind: dict[str, int] = {}
    for r in worked:
        by_kind[r["kind_of_round"]] = by_kind.get(r["kind_of_round"], 0) + 1
    waits = [float(w) for r in prefill for w in (r.get("first_selection_wait_s") or [])]
    host = sum(float(r.get("host_time_s", 0.0)) for r in worked)
    return {
        "rounds": len(worked),
        "prefill_rounds": len(prefill),
        "by_kind": by_kind,
        "host_time_s": host,
        "host_cost_per_round_s": _ratio(host, len(worked)),
        "blocked_skips": sum(int(r.get("blocked_skips", 0)) for r in prefill),
        "avoidable_bubbles": sum(int(bool(r.get("avoidable_bubble", False))) for r in prefill),
        "producers": sum(int(r.get("producers", 0)) for r in prefill),
        "adopted_producers": sum(int(r.get("adopted_producers", 0)) for r in prefill),
        "first_selection_wait_mean_s": mean(waits),
        "token_hit_tokens": sum(int(r.get("token_hit", 0)) for r in requests),
        "state_ready_hit_tokens": sum(int(r.get("state_hit", 0)) for r in requests),
        "request_records": len(requests),
    }


def arm_summary(model: str, arm: str, requests: Sequence[dict[str, Any]], prefill: Sequence[dict[str, int]],
                trace: Optional[dict[str, Any]], S: int, T: int,
                baseline_requests: Optional[Sequence[dict[str, Any]]],
                run: Optional[dict[str, Any]] = None, counts: Optional[dict[str, int]] = None,
                missing: Optional[str] = None) -> dict[str, Any]:
    """One arm's summary. `counts`: prefill rounds / rows / tokens from a server's metrics where the bench has no log
    of it (bench/remote.py); `missing`: why neither is there (those fields are then null, never zero)."""
    ok = [r for r in requests if not r.get("error")]
    lat = [float(r["latency_s"]) for r in ok]
    prompt = sum(int(r["prompt_len"]) for r in requests)
    # The score path's endpoint reports no cached tokens (None): no client reuse, and chunk depth counts one round.
    known = [r for r in ok if r.get("cached_tokens") is not None]
    cached = sum(int(r["cached_tokens"]) for r in known)
    lm: dict[str, Any] = log_metrics(prefill)
    if counts is not None:
        lm.update(counts)
    measured = bool(prefill) or counts is not None
    if missing is not None:
        lm.update(dict.fromkeys(("prefill_rounds", "rows", "tokens"), None))
    depth = max((math.ceil((int(r["prompt_len"]) - int(r["cached_tokens"])) / T) for r in known), default=1)
    bound = max(math.ceil(lm["tokens"] / T), math.ceil(lm["rows"] / S), depth) if measured else None
    t = trace or {}
    agreement = (
        first_token_agreement(requests, baseline_requests)
        if baseline_requests is not None and arm != BASELINE_ARM else None
    )
    span = max((float(r["done_s"]) for r in ok), default=0.0)
    sent: dict[Any, list[float]] = {}
    for r in requests:
        sent.setdefault(r.get("qid"), []).append(float(r.get("sent_s") or 0.0))
    spreads = [1000.0 * (max(v) - min(v)) for v in sent.values() if len(v) > 1]
    return {
        "model": model,
        "workers": int((run or {}).get("workers") or 1),  # servers the workload went to
        "router": (run or {}).get("router") or "none",  # the gateway's policy; `none`: one server, no gateway
        "requests": len(requests),
        "completed": len(ok),
        "errors": len(requests) - len(ok),
        "rounds": lm["prefill_rounds"],
        "prefill_rounds": lm["prefill_rounds"],
        "rows_per_round": _ratio(lm["rows"], lm["prefill_rounds"]) if measured else None,
        "tokens_per_round": _ratio(lm["tokens"], lm["prefill_rounds"]) if measured else None,
        "latency_mean_s": mean(lat),
        "latency_p50_s": percentile(lat, 50),
        "latency_p95_s": percentile(lat, 95),
        "latency_p99_s": percentile(lat, 99),
        "first_selection_wait_mean_s": t.get("first_selection_wait_mean_s"),
        "reuse_ratio": _ratio(cached, prompt) if known else None,
        "token_hit_tokens": t.get("token_hit_tokens"),
        "state_ready_hit_tokens": t.get("state_ready_hit_tokens"),
        "blocked_skips": t.get("blocked_skips"),
        "avoidable_bubbles": t.get("avoidable_bubbles"),
        "host_time_s": t.get("host_time_s"),
        "host_cost_per_round_s": t.get("host_cost_per_round_s"),
        "round_lower_bound": bound,
        "first_token_agreement": agreement,
        # one output token per request: the first token is the whole response
        "ttft_mean_s": mean(lat),
        "ttft_p99_s": percentile(lat, 99),
        "missed_tokens_mean": None,  # agent bench only
        "missed_tokens_p99": None,
        "extra": {  # the log's own view (null for a server whose log the bench does not have)
            "log_cached_tokens": lm["cached"] if prefill else None,
            "log_queue_max": lm["queue_max"] if prefill else None,
            "log_queue_mean": lm["queue_mean"] if prefill else None,
            "log_new_tokens": lm["tokens"] if prefill else None,
            # Server-side: 1 - tokens the server computed / prompt tokens. Unlike cached_tokens this also charges what
            # requests no client sees computed (radixflow's prefix requests), so it is the reuse the model really got.
            "computed_reuse_ratio": (1.0 - lm["tokens"] / prompt) if measured and prompt else None,
            "missing": missing,
            "url": (run or {}).get("url"),
            "trace_rounds": t.get("rounds"),
            "trace_prefill_rounds": t.get("prefill_rounds"),
            "trace_by_kind": t.get("by_kind"),
            "producers": t.get("producers"),
            "adopted_producers": t.get("adopted_producers"),  # in-flight requests adopted (schedule/state.py)
            "completion_span_s": span,
            "throughput_rps": _ratio(len(ok), span),
            "send_spread_ms_mean": mean(spreads),  # first to last sibling send, per question
            "send_spread_ms_max": max(spreads, default=None),
            "loadavg_start": (run or {}).get("loadavg_start"),
            "loadavg_end": (run or {}).get("loadavg_end"),
        },
    }


def cost_identity(base: dict[str, Any], arm: dict[str, Any], baseline_key: str) -> Optional[dict[str, Any]]:
    """T_host,0 − T_host,1 = (K0 − K1)·c̄0 − K1·(c̄1 − c̄0) from the trace's K and T_host (exact)."""
    k0, k1 = base.get("rounds"), arm.get("rounds")
    h0, h1 = base.get("host_time_s"), arm.get("host_time_s")
    if not k0 or not k1 or h0 is None or h1 is None:
        return None
    c0, c1 = h0 / k0, h1 / k1
    gain, drift = (k0 - k1) * c0, k1 * (c1 - c0)
    return {"baseline": baseline_key, "round_gain_s": gain, "cost_drift_s": drift, "total_s": gain - drift}


# ---------------------------------------------------------------- whole run

def server_views(run: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """Each server of a run, with its log and trace: the workers behind a gateway (bench/fleet.py), else the one."""
    if run.get("worker_runs"):
        return list(run["worker_runs"])
    return [{"url": run.get("url"), "log": f"{label}.server.log", "log_start": run.get("log_start", 0),
             "log_end": run.get("log_end"), "trace": f"{label}.trace.jsonl",
             "warmup_last_round": run.get("warmup_last_round", -1)}]


def load_arm(out: Path, model: str, label: str, path: str = "raw") -> dict[str, Any]:
    """Everything saved for one run of an arm (`label`: the arm, or `<arm>@<N>x<router>` behind a gateway), filtered
    to the workload (warm-up excluded). On the score path SGLang names the requests itself: the trace's request
    records of the workload are those released after the warm-up's last round, less health checks and radixflow's
    prefix requests. A gateway run's servers are summed; `split` is its per-worker view."""
    base = out / model
    run = json.loads((base / f"{label}.run.json").read_text())
    requests = read_jsonl(base / f"{label}.requests.jsonl")
    views = server_views(run, label)
    per_server = [parse_prefill_lines(log_window(base / v["log"], v.get("log_start", 0), v.get("log_end")))
                  for v in views]
    rids = {r["rid"] for r in requests}
    rounds: list[dict[str, Any]] = []
    reqs: list[dict[str, Any]] = []
    traces = [(base / v["trace"], int(v.get("warmup_last_round", -1))) for v in views if v.get("trace")]
    traces = [(p, first) for p, first in traces if p.is_file()]
    for trace_path, first in traces:
        records = read_jsonl(trace_path)
        rounds += [r for r in records if r.get("kind") == "round" and int(r["round"]) > first]
        if path == "score":
            reqs += [r for r in request_records(records) if int(r.get("round", -1)) > first
                     and not str(r.get("rid")).startswith("HEALTH_CHECK") and PREFIX_RID_MARK not in str(r.get("rid"))]
        else:
            reqs += [r for r in request_records(records) if r.get("rid") in rids]
    trace = trace_metrics(rounds, reqs) if traces else None
    questions = read_jsonl(base / f"{label}.questions.jsonl")  # frontend paths only
    counts, missing = None, None
    if run.get("url"):  # a server the bench did not start: no log, what its metrics counted if anything
        counts = remote.counted(run.get("metrics_start"), run.get("metrics_end"))
        missing = None if counts is not None else remote.missing_note(run.get("server") or {})
    split = worker_split(requests, views, per_server) if run.get("worker_runs") else None
    return {"run": run, "requests": requests, "prefill": [p for lines in per_server for p in lines], "trace": trace,
            "questions": questions, "counts": counts, "missing": missing, "split": split}


def frontend_metrics(questions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-question view of a frontend path (select / fork): program latency, warm-ups, reuse of the choices."""
    ok = [q for q in questions if not q.get("error")]
    lat = [float(q["latency_s"]) for q in ok]
    choice_prompt = sum(sum(q["choice_prompt_tokens"]) for q in ok)
    choice_cached = sum(sum(q["choice_cached_tokens"]) for q in ok)
    warm = [q for q in ok if q.get("warmup_prompt_tokens") is not None]
    return {
        "path": questions[0]["path"] if questions else None,
        "questions": len(questions), "errors": len(questions) - len(ok),
        "choice_requests": sum(len(q["choice_cached_tokens"]) for q in ok),
        "question_latency_mean_s": mean(lat), "question_latency_p95_s": percentile(lat, 95),
        "choice_reuse_ratio": _ratio(choice_cached, choice_prompt),
        "choice_requests_fully_cached_context": sum(  # choices whose cached prefix reached the warm-up's length - 2
            c >= (q.get("warmup_prompt_tokens") or 0) - 2 for q in warm for c in q["choice_cached_tokens"]),
        "warmup_requests": sum(int(q.get("warmup_requests") or 0) for q in ok),
        "warmup_prompt_tokens": sum(int(q["warmup_prompt_tokens"]) for q in warm),
        "warmup_cached_tokens": sum(int(q["warmup_cached_tokens"]) for q in warm),
    }


def load_run(out: Path) -> tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]:
    """(workload.json, {(model, arm): load_arm(...)}) with arms in the run's model / arm order."""
    workload = json.loads((out / "workload.json").read_text())
    loaded: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(out.glob("*/*.run.json")):
        run = json.loads(path.read_text())
        label = run.get("label", run["arm"])
        loaded[(run["model"], label)] = load_arm(out, run["model"], label, workload.get("path", "raw"))
    if not loaded:
        raise FileNotFoundError(f"{out}: no <model>/<arm>.run.json (not a multi-candidate bench directory?)")
    order = {m: i for i, m in enumerate(workload.get("models", []))}
    arm_order = {a: i for i, a in enumerate(workload.get("arms", []))}
    # each arm's one-server run first, then its gateway run
    keys = sorted(loaded, key=lambda k: (order.get(k[0], 99), k[0], arm_order.get(arm_of(k[1])[0], 99), k[1]))
    return workload, {k: loaded[k] for k in keys}


def build_summary(out: str | Path,
                  run: Optional[tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]] = None) -> dict[str, Any]:
    out = Path(out)
    workload, loaded = run if run is not None else load_run(out)
    budgets = json.loads((out / "budgets.json").read_text())
    S, T = int(budgets["S"]), int(budgets["T"])
    keys = list(loaded)
    arms: dict[str, Any] = {}
    for model, label in keys:
        data = loaded[(model, label)]
        arm, fleet = arm_of(label)
        base = loaded.get((model, BASELINE_ARM + fleet)) or loaded.get((model, BASELINE_ARM))
        summary = arm_summary(
            model, arm, data["requests"], data["prefill"], data["trace"], S, T,
            base["requests"] if base is not None else None, data["run"], data["counts"], data["missing"],
        )
        if data["questions"]:
            summary["extra"]["frontend"] = frontend_metrics(data["questions"])
        if data["split"] is not None:
            summary["extra"]["per_worker"] = data["split"]
        arms[f"{model}/{label}"] = summary
    identity: dict[str, Any] = {}
    for model, label in keys:
        arm, fleet = arm_of(label)
        base_key = COST_BASELINE_ARM + fleet  # against prefix-stop on the same servers
        base = loaded.get((model, base_key))
        if arm == COST_BASELINE_ARM or base is None or base["trace"] is None or loaded[(model, label)]["trace"] is None:
            continue
        ci = cost_identity(base["trace"], loaded[(model, label)]["trace"], f"{model}/{base_key}")
        if ci is not None:
            identity[f"{model}/{label}"] = ci
    return {
        "kind": "multi-candidate",
        "workload": workload,
        "budgets": {"S": S, "T": T, "calibrated_on": budgets["calibrated_on"]},
        "arms": arms,
        "cost_identity": identity,
    }


def write_report(out: str | Path, with_figures: bool = True) -> dict[str, Any]:
    """(Re)build DIR/summary.json, DIR/report.md and the figures from DIR's saved records (logs, traces, requests)."""
    out = Path(out)
    run = load_run(out)
    summary = build_summary(out, run)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    detail = json.loads((out / "budgets.json").read_text())
    if with_figures:
        from sglang_radixflow.bench import figures  # matplotlib, only when drawing

        figs = [p.name for p in figures.multi_candidate_figures(out, summary, run[1], baseline=BASELINE_ARM)]
    else:
        figs = []
    (out / "report.md").write_text(report_md.format_report(summary, detail, figs))
    return summary


if __name__ == "__main__":  # python -m sglang_radixflow.bench.report DIR
    import sys

    write_report(sys.argv[1])
    print((Path(sys.argv[1]) / "report.md").read_text())
