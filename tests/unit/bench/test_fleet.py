"""Runs through SGLang's gateway (bench/fleet.py): run labels, the per-worker split, and the multi-candidate and agent
summaries of a saved gateway run next to its one-server reference (saved records only; the live run is
tests/integration/test_gateway.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sglang_radixflow.bench import agent, agent_cli, gateway, report
from sglang_radixflow.bench.agent_workload import AgentParams, make_agent_workload
from sglang_radixflow.bench.fleet import Fleet, arm_of, worker_split
from tests.unit.bench.test_summary import CONTRACT_ARM_KEYS, _line, _request

W0, W1 = "http://127.0.0.1:1001", "http://127.0.0.1:1002"


def test_labels_name_the_arm_the_workers_and_the_router() -> None:
    assert Fleet().label("radixflow") == "radixflow" and not Fleet().gateway
    fleet = Fleet(2, "cache_aware")
    assert fleet.label("radixflow") == "radixflow@2xcache_aware" and fleet.gateway
    assert arm_of("radixflow@2xcache_aware") == ("radixflow", "@2xcache_aware")
    assert arm_of("prefix-stop") == ("prefix-stop", "")
    allowed = "cache_aware, round_robin, power_of_two, manual, sticky_round_robin"
    with pytest.raises(ValueError, match=f"--router nearest; allowed: {allowed}"):
        Fleet(2, "nearest")


def test_manual_routing_balances_new_keys_and_router_args_come_last(tmp_path: Path) -> None:
    manual = gateway.Gateway(["http://w0", "http://w1"], "manual", tmp_path / "g.log", ("--assignment-mode", "random"))
    cmd = manual.command()
    assert cmd[cmd.index("--policy") + 1] == "manual"
    # the bench's min_group first, the user's own flags after it (smg keeps the last)
    assert cmd[-4:] == ["--assignment-mode", "min_group", "--assignment-mode", "random"]
    assert "--assignment-mode" not in gateway.Gateway(["http://w0"], "cache_aware", tmp_path / "g.log").command()


def test_sticky_round_robin_is_smgs_round_robin_with_sticky_sessions(tmp_path: Path) -> None:
    cmd = gateway.Gateway(["http://w0", "http://w1"], "sticky_round_robin", tmp_path / "g.log").command()
    assert cmd[cmd.index("--policy") + 1] == "round_robin"
    assert "--sticky-sessions" in cmd
    assert "--sticky-sessions" not in gateway.Gateway(["http://w0"], "round_robin", tmp_path / "g.log").command()
    assert Fleet(2, "sticky_round_robin").label("rr") == "rr@2xsticky_round_robin"


def test_missing_gateway_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValueError, match=r'pip install -e "\.\[scale\]" \(installs smg==1\.13\.0\)'):
        gateway.smg_executable()


def test_worker_split_counts_each_workers_requests_and_its_own_log() -> None:
    reqs = [dict(_request(f"q0000{i}-b0", 0.1, 0, 5), worker=w) for i, w in enumerate([W0, W0, W1])]
    reqs.append(dict(_request("q00009-b0", None, 0, 0, error="HTTP 404: no worker"), worker=None))
    views = [{"url": W0}, {"url": W1}]
    lines = [report.parse_prefill_lines(_line(2, 60, 40)), report.parse_prefill_lines(_line(1, 50, 0) + _line(1, 5, 0))]
    split = worker_split(reqs, views, lines)
    assert split[0] == {"url": W0, "requests": 2, "errors": 0, "prompt_tokens": 100, "prefill_rounds": 1,
                        "computed_tokens": 60, "computed_reuse_ratio": pytest.approx(0.4)}
    assert (split[1]["requests"], split[1]["prefill_rounds"], split[1]["computed_tokens"]) == (1, 2, 55)
    assert split[1]["computed_reuse_ratio"] < 0  # more computed than its prompts: shown, not hidden
    assert split[2] == {"url": None, "requests": 1, "errors": 1}


def _gateway_run(base: Path, label: str, requests: list[dict], logs: list[str]) -> None:
    views = []
    for i, body in enumerate(logs):
        (base / f"{label}.w{i}.server.log").write_text("boot\n" + body)
        views.append({"url": [W0, W1][i], "log": f"{label}.w{i}.server.log", "log_start": 5,
                      "log_end": 5 + len(body.encode()), "trace": None, "warmup_last_round": -1, "server_exit": None})
    arm = arm_of(label)[0]
    (base / f"{label}.run.json").write_text(json.dumps(
        {"model": "nemotron_h", "arm": arm, "label": label, "workers": 2, "router": "cache_aware",
         "worker_runs": views}))
    report.write_jsonl(base / f"{label}.requests.jsonl", requests)


def test_multi_candidate_summary_sums_the_workers_and_keeps_the_reference(tmp_path: Path) -> None:
    (tmp_path / "workload.json").write_text(json.dumps({
        "questions": 1, "requests": 2, "prompt_tokens": 100, "ideal_reuse_ratio": 0.5, "models": ["nemotron_h"],
        "arms": ["sglang"], "workers": 2, "router": "cache_aware"}))
    (tmp_path / "budgets.json").write_text(json.dumps({"S": 4, "T": 100, "calibrated_on": "fixed"}))
    base = tmp_path / "nemotron_h"
    base.mkdir()
    one = [_request("q00000-b0", 0.1, 0, 5), _request("q00000-b1", 0.1, 40, 6)]
    (base / "sglang.server.log").write_text(_line(1, 50, 0) + _line(1, 10, 40))
    (base / "sglang.run.json").write_text(json.dumps({"model": "nemotron_h", "arm": "sglang", "log_start": 0}))
    report.write_jsonl(base / "sglang.requests.jsonl", one)
    routed = [dict(one[0], worker=W0), dict(one[1], worker=W1, output_ids=[7])]
    _gateway_run(base, "sglang@2xcache_aware", routed, [_line(1, 50, 0), _line(1, 50, 0)])

    summary = report.write_report(tmp_path, with_figures=False)
    assert list(summary["arms"]) == ["nemotron_h/sglang", "nemotron_h/sglang@2xcache_aware"]
    single, gw = summary["arms"]["nemotron_h/sglang"], summary["arms"]["nemotron_h/sglang@2xcache_aware"]
    assert set(gw) - {"extra"} == CONTRACT_ARM_KEYS
    assert (single["workers"], single["router"]) == (1, "none") and (gw["workers"], gw["router"]) == (2, "cache_aware")
    assert "per_worker" not in single["extra"]
    # the workers' logs summed: two prefill rounds of 50 computed tokens, against the reference's 60
    assert gw["prefill_rounds"] == 2 and gw["extra"]["computed_reuse_ratio"] == pytest.approx(0.0)
    assert single["extra"]["computed_reuse_ratio"] == pytest.approx(0.4)
    assert [w["requests"] for w in gw["extra"]["per_worker"]] == [1, 1]
    md = (tmp_path / "report.md").read_text()
    assert "## Several servers (per worker)" in md
    assert f"| nemotron_h/sglang@2xcache_aware | w1 {W1} | 1 | 0 | 1 | 50 / 50 | 0.00% |" in md


def test_agent_summary_compares_rr_with_lru_behind_the_same_gateway(tmp_path: Path) -> None:
    w = make_agent_workload(AgentParams(**agent_cli.QUICK))
    runs = ["lru", "lru@2xmanual", "rr", "rr@2xmanual"]
    (tmp_path / "workload.json").write_text(json.dumps(
        {"workload": w.describe(), "models": ["qwen3"], "policies": ["lru", "rr"], "runs": runs}))
    for label in runs:
        d = tmp_path / "qwen3" / label
        d.mkdir(parents=True)
        gateway_run = "@" in label
        missed = {"lru": 300, "rr": 30, "lru@2xmanual": 200, "rr@2xmanual": 100}[label]
        recs = [{"agent": a, "turn": t, "prompt_len": 400, "reusable": 0 if t == 0 else 350, "sent_s": 3 * a + t,
                 "ttft_s": 0.1, "latency_s": 0.2, "cached_tokens": 100, "missed_tokens": 0 if t == 0 else missed,
                 "output_len": 8, "error": None, "worker": (W0 if a % 2 else W1) if gateway_run else None}
                for a in range(4) for t in range(3)]
        report.write_jsonl(d / "requests.jsonl", recs)
        views = [{"url": W0, "trace": "w0.trace.jsonl", "first_round": -1},
                 {"url": W1, "trace": "w1.trace.jsonl", "first_round": -1}]
        (d / "meta.json").write_text(json.dumps(
            {"wall_s": 1.0, "first_round": -1, "idle_leak_reported": False, "label": label,
             "workers": 2 if gateway_run else 1, "router": "manual" if gateway_run else "none",
             **({"worker_runs": views} if gateway_run else {})}))
    summary = agent.write_report(tmp_path)
    assert set(summary["arms"]) == {f"qwen3/{r}" for r in runs}
    assert summary["arms"]["qwen3/rr@2xmanual"]["policy"] == "rr"
    assert summary["targets"]["qwen3"]["missed_p99"]["ratio"] == pytest.approx(0.1)
    assert summary["targets"]["qwen3@2xmanual"]["missed_p99"]["ratio"] == pytest.approx(0.5)
    assert summary["vs_best_other"]["qwen3@2xmanual"]["missed_tokens_p99"]["best_other"] == "lru"
    shares = summary["arms"]["qwen3/rr@2xmanual"]["per_worker"]
    assert [(s["url"], s["turns"], s["agents"]) for s in shares] == [(W0, 6, 2), (W1, 6, 2)]
    md = (tmp_path / "report.md").read_text()
    assert "## qwen3 on 2 workers behind SGLang's gateway (`--policy manual`)" in md
    assert f"| rr | {W0} | 6 | 2 | 0 | 100.0 |" in md


def test_agent_gateway_runs_serve_n_times_the_agents_each_worker_with_one_servers_pool(tmp_path: Path) -> None:
    opts = agent.AgentBenchOptions(out=tmp_path, params=AgentParams(**agent_cli.QUICK), models=("qwen3",))
    one, two = opts.workloads()[0].params, opts.workloads(Fleet(2, "manual"))[0].params
    assert (two.agents, two.active, two.capacity) == (2 * one.agents, 2 * one.active, 2 * one.capacity)
    assert len(opts.workloads(Fleet(2, "manual"))[0].agents) == 2 * len(opts.workloads()[0].agents)
    kv = lambda server: int(server.extra_args[server.extra_args.index("--max-total-tokens") + 1])  # noqa: E731
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    for params in (one, two):  # each worker: the one server's pool, whatever it serves
        assert kv(agent.arm_server(model, "qwen3", "rr", params, opts, {}, tmp_path / "log")) == one.kv_tokens()
