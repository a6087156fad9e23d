"""report.md of a multi-candidate bench run, from its summary.json (bench/report.py builds the summary)."""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from sglang_radixflow.bench.fleet import SPLIT_HEAD, split_lines


def _adopted(extra: dict[str, Any]) -> str:
    """The producers cell's suffix: in-flight requests adopted as producers, when any were."""
    adopted = extra.get("adopted_producers")
    return f" (+{adopted} adopted)" if adopted else ""


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return fmt.format(x)
    return str(x)


def overlap_note(setting: str) -> str:
    """Runs before the setting was recorded had SGLang's default: on, except for no_buffer hybrids."""
    if setting == "off":
        return "off (`--disable-overlap-schedule`)"
    return "on (no_buffer hybrids: off, as SGLang requires)"


def _doc_scale_note(scale: Any) -> str:
    """Runs with shortened documents say so (runs before --doc-scale have no key: scale 1)."""
    return "" if scale in (None, 1) else f", lengths x{scale:g} of the default"


def _server_args_note(args: Optional[Sequence[str]]) -> str:
    """Extra server flags of the run (--server-args), when there were any."""
    return f", extra server flags `{' '.join(args)}`" if args else ""


def _servers_note(w: dict[str, Any]) -> str:
    pairs = ", ".join(f"`{arm}` at {url}" for arm, url in zip(w.get("arms", []), w.get("urls", [])))
    return (f"Servers: already running, not started by the bench ({pairs}); budgets and cache settings are theirs "
            "(each arm's run.json records its /server_info).")


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{100 * x:.2f}%"


TABLE_HEAD = (
    "| arm | requests | completed | errors | rounds | prefill rounds | rows/round | tokens/round | latency mean s | "
    "p50 s | p95 s | reuse | computed reuse | ideal reuse | first-sel. wait s | blocked skips | avoidable bubbles | host time s | "
    "first-token agreement vs sglang |"
)


def format_report(summary: dict[str, Any], budgets_detail: Optional[dict[str, Any]] = None,
                  figures: Sequence[str] = ()) -> str:
    w = summary["workload"]
    b = summary["budgets"]
    ideal = w.get("ideal_reuse_ratio")
    # Runs before the running set was widened to 2S used S (no key in their workload.json).
    k = int(w.get("max_running_per_row_budget") or 1)
    running = f"{k}S, room for a round still in flight when the overlap scheduler is on" if k > 1 else "S"
    lines = [
        "# Multi-candidate scoring bench",
        "",
        f"Workload: {w.get('questions')} questions "
        + (f"x {w.get('candidates', 4)} candidates" if w.get("candidates") != "varies" else "(candidates vary)")
        + (" + the anchor (document + question alone)" if w.get("anchor") else "")
        + f" = {w.get('requests')} requests, "
        + (f"from `{w['source']}`" if w.get("source") else f"stream `{w.get('stream')}`, order `{w.get('order')}`")
        + f", Poisson {w.get('rate')} questions/s, seed {w.get('seed')}; "
        f"{w.get('documents')} documents (mean {_f(w.get('mean_doc_len'), '{:.0f}')} tokens"
        f"{_doc_scale_note(w.get('doc_scale'))}), "
        f"{w.get('prompt_tokens')} prompt tokens, ideal reuse ratio {_pct(ideal)}.",
        f"Budgets: S = {b['S']} rows (`--prefill-max-requests`; `--max-running-requests` "
        f"{running}), T = {b['T']} tokens "
        f"(`--chunked-prefill-size`, `--max-prefill-tokens`); calibrated on: {b['calibrated_on']}.",
        _servers_note(w) if w.get("urls") else (
            "Servers: one fresh server per arm, " + (f"`--max-total-tokens {w['kv_tokens']}`" if w.get("kv_tokens")
                                                     else "SGLang's own KV pool size") + ", "
            f"OMP_NUM_THREADS={w.get('server_threads') or 'torch default'}, hybrids with "
            f"`--mamba-radix-cache-strategy {w.get('hybrid_strategy', 'no_buffer')}`, SGLang's overlap scheduler "
            f"{overlap_note(w.get('overlap_schedule', 'on'))}{_server_args_note(w.get('server_args'))}; each "
            "question's branches are released together by the client (see the sibling send spread)."),
        "",
    ]
    if w.get("path") == "score":
        lines += [
            "Path `score`: one call of SGLang's `/v1/score` per question (query = document + question, items = its 4 "
            "candidates, two label tokens), which SGLang sends on as one request per item. Each item is a request of "
            "the tables below with its question's latency; the endpoint reports no cached tokens, so client reuse is "
            "— and computed reuse is the measure; first-token agreement compares each item's best label.",
            "",
        ]
    models = []
    for key, a in summary["arms"].items():
        if a["model"] not in models:
            models.append(a["model"])
    for model in models:
        lines += [f"## {model}", "", TABLE_HEAD, "|" + "---|" * (TABLE_HEAD.count("|") - 1)]
        for key, a in summary["arms"].items():
            if a["model"] != model:
                continue
            arm = key.split("/", 1)[1]
            lines.append(
                f"| {arm} | {a['requests']} | {a['completed']} | {a['errors']} | {a['rounds']} | {a['prefill_rounds']} | "
                f"{_f(a['rows_per_round'], '{:.2f}')} | {_f(a['tokens_per_round'], '{:.1f}')} | "
                f"{_f(a['latency_mean_s'])} | {_f(a['latency_p50_s'])} | {_f(a['latency_p95_s'])} | "
                f"{_pct(a['reuse_ratio'])} | {_pct(a['extra'].get('computed_reuse_ratio'))} | {_pct(ideal)} | "
                f"{_f(a['first_selection_wait_mean_s'], '{:.4f}')} | "
                f"{_f(a['blocked_skips'])} | {_f(a['avoidable_bubbles'])} | {_f(a['host_time_s'])} | "
                f"{_pct(a['first_token_agreement'])} |"
            )
        lines += ["", "Cross-checks and extras:", "",
                  "| arm | trace rounds (by kind) | log queue max / mean | token hits ĥ | state-ready hits h | "
                  "producers | round lower bound | p99 s | throughput req/s | sibling send spread ms mean / max | "
                  "load avg start / end |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, a in summary["arms"].items():
            if a["model"] != model:
                continue
            e = a["extra"]
            kinds = e.get("trace_by_kind")
            lines.append(
                f"| {key.split('/', 1)[1]} | {_f(e.get('trace_rounds'))}"
                f"{' ' + json.dumps(kinds) if kinds else ''} | {e.get('log_queue_max')} / "
                f"{_f(e.get('log_queue_mean'), '{:.1f}')} | {_f(a['token_hit_tokens'])} | "
                f"{_f(a['state_ready_hit_tokens'])} | {_f(e.get('producers'))}{_adopted(e)} | {_f(a['round_lower_bound'])} | "
                f"{_f(a['latency_p99_s'])} | {_f(e.get('throughput_rps'), '{:.2f}')} | "
                f"{_f(e.get('send_spread_ms_mean'), '{:.2f}')} / {_f(e.get('send_spread_ms_max'), '{:.2f}')} | "
                f"{_f(e.get('loadavg_start'), '{:.1f}')} / {_f(e.get('loadavg_end'), '{:.1f}')} |"
            )
        for key, a in summary["arms"].items():
            if a["model"] == model and a["extra"].get("missing"):
                lines.append(f"Not measured for `{key.split('/', 1)[1]}` ({a['extra'].get('url')}): "
                             f"{a['extra']['missing']}.")
        lines.append("")
    splits = {k: a["extra"]["per_worker"] for k, a in summary["arms"].items() if a["extra"].get("per_worker")}
    if splits:
        lines += ["## Several servers (per worker)", "",
                  "Runs named `<arm>@<N>x<router>` sent the workload through SGLang's gateway (`smg`) to N workers "
                  "with that routing policy, each request keyed by its document (`X-SMG-Routing-Key`, which only "
                  "`manual` reads); the worker is the one the gateway's response names. The arm's own row above is one "
                  "server (the reference). Computed reuse per worker = 1 − tokens the worker computed / prompt tokens "
                  "of the requests it served.", "", SPLIT_HEAD]
        for key, split in splits.items():
            lines += split_lines(key, split)
        lines.append("")
    fe = {k: a["extra"]["frontend"] for k, a in summary["arms"].items() if a.get("extra", {}).get("frontend")}
    if fe:
        lines += [f"## Frontend path (`{w.get('path')}`: one sgl.function program per question via sgl.RuntimeEndpoint)",
                  "", "Reuse here = Σ cached / Σ prompt tokens of the choice requests (ideal "
                  f"{_pct(ideal)}; the token workload's own ideal: {_pct(w.get('token_workload_ideal_reuse_ratio'))}). "
                  "Warm-up = the cache-only request (max_new_tokens=0) that select / fork send with the shared context "
                  "first.", "",
                  "| arm | questions | errors | question latency mean s | p95 s | choice reuse | choices reusing the "
                  "context | warm-ups | warm-up cached / prompt tokens |", "|---|---|---|---|---|---|---|---|---|"]
        for key, f in fe.items():
            lines.append(
                f"| {key} | {f['questions']} | {f['errors']} | {_f(f['question_latency_mean_s'])} | "
                f"{_f(f['question_latency_p95_s'])} | {_pct(f['choice_reuse_ratio'])} | "
                f"{f['choice_requests_fully_cached_context']} / {f['choice_requests']} | "
                f"{f['warmup_requests']} | {f['warmup_cached_tokens']} / {f['warmup_prompt_tokens']} |")
        lines.append("")
    if summary["cost_identity"]:
        lines += ["## Cost identity (trace K and host time, against prefix-stop)", "",
                  "| arm | baseline | round gain s | cost drift s | T_host,0 − T_host,1 s |", "|---|---|---|---|---|"]
        for key, ci in summary["cost_identity"].items():
            lines.append(f"| {key} | {ci['baseline']} | {ci['round_gain_s']:.4f} | {ci['cost_drift_s']:.4f} | "
                         f"{ci['total_s']:.4f} |")
        lines.append("")
    if budgets_detail and budgets_detail.get("calibration"):
        lines += ["## Budget calibration (sglang arm, held-out questions)", "",
                  "| S | T | mean latency s | prefill rounds | chosen |", "|---|---|---|---|---|"]
        for c in budgets_detail["calibration"]:
            chosen = "yes" if (c["S"], c["T"]) == (b["S"], b["T"]) else ""
            lines.append(f"| {c['S']} | {c['T']} | {_f(c.get('latency_mean_s'))} | {_f(c.get('prefill_rounds'))} | "
                         f"{chosen} |")
        lines.append("")
    if figures:
        lines += ["## Figures", "",
                  "Rounds and latency per arm against `sglang`, and round gain vs cost drift (paper's Figure 3); "
                  "round fullness (rows / S per prefill round, from SGLang's log) and latency distributions per arm "
                  "(paper's Figure 4).", ""]
        lines += [f"![{name}]({name})" for name in figures] + [""]
    lines += [
        "## Where the numbers come from",
        "",
        "- rounds / prefill rounds / rows per round / tokens per round: SGLang's `Prefill batch` log lines of the "
        "workload window, parsed identically for every arm. Every request generates one token, so every worker call "
        "is a prefill round (`rounds` = `prefill_rounds`); the radixflow trace's own K is shown as a cross-check.",
        "- computed reuse = 1 − Σ new tokens of SGLang's `Prefill batch` lines / Σ prompt tokens: the server's own count, "
        "which also charges the tokens of radixflow's prefix requests (a hybrid producer's first b tokens computed as "
        "their own request, whose cached_tokens no client sees).",
        "- latency (client send to response), reuse ratio (Σ meta_info.cached_tokens / Σ prompt tokens), errors: the "
        "open-loop client. TTFT = latency (one output token).",
        "- `sglang` arm (SGLang's default cache, no radixflow trace): first-selection wait, token / state-ready hits, "
        "blocked skips, avoidable bubbles, host time and host cost per round are null — only the radixflow backend "
        "records them. First-token agreement is null for `sglang` itself (it is the reference).",
        "- avoidable bubbles are counted where certain (prefix-stop stopped on a Blocked request while rows were left "
        "and a later waiting request had no blocking promise); the skip arms cannot have that kind.",
        "- round lower bound: max(⌈W/T⌉, ⌈V/S⌉, D) over the fragments the arm executed; it ignores arrival times.",
        "- missed tokens: agent bench only (null).",
        "- timings (latency, host time) are wall-clock on the machine as it was: the 1-minute load average at the start "
        "and end of each arm's workload is listed; on a shared small CPU compare arms with that in mind.",
        "",
    ]
    return "\n".join(lines)


