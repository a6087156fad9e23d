"""The round lower bound max(ceil(W/T), ceil(V/S), D) and the empty-slot count."""
from __future__ import annotations

import pytest

from sglang_radixflow.bench.bounds import empty_row_slots, first_round_bound, round_lower_bound


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


def test_first_round_bound_counts_what_round_one_can_hold() -> None:
    """Round 1 runs only fragments that start at 0. Three 1,500-token documents and 12 short continuations, S = 8,
    T = 2048: V = 15 gives ceil(15/8) = 2, but round 1 holds one document (two exceed T), so 1 + ceil(14/8) = 3."""
    docs = [(0, 1500)] * 3
    rest = [(1500, 10)] * 12
    assert round_lower_bound(4620, 15, 2, S=8, T=2048) == 3  # ceil(4620/2048) = 3 already
    assert first_round_bound(docs + rest, S=8, T=2048) == 3
    # Shorter documents: 8 rows of them fit round 1, which then binds nothing beyond ceil(V/S).
    small = [(0, 100)] * 8 + [(100, 10)] * 8
    assert first_round_bound(small, S=8, T=2048) == 2 == round_lower_bound(880, 16, 2, S=8, T=2048)
    # Round 1 holds 2 of 4 documents (tokens), the rows then need 1 + ceil((4 + 8 - 2)/8) = 3 > ceil(12/8) = 2.
    four = [(0, 900)] * 4 + [(900, 5)] * 8
    assert first_round_bound(four, S=8, T=2048) == 3 > round_lower_bound(3640, 12, 2, S=8, T=2048)
    assert first_round_bound([], S=8, T=2048) == 0
    with pytest.raises(ValueError, match="no fragment starts at 0"):
        first_round_bound([(5, 10)], S=8, T=2048)
    with pytest.raises(ValueError, match="budgets must be positive"):
        first_round_bound(docs, S=0, T=2048)
