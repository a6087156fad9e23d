"""Quiet admissions: a request that no later request of its pass can adopt (no other request has its sibling key, or
`examine` proved that none shares past its hit) is tracked in flight at the end of the pass, in C, instead of one by
one when admitted. Adoption must read the table the per-request path builds: a request on a quiet one's key that may
adopt (its own proof failed) has the quiet ones tracked first. On SGLang's real pass under the overlap order (a pass
runs before the previous round's results are processed), the rounds, each request's deferrals and the in-flight
table after every pass must be those of the per-request path."""
from __future__ import annotations

import random
from typing import Any
from unittest import mock

import pytest

from sglang_radixflow.schedule.state import DEFER_COUNT, SchedulingState
from tests.unit.cache.helpers import FULL
from tests.unit.schedule.harness import PassHarness, make_request


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def waves(seed: int) -> list[list[Any]]:
    """Arrival waves, one per pass. Documents D0-D2 are published by the first wave; later waves hold, on the same
    sibling keys: consumers of a published document with their own questions (proven alone), pairs that also share
    a second part the tree does not hold (their proof fails: one produces or adopts, on a key where quiet consumers
    were admitted before them in the same pass), cache-only warm-ups, late siblings of requests in flight, and
    unrelated requests."""
    rng = random.Random(seed)
    docs = [prompt(10_000 * (k + 1), 120 + 40 * k) for k in range(3)]
    counter = iter(range(10_000))

    def consumer(k: int) -> Any:
        n = next(counter)
        return make_request(f"c{n}.d{k}", docs[k] + prompt(500_000 + 100 * n, rng.randint(6, 20)))

    def pair(k: int) -> list[Any]:
        n = next(counter)
        part = prompt(700_000 + 1000 * n, rng.randint(30, 80))
        return [make_request(f"p{n}.{i}.d{k}", docs[k] + part + prompt(900_000 + 100 * n + 10 * i, 5))
                for i in range(2)]

    def warm_up(k: int) -> Any:  # cache-only (sgl.select's warm-up): planned apart from the proof
        n = next(counter)
        return make_request(f"w{n}.d{k}", docs[k] + prompt(600_000 + 100 * n, 8), max_new_tokens=0)

    def unrelated() -> Any:
        n = next(counter)
        return make_request(f"u{n}", prompt(2_000_000 + 1000 * n, rng.randint(20, 150)))

    result = [[make_request(f"warm.d{k}", docs[k] + prompt(400_000 + 100 * k, 4)) for k in range(3)]]
    for _ in range(rng.randint(5, 8)):
        wave: list[Any] = []
        for _ in range(rng.randint(3, 12)):
            kind = rng.random()
            k = rng.randrange(3)
            if kind < 0.5:
                wave.append(consumer(k))
            elif kind < 0.55:
                wave.append(warm_up(k))
            elif kind < 0.7:
                wave += pair(k)
            else:
                wave.append(unrelated())
        rng.shuffle(wave)
        result.append(wave)
    return result


def in_flight_table(h: PassHarness) -> dict[Any, list[tuple[str, int, int]]]:
    """The in-flight table by sibling key: (rid, extend end, round) in its order."""
    return {key: [(str(req.rid), end, round_id) for req, end, round_id in group.values()]
            for key, group in h.cache.rf_sched._unlanded.items()}


def run(seed: int, quiet: bool) -> tuple[list[list[str]], list[dict], dict[str, int], dict[str, int]]:
    """Per pass: the admitted rids and the in-flight table after it; each request's deferrals; how the pass tracked
    (requests tracked at a pass's end, in C, and quiet admissions tracked early because a request might adopt)."""
    h = PassHarness(FULL, token_budget=600, rows=6, kv_size=16384)
    real_examine, real_flush = SchedulingState.examine, SchedulingState._flush_quiet
    real_track_quiet = SchedulingState._track_quiet
    counts = {"quiet": 0, "early": 0}

    def examine(self: SchedulingState, req: Any) -> int:
        checks = real_examine(self, req)
        if not quiet:
            self._alone = None  # every admission takes the per-request path
        return checks

    def flush(self: SchedulingState) -> None:
        counts["early"] += len(self._quiet)
        real_flush(self)

    def track_quiet(self: SchedulingState, reqs: list[Any], round_id: int) -> None:
        counts["quiet"] += len(reqs)
        real_track_quiet(self, reqs, round_id)

    admitted: list[list[str]] = []
    tables: list[dict] = []
    submitted: list[Any] = []
    with mock.patch.object(SchedulingState, "examine", examine), \
            mock.patch.object(SchedulingState, "_flush_quiet", flush), \
            mock.patch.object(SchedulingState, "_track_quiet", track_quiet):
        in_flight = None
        arrivals = waves(seed)
        while arrivals or h.waiting or in_flight is not None:  # one wave per pass, then until the queue drains
            if arrivals:
                submitted += arrivals[0]
                h.submit(*arrivals.pop(0))
            batch = h.run_pass()
            admitted.append([str(r.rid) for r in batch])
            tables.append(in_flight_table(h))
            launched = h.launch() if batch else None
            if in_flight is not None:
                h.finish(in_flight)
            in_flight = launched
            assert len(admitted) < 200, "the queue does not drain"
        h.assert_idle_invariants()
    deferrals = {str(r.rid): getattr(r, DEFER_COUNT, 0) for r in submitted}
    return admitted, tables, deferrals, counts


@pytest.mark.parametrize("seed", range(6))
def test_quiet_admissions_leave_the_table_the_per_request_path_leaves(seed: int) -> None:
    quiet = run(seed, quiet=True)
    eager = run(seed, quiet=False)
    assert quiet[0] == eager[0]  # the same rounds
    assert quiet[2] == eager[2]  # the same deferrals
    for n, (a, b) in enumerate(zip(quiet[1], eager[1])):
        assert a == b, f"in-flight table after pass {n}"
    assert eager[3]["quiet"] < quiet[3]["quiet"]  # the per-request path took admissions the quiet one tracked late


def test_the_workload_exercises_every_path() -> None:
    """Across the seeds: quiet admissions proven alone on shared keys, and requests that might adopt one of them
    (tracked early, before their own verdict)."""
    totals = {"quiet": 0, "early": 0}
    for seed in range(6):
        for name, count in run(seed, quiet=True)[3].items():
            totals[name] += count
    assert totals["quiet"] > 50 and totals["early"] > 3, totals
