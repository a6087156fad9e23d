"""Passes with nothing shared: when no waiting request shares its sibling key with another waiting or in-flight
request, none is cache-only and no promise is open, `SchedulingState.examine` answers PLAIN for every request at the
cost of one test, until a promise is registered in the pass (a chunked request continuing as a producer). The
schedule must be the one the full checks make, on SGLang's real pass, in each of the ways a pass stops being one with
nothing shared."""
from __future__ import annotations

import itertools
import random
from typing import Any, Optional
from unittest import mock

import pytest

from sglang_radixflow.bench.passes import FULL, HYBRID, PassHarness, make_request
from sglang_radixflow.config import RadixFlowConfig
from sglang_radixflow.schedule.producers import PublishMode, SiblingIndex, is_cache_only, sibling_key
from sglang_radixflow.schedule.state import CUT_HOLDS, DEFER_COUNT, MAY_BLOCK, MAY_PLAN, PLAIN, SchedulingState


def brute_plans_nothing(queue: list[Any], unlanded: dict) -> bool:
    keys = [sibling_key(r) for r in {id(r): r for r in queue}.values()]
    indexed = [k for k in keys if k is not None]
    return (
        len(indexed) == len(set(indexed))
        and not any(is_cache_only(r) for r in queue)
        and not set(indexed) & set(unlanded)
    )


def test_the_index_knows_when_nothing_is_shared() -> None:
    """`SiblingIndex.plans_nothing` against its definition, as the queue changes the ways SGLang's does (arrivals,
    admissions, aborts, reordering) with siblings, cache-only requests and in-flight keys coming and going."""
    rng = random.Random(3)
    counter = itertools.count()
    docs = [list(range(1000 * k, 1000 * k + 40)) for k in range(1, 4)]

    def new() -> Any:
        n = next(counter)
        if rng.random() < 0.2:
            return make_request(f"s{n}", rng.choice(docs) + [n])  # a sibling of the document's other requests
        tokens = list(range(100_000 + 100 * n, 100_000 + 100 * n + rng.randint(3, 60)))  # some too short for a key
        return make_request(f"u{n}", tokens, max_new_tokens=0 if rng.random() < 0.1 else 1)

    index, queue = SiblingIndex(), []
    seen = {True: 0, False: 0}
    for _ in range(200):
        queue = queue + [new() for _ in range(rng.randint(0, 3))]
        event = rng.random()
        if event < 0.1 and queue:
            queue.pop(rng.randrange(len(queue)))
        elif event < 0.15:
            queue.reverse()
        index.refresh(queue)
        unlanded = {sibling_key(r): {} for r in rng.sample(queue, min(len(queue), rng.randint(0, 2)))
                    if sibling_key(r) is not None} if rng.random() < 0.3 else {}
        expected = brute_plans_nothing(queue, unlanded)
        assert index.plans_nothing(unlanded) is expected
        seen[expected] += 1
        admitted = rng.sample(queue, min(len(queue), rng.randint(0, 6)))
        queue = [r for r in queue if r not in admitted]
        index.left(admitted, queue)
        assert index.plans_nothing({}) is brute_plans_nothing(queue, {})
        groups: dict = {}
        for r in queue:
            if sibling_key(r) is not None:
                groups.setdefault(sibling_key(r), {})[id(r)] = r
        assert index.groups_view() == groups  # every member in its key's group, no group left empty
    assert seen[True] > 10 and seen[False] > 10  # both answers were exercised


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def script() -> list[list[Any]]:
    """The waves, one per pass, each pass running before the previous round's results are processed (SGLang's
    overlap scheduler). Unrelated requests throughout, each first in its wave (the pass decides at its first request
whether nothing is shared, which then answers for the rest); then
    - pass 2: G, a sibling of F, arrives while F (admitted by pass 1) is in flight (full attention: G may adopt it);
    - pass 3-4: L, a long prompt, is chunked; W, arriving beside its continuation, shares L's first 700 tokens, past
      its first chunk (the continuation becomes W's producer, registered in the middle of a pass whose queue shares
      nothing);
    - pass 5: a cache-only request with nothing else shared (it publishes its states on the hybrid)."""
    doc_f, doc_l, doc_e = prompt(10_001, 200), prompt(20_001, 900), prompt(30_001, 260)
    return [
        [make_request("u0", prompt(1, 60)), make_request("f", doc_f + prompt(11_001, 9))],
        [make_request("u1", prompt(2_001, 50)), make_request("g", doc_f + prompt(12_001, 7))],
        [make_request("u2", prompt(3_001, 40)), make_request("L", doc_l)],
        [make_request("u3", prompt(4_001, 70)), make_request("w", doc_l[:700] + prompt(21_001, 12))],
        [make_request("u4", prompt(5_001, 80)), make_request("warm", doc_e, max_new_tokens=0)],
        [make_request(f"u{5 + i}", prompt(6_001 + 300 * i, 90 + 20 * i)) for i in range(6)],
    ]


def run(components: Any, full_checks: bool) -> tuple[list[Any], dict[str, Any], int]:
    """Fragments of every round, each request's defer / cut-hold counters, and how many requests a pass with nothing
    shared answered PLAIN. full_checks: every request gets `blocking_promise` and planning, whatever examine says."""
    h = PassHarness(components, token_budget=512, rows=6, kv_size=16384, mamba_cache_size=64)
    real_examine = SchedulingState.examine
    fast = [0]

    def examine(self: SchedulingState, req: Any) -> int:
        checks = real_examine(self, req)
        fast[0] += self._nothing_shared and checks == PLAIN
        return checks | MAY_BLOCK | MAY_PLAN if full_checks else checks

    waves = script()
    requests = [r for wave in waves for r in wave]
    with mock.patch.object(SchedulingState, "examine", examine):
        in_flight: Optional[Any] = None
        for _ in range(60):
            if waves:
                h.submit(*waves.pop(0))
            elif not (h.waiting or h.sched.chunked_req is not None or in_flight is not None):
                break
            launched = h.launch() if h.run_pass() else None
            if in_flight is not None:
                h.finish(in_flight)
            in_flight = launched
        assert in_flight is None and not waves, "queue not drained"
    h.assert_idle_invariants()
    counters = {r.rid: (getattr(r, DEFER_COUNT, 0), getattr(r, CUT_HOLDS, 0)) for r in requests}
    return [r.fragments for r in h.rounds], counters, fast[0]


@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_passes_with_nothing_shared_schedule_as_the_full_checks(components: Any) -> None:
    full_rounds, full_counters, _ = run(components, full_checks=True)
    rounds, counters, fast = run(components, full_checks=False)
    assert rounds == full_rounds
    assert counters == full_counters
    assert fast > 5, "passes with nothing shared answered on the short path"
    assert counters["w"][0] > 0, "w waited for L's continuation (a promise registered in the middle of a pass)"
    if components is FULL:
        assert counters["g"][0] > 0, "g adopted f in flight"


def test_the_admissions_of_a_pass_with_nothing_shared_are_tracked_in_flight_as_one_by_one() -> None:
    """A pass with nothing shared tracks its indexed admissions in flight at its end, in C (`_track_quiet`): the
    table of in-flight requests must be the one `_track_in_flight` builds request by request, whatever the batch
    holds — requests whose KV does not land under their token ids (session, multimodal or embedding input, barred
    from the tree), requests too short for a sibling key, keys already in flight, keys two of them share (appended
    to one group in order), and requests whose key was never cached (the batch then takes the per-request path)."""
    rng = random.Random(5)
    docs = [list(range(1000 * k, 1000 * k + 40)) for k in range(1, 6)]
    fast = 0
    for trial in range(300):
        reqs = []
        for n in range(rng.randint(0, 8)):
            if rng.random() < 0.15:
                tokens = list(range(50_000 + 10 * n, 50_000 + 10 * n + 3))  # too short for a key
            elif rng.random() < 0.3:
                tokens = rng.choice(docs) + [n]  # may share its key with another of the batch or one in flight
            else:
                tokens = list(range(100_000 + 100 * n + 1000 * trial, 100_000 + 100 * n + 1000 * trial + 50))
            req = make_request(f"r{trial}.{n}", tokens)
            req.prefix_len, req.extend_end = 0, len(tokens)  # as SGLang's match and admission leave them
            odd = rng.random()
            if odd < 0.05:
                req.session = object()
            elif odd < 0.1:
                req.input_embeds = [[0.0]]
            elif odd < 0.15:
                req.skip_radix_cache_insert = True
            elif odd < 0.2:
                req.multimodal_inputs = object()
            if rng.random() < 0.9:
                sibling_key(req)  # cached, as indexing the queue leaves it
            reqs.append(req)
        earlier = make_request("earlier", rng.choice(docs) + [99])
        earlier.prefix_len, earlier.extend_end = 0, 41
        with_earlier = rng.random() < 0.5
        tables = []
        for one_by_one in (True, False):
            sched = SchedulingState(RadixFlowConfig(), PublishMode.KV, 1)
            if with_earlier:
                sched._track_in_flight(earlier, 6)  # admitted by the pass before
            if one_by_one:
                for req in reqs:
                    sched._track_in_flight(req, 7)
            else:
                singly = []
                sched._track_in_flight = lambda req, round_id, sched=sched: (  # type: ignore[method-assign]
                    singly.append(req), SchedulingState._track_in_flight(sched, req, round_id))
                sched._track_quiet(list(reqs), 7)
                fast += not singly and len(reqs) > 2
            tables.append({key: dict(group) for key, group in sched._unlanded.items()})
        assert tables[0] == tables[1], trial
    assert fast > 50  # most batches take the C path
