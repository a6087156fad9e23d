"""scripts/mc_repeats.py: pooling repeated multi-candidate bench runs (the noisy CPU latency comparison)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mc_repeats", ROOT / "scripts" / "mc_repeats.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(latencies: dict[str, float], rounds: dict[str, int]) -> dict:
    return {"kind": "multi-candidate", "arms": {
        f"nemotron_h/{arm}": {"latency_mean_s": lat, "latency_p95_s": 2 * lat, "rounds": rounds[arm],
                              "prefill_rounds": rounds[arm], "reuse_ratio": 0.9,
                              "extra": {"computed_reuse_ratio": 0.8 if arm == "radixflow" else 0.7}}
        for arm, lat in latencies.items()}}


def test_aggregate_pools_repetitions_and_counts_latency_wins(tmp_path: Path) -> None:
    mod = _script()
    runs = [({"prefix-stop": 0.30, "radixflow": 0.20}, {"prefix-stop": 40, "radixflow": 30}),
            ({"prefix-stop": 0.10, "radixflow": 0.25}, {"prefix-stop": 44, "radixflow": 28}),
            ({"prefix-stop": 0.40, "radixflow": 0.30}, {"prefix-stop": 42, "radixflow": 35})]
    for k, (lat, rounds) in enumerate(runs, start=1):
        (tmp_path / f"rep{k}").mkdir()
        (tmp_path / f"rep{k}" / "summary.json").write_text(json.dumps(_summary(lat, rounds)))
    (tmp_path / "rep4").mkdir()  # an unfinished repetition (no summary) is left out
    agg = mod.write(tmp_path, ["--models", "nemotron_h"])
    assert agg["repetitions"] == 3
    rf = agg["arms"]["nemotron_h/radixflow"]
    assert rf["latency_mean_s"]["values"] == [0.20, 0.25, 0.30]
    assert rf["latency_mean_s"]["mean"] == pytest.approx(0.25) and rf["rounds"]["median"] == 30
    assert rf["computed_reuse_ratio"]["mean"] == pytest.approx(0.8)  # read from the summary's extra block
    assert agg["latency_wins"]["nemotron_h/prefix-stop vs nemotron_h/radixflow"] == {
        "first_lower": 1, "second_lower": 2, "repetitions": 3}
    report = (tmp_path / "repeats.md").read_text()
    assert "- nemotron_h/prefix-stop 1, nemotron_h/radixflow 2 (of 3)" in report
    assert json.loads((tmp_path / "repeats.json").read_text())["command"] == ["--models", "nemotron_h"]


def test_bad_invocations_name_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = _script()
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path), "--reps", "2"])
    assert "give the bench's arguments after `--`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path), "--reps", "0", "--", "--quick"])
    assert "--reps needs an integer >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no repetition"):
        mod.aggregate([])


def test_every_second_repetition_reverses_the_arms() -> None:
    mod = _script()
    given = ["--models", "qwen3", "--arms", "sglang,prefix-stop,radixflow", "--quick"]
    assert mod.arms_for(given, 1) == given
    assert mod.arms_for(given, 2) == ["--models", "qwen3", "--arms", "radixflow,prefix-stop,sglang", "--quick"]
    assert mod.arms_for(given, 3) == given
    assert mod.arms_for(["--arms=sglang,radixflow"], 4) == ["--arms=radixflow,sglang"]
    assert mod.arms_for(["--quick"], 2) == ["--quick"]  # the bench's default arms: its own order
