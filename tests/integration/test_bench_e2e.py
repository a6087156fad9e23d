"""Short benches on real servers: multi-candidate (tiny NemotronH, 3 questions, 2 arms), its frontend select path and
its /v1/score path, summary.json per the contract, report + figures, `radixflow report` rebuilding the same summary
from the files; and the agent bench (lru vs rr)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sglang_radixflow import cli
from sglang_radixflow.bench import agent_cli
from sglang_radixflow.bench.agent_workload import AgentParams
from sglang_radixflow.bench.figures import FIG3, FIG4
from sglang_radixflow.bench.options import BenchOptions
from sglang_radixflow.bench.runner import run_bench
from sglang_radixflow.bench.workloads import WorkloadParams
from sglang_radixflow.models import MARKER_FILE
from tests.integration.conftest import MODELS_ROOT
from tests.unit.bench.test_summary import CONTRACT_ARM_KEYS

WORKLOAD = WorkloadParams(questions=3, stream="reuse", rate=8.0, seed=5)  # 3 questions on one QuALITY-like document


def _options(out: Path, arms: tuple[str, ...], path: str = "raw") -> BenchOptions:
    return BenchOptions(out=out, workload=WORKLOAD, models=("nemotron_h",), arms=arms, budgets=(8, 2048),
                        kv_tokens=8192, models_root=MODELS_ROOT, quick=True, path=path)


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory: pytest.TempPathFactory, model_dirs: dict[str, Path]) -> Path:
    out = tmp_path_factory.mktemp("bench") / "raw"
    run_bench(_options(out, ("prefix-stop", "radixflow")), log=lambda msg: None)
    return out


def test_raw_bench_summary_report_and_figures(raw_run: Path) -> None:
    summary = json.loads((raw_run / "summary.json").read_text())
    assert summary["kind"] == "multi-candidate" and summary["budgets"]["S"] == 8
    assert 0 < summary["workload"]["ideal_reuse_ratio"] < 1 and summary["workload"]["seed"] == 5
    assert list(summary["arms"]) == ["nemotron_h/prefix-stop", "nemotron_h/radixflow"]
    for key, arm in summary["arms"].items():
        assert set(arm) - {"extra"} == CONTRACT_ARM_KEYS, key
        assert (arm["requests"], arm["completed"], arm["errors"]) == (12, 12, 0), key
        assert arm["prefill_rounds"] >= arm["round_lower_bound"] >= 1, key
        # siblings branch off a shared document: both radixflow-cache arms reuse it from a published state
        assert arm["reuse_ratio"] > 0.3 and arm["state_ready_hit_tokens"] > 0, key
        assert arm["token_hit_tokens"] >= arm["state_ready_hit_tokens"], key
        assert arm["first_token_agreement"] is None  # no sglang arm in this run
    assert set(summary["cost_identity"]) == {"nemotron_h/radixflow"}
    for name in (FIG3, FIG4):
        assert (raw_run / name).read_bytes()[:4] == b"\x89PNG"
    text = (raw_run / "report.md").read_text()
    assert "| radixflow | 12 | 12 | 0 |" in text and f"![{FIG3}]({FIG3})" in text


def test_report_command_rebuilds_the_same_summary(raw_run: Path) -> None:
    before = json.loads((raw_run / "summary.json").read_text())
    for name in ("summary.json", "report.md", FIG3, FIG4):
        (raw_run / name).unlink()
    assert cli.main(["report", str(raw_run)]) == 0
    assert json.loads((raw_run / "summary.json").read_text()) == before
    assert (raw_run / FIG4).is_file()


def test_frontend_select_path(tmp_path: Path, model_dirs: dict[str, Path]) -> None:
    out = tmp_path / "select"
    summary = run_bench(_options(out, ("radixflow",), path="select"), log=lambda msg: None)
    arm = summary["arms"]["nemotron_h/radixflow"]
    fe = arm["extra"]["frontend"]
    assert summary["workload"]["path"] == "select" and 0.9 < summary["workload"]["ideal_reuse_ratio"] < 1
    assert (fe["questions"], fe["errors"], fe["choice_requests"], fe["warmup_requests"]) == (3, 0, 12, 3)
    assert (arm["requests"], arm["errors"]) == (12, 0)
    # the choice requests reuse the context the warm-up computed (at least for the siblings of the first choice)
    assert fe["choice_reuse_ratio"] > 0.5 and fe["choice_requests_fully_cached_context"] >= 9
    questions = [json.loads(line) for line in (out / "nemotron_h" / "radixflow.questions.jsonl").read_text().splitlines()]
    assert all(q["decision"] is not None and len(q["choice_cached_tokens"]) == 4 for q in questions)
    assert "## Frontend path (`select`" in (out / "report.md").read_text()


def test_score_path(tmp_path: Path, model_dirs: dict[str, Path]) -> None:
    """`--path score`: one /v1/score call per question. Natively the hybrid computes the shared document once per
    item; under radixflow one item produces it and the others start from its state, with the same best labels."""
    out = tmp_path / "score"
    summary = run_bench(_options(out, ("sglang", "radixflow"), path="score"), log=lambda msg: None)
    native, ours = summary["arms"]["nemotron_h/sglang"], summary["arms"]["nemotron_h/radixflow"]
    for arm in (native, ours):
        assert (arm["requests"], arm["completed"], arm["errors"]) == (12, 12, 0)
        assert arm["reuse_ratio"] is None  # the endpoint reports no cached tokens
    assert native["extra"]["computed_reuse_ratio"] < 0.5 < ours["extra"]["computed_reuse_ratio"]
    assert ours["state_ready_hit_tokens"] > 0  # the trace's records of SGLang-named requests are found
    assert ours["first_token_agreement"] == 1.0  # every item's best label equals native's
    assert "Path `score`" in (out / "report.md").read_text()


def test_agent_bench_rr_spreads_the_misses_lru_concentrates(tmp_path: Path, model_dirs: dict[str, Path]) -> None:
    """`radixflow bench agent --quick --model-path DIR` on real servers (a copy of the tiny NemotronH outside the
    models root, read as any model directory; lru and rr, one schedule): the contract, the report and figure, no
    leaked slot, and RR-Evict doing its job: with n_a < m < n, lru throws whole idle histories away (its P99 return
    recomputes most of one) while rr cuts tails across all of them."""
    mine = tmp_path / "my-nemotron"
    shutil.copytree(model_dirs["nemotron_h"], mine)
    (mine / MARKER_FILE).unlink()
    out = tmp_path / "agent"
    assert cli.main(["bench", "agent", "--quick", "--model-path", str(mine), "--policies", "lru,rr", "--seeds", "1",
                     "--rr-block", "8", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    params = AgentParams(**agent_cli.QUICK)
    assert summary["kind"] == "agent" and list(summary["arms"]) == ["my-nemotron/lru", "my-nemotron/rr"]
    turns = params.agents * params.turns
    for key, arm in summary["arms"].items():
        assert set(CONTRACT_ARM_KEYS) <= set(arm), key
        assert (arm["requests"], arm["completed"], arm["errors"]) == (turns, turns, 0), key
        assert arm["idle_leak_reported"] is False, key  # SGLang's idle memory check passed after the schedule
        assert arm["return_turns"] == turns - params.agents, key
    rr_log = (out / "my-nemotron" / "rr" / "server.log").read_text()
    assert "RR-Evict: block=8 tokens" in rr_log and "--mamba-radix-cache-strategy" in " ".join(
        json.loads((out / "my-nemotron" / "rr" / "meta.json").read_text())["server_args"])  # a hybrid, by its config
    lru, rr = summary["arms"]["my-nemotron/lru"], summary["arms"]["my-nemotron/rr"]
    assert lru["missed_tokens_p99"] > params.first_tokens  # lru's worst return lost most of a whole history
    assert rr["missed_tokens_p99"] < 0.5 * lru["missed_tokens_p99"], (rr["missed_tokens_p99"], lru["missed_tokens_p99"])
    assert rr["missed_tokens_mean"] < lru["missed_tokens_mean"]
    target = summary["targets"]["my-nemotron"]["missed_p99"]
    assert target["ratio"] == rr["missed_tokens_p99"] / lru["missed_tokens_p99"]
    assert (out / "agent_distributions.png").read_bytes()[:4] == b"\x89PNG"
    assert "| rr / lru |" in (out / "report.md").read_text()
    assert cli.main(["report", str(out)]) == 0  # rebuilt from the saved per-turn records
    assert json.loads((out / "summary.json").read_text()) == summary


def test_agent_bench_through_the_chat_api(tmp_path: Path, model_dirs: dict[str, Path]) -> None:
    """`--api chat`: every turn through SGLang's /v1/chat/completions (the tiny model's chat template, the servers
    with --enable-cache-report); the returns find their conversations cached."""
    out = tmp_path / "agent-chat"
    assert cli.main(["bench", "agent", "--quick", "--api", "chat", "--models", "qwen3", "--policies", "rr",
                     "--seeds", "1", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    arm = summary["arms"]["qwen3/rr"]
    params = AgentParams(**agent_cli.QUICK)
    assert (arm["requests"], arm["errors"]) == (params.agents * params.turns, 0)
    assert summary["workload"]["api"] == "chat" and arm["reuse_ratio"] > 0.3
    assert "--enable-cache-report" in json.loads((out / "qwen3" / "rr" / "meta.json").read_text())["server_args"]
