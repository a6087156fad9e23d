"""State-ready traversal on SGLang's real prefill scheduling pass (real cache, pools, policy, adder) on CPU.

The paper's basic case: 4 candidates share a document, plus an unrelated request, all waiting at once.
"""
from __future__ import annotations

import pytest
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder

from sglang_radixflow.cache.promises import PromiseState
from sglang_radixflow.schedule.prefix_request import prefix_rid, split_prefix_rid
from sglang_radixflow.schedule.binding import run_prefill_pass
from sglang_radixflow.schedule.blocked import DEFER_COUNT
from tests.unit.cache.helpers import FULL, HYBRID
from tests.unit.schedule.harness import PassHarness, make_request

DOC = list(range(1000, 1600))  # 600 shared tokens


def candidates(salt=None):  # noqa: ANN001, ANN201
    return [make_request(f"c{i}", DOC + list(range(10 * i, 10 * i + 20)), cache_salt=salt) for i in range(4)]


def unrelated():  # noqa: ANN201
    return make_request("other", list(range(5000, 5300)))


def harness(components, arm: str, slot_wait: bool = False, prefix_requests: bool = True) -> PassHarness:  # noqa: ANN001
    return PassHarness(
        components, arm=arm, kv_size=8192, mamba_cache_size=64, slot_wait=slot_wait, prefix_requests=prefix_requests,
    )


def rids(reqs) -> list[str]:  # noqa: ANN001
    return [r.rid for r in reqs]


def prefix(rid: str, boundary: int = len(DOC)) -> str:
    """The rid of the prefix request publishing `rid`'s first `boundary` tokens."""
    return prefix_rid(rid, boundary)


def test_skip_admits_producer_and_unrelated_and_defers_consumers_on_hybrid() -> None:
    h = harness(HYBRID, "radixflow")
    free_slots = h.pool.mamba_allocator.available_size()
    h.submit(*candidates(), unrelated())
    batch = h.run_pass()
    # The producer publishes its first b tokens through a prefix request (no_buffer: the state lands at its end)
    # and waits with its siblings; SGLang's chunk slot stays free.
    assert rids(batch) == [prefix("c0"), "other"]
    assert rids(h.waiting) == ["c0", "c1", "c2", "c3"]
    assert batch[0].extend_end == len(DOC) and list(batch[0].origin_input_ids) == DOC
    assert h.sched.chunked_req is None
    (promise,) = h.cache.rf_sched.promises.for_producer(prefix("c0"))
    assert promise.boundary == len(DOC) and promise.state is PromiseState.OPEN
    # Skipped consumers leave nothing staged: no COW source, no slot, no flag.
    for req in h.waiting:
        assert req.kv.mamba_cow_src_index is None and not req.kv.mamba_needs_clear and not req.kv.holds_mamba
    assert h.pool.mamba_allocator.available_size() == free_slots
    assert h.cache.rf_sched.end_pass([]) is None  # the pass closed its scratch


def test_aborting_the_producer_leaves_its_prefix_request_running() -> None:
    """SGLang's Scheduler.abort_request aborts every queued or running request whose rid starts with the rid given
    (`req.rid.startswith(recv_req.rid)`). A client cancelling the producer must not take away the prefix its siblings
    wait for, so the prefix request's rid must not start with the producer's (it did: `<rid>#radixflow-prefix-<b>`).
    The rid still names the producer and b, the same on every TP rank."""
    h = harness(HYBRID, "radixflow")
    h.submit(*candidates(), unrelated())
    batch = h.run_pass()
    prefix_req = batch[0]
    assert split_prefix_rid(prefix_req.rid) == ("c0", len(DOC))
    aborted = [r.rid for r in batch + h.waiting if r.rid.startswith("c0")]  # SGLang's rule, for an abort of c0
    assert aborted == ["c0"]
    assert split_prefix_rid(prefix_rid("a#7-radixflow-prefix-3", 12)) == ("a#7-radixflow-prefix-3", 12)
    assert split_prefix_rid("c0") is None and split_prefix_rid("radixflow-prefix-x#c0") is None


def test_without_prefix_requests_the_producer_cuts_its_own_chunk_at_b() -> None:
    h = harness(HYBRID, "radixflow", prefix_requests=False)
    h.submit(*candidates(), unrelated())
    batch = h.run_pass()
    assert rids(batch) == ["c0", "other"]
    assert rids(h.waiting) == ["c1", "c2", "c3"]
    producer = batch[0]
    assert producer.extend_end == len(DOC)  # no_buffer: its chunk ends at the branch point, where its state lands
    assert h.sched.chunked_req is producer
    (promise,) = h.cache.rf_sched.promises.for_producer("c0")
    assert promise.boundary == len(DOC) and promise.state is PromiseState.OPEN


def test_stop_mode_leaves_the_unrelated_request_out() -> None:
    h = harness(HYBRID, "prefix-stop")
    h.submit(*candidates(), unrelated())
    assert rids(h.run_pass()) == [prefix("c0")]
    assert rids(h.waiting) == ["c0", "c1", "c2", "c3", "other"]


def test_native_sglang_admits_every_sibling_each_recomputing_the_document() -> None:
    h = harness(HYBRID, "sglang")
    h.submit(*candidates(), unrelated())
    batch = h.run_pass()
    assert rids(batch) == ["c0", "c1", "c2", "c3", "other"]
    assert all(r.prefix_len == 0 and r.extend_end == len(r.origin_input_ids) for r in batch)


def test_hicache_storage_attached_on_a_running_server_turns_the_traversal_off() -> None:
    """SGLang's attach endpoint sets enable_hicache_storage on a live scheduler: a skipped request would already have
    spent its storage prefetch span, so every pass from the next one on is SGLang's own."""
    h = harness(HYBRID, "radixflow")
    h.submit(make_request("first", list(range(7000, 7300))))
    assert rids(h.run_pass()) == ["first"]
    h.sched.enable_hicache_storage = True  # what Scheduler.attach_hicache_storage_wrapped does on success
    adders = []

    def sglang_pass(scheduler, *args):  # noqa: ANN001, ANN202 (the harness cannot run SGLang's storage prefetch)
        adders.append(scheduler.get_prefill_adder_class())
        return None, args[1]

    run_prefill_pass(sglang_pass, h.sched, h.cache.rf_sched, None, ScheduleBatch(reqs=[]))
    assert adders == [PrefillAdder]
    assert h.cache.rf_sched.traversal == "native"
    assert "--enable-hicache-storage is on" in h.cache.rf_sched.disabled_reason


def test_full_attention_producer_runs_whole_and_consumers_wait_for_its_kv() -> None:
    h = harness(FULL, "radixflow")
    h.submit(*candidates(), unrelated())
    batch = h.run_pass()
    assert rids(batch) == ["c0", "other"]
    assert batch[0].extend_end == len(batch[0].origin_input_ids)  # KV enters the tree whole and splits at b
    assert h.sched.chunked_req is None
    assert h.cache.rf_sched.promises.for_producer("c0")[0].boundary == len(DOC)


def test_namespaces_never_wait_on_each_other() -> None:
    h = harness(HYBRID, "radixflow", slot_wait=True, prefix_requests=False)
    a, b = candidates(salt="tenant-a")[:2], candidates(salt="tenant-b")[2:]
    h.submit(a[0], b[0], a[1], b[1])
    batch = h.run_pass()
    # One producer per namespace would need two chunked requests; SGLang tracks one chunked request, so tenant-b's
    # group waits for the slot (it is never deferred onto tenant-a's promise, which it could not use).
    assert rids(batch) == ["c0"]
    assert rids(h.waiting) == ["c2", "c1", "c3"]
    (promise,) = h.cache.rf_sched.promises.open_promises()
    assert promise.namespace == (None, "tenant-a")
    assert promise.covers((None, "tenant-a"), b[0].origin_input_ids)
    assert not promise.covers((None, "tenant-b"), b[0].origin_input_ids)


def test_deferral_is_bounded() -> None:
    h = harness(HYBRID, "radixflow", prefix_requests=False)
    limit = h.cache.rf_sched.config.max_defer_rounds
    h.submit(*candidates())
    h.run_pass()
    h.sched.chunked_req = None  # keep the producer's promise open forever (never executed)
    for _ in range(limit - 1):
        assert h.run_pass() == []
    assert rids(h.run_pass()) == ["c1", "c2", "c3"]  # past the bound they run from h


@pytest.mark.parametrize("arm", ["radixflow", "prefix-stop"])
@pytest.mark.parametrize("components", [FULL, HYBRID], ids=["full", "hybrid"])
def test_consumers_wait_out_a_producer_chunked_past_the_deferral_bound(components, arm) -> None:  # noqa: ANN001
    """The token budget cuts the document into more chunks than the deferral bound allows rounds. The consumers are
    not released midway (each would compute the rest of the document again beside the producer): a continuation short
    of b spends the whole chunk budget, so SGLang's scan ends before it reaches them and nothing counts against their
    bound until the last chunk. The document is computed once. (min_gain 1: with chunks of 48 tokens, the default
    of 64 would let the consumers run beside the last chunk rather than wait for fewer than 64 tokens.)"""
    budget = 48
    h = PassHarness(components, arm=arm, token_budget=budget, kv_size=8192, mamba_cache_size=64, min_gain_tokens=1)
    limit = h.cache.rf_sched.config.max_defer_rounds
    assert len(DOC) > (limit + 2) * budget  # the producer alone needs more rounds than the bound
    h.submit(*candidates())
    first = h.run_pass()
    (promise,) = h.cache.rf_sched.promises.open_promises()
    producer = first[0]
    assert promise.boundary == len(DOC) and producer.rid in {"c0", prefix("c0")}
    rounds = 0
    while promise.state is PromiseState.OPEN:
        h.execute()
        batch = h.run_pass()
        rounds += 1
        if promise.state is PromiseState.OPEN:
            assert rids(batch) == [producer.rid]  # the continuation alone: every sibling still waits
    assert rounds > limit
    # counted at most on the last chunk's pass (short of the budget) and, on the hybrid, when c0 gave way to its
    # prefix request
    assert max(getattr(r, DEFER_COUNT, 0) for r in h.waiting + list(h.batch.reqs)) <= 2
    consumers = [r for r in h.batch.reqs if r.rid != producer.rid]
    assert consumers and all(int(r.prefix_len) == len(DOC) for r in consumers)
    h.execute()
    h.run_rounds()
    computed = sum(f.extend_len for r in h.rounds for f in r.fragments)
    assert computed == len(DOC) + 4 * 20  # the document once, each candidate's own 20 tokens
    h.assert_idle_invariants()


def test_cancelled_promise_releases_its_consumers() -> None:
    h = harness(HYBRID, "radixflow", prefix_requests=False)
    h.submit(*candidates())
    (producer,) = h.run_pass()
    h.sched.chunked_req = None
    h.cache.rf_sched.on_release(producer, round_id=1)  # e.g. the producer was aborted
    assert not list(h.cache.rf_sched.promises.open_promises())
    record = h.cache.rf_sched.records.promise_record()  # the trace's view of it: how many, and why
    assert (record["promises_cancelled_delta"], record["promises_cancelled_reasons"]) == (
        1, {"producer released before publishing": 1})
    assert "promises_cancelled_reasons" not in h.cache.rf_sched.records.promise_record()  # only on rounds that cancelled
    # Nobody waits on the cancelled promise: the next sibling becomes the producer, the others wait on it.
    assert rids(h.run_pass()) == ["c1"]
    assert [p.producer_rid for p in h.cache.rf_sched.promises.open_promises()] == ["c1"]
    assert rids(h.waiting) == ["c2", "c3"]


@pytest.mark.parametrize("arm", ["radixflow", "prefix-stop"])
def test_identical_decisions_when_replayed(arm: str) -> None:
    """Decisions depend only on replicated inputs: two schedulers (two TP ranks) agree."""
    out = []
    for _ in range(2):
        h = harness(HYBRID, arm)
        h.submit(*candidates(), unrelated())
        out.append((rids(h.run_pass()), rids(h.waiting)))
    assert out[0] == out[1]


def test_each_namespace_publishes_through_its_own_prefix_request() -> None:
    """Both tenants' producers publish their b through prefix requests in their own namespace, in one round, and each
    tenant's consumers wait for their own producer only."""
    h = harness(HYBRID, "radixflow")
    a, b = candidates(salt="tenant-a")[:2], candidates(salt="tenant-b")[2:]
    h.submit(a[0], b[0], a[1], b[1])
    batch = h.run_pass()
    assert rids(batch) == [prefix("c0"), prefix("c2")]
    assert [r.cache_salt for r in batch] == ["tenant-a", "tenant-b"]
    assert all(list(r.origin_input_ids) == DOC for r in batch)
    assert rids(h.waiting) == ["c0", "c2", "c1", "c3"]
    promises = {p.producer_rid: p for p in h.cache.rf_sched.promises.open_promises()}
    assert promises[prefix("c0")].namespace == (None, "tenant-a")
    assert promises[prefix("c2")].namespace == (None, "tenant-b")
    assert not promises[prefix("c0")].covers((None, "tenant-b"), b[0].origin_input_ids)


def test_without_prefix_requests_the_second_namespace_runs_natively() -> None:
    """RADIXFLOW_PREFIX_REQUESTS=0 (paper's definitions): tenant-b's siblings are Ready, nothing is produced for them."""
    h = PassHarness(HYBRID, arm="radixflow", kv_size=8192, mamba_cache_size=64, prefix_requests=False)
    a, b = candidates(salt="tenant-a")[:2], candidates(salt="tenant-b")[2:]
    h.submit(a[0], b[0], a[1], b[1])
    assert rids(h.run_pass()) == ["c0", "c2", "c3"]
    assert rids(h.waiting) == ["c1"]


def test_a_cut_producer_is_never_replaced_by_a_second_chunked_request() -> None:
    """The producer's chunk ends at b with budget left; a long unrelated request that would need a chunk must not
    take SGLang's single chunked-request slot (it would silently replace the producer)."""
    h = PassHarness(
        HYBRID, arm="radixflow", token_budget=1000, kv_size=8192, mamba_cache_size=64, prefix_requests=False,
    )
    h.submit(*candidates()[:2], make_request("long", list(range(7000, 7900))))
    batch = h.run_pass()
    assert rids(batch) == ["c0"]
    assert h.sched.chunked_req is batch[0] and batch[0].extend_end == len(DOC)
    assert rids(h.waiting) == ["c1", "long"]
