"""summary.json / report.md of the multi-candidate bench, built from a small fake run directory (saved records only)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_radixflow.bench import report, report_md

CONTRACT_ARM_KEYS = {
    "model", "requests", "completed", "errors", "rounds", "prefill_rounds", "rows_per_round", "tokens_per_round",
    "latency_mean_s", "latency_p50_s", "latency_p95_s", "latency_p99_s", "first_selection_wait_mean_s", "reuse_ratio",
    "token_hit_tokens", "state_ready_hit_tokens", "blocked_skips", "avoidable_bubbles", "host_time_s",
    "host_cost_per_round_s", "round_lower_bound", "first_token_agreement", "ttft_mean_s", "ttft_p99_s",
    "missed_tokens_mean", "missed_tokens_p99", "workers", "router",
}
S, T = 4, 100
RIDS = ["q00000-b0", "q00000-b1", "q00001-b0", "q00001-b1"]


def _line(seqs: int, new: int, cached: int, queue: int = 0) -> str:
    # the format of SGLang 0.5.23's metrics_reporter.report_prefill_stats (hybrid model, CPU)
    return (
        f"[2026-11-30 06:48:33] Prefill batch, #new-seq: {seqs}, #new-token: {new}, #cached-token: {cached}, "
        f"full token usage: 0.00, mamba usage: 0.00, #running-req: 0, #queue-req: {queue}, #pending-token: 0, "
        f"cpu graph: False, input throughput (token/s): 12.34\n"
    )


def _request(rid: str, latency: float | None, cached: int, out: int, error: str | None = None) -> dict:
    return {
        "rid": rid, "qid": int(rid[1:6]), "branch": int(rid[-1]), "prompt_len": 50, "arrival_s": 0.0, "sent_s": 0.0,
        "done_s": (latency or 0.0) + 1.0, "latency_s": latency, "cached_tokens": None if error else cached,
        "token_hit": None, "state_hit": None, "output_ids": [] if error else [out], "error": error,
    }


def _round(n: int, kind: str, rows: int, tokens: int, host: float, **extra: object) -> dict:
    return {"kind": "round", "round": n, "kind_of_round": kind, "rows": rows, "tokens": tokens, "host_time_s": host,
            **extra}


def _arm(base: Path, arm: str, requests: list[dict], lines: list[str], trace: list[dict] | None) -> None:
    warm = _line(1, 999, 0, queue=77)  # warm-up: before the workload window, must not count
    late = _line(9, 999, 0, queue=88)  # after the window
    body = "".join(lines)
    (base / f"{arm}.server.log").write_text("boot...\n" + warm + body + late)
    start = len(("boot...\n" + warm).encode())
    run = {"model": "nemotron_h", "arm": arm, "log_start": start, "log_end": start + len(body.encode()),
           "warmup_last_round": 3 if trace is not None else -1}
    (base / f"{arm}.run.json").write_text(json.dumps(run))
    report.write_jsonl(base / f"{arm}.requests.jsonl", requests)
    if trace is not None:
        report.write_jsonl(base / f"{arm}.trace.jsonl", trace)


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "workload.json").write_text(json.dumps({
        "questions": 2, "stream": "mixed", "order": "forward", "rate": 1.0, "seed": 0, "requests": 4,
        "prompt_tokens": 200, "ideal_reuse_ratio": 0.75, "models": ["nemotron_h"],
        "arms": ["sglang", "prefix-stop", "radixflow"],
    }))
    (tmp_path / "budgets.json").write_text(json.dumps({"S": S, "T": T, "calibrated_on": "fixed", "calibration": []}))
    base = tmp_path / "nemotron_h"
    base.mkdir()
    _arm(base, "sglang",
         [_request(r, lat, c, o) for r, lat, c, o in zip(RIDS, [0.1, 0.2, 0.3, 0.4], [0, 0, 40, 40], [5, 6, 7, 8])],
         [_line(2, 100, 0, queue=2), _line(2, 20, 80)], None)
    warmup_trace = [_round(n, "prefill", 1, 10, 5.0) for n in (1, 2, 3)] + [
        {"kind": "request", "rid": "warmup-0", "prompt_len": 9, "token_hit": 9, "state_hit": 9, "cached_tokens": 0,
         "round": 2}]
    ps_requests = [_request(RIDS[0], 1.0, 0, 5), _request(RIDS[1], 2.0, 45, 6), _request(RIDS[2], 3.0, 45, 9),
                   _request(RIDS[3], None, 0, 0, error="HTTP 500: boom")]
    _arm(base, "prefix-stop", ps_requests, [_line(1, 50, 0), _line(1, 5, 45, queue=3), _line(1, 5, 45)],
         warmup_trace + [
             _round(4, "prefill", 1, 50, 0.1, blocked_skips=1, avoidable_bubble=True, producers=1,
                    first_selection_wait_s=[0.5]),
             _round(5, "prefill", 1, 5, 0.1, blocked_skips=0, avoidable_bubble=False, first_selection_wait_s=[1.5]),
             _round(6, "idle", 0, 0, 9.0),
             _round(7, "prefill", 1, 5, 0.1, blocked_skips=0, avoidable_bubble=False, first_selection_wait_s=[]),
         ] + [{"kind": "request", "rid": r, "prompt_len": 50, "token_hit": 45, "state_hit": h, "cached_tokens": h,
               "round": 5} for r, h in zip(RIDS[:3], [0, 45, 45])])
    _arm(base, "radixflow",
         [_request(r, 0.5, c, o) for r, c, o in zip(RIDS, [0, 45, 45, 45], [5, 6, 7, 8])],
         [_line(1, 50, 0), _line(3, 15, 135)],
         warmup_trace + [
             _round(4, "prefill", 1, 50, 0.1, blocked_skips=2, avoidable_bubble=False, producers=1,
                    first_selection_wait_s=[0.2]),
             _round(5, "prefill", 3, 15, 0.2, blocked_skips=0, avoidable_bubble=False,
                    first_selection_wait_s=[0.4, 0.4, 0.4]),
         ] + [{"kind": "request", "rid": r, "prompt_len": 50, "token_hit": 45, "state_hit": h, "cached_tokens": h,
               "round": 5} for r, h in zip(RIDS, [0, 45, 45, 45])])
    return tmp_path


def test_summary_follows_the_contract(run_dir: Path) -> None:
    summary = report.write_report(run_dir)
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert summary["kind"] == "multi-candidate"
    assert summary["workload"]["ideal_reuse_ratio"] == 0.75 and summary["workload"]["seed"] == 0
    assert summary["budgets"] == {"S": S, "T": T, "calibrated_on": "fixed"}
    assert list(summary["arms"]) == ["nemotron_h/sglang", "nemotron_h/prefix-stop", "nemotron_h/radixflow"]
    for arm in summary["arms"].values():
        assert set(arm) - {"extra"} == CONTRACT_ARM_KEYS
        assert arm["model"] == "nemotron_h"
    assert set(summary["cost_identity"]) == {"nemotron_h/radixflow"}


def test_numbers_come_from_the_workload_window_and_the_right_source(run_dir: Path) -> None:
    arms = report.write_report(run_dir)["arms"]
    sg, ps, rf = arms["nemotron_h/sglang"], arms["nemotron_h/prefix-stop"], arms["nemotron_h/radixflow"]
    # log: only lines inside the window (warm-up and trailing lines excluded)
    assert (sg["rounds"], sg["prefill_rounds"]) == (2, 2)
    assert sg["rows_per_round"] == 2.0 and sg["tokens_per_round"] == 60.0
    assert sg["extra"]["log_queue_max"] == 2
    assert ps["rounds"] == 3 and ps["tokens_per_round"] == pytest.approx(20.0)
    # client: latency over completed requests, errors counted, reuse over all prompt tokens
    assert sg["latency_mean_s"] == pytest.approx(0.25)
    assert sg["latency_p50_s"] == pytest.approx(0.25)
    assert sg["latency_p95_s"] == pytest.approx(0.385)
    assert sg["ttft_mean_s"] == sg["latency_mean_s"]
    assert sg["reuse_ratio"] == pytest.approx(80 / 200)
    assert (ps["requests"], ps["completed"], ps["errors"]) == (4, 3, 1)
    assert ps["reuse_ratio"] == pytest.approx(90 / 200)
    # the sglang arm has no radixflow trace: trace fields are null, agreement is null for the reference itself
    for key in ("first_selection_wait_mean_s", "token_hit_tokens", "state_ready_hit_tokens", "blocked_skips",
                "avoidable_bubbles", "host_time_s", "host_cost_per_round_s", "first_token_agreement"):
        assert sg[key] is None, key
    assert sg["missed_tokens_mean"] is None and sg["missed_tokens_p99"] is None
    # trace: warm-up rounds/requests excluded, idle rounds not counted in K or host time
    assert ps["blocked_skips"] == 1 and ps["avoidable_bubbles"] == 1
    assert ps["host_time_s"] == pytest.approx(0.3) and ps["extra"]["trace_rounds"] == 3
    assert ps["first_selection_wait_mean_s"] == pytest.approx(1.0)
    assert ps["token_hit_tokens"] == 135 and ps["state_ready_hit_tokens"] == 90
    assert rf["first_selection_wait_mean_s"] == pytest.approx(0.35)
    assert rf["state_ready_hit_tokens"] == 135 and rf["blocked_skips"] == 2
    # first-token agreement vs sglang over requests completed in both
    assert ps["first_token_agreement"] == pytest.approx(2 / 3)
    assert rf["first_token_agreement"] == 1.0
    # lower bound: max(ceil(W/T), ceil(V/S), max ceil((prompt - cached)/T)) = max(2, 1, 1)
    assert sg["round_lower_bound"] == 2


def test_cost_identity_is_exact(run_dir: Path) -> None:
    ci = report.write_report(run_dir)["cost_identity"]["nemotron_h/radixflow"]
    assert ci["baseline"] == "nemotron_h/prefix-stop"
    # K0 = 3, T0 = 0.3 (c0 = 0.1); K1 = 2, T1 = 0.3 (c1 = 0.15)
    assert ci["round_gain_s"] == pytest.approx(0.1)
    assert ci["cost_drift_s"] == pytest.approx(0.1)
    assert ci["total_s"] == pytest.approx(0.3 - 0.3)


def test_report_md_has_a_table_row_per_arm(run_dir: Path) -> None:
    report.write_report(run_dir)
    text = (run_dir / "report.md").read_text()
    assert "## nemotron_h" in text
    for arm in ("sglang", "prefix-stop", "radixflow"):
        assert f"| {arm} | 4 |" in text
    assert "| prefix-stop | 4 | 3 | 1 | 3 | 3 |" in text
    assert "75.00%" in text  # ideal reuse in every row
    header = report_md.TABLE_HEAD
    rows = [line for line in text.splitlines() if line.startswith("| radixflow | 4 |")]
    assert rows and rows[0].count("|") == header.count("|")
    assert "lengths x" not in text  # default document lengths: nothing to say
    workload = json.loads((run_dir / "workload.json").read_text())
    (run_dir / "workload.json").write_text(json.dumps({**workload, "doc_scale": 0.25}))
    report.write_report(run_dir)
    assert "lengths x0.25 of the default" in (run_dir / "report.md").read_text()


def test_percentile_and_log_parsing() -> None:
    assert report.percentile([], 50) is None
    assert report.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert report.percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    parsed = report.parse_prefill_lines(_line(6, 818, 4800, queue=3) + "Decode batch, #running-req: 1\n")
    assert parsed == [{"seqs": 6, "new": 818, "cached": 4800, "running": 0, "queue": 3}]


def test_a_retracted_request_counts_once_with_its_last_admission(run_dir: Path) -> None:
    """SGLang's decode retraction releases a request before requeueing it, so the trace holds a record per release:
    the hits come from each request's last record (the admission that finished it), not from every release."""
    path = run_dir / "nemotron_h" / "radixflow.trace.jsonl"
    records = report.read_jsonl(path)
    before = report.write_report(run_dir)["arms"]["nemotron_h/radixflow"]
    # RIDS[1] was admitted with no hit, retracted during decode, then readmitted with its 45-token hit
    retracted = {"kind": "request", "rid": RIDS[1], "prompt_len": 50, "token_hit": 30, "state_hit": 0,
                 "cached_tokens": 0, "round": 4, "retractions": 0}
    report.write_jsonl(path, records[:-4] + [retracted] + records[-4:])
    after = report.write_report(run_dir)["arms"]["nemotron_h/radixflow"]
    assert after["token_hit_tokens"] == before["token_hit_tokens"] == 180
    assert after["state_ready_hit_tokens"] == before["state_ready_hit_tokens"] == 135
    kept = report.request_records(report.read_jsonl(path))
    assert [r["rid"] for r in kept] == ["warmup-0", *RIDS] and kept[2]["state_hit"] == 45
