"""A short run of scripts/soak.py: randomised waves (sibling groups, select-shaped groups, salts, chunked documents,
aborts at random instants) on a radixflow NemotronH server and a native one. Every request completes with native's
greedy tokens, nothing leaks, no promise is left open, and the waves really went through the paths they exist for."""
from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

from sglang_radixflow.bench.report import read_jsonl, request_records

ROOT = Path(__file__).resolve().parents[2]


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_soak_waves_complete_equal_native_and_leave_nothing(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    soak = _soak_module()
    models_root = model_dirs["nemotron_h"].parent
    rc = soak.main(["--config", "hybrid", "--waves", "5", "--seed", "21", "--abort-fraction", "0.15",
                    "--models-root", str(models_root), "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0 and summary["failures"] == [], summary["failures"]
    assert summary["aborted"] > 0
    paths = summary["paths"]
    # the waves exercised what they are for: producers (prefix requests on no_buffer), Blocked consumers, holds
    assert paths["producers"] > 0 and paths["prefix_requests"] > 0, paths
    assert paths["blocked_skips"] > 0, paths
    assert paths["promises_published_delta"] > 0, paths


def test_rr_soak_under_heavy_eviction_equals_native(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """RR-Evict on a KV pool a fraction of the waves' documents: tail units are cut throughout (counted from the
    trace), and every request still finishes with native SGLang's greedy tokens and prompt logprobs (the reference
    evicts with SGLang's LRU: eviction changes no output), nothing leaks, no promise is left open."""
    soak = _soak_module()
    models_root = model_dirs["nemotron_h"].parent
    rc = soak.main(["--config", "hybrid", "--waves", "4", "--seed", "8", "--eviction", "rr",
                    "--max-total-tokens", "3000", "--long-doc", "1200", "--models-root", str(models_root),
                    "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0 and summary["failures"] == [], summary["failures"]
    assert summary["eviction"] == "rr" and summary["paths"]["rr_units"] >= 20, summary["paths"]
    assert summary["paths"]["producers"] > 0, summary["paths"]


def test_retracted_requests_prefill_again_equal_native_and_leave_nothing(model_dirs: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    """SGLang's retraction test mode (SGLANG_TEST_RETRACT) on both servers: decode retracts requests every few forward
    passes, and they go back to the waiting queue with their outputs so far, where radixflow's scan meets them
    (siblings, producers and promises of requests that already have output tokens). They still finish with native's
    tokens, and nothing leaks."""
    soak = _soak_module()
    models_root = model_dirs["nemotron_h"].parent
    rc = soak.main(["--config", "hybrid", "--waves", "3", "--seed", "4", "--max-new", "24", "--test-retract",
                    "--models-root", str(models_root), "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0 and summary["failures"] == [], summary["failures"]
    assert summary["retracted"] > 0, summary  # the mode really retracted requests
    assert summary["paths"]["producers"] > 0 and summary["paths"]["promises_published_delta"] > 0, summary["paths"]
    # the trace writes a request record per release, retractions included; readers keep each request's last one,
    # which counts its retractions
    records = read_jsonl(tmp_path / "radixflow.rank0.trace.jsonl")
    releases = Counter(r["rid"] for r in records if r["kind"] == "request")
    last = {r["rid"]: r for r in request_records(records)}
    retracted = [rid for rid, r in last.items() if r["retractions"] > 0]
    assert retracted, "no request record counts a retraction"
    assert all(releases[rid] >= last[rid]["retractions"] + 1 for rid in retracted)
