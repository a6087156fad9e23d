"""Plans on extra_buffer hybrids (GPU default; the CPU runtime runs it for NemotronH): SGLang snapshots one state per
extend, at `req.mamba_branching_seqlen` when its match sets it (the grid-aligned token hit, where this request leaves a
path the tree knows) and otherwise at the last grid position. radixflow moves that snapshot to serve waiting siblings
or a select's choices, but never off SGLang's own branch point: that state is what every later question on the same
document starts from (found on the frontend `select` path: repeated documents were recomputed whole)."""
from __future__ import annotations

import random

from sglang_radixflow.schedule.producers import PublishMode, native_branch, plan_cache_only, plan_producer
from tests.unit.schedule.harness import make_request

GRID = 64


def _group(doc_len: int = 600, tail: int = 80, n: int = 4) -> list:
    rng = random.Random(0)
    doc = [rng.randrange(3, 2000) for _ in range(doc_len)]
    question = [rng.randrange(3, 2000) for _ in range(40)]
    return [make_request(f"c{i}", doc + question + [rng.randrange(3, 2000) for _ in range(tail)]) for i in range(n)]


def _producer_plan(reqs: list, token_hit: int, branch):  # noqa: ANN001, ANN202
    producer = reqs[0]
    producer.prefix_len = 0
    producer.mamba_branching_seqlen = branch
    return plan_producer(producer, reqs[1:], min_gain=32, mode=PublishMode.TRACK, cache_chunk=GRID,
                         token_hit=token_hit, branch=native_branch(producer))


def test_a_new_document_is_published_at_the_siblings_shared_prefix_on_the_grid() -> None:
    plan = _producer_plan(_group(), token_hit=0, branch=None)
    assert (plan.boundary, plan.siblings) == (640 // GRID * GRID, 3)  # document + question = 640 tokens shared


def test_a_document_seen_before_keeps_sglangs_snapshot_at_its_branch_point() -> None:
    # The tree holds the document's KV (token hit 600) but no state: SGLang's match points the snapshot at 576.
    plan = _producer_plan(_group(), token_hit=600, branch=576)
    assert (plan.boundary, plan.siblings) == (576, 3)


def _warm_up(context_len: int, state_hit: int, branch):  # noqa: ANN001, ANN202
    rng = random.Random(1)
    req = make_request("warm", [rng.randrange(3, 2000) for _ in range(context_len)], max_new_tokens=0)
    req.prefix_len = state_hit
    req.mamba_branching_seqlen = branch
    return plan_cache_only(req, token_hit=600, min_gain=32, mode=PublishMode.TRACK,
                           cache_chunk=GRID, branch=native_branch(req))


def test_a_select_warm_up_snapshots_the_last_position_its_choices_can_use() -> None:
    # context 704: SGLang's own snapshot would be at 704, past context - 2 where the choices' match stops
    assert _warm_up(704, state_hit=0, branch=None).boundary == 640
    assert _warm_up(704, state_hit=576, branch=None).boundary == 576 + 64


def test_a_select_warm_up_on_a_known_document_leaves_sglangs_branch_snapshot_alone() -> None:
    assert _warm_up(704, state_hit=0, branch=576) is None


def test_a_chunked_producer_keeps_its_boundary_on_the_grid_of_its_continuation() -> None:
    """SGLang snapshots inside an extend only on the grid counted from that extend's start. A producer whose document
    outgrows the token budget (400) is chunked: its chunk must stop on the grid (384, not 400), so that b = 640 is on
    the grid of the continuation too, and the continuation must then run on past b (SGLang tracks b inside it) instead
    of being cut there. (Found live: 11 of 54 extra_buffer promises were cancelled as "passed the boundary without a
    state", each after its siblings had waited a round for it.) The harness's cache is a no_buffer one; only the
    scheduling side is switched to extra_buffer's publish mode and grid, which decide these chunk shapes."""
    from sglang_radixflow.bench.passes import HYBRID, PassHarness

    h = PassHarness(HYBRID, token_budget=400, rows=8, kv_size=8192, max_num_reqs=16, mamba_cache_size=32)
    h.cache.rf_sched.mode, h.cache.rf_sched.cache_chunk = PublishMode.TRACK, GRID
    group = _group()  # 600-token document + 40-token question shared, 80-token answers: b = 640 // 64 * 64
    h.submit(*group)
    h.run_pass()
    first = h.execute()
    assert [(f.rid, f.prefix_len, f.extend_len) for f in first.fragments] == [("c0", 0, 384)]
    assert group[0].mamba_branching_seqlen == 640  # b, where SGLang snapshots the producer's state
    assert h.run_pass()
    second = h.execute()
    assert (second.fragments[0].rid, second.fragments[0].prefix_len, second.fragments[0].extend_len) == (
        "c0", 384, 720 - 384)
