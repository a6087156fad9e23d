"""`radixflow report DIR`: summary.json, report.md and the figures are rebuilt from the saved records, not copied."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_radixflow import cli
from sglang_radixflow.bench import figures, report
from tests.unit.bench.test_summary import run_dir  # noqa: F401  (fixture: a small saved multi-candidate run)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 5000 and path.read_bytes()[:8] == PNG_MAGIC


def test_report_command_rebuilds_everything_from_the_records(run_dir: Path, capsys) -> None:  # noqa: F811
    assert cli.main(["report", str(run_dir)]) == 0
    first = json.loads((run_dir / "summary.json").read_text())
    for name in (figures.FIG3, figures.FIG4):
        assert _is_png(run_dir / name), name
        assert f"![{name}]({name})" in (run_dir / "report.md").read_text()
    assert "# Multi-candidate scoring bench" in capsys.readouterr().out

    # Derived files gone and one client record changed: the rebuild follows the records, not the old summary.
    for name in ("summary.json", "report.md", figures.FIG3, figures.FIG4):
        (run_dir / name).unlink()
    path = run_dir / "nemotron_h" / "radixflow.requests.jsonl"
    rows = report.read_jsonl(path)
    rows[0]["latency_s"] = 2.5  # was 0.5
    report.write_jsonl(path, rows)
    assert cli.main(["report", str(run_dir)]) == 0
    second = json.loads((run_dir / "summary.json").read_text())
    assert first["arms"]["nemotron_h/radixflow"]["latency_mean_s"] == pytest.approx(0.5)
    assert second["arms"]["nemotron_h/radixflow"]["latency_mean_s"] == pytest.approx(1.0)
    assert second["arms"]["nemotron_h/sglang"] == first["arms"]["nemotron_h/sglang"]
    assert _is_png(run_dir / figures.FIG3) and _is_png(run_dir / figures.FIG4)


def test_round_fullness_comes_from_the_prefill_log(run_dir: Path) -> None:  # noqa: F811
    workload, loaded = report.load_run(run_dir)
    assert [p["seqs"] for p in loaded[("nemotron_h", "sglang")]["prefill"]] == [2, 2]  # warm-up line excluded
    assert [p["seqs"] for p in loaded[("nemotron_h", "radixflow")]["prefill"]] == [1, 3]


def test_report_on_a_directory_that_is_not_a_bench(tmp_path: Path, capsys) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "not a bench output directory" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_bench_kind_is_read_from_the_saved_files(run_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    from sglang_radixflow.bench.rebuild import bench_kind

    assert bench_kind(run_dir) == "multi-candidate"
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "workload.json").write_text(json.dumps({"models": ["qwen3"], "policies": ["lru", "rr"], "workload": {}}))
    assert bench_kind(agent) == "agent"
    replay = tmp_path / "replay"
    replay.mkdir()
    (replay / "summary.json").write_text(json.dumps({"kind": "replay", "instances": {}}))
    assert bench_kind(replay) == "replay"


def test_report_states_the_running_set_the_run_used(run_dir: Path) -> None:  # noqa: F811
    """Runs record the running set as a multiple of S (2S since the overlap fix); older runs, without the key, used S."""
    path = run_dir / "workload.json"
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "max_running_per_row_budget": 2}))
    assert cli.main(["report", str(run_dir)]) == 0
    assert "`--max-running-requests` 2S, room for a round still in flight" in (run_dir / "report.md").read_text()
    path.write_text(json.dumps({k: v for k, v in saved.items() if k != "max_running_per_row_budget"}))
    assert cli.main(["report", str(run_dir)]) == 0
    assert "`--max-running-requests` S)" in (run_dir / "report.md").read_text()
