"""The bench on the user's own model and servers: `radixflow make-model` into a directory of one's own (its marker
removed, so it is read as any Hugging Face model directory), a native and a radixflow server started by hand, and
`radixflow bench multi-candidate --url ... --model-path DIR --workload FILE` measuring them: a complete summary
whose radixflow round counts agree with that server's own log, the native ones reported missing (not zero)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sglang_radixflow import cli
from sglang_radixflow.bench.report import PREFILL_LINE
from sglang_radixflow.bench.server import SGLangServer
from sglang_radixflow.models import MARKER_FILE
from tests.unit.bench.test_summary import CONTRACT_ARM_KEYS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi_candidate_workload.jsonl"


@pytest.fixture(scope="module")
def own_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = tmp_path_factory.mktemp("user") / "my-hybrid"
    assert cli.main(["make-model", "--arch", "nemotron_h", "--out", str(model)]) == 0
    (model / MARKER_FILE).unlink()  # a model directory as users have them
    return model


def test_bench_measures_servers_started_by_hand(own_model: Path, tmp_path: Path) -> None:
    # float32 (conv state too): the first-token agreement below is exact, not bf16's near-tie flips
    f32, env = ["--dtype", "float32"], {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
    native = SGLangServer(str(own_model), radix_cache=None, extra_args=f32, env=env)
    ours = SGLangServer(str(own_model), extra_args=[*f32, "--enable-metrics"], env=env)
    out = tmp_path / "remote"
    with native, ours:
        code = cli.main(["bench", "multi-candidate", "--out", str(out), "--quick", "--arms", "sglang,radixflow",
                         "--url", f"{native.url},{ours.url}", "--model-path", str(own_model),
                         "--workload", str(EXAMPLE)])
        log = ours.log_text()
        end = json.loads((out / "my-hybrid" / "radixflow.run.json").read_text())["metrics_end"]
        # one server, no --arms: the arm is read from its cache backend; its cache is flushed before the warm-up
        alone = tmp_path / "alone"
        assert cli.main(["bench", "multi-candidate", "--out", str(alone), "--quick", "--url", ours.url,
                         "--model-path", str(own_model), "--workload", str(EXAMPLE)]) == 0
    assert code == 0
    again = json.loads((alone / "summary.json").read_text())["arms"]
    assert list(again) == ["my-hybrid/radixflow"] and again["my-hybrid/radixflow"]["errors"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"]["source"] == str(EXAMPLE) and summary["workload"]["urls"] == [native.url, ours.url]
    assert list(summary["arms"]) == ["my-hybrid/sglang", "my-hybrid/radixflow"]
    for key, arm in summary["arms"].items():
        assert set(arm) - {"extra"} == CONTRACT_ARM_KEYS, key
        assert (arm["requests"], arm["completed"], arm["errors"]) == (18, 18, 0), key
    sglang, radixflow = summary["arms"]["my-hybrid/sglang"], summary["arms"]["my-hybrid/radixflow"]
    assert sglang["prefill_rounds"] is None and sglang["extra"]["computed_reuse_ratio"] is None
    assert "SGLang's own metrics count no prefill rounds" in sglang["extra"]["missing"]
    assert radixflow["prefill_rounds"] >= 1 and radixflow["extra"]["missing"] is None
    assert radixflow["first_token_agreement"] == 1.0  # the same answers as the native deployment
    # the counters the bench read agree with the server's own log: every prefill batch it logged since it started
    logged = len(PREFILL_LINE.findall(log))
    counted = end["radixflow_rounds_total{kind=prefill}"] + end.get("radixflow_rounds_total{kind=mixed}", 0.0)
    assert counted == logged
    assert sum(int(m.group("new")) for m in PREFILL_LINE.finditer(log)) == end["radixflow_prefill_tokens_total"]
    report = (out / "report.md").read_text()
    assert "Servers: already running, not started by the bench" in report
    assert f"5 questions (candidates vary) = 18 requests, from `{EXAMPLE}`, Poisson" in report
    assert re.search(r"Not measured for `sglang` \(http://127\.0\.0\.1:\d+\): SGLang's own metrics", report)
