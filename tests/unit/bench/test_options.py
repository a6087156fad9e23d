"""`radixflow bench multi-candidate` options: --quick defaults, fixed budgets, calibration grid."""
from __future__ import annotations

import pytest

from sglang_radixflow.bench.runner import QUICK_BUDGETS, budget_args, options_from_args, parse_grid
from sglang_radixflow.cli import build_parser


def _opts(argv: str):
    return options_from_args(build_parser().parse_args(["bench", "multi-candidate", *argv.split()]))


def test_quick_fixes_budgets_and_size() -> None:
    o = _opts("--out x --quick")
    assert o.quick and o.budgets == QUICK_BUDGETS and o.workload.questions == 16
    assert o.arms == ("sglang", "prefix-stop", "radixflow") and o.models == ("nemotron_h", "qwen3")


def test_explicit_options() -> None:
    o = _opts("--out x --arms sglang,radixflow --models qwen3 --questions 5 --rate 9 --stream cold --seed 3 "
              "--budgets 4,512 --order reverse")
    assert o.arms == ("sglang", "radixflow") and o.models == ("qwen3",) and o.budgets == (4, 512)
    w = o.workload
    assert (w.questions, w.rate, w.stream, w.seed, w.order) == (5, 9.0, "cold", 3, "reverse")
    assert _opts("--out x").budgets is None  # calibrate
    assert _opts("--out x --calibration-grid 4x256,8x512").calibration_grid == ((4, 256), (8, 512))


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        _opts("--out x --arms sglang,fastest")
    with pytest.raises(ValueError):
        parse_grid("16-2048")


def test_budget_flags() -> None:
    args = budget_args(16, 2048, 32768)
    pairs = dict(zip(args[::2], args[1::2]))
    # S caps every prefill round; the running set also holds the round still in flight under the overlap scheduler.
    assert pairs == {"--prefill-max-requests": "16", "--max-running-requests": "32", "--chunked-prefill-size": "2048",
                     "--max-prefill-tokens": "2048", "--max-total-tokens": "32768"}
