"""The fewest rounds in which a fixed set of fragments can run: the exact version of the replay's lower bound.

max(⌈W/T⌉, ⌈V/S⌉, D) relaxes three constraints separately. Held together — every fragment in one round, at most S
rows and T tokens per round, each fragment in a later round than the one that computed its prefix — they are a small
time-indexed integer program (fragments x rounds binaries), which SciPy's MILP solver (HiGHS, shipped with SGLang's
dependencies) settles in seconds for the replay's instances. The answer is a lower bound for any schedule of the same
fragments, so an arm's rounds over it say how much of its gap to max(⌈W/T⌉, ⌈V/S⌉, D) is its own ordering and how
much the instance's structure (e.g. a cold round can only hold documents).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Optimum:
    rounds: int  # the fewest rounds found feasible (the schedule's own count if none fewer was)
    proven: bool  # rounds - 1 was proven infeasible (else the solver's time ran out first: rounds is an upper value)


def _heights(parent: Sequence[Optional[int]]) -> list[int]:
    """Longest chain from each fragment down to a leaf, itself included (parents precede children)."""
    height = [1] * len(parent)
    for i in reversed(range(len(parent))):
        p = parent[i]
        if p is not None:
            assert p < i, "a parent precedes its children"
            height[p] = max(height[p], height[i] + 1)
    return height


def _depths(parent: Sequence[Optional[int]]) -> list[int]:
    depth: list[int] = []
    for p in parent:
        depth.append(1 if p is None else depth[p] + 1)
    return depth


def fits(tokens: Sequence[int], parent: Sequence[Optional[int]], S: int, T: int, K: int,  # noqa: N803
         time_limit_s: float) -> Optional[bool]:
    """Whether the fragments can run in K rounds; None when the solver's time ran out."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n = len(tokens)
    if any(t > T for t in tokens):
        return False
    depth, height = _depths(parent), _heights(parent)
    var: dict[tuple[int, int], int] = {}  # (fragment, round) -> column; only rounds its chain leaves room for
    for i in range(n):
        if depth[i] + height[i] - 1 > K:
            return False
        for r in range(depth[i], K - height[i] + 2):
            var[(i, r)] = len(var)
    rows, cols, vals, lower, upper = [], [], [], [], []

    def constraint(terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        for col, val in terms:
            rows.append(len(lower))
            cols.append(col)
            vals.append(val)
        lower.append(lo)
        upper.append(hi)

    by_fragment: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (round, column)
    by_round: list[list[int]] = [[] for _ in range(K + 1)]
    for (i, r), col in var.items():
        by_fragment[i].append((r, col))
        by_round[r].append(i)
    for i in range(n):
        constraint([(col, 1.0) for _, col in by_fragment[i]], 1, 1)  # runs exactly once
    for r in range(1, K + 1):
        constraint([(var[(i, r)], 1.0) for i in by_round[r]], 0, S)
        constraint([(var[(i, r)], float(tokens[i])) for i in by_round[r]], 0, T)
    for i, p in enumerate(parent):
        if p is not None:  # round(i) - round(p) >= 1
            constraint([(col, float(r)) for r, col in by_fragment[i]] + [(col, -float(r)) for r, col in by_fragment[p]],
                       1, np.inf)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(lower), len(var))).tocsr()
    result = milp(c=np.zeros(len(var)), constraints=LinearConstraint(matrix, lower, upper),
                  integrality=np.ones(len(var)), bounds=Bounds(0, 1), options={"time_limit": time_limit_s})
    if result.status == 0:
        return True
    if result.status == 2:
        return False
    return None  # time limit (1) or another solver status: unknown


def fewest_rounds(tokens: Sequence[int], parent: Sequence[Optional[int]], S: int, T: int,  # noqa: N803
                  rounds: int, lower_bound: int, time_limit_s: float = 30.0) -> Optimum:
    """Fewest rounds for these fragments, searched down from a schedule's own `rounds` to `lower_bound` (each step
    proves a schedule one round shorter exists, until one is proven impossible or the time per step runs out)."""
    best = rounds
    for K in range(rounds - 1, lower_bound - 1, -1):  # noqa: N806
        feasible = fits(tokens, parent, S, T, K, time_limit_s)
        if feasible is None:
            return Optimum(best, proven=False)
        if not feasible:
            return Optimum(best, proven=True)
        best = K
    return Optimum(best, proven=True)  # reached a valid lower bound
