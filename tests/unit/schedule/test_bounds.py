"""The round lower bound max(ceil(W/T), ceil(V/S), D) and the empty-slot count."""
from __future__ import annotations

import pytest

from sglang_radixflow.schedule.bounds import empty_row_slots, round_lower_bound


def test_paper_figure1_numbers() -> None:
    # 15 fragments, 12,970 tokens, S = 4, T = 4096, D = 2: ceil(12970/4096) = 4, ceil(15/4) = 4.
    assert round_lower_bound(12_970, 15, 2, S=4, T=4096) == 4


@pytest.mark.parametrize(
    ("w", "v", "d", "expected", "binding"),
    [
        (4096 * 3 + 1, 4, 1, 4, "tokens"),  # one token over three full rounds
        (4096 * 3, 4, 1, 3, "tokens exact"),
        (10, 9, 1, 3, "rows"),  # 9 rows at 4 per round
        (10, 8, 1, 2, "rows exact"),
        (10, 3, 5, 5, "depth"),  # a chain of 5 dependent fragments
    ],
)
def test_each_term_can_bind(w: int, v: int, d: int, expected: int, binding: str) -> None:
    assert round_lower_bound(w, v, d, S=4, T=4096) == expected, binding


def test_empty_workload_and_bad_input() -> None:
    assert round_lower_bound(0, 0, 0, S=4, T=4096) == 0
    with pytest.raises(ValueError):
        round_lower_bound(10, 1, 1, S=0, T=4096)
    with pytest.raises(ValueError):
        round_lower_bound(10, 1, 1, S=4, T=0)
    with pytest.raises(ValueError):
        round_lower_bound(10, 1, 0, S=4, T=4096)  # rows to run but no dependency level
    with pytest.raises(ValueError):
        round_lower_bound(-1, 1, 1, S=4, T=4096)


def test_empty_row_slots() -> None:
    assert empty_row_slots([1, 4, 4, 1, 4, 1], S=4) == 9
    assert empty_row_slots([4, 4, 3, 4], S=4) == 1
    assert empty_row_slots([], S=4) == 0
    with pytest.raises(ValueError):
        empty_row_slots([5], S=4)
