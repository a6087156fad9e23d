"""Round counts for a fixed set of fragments (paper, "Lower bound on rounds").

A fragment is one row visit: one request's extend in one round. With W tokens over all fragments, V row visits and
dependency depth D (the longest producer -> consumer chain, counted in fragments), any schedule with at most S rows
and T tokens per round needs K >= max(ceil(W / T), ceil(V / S), D) rounds: every round moves at most T tokens and at
most S rows, and a fragment can run only after the round that published the prefix it continues from.
"""
from __future__ import annotations

from typing import Iterable


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_lower_bound(total_tokens: int, row_visits: int, depth: int, S: int, T: int) -> int:  # noqa: N803
    """max(ceil(W / T), ceil(V / S), D); 0 for an empty workload."""
    if S < 1 or T < 1:
        raise ValueError(f"budgets must be positive: S={S}, T={T}")
    if min(total_tokens, row_visits, depth) < 0:
        raise ValueError(f"negative workload: W={total_tokens}, V={row_visits}, D={depth}")
    if row_visits == 0:
        return 0
    if depth < 1:
        raise ValueError("a non-empty workload has depth >= 1")
    return max(_ceil_div(total_tokens, T), _ceil_div(row_visits, S), depth)


def empty_row_slots(rows_per_round: Iterable[int], S: int) -> int:  # noqa: N803
    """Sum over rounds of b_t = S - |B_t| (rows left unused)."""
    total = 0
    for rows in rows_per_round:
        if not 0 <= rows <= S:
            raise ValueError(f"a round used {rows} rows with S={S}")
        total += S - rows
    return total
