"""Fewest rounds of a fixed set of fragments (bench/optimum.py): the exact version of max(⌈W/T⌉, ⌈V/S⌉, D)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_radixflow import cli
from sglang_radixflow.bench.optimum import Optimum, fewest_rounds, fits
from sglang_radixflow.bench.bounds import round_lower_bound


def test_a_cold_round_that_holds_one_document_costs_a_round_the_bound_does_not_see() -> None:
    """A document of T tokens and 5 one-token consumers, S = 4: max(⌈105/100⌉, ⌈6/4⌉, 2) = 2, but round 1 can hold
    only the document, and the 5 consumers need 2 rounds of 4 rows after it."""
    tokens, parent = [100] + [1] * 5, [None] + [0] * 5
    assert round_lower_bound(sum(tokens), len(tokens), 2, S=4, T=100) == 2
    assert fits(tokens, parent, S=4, T=100, K=2, time_limit_s=10) is False
    assert fits(tokens, parent, S=4, T=100, K=3, time_limit_s=10) is True
    assert fewest_rounds(tokens, parent, S=4, T=100, rounds=5, lower_bound=2) == Optimum(3, proven=True)


def test_a_schedule_that_wasted_rounds_is_shown_the_shorter_one() -> None:
    """Eight independent fragments and a chain of two, S = 4, T = 40: a schedule of 4 rounds could have taken 3
    (10 rows), which is the bound: the search stops there, proven."""
    tokens = [10] * 8 + [10, 10]
    parent = [None] * 8 + [None, 8]
    assert fewest_rounds(tokens, parent, S=4, T=40, rounds=4, lower_bound=3) == Optimum(3, proven=True)


def test_rows_tokens_and_order_are_held_together() -> None:
    """Two documents of 60 tokens (T = 100: one per round) each with a 50-token consumer: tokens alone allow 2 rounds
    (220 / 100 → 3, in fact), rows 1; a consumer after its document and a document per round make it 3."""
    tokens, parent = [60, 60, 50, 50], [None, None, 0, 1]
    assert round_lower_bound(sum(tokens), 4, 2, S=4, T=100) == 3
    assert fewest_rounds(tokens, parent, S=4, T=100, rounds=4, lower_bound=3) == Optimum(3, proven=True)
    assert fits([120], [None], S=4, T=100, K=5, time_limit_s=10) is False  # a fragment above T never fits


def test_replay_reports_the_fewest_rounds_of_each_arm_and_the_rebuild_keeps_them(tmp_path: Path) -> None:
    """Figure 1: prefix-stop's 6 rounds run the same 15 fragments radixflow packs into 4, so both arms' fewest is 4:
    prefix-stop's gap is its ordering, not the instance."""
    out = tmp_path / "opt"
    assert cli.main(["bench", "replay", "--out", str(out), "--instances", "figure1", "--arms",
                     "prefix-stop,radixflow", "--optimum", "20"]) == 0
    arms = json.loads((out / "summary.json").read_text())["instances"]["figure1"]["arms"]
    assert arms["radixflow"]["fragment_optimum"] == arms["prefix-stop"]["fragment_optimum"] == {
        "rounds": 4, "proven": True}
    assert arms["prefix-stop"]["rounds"] == 6
    assert "| prefix-stop | 6 | 4 | 1.500 | 4 | 4 |" in (out / "report.md").read_text()
    assert cli.main(["report", str(out)]) == 0
    rebuilt = json.loads((out / "summary.json").read_text())["instances"]["figure1"]["arms"]
    assert rebuilt["prefix-stop"]["fragment_optimum"] == {"rounds": 4, "proven": True}


def test_the_optimum_is_off_by_default_and_rejects_negative_seconds(tmp_path: Path) -> None:
    out = tmp_path / "plain"
    assert cli.main(["bench", "replay", "--out", str(out), "--instances", "figure1", "--arms", "radixflow"]) == 0
    arm = json.loads((out / "summary.json").read_text())["instances"]["figure1"]["arms"]["radixflow"]
    assert "fragment_optimum" not in arm and "| radixflow | 4 | 4 | 1.000 | 4 | — |" in (out / "report.md").read_text()
    with pytest.raises(SystemExit, match="--optimum -1.0: allowed: seconds >= 0"):
        cli.main(["bench", "replay", "--out", str(out), "--optimum", "-1"])
