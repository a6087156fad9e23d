"""Several servers: `radixflow bench multi-candidate --workers 2` starts two radixflow workers behind SGLang's gateway
(`smg`, `manual`: each request keyed by its document) and sends the workload through it. Each question's siblings
reach one worker, where the consumers reuse the state its producer published; every output equals a single native
server's; neither worker leaks a KV or mamba slot (SGLang's idle check kills a scheduler that does); the workers and
the gateway are stopped. The agent bench through the gateway deals trajectories evenly and keeps each on its worker."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from sglang_radixflow import cli
from sglang_radixflow.bench.report import read_jsonl
from sglang_radixflow.bench.server import SGLangServer, live_servers
from sglang_radixflow.bench.workloads import WorkloadParams, make_workload

QUESTIONS = 6
LEAK = "memory leak detected"


def test_siblings_share_one_workers_producer_and_answer_as_native_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dirs: dict[str, Path]) -> None:
    # float32 (conv state too): outputs compared exactly, not bf16's near-tie flips
    monkeypatch.setenv("SGLANG_MAMBA_CONV_DTYPE", "float32")
    # Through the gateway on a busy 2-core CPU, siblings sent together have reached their worker 7 ms apart; with the
    # 5 ms hold the first then runs alone and computes the document itself. A 50 ms hold gathers them (it ends as soon
    # as the siblings' tokens fill the round).
    monkeypatch.setenv("RADIXFLOW_HOLD_MS", "50")
    out = tmp_path / "gateway"
    before = set(live_servers())
    assert cli.main(["bench", "multi-candidate", "--out", str(out), "--models", "nemotron_h", "--arms", "radixflow",
                     "--workers", "2", "--router", "manual", "--no-reference", "--questions", str(QUESTIONS),
                     "--budgets", "16,2048", "--server-args", "--dtype float32",
                     "--models-root", str(model_dirs["nemotron_h"].parent)]) == 0
    assert set(live_servers()) == before  # both workers and the gateway stopped

    # manual, not cache_aware: smg's cache_aware tree is approximate, and under load it has split a cold document's
    # siblings, released within a millisecond, 2 / 2 over the workers; the routing key pins them every time
    label = "radixflow@2xmanual"
    arm = json.loads((out / "summary.json").read_text())["arms"][f"nemotron_h/{label}"]
    assert (arm["workers"], arm["router"], arm["errors"]) == (2, "manual", 0)
    run = json.loads((out / "nemotron_h" / f"{label}.run.json").read_text())
    assert len(run["worker_runs"]) == 2 and run["gateway"]["smg_version"] == "1.13.0"
    records = read_jsonl(out / "nemotron_h" / f"{label}.requests.jsonl")
    table = {r["rid"]: r for r in read_jsonl(out / "workload.requests.jsonl")}
    urls = {w["url"] for w in run["worker_runs"]}

    by_question: dict[int, set[str]] = defaultdict(set)
    for r in records:
        assert r["worker"] in urls, r  # every response names the worker that served it
        by_question[r["qid"]].add(r["worker"])
        # the document's state was ready when it ran: computed once on this worker, by its producer
        assert r["state_hit"] >= table[r["rid"]]["doc_len"], r
    assert all(len(workers) == 1 for workers in by_question.values()), dict(by_question)

    split = arm["extra"]["per_worker"]
    assert sorted(w["url"] for w in split) == sorted(urls)
    assert sum(w["requests"] for w in split) == len(records) == arm["requests"]
    for w in split:  # each worker's share agrees with its own log, and it reused what it served more than once
        if w["requests"]:
            assert 0 < w["computed_tokens"] < w["prompt_tokens"] and w["prefill_rounds"] >= 1, w

    for view in run["worker_runs"]:
        assert view["server_exit"] is None, view  # alive after the workload: no scheduler died
        assert LEAK not in (out / "nemotron_h" / view["log"]).read_text(errors="replace"), view

    # the same requests on one native server: the same first tokens
    requests = make_workload(WorkloadParams(questions=QUESTIONS)).requests()
    assert [r.rid for r in requests] == [r["rid"] for r in records]
    answers = {r["rid"]: r["output_ids"] for r in records}
    with SGLangServer(str(model_dirs["nemotron_h"]), radix_cache=None, extra_args=["--dtype", "float32"]) as native:
        for req in requests:
            got = native.post("/generate", {"input_ids": list(req.input_ids),
                                            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
            assert got["output_ids"] == answers[req.rid], req.rid


def test_agent_trajectories_are_dealt_evenly_and_stay_on_their_worker(
        tmp_path: Path, model_dirs: dict[str, Path]) -> None:
    """`radixflow bench agent --workers 2` routes by trajectory by default (smg's round_robin with sticky sessions,
    keyed by X-SMG-Routing-Key): new trajectories alternate between the workers, every later turn returns to the
    worker that holds the trajectory's history, and each worker serves as many as one server would."""
    out = tmp_path / "agents"
    before = set(live_servers())
    assert cli.main(["bench", "agent", "--quick", "--models", "nemotron_h", "--policies", "rr", "--seeds", "1",
                     "--turns", "3", "--workers", "2", "--no-reference", "--out", str(out),
                     "--models-root", str(model_dirs["nemotron_h"].parent)]) == 0
    assert set(live_servers()) == before

    label = "rr@2xsticky_round_robin"
    summary = json.loads((out / "summary.json").read_text())
    arm = summary["arms"][f"nemotron_h/{label}"]
    assert (arm["workers"], arm["router"], arm["errors"]) == (2, "sticky_round_robin", 0)
    records = read_jsonl(out / "nemotron_h" / label / "requests.jsonl")
    workers_of: dict[int, set[str]] = defaultdict(set)
    for r in records:
        workers_of[r["agent"]].add(r["worker"])
    assert all(len(w) == 1 for w in workers_of.values()), dict(workers_of)  # sticky: one worker per trajectory
    agents = summary["workload"]["agents"]  # one server's agents; the gateway run serves twice as many
    assert len(workers_of) == 2 * agents
    assert sorted(w["agents"] for w in arm["per_worker"]) == [agents, agents]
    assert arm["idle_leak_reported"] is False
