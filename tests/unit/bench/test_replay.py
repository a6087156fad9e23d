"""Fixed-batch replay (bench/replay.py) on SGLang's real prefill pass, in-process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_radixflow import cli
from sglang_radixflow.bench import replay
from sglang_radixflow.bench.fragments import Fragment, RoundRecord
from sglang_radixflow.bench.bounds import round_lower_bound


def test_figure1_radixflow_reaches_the_lower_bound() -> None:
    inst = replay.figure1_instance()
    assert inst.prompt_tokens == 19_570 and inst.min_tokens() == 12_970 and inst.floor() == 4
    rf = replay.replay(inst, "radixflow")
    assert (rf.K, rf.tokens, rf.row_visits, rf.depth) == (4, 12_970, 15, 2)
    assert rf.lower_bound == round_lower_bound(12_970, 15, 2, S=4, T=4096) == 4
    assert rf.empty_slots == 1
    ps = replay.replay(inst, "prefix-stop")
    assert (ps.K, ps.lower_bound, ps.empty_slots) == (6, 4, 9)  # the same fragments, packed worse


def test_generated_instance_replays_every_request_once() -> None:
    inst = replay.make_instance("mc-reuse", questions=3, seed=1, budgets=(8, 2048))
    assert len(inst.prompts) == 12 and inst.params["questions"] == 3
    native = replay.replay(inst, "sglang")
    rf = replay.replay(inst, "radixflow")
    for res in (native, rf):
        finished = {
            f.rid for r in res.rounds for f in r.fragments
            if f.rid in inst.prompts and f.prefix_len + f.extend_len == len(inst.prompts[f.rid])
        }
        assert finished == set(inst.prompts)  # every prompt computed to its end (prefix requests aside)
        assert res.K >= res.lower_bound >= 1 and res.K >= inst.floor()
        assert res.K >= res.first_round_bound >= res.lower_bound  # a valid, tighter bound of the same fragments
        assert all(r.rows <= inst.S and r.tokens <= inst.T for r in res.rounds)
    assert rf.tokens < native.tokens  # siblings reuse the published document state instead of recomputing it


def test_dependency_depth_follows_prefixes_across_rounds() -> None:
    F, R = Fragment, RoundRecord
    prompts = {"p": (1, 2, 3, 4), "c": (1, 2, 3, 9), "x": (5, 6)}
    rounds = [R(1, (F("p", 0, 3), F("x", 0, 2))), R(2, (F("p", 3, 1), F("c", 3, 1)))]
    assert replay.dependency_depth(rounds, prompts) == 2
    with pytest.raises(AssertionError, match="no fragment of an earlier round"):
        replay.dependency_depth([R(1, (F("c", 3, 1),))], prompts)


def test_replay_command_writes_outputs_and_report_rebuilds_from_rounds(tmp_path: Path, capsys) -> None:
    out = tmp_path / "replay"
    assert cli.main(["bench", "replay", "--out", str(out), "--instances", "figure1", "--arms",
                     "prefix-stop,radixflow"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    arms = summary["instances"]["figure1"]["arms"]
    assert summary["kind"] == "replay"
    assert (arms["radixflow"]["rounds"], arms["radixflow"]["lower_bound"]) == (4, 4)
    assert arms["prefix-stop"]["rounds"] == 6 and arms["prefix-stop"]["empty_slots"] == 9
    assert (out / "replay_rounds.png").read_bytes()[:4] == b"\x89PNG"
    assert "| radixflow | 4 | 4 | 1.000 |" in (out / "report.md").read_text()
    # Rebuild from the saved rounds: drop prefix-stop's last round and the numbers follow.
    path = out / "figure1" / "prefix-stop.rounds.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    (out / "summary.json").write_text(json.dumps({**summary}))
    assert cli.main(["report", str(out)]) == 0
    rebuilt = json.loads((out / "summary.json").read_text())["instances"]["figure1"]["arms"]
    assert rebuilt["prefix-stop"]["rounds"] == 5 and rebuilt["radixflow"] == arms["radixflow"]


@pytest.mark.parametrize("argv, message", [
    (["--instances", "figure2"], "unknown instance"),
    (["--instances", "mc-warm"], "stream='warm'"),
    (["--arms", "fastest"], "unknown or no arm"),
    (["--budgets", "8"], "expected S,T"),
    (["--producer-rows", "-1"], "--producer-rows -1: allowed: an integer >= 0"),
])
def test_replay_rejects_bad_input(tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        cli.main(["bench", "replay", "--out", str(tmp_path), *argv])


def test_replay_command_applies_producer_rows_to_the_skip_arms_and_records_them(tmp_path: Path) -> None:
    def arms(*extra: str) -> dict:
        out = tmp_path / "-".join(("rows", *extra))
        assert cli.main(["bench", "replay", "--out", str(out), "--instances", "mc-cold", "--questions", "12", "--arms",
                         "prefix-stop,radixflow", *extra]) == 0
        assert cli.main(["report", str(out)]) == 0  # the rebuild keeps the setting
        return json.loads((out / "summary.json").read_text())["instances"]["mc-cold"]["arms"]

    default, fcfs = arms(), arms("--producer-rows", "0")
    assert default["radixflow"]["producer_rows"] == 2 and "producer_rows" not in default["prefix-stop"]
    assert fcfs["radixflow"]["producer_rows"] == 0
    # The paper's FCFS scan takes 10 rounds on this instance (test_producer_rows); the rows take 9.
    assert fcfs["radixflow"]["rounds"] == 10
    assert default["radixflow"]["rounds"] == 9
