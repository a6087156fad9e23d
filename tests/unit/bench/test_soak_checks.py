"""scripts/soak.py's verdicts: what counts as a failure of a wave, of the trace, and of tensor-parallel agreement."""
from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
assert spec is not None and spec.loader is not None
soak = importlib.util.module_from_spec(spec)
sys.modules["soak"] = soak  # its dataclasses look their module up there
spec.loader.exec_module(soak)


def _send(rid: str, aborted: bool = False) -> "soak.Send":
    return soak.Send(rid, [1, 2, 3], 2, 0.0, abort_after_s=0.1 if aborted else None)


def test_a_wave_fails_on_a_different_output_a_stuck_request_or_an_abort_nobody_asked_for() -> None:
    sends = [_send("a"), _send("b"), _send("c"), _send("d"), _send("e", aborted=True)]
    ref = {s.rid: soak.Outcome(output_ids=[7, 8], finish="length") for s in sends}
    got = {
        "a": soak.Outcome(output_ids=[7, 8], finish="length"),
        "b": soak.Outcome(output_ids=[7, 9], finish="length"),
        "c": soak.Outcome(error="TimeoutError: timed out"),
        "d": soak.Outcome(output_ids=[], finish="abort"),
        "e": soak.Outcome(output_ids=[], finish="abort"),  # asked for: fine
    }
    failures = soak.check_wave(sends, got, ref)
    assert [f.split(":")[0] for f in failures] == ["b", "c", "d"], failures


def test_prompt_logprobs_must_match_within_the_tolerance() -> None:
    sends = [_send("x")]
    ref = {"x": soak.Outcome(output_ids=[], finish="length", prompt_logprobs=[-1.0, -2.0])}
    near = {"x": soak.Outcome(output_ids=[], finish="length", prompt_logprobs=[-1.0 + soak.LOGPROB_TOL / 2, -2.0])}
    far = {"x": soak.Outcome(output_ids=[], finish="length", prompt_logprobs=[-1.0 + soak.LOGPROB_TOL * 2, -2.0])}
    assert soak.check_wave(sends, near, ref) == []
    assert len(soak.check_wave(sends, far, ref)) == 1


def test_no_rid_is_a_prefix_of_another() -> None:
    """SGLang aborts every request whose rid starts with the aborted one: a soak rid that prefixes another would
    abort requests nobody meant to abort."""
    rng = random.Random(0)
    docs: list[list[int]] = []
    rids = [s.rid for wave in range(12) for s in soak.make_wave(rng, wave, docs, 0.1, 1500, 4)]
    assert len(rids) == len(set(rids)) > 100
    ordered = sorted(rids)
    assert not any(b.startswith(a) for a, b in zip(ordered, ordered[1:]))


def _trace(path: Path, rounds: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"kind": "round", **r}) + "\n" for r in rounds))
    return path


def test_trace_counters_and_ranks(tmp_path: Path) -> None:
    rounds = [{"round": 1, "rows": 2, "producers": 1, "promises_open": 1},
              {"round": 2, "rows": 3, "blocked_skips": 2, "promises_open": 0}]
    rank0 = _trace(tmp_path / "r0.jsonl", rounds)
    sums, still_open = soak.trace_counters(rank0)
    assert sums["producers"] == 1 and sums["blocked_skips"] == 2 and still_open == 0
    assert soak.rank_divergence([rank0, _trace(tmp_path / "r1.jsonl", rounds)]) is None
    other = [rounds[0], {**rounds[1], "blocked_skips": 1}]
    assert "round 2" in soak.rank_divergence([rank0, _trace(tmp_path / "r2.jsonl", other)])
    assert soak.trace_counters(_trace(tmp_path / "open.jsonl", rounds[:1]))[1] == 1
    assert soak.trace_verdict(rank0) == (sums, [])
    assert soak.trace_verdict(_trace(tmp_path / "open2.jsonl", rounds[:1]))[1] == ["1 promises still open when idle"]
    missing = tmp_path / "never-written.jsonl"  # e.g. a relative path the server resolved against its own folder
    assert soak.trace_verdict(missing) == ({}, [f"the radixflow server wrote no trace at {missing}"])


def test_retractions_are_counted_once_per_retraction_at_any_tp() -> None:
    """SGLang's lines as it writes them; at TP 2 both ranks log every retraction."""
    one = ("[2026-12-03 23:47:32] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 90\n"
           "[2026-12-03 23:47:33] Testing retraction. #retracted_reqs: 0, #new_tokens_gained: 0\n"
           "[2026-12-03 23:47:34] Testing retraction. #retracted_reqs: 3, #new_tokens_gained: 40\n")
    assert soak.count_retracted(one, tp=1) == 5
    two = "".join(line.replace("] ", f" TP{r}] ", 1) + "\n" for line in one.splitlines() for r in (0, 1))
    assert soak.count_retracted(two, tp=2) == 5
    assert soak.count_retracted("", tp=1) == 0
