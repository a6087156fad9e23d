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


def first_round_bound(fragments: Iterable[tuple[int, int]], S: int, T: int) -> int:  # noqa: N803
    """A tighter bound for a queue that starts with nothing cached: max(1 + ceil((V - a1) / S), 1 + ceil((W - w1) / T)).

    fragments: (prefix_len, extend_len) of each fragment. Round 1 can only run fragments that start at 0 (nothing is
    cached before it): at most a1 of them, the most of the shortest ones that fit T tokens and S rows, and at most
    w1 = min(T, their tokens) tokens; every later round moves at most S rows and T tokens. 0 for no fragments."""
    if S < 1 or T < 1:
        raise ValueError(f"budgets must be positive: S={S}, T={T}")
    frags = list(fragments)
    if not frags:
        return 0
    from_zero = sorted(n for p, n in frags if p == 0)
    if not from_zero:
        raise ValueError("no fragment starts at 0: nothing could run in the first round")
    rows = tokens = 0
    for n in from_zero:
        if rows == S or tokens + n > T:
            break
        rows, tokens = rows + 1, tokens + n
    total_tokens = sum(n for _, n in frags)
    first_tokens = min(T, sum(from_zero))
    return max(1 + _ceil_div(len(frags) - rows, S), 1 + _ceil_div(total_tokens - first_tokens, T))
