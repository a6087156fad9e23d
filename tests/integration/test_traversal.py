"""State-ready traversal on real SGLang servers (CPU): reuse, equality with native outputs, aborts, no leaks.

The hybrid tests run on NemotronH (Mamba-2); those that exercise a distinct path of the state handling (consumers,
aborts, namespaces, adoption, a chunked producer, `/v1/score`, sessions) also on Qwen3.5 (gated delta net).
"""
from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from sglang_radixflow.bench.report import parse_prefill_lines
from sglang_radixflow.bench.server import SGLangServer, ServerError
from tests.integration.server_group import started

DOC_LEN = 600
LEAK = "memory leak detected"
# float32 with a float32 conv state: a consumer resumed from the producer's state must give the same next-token
# logprob as native SGLang computing the whole prompt (see test_serving.py for why these settings).
FLOAT32 = ("--dtype", "float32")
FLOAT32_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
LOGPROB_TOL = 2e-4
HYBRIDS = ("nemotron_h", "qwen3_5")
# `hybrid_servers` is parametrized per test (indirect): on both hybrid families, or on NemotronH alone
ON_BOTH_HYBRIDS = pytest.mark.parametrize("hybrid_servers", HYBRIDS, indirect=True)
ON_NEMOTRON_H = pytest.mark.parametrize("hybrid_servers", ["nemotron_h"], indirect=True)


def _workload(seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    doc = [rng.randrange(3, 2000) for _ in range(DOC_LEN)]
    cands = [doc + [rng.randrange(3, 2000) for _ in range(20)] for _ in range(4)]
    return cands, [rng.randrange(3, 2000) for _ in range(300)]


def _batch(
    server: SGLangServer, prompts: list[list[int]], rids: list[str] | None = None, salts: list[str] | None = None
) -> list[dict]:
    payload = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
               "return_logprob": True}
    if rids:
        payload["rid"] = rids
    if salts:
        payload["cache_salt"] = salts
    return server.post("/generate", payload)


def _log_with(server: SGLangServer, *lines: str, timeout_s: float = 10.0, since: int = 0,
              poll_s: float = 0.05) -> str:
    """The server's log from offset `since` once it holds every one of `lines` (or at the timeout). SGLang 0.5.23 logs
    a prefill batch after streaming its outputs (batch_result_processor: stream_output, then report_prefill_stats), so
    a response can reach the client before the log line of its last round is written."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = server.log_text()[since:]
        if all(line in log for line in lines) or time.monotonic() > deadline:
            return log
        time.sleep(poll_s)


def _adopted(trace: Path) -> int:
    """In-flight requests adopted as producers, over the round records of a radixflow trace so far."""
    rounds = [json.loads(line) for line in trace.read_text().splitlines()]
    return sum(r.get("adopted_producers", 0) for r in rounds if r.get("kind") == "round")


@pytest.fixture(scope="module")
def trace_path(hybrid_servers: dict[str, SGLangServer]) -> Path:
    """The trace of the radixflow server in `hybrid_servers`."""
    return Path(hybrid_servers["radixflow"].env["RADIXFLOW_TRACE"])


@pytest.fixture(scope="module")
def hybrid_servers(
    request: pytest.FixtureRequest, model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SGLangServer]]:
    """Native SGLang, prefix-stop and radixflow on the hybrid named by the test's parameter (no_buffer)."""
    model = str(model_dirs[request.param])
    trace_path = tmp_path_factory.mktemp(f"trace-{request.param}") / "radixflow.jsonl"
    servers = {
        "sglang": SGLangServer(model, radix_cache=None, extra_args=FLOAT32, env=FLOAT32_ENV),
        "prefix-stop": SGLangServer(model, extra_args=FLOAT32, env={**FLOAT32_ENV, "RADIXFLOW_ARM": "prefix-stop"}),
        "radixflow": SGLangServer(model, extra_args=FLOAT32, env={**FLOAT32_ENV, "RADIXFLOW_TRACE": str(trace_path)}),
    }
    with started(servers):
        yield servers


@ON_BOTH_HYBRIDS
def test_consumers_start_from_the_producers_state_and_outputs_equal_native(
    hybrid_servers: dict[str, SGLangServer],
) -> None:
    cands, other = _workload()
    results = {arm: _batch(s, cands + [other]) for arm, s in hybrid_servers.items()}
    cached = {arm: [o["meta_info"]["cached_tokens"] for o in out] for arm, out in results.items()}
    # Native SGLang admits every sibling in one batch: each recomputes the document.
    assert cached["sglang"] == [0, 0, 0, 0, 0]
    # radixflow: the producer's prefix request computes the document and leaves its state at the branch point; the
    # producer and its three siblings wait one round and start from it.
    assert cached["radixflow"] == [DOC_LEN, DOC_LEN, DOC_LEN, DOC_LEN, 0]
    assert cached["prefix-stop"] == cached["radixflow"]
    outputs = {arm: [o["output_ids"] for o in out] for arm, out in results.items()}
    assert outputs["radixflow"] == outputs["sglang"] == outputs["prefix-stop"]
    logprobs = {arm: [o["meta_info"]["output_token_logprobs"][0][0] for o in out] for arm, out in results.items()}
    for arm in ("radixflow", "prefix-stop"):
        diffs = [abs(a - b) for a, b in zip(logprobs[arm], logprobs["sglang"])]
        assert max(diffs) < LOGPROB_TOL, (arm, diffs)
    # ĥ and h per request in meta_info: the consumers' token hit is state-ready too.
    meta = [(o["meta_info"]["radixflow_token_hit"], o["meta_info"]["radixflow_state_hit"]) for o in results["radixflow"]]
    assert meta == [([DOC_LEN], [DOC_LEN])] * 4 + [([0], [0])]
    # SGLang's scheduler log: the document (the producer's prefix request) shared its round with the unrelated
    # request; the next round ran the four candidates from it.
    rounds = (f"#new-seq: 2, #new-token: {DOC_LEN + 300}, #cached-token: 0",
              f"#new-seq: 4, #new-token: 80, #cached-token: {4 * DOC_LEN}")
    log = _log_with(hybrid_servers["radixflow"], *rounds)
    for line in rounds:
        assert line in log


@ON_BOTH_HYBRIDS
def test_aborted_producer_releases_consumers_and_nothing_leaks(hybrid_servers: dict[str, SGLangServer]) -> None:
    server = hybrid_servers["radixflow"]
    rng = random.Random(7)
    # A document longer than the chunk (4096) keeps the producer's prefix request in flight for two rounds: the abort
    # reaches the scheduler between them.
    doc = [rng.randrange(3, 2000) for _ in range(6000)]
    cands = [doc + [rng.randrange(3, 2000) for _ in range(10)] for _ in range(4)]
    rids = [f"abort-test-{i}" for i in range(4)]
    results: list = []
    worker = threading.Thread(target=lambda: results.extend(_try_batch(server, cands, rids)))
    worker.start()
    time.sleep(0.3)
    server.post("/abort_request", {"rid": rids[0]})
    worker.join(timeout=240)
    assert not worker.is_alive(), "consumers of an aborted producer never completed"
    finished = [r for r in results if r["meta_info"]["finish_reason"]["type"] != "abort"]
    assert len(finished) >= 3, results
    # Aborting the producer leaves its prefix request running (its rid does not start with the producer's, which
    # SGLang's abort matches by): the consumers still start from the document's state.
    assert all(r["meta_info"]["cached_tokens"] >= len(doc) - 64 for r in finished), [
        r["meta_info"]["cached_tokens"] for r in finished]
    log_lines = server.log_text().splitlines()
    assert not [line for line in log_lines if "Abort request" in line and "radixflow-prefix" in line]
    # Idle now: SGLang's idle check (strict by default) would raise on any leaked KV or mamba slot.
    time.sleep(2.0)
    assert server.generate([5, 6, 7], 2)["output_ids"]
    assert LEAK not in server.log_text()


def _try_batch(server: SGLangServer, prompts: list[list[int]], rids: list[str]) -> list[dict]:
    try:
        return _batch(server, prompts, rids)
    except ServerError:  # the batch call reports the aborted member as an error on some paths
        return [server.generate(p, 1) for p in prompts[1:]]


@ON_NEMOTRON_H
def test_mixed_workload_leaves_no_leak(hybrid_servers: dict[str, SGLangServer]) -> None:
    server = hybrid_servers["radixflow"]
    rng = random.Random(11)
    docs = [[rng.randrange(3, 2000) for _ in range(rng.randint(100, 900))] for _ in range(5)]
    prompts = [rng.choice(docs) + [rng.randrange(3, 2000) for _ in range(rng.randint(1, 40))] for _ in range(24)]
    rids = [f"mixed-{i}" for i in range(len(prompts))]
    worker = threading.Thread(target=lambda: _try_batch(server, prompts, rids))
    worker.start()
    for rid in rids[::5]:
        time.sleep(0.05)
        server.post("/abort_request", {"rid": rid})
    worker.join(timeout=300)
    assert not worker.is_alive()
    time.sleep(2.0)
    assert server.generate([9, 8, 7], 2)["output_ids"]
    assert LEAK not in server.log_text()


@ON_NEMOTRON_H
def test_round_trace_records_the_producer_round_and_the_consumer_round(
    hybrid_servers: dict[str, SGLangServer], trace_path: Path
) -> None:
    from sglang_radixflow.observe.trace import read_trace

    cands, other = _workload(3)
    _batch(hybrid_servers["radixflow"], cands + [other])
    time.sleep(0.5)
    rounds = [r for r in read_trace(str(trace_path), "round") if r["kind_of_round"] == "prefill" and r["rows"] > 1]
    producer_round = next(r for r in rounds if r["producers"] == 1 and r["blocked_skips"] == 3)
    assert producer_round["rows"] == 2 and producer_round["tokens"] == DOC_LEN + 300
    assert producer_round["prefix_requests"] == 1  # the producer waits too, for its own prefix request
    assert producer_round["deferred"] == 4 and not producer_round["avoidable_bubble"]
    assert producer_round["promises_registered_delta"] == 1 and producer_round["promises_open"] == 1
    consumer_round = next(r for r in rounds if r["round"] == producer_round["round"] + 1)
    assert consumer_round["rows"] == 4 and consumer_round["state_hit_sum"] == 4 * DOC_LEN
    # the prefix request's state landed while the producer round's results were processed: published since then
    assert consumer_round["promises_published_delta"] == 1 and consumer_round["promises_cancelled_delta"] == 0
    assert all(r["host_time_s"] > 0 for r in rounds)
    every = list(read_trace(str(trace_path), "round"))  # all kinds: the deltas add up to the table's counters
    opened = sum(r["promises_registered_delta"] for r in every)
    closed = sum(r["promises_published_delta"] + r["promises_cancelled_delta"] for r in every)
    assert opened - closed == every[-1]["promises_open"]


@ON_BOTH_HYBRIDS
def test_namespaces_never_share_a_producer(hybrid_servers: dict[str, SGLangServer]) -> None:
    """Same document, two cache_salt values: each tenant's consumers wait for their own tenant's producer, never the
    other's. Each tenant's producer publishes the document through a prefix request in its own namespace, whose
    output never reaches a client. A third tenant reuses neither."""
    server = hybrid_servers["radixflow"]
    cands, _ = _workload(5)
    out = _batch(server, [cands[0], cands[2], cands[1], cands[3]],
                 salts=["tenant-a", "tenant-b", "tenant-a", "tenant-b"])
    assert [o["meta_info"]["cached_tokens"] for o in out] == [DOC_LEN] * 4
    again = _batch(server, [cands[0]], salts=["tenant-c"])
    assert again[0]["meta_info"]["cached_tokens"] == 0
    assert "radixflow-prefix" not in server.log_text()  # no output for the prefix request reached the tokenizer


@pytest.fixture(scope="module")
def control_servers(model_dirs: dict[str, Path]) -> Iterator[dict[str, SGLangServer]]:
    model = str(model_dirs["qwen3"])
    servers = {
        "sglang": SGLangServer(model, radix_cache=None),
        "radixflow": SGLangServer(model, extra_args=["--enable-metrics"]),
    }
    with started(servers):
        yield servers


def test_full_attention_control_consumers_wait_for_the_producers_kv(control_servers: dict[str, SGLangServer]) -> None:
    """SGLang (unlike vLLM) does not share same-round KV: natively every sibling recomputes the document on the
    control too; with radixflow the consumers wait one round and hit the producer's KV."""
    cands, other = _workload(9)
    results = {arm: _batch(s, cands + [other]) for arm, s in control_servers.items()}
    cached = {arm: [o["meta_info"]["cached_tokens"] for o in out] for arm, out in results.items()}
    assert cached["sglang"] == [0, 0, 0, 0, 0]
    assert cached["radixflow"] == [0, DOC_LEN, DOC_LEN, DOC_LEN, 0]
    assert [o["output_ids"] for o in results["radixflow"]] == [o["output_ids"] for o in results["sglang"]]


def test_a_sibling_sent_during_its_producers_round_waits_for_that_kv(
    control_servers: dict[str, SGLangServer], model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Full attention runs SGLang's overlap scheduler: the pass after a request's round runs before that round's KV
    lands, so a sibling arriving meanwhile would recompute the shared document (natively it does). With radixflow it
    adopts the in-flight request as its producer, waits one round and hits the KV. prefix-stop (no admission hold,
    which can catch the case by itself on an idle server); a 3000-token document keeps the first request in flight
    for ~0.2 s on this 2-core CPU, and four send gaps make sure at least one sibling lands in that window (a faster
    CPU shortens it: the short gaps cover that). Whatever the timing, the second request hits the whole document."""
    trace = tmp_path / "radixflow.jsonl"
    server = SGLangServer(str(model_dirs["qwen3"]), env={
        "RADIXFLOW_ARM": "prefix-stop", "RADIXFLOW_TRACE": str(trace), "OMP_NUM_THREADS": "1"})
    rng = random.Random(29)
    server.start()
    try:
        for gap in (0.01, 0.03, 0.06, 0.1):
            doc = [rng.randrange(3, 2000) for _ in range(3000)]
            first, second = doc + [5, 6, 7], doc + [8, 9, 10]
            out: dict[str, dict] = {}
            worker = threading.Thread(target=lambda: out.update(a=server.generate(first, 1)))
            worker.start()
            time.sleep(gap)
            out["b"] = server.generate(second, 1)
            worker.join(timeout=120)
            assert [out[k]["meta_info"]["cached_tokens"] for k in "ab"] == [0, 3000], gap
            native = control_servers["sglang"].generate(second, 1)
            assert out["b"]["output_ids"] == native["output_ids"]
        time.sleep(1.0)
        assert LEAK not in server.log_text()
    finally:
        server.stop()
    assert _adopted(trace) >= 1


@ON_BOTH_HYBRIDS
def test_an_extra_buffer_sibling_sent_during_a_requests_round_waits_for_its_snapshot(
    hybrid_servers: dict[str, SGLangServer], model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The hybrid counterpart of the test above, in SGLang's GPU default for hybrids: extra_buffer with the overlap
    scheduler (on the CPU runtime). A request alone on the server snapshots one state inside its extend, on
    the 64-token grid (2944 of a 3003-token prompt), which enters the tree only when its round's results are
    processed, after the next pass. A sibling sharing the 3000-token document that reaches that pass adopts the
    request: it waits a round and starts from 2944 (without adoption it recomputes the document beside it, from 0).
    Same send gaps as above; whatever the timing, the second request starts from the snapshot. A sibling that branches
    before the snapshot (2940 shared tokens, the snapshot at 2944) has nothing to wait for: it is never adopted."""
    trace = tmp_path / "radixflow.jsonl"
    server = SGLangServer(hybrid_servers["radixflow"].model_path, extra_args=FLOAT32, mamba_strategy="extra_buffer",
                          env={**FLOAT32_ENV, "RADIXFLOW_ARM": "prefix-stop", "RADIXFLOW_TRACE": str(trace),
                               "OMP_NUM_THREADS": "1"})
    rng = random.Random(43)
    snapshot = 3003 // 64 * 64

    def pair(doc_len: int, gap: float) -> tuple[list[int], dict[str, dict]]:
        """A 3003-token prompt, then after `gap` s a sibling sharing its first doc_len tokens: (sibling, outputs)."""
        doc = [rng.randrange(3, 2000) for _ in range(doc_len)]
        first, second = doc + [5, 6, 7] + [4] * (3003 - doc_len - 3), doc + [8, 9, 10]
        out: dict[str, dict] = {}
        worker = threading.Thread(target=lambda: out.update(a=server.generate(first, 1, return_logprob=True)))
        worker.start()
        time.sleep(gap)
        out["b"] = server.generate(second, 1, return_logprob=True)
        worker.join(timeout=120)
        return second, out

    server.start()
    try:
        for gap in (0.01, 0.06):
            _, out = pair(2940, gap)
            assert [out[k]["meta_info"]["cached_tokens"] for k in "ab"] == [0, 0], gap
        time.sleep(0.5)  # the trace's record of the last round
        assert _adopted(trace) == 0
        for gap in (0.01, 0.03, 0.06, 0.1):
            second, out = pair(3000, gap)
            assert [out[k]["meta_info"]["cached_tokens"] for k in "ab"] == [0, snapshot], gap
            native = hybrid_servers["sglang"].generate(second, 1, return_logprob=True)
            assert out["b"]["output_ids"] == native["output_ids"]
            diff = out["b"]["meta_info"]["output_token_logprobs"][0][0] - native["meta_info"]["output_token_logprobs"][0][0]
            assert abs(diff) < LOGPROB_TOL, (gap, diff)
        time.sleep(1.0)
        log = server.log_text()
        assert "#new-seq: 1, #new-token: 3003, #cached-token: 0" in log  # the first request ran in one extend
        assert "'disable_overlap_schedule': False" in log and LEAK not in log
        assert _adopted(trace) >= 1
    finally:
        server.stop()


@ON_NEMOTRON_H
@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_siblings_sent_while_a_chunked_prompt_continues_wait_for_its_state(
    hybrid_servers: dict[str, SGLangServer], model_dirs: dict[str, Path], tmp_path: Path, strategy: str
) -> None:
    """A 3000-token document + question, chunked 256 tokens at a time; its three siblings are sent once the server
    has logged the first chunk, so they reach a pass that continues the chunked request (which was no producer: nobody
    waited when it was admitted). It becomes their producer, and the siblings start from its state at the branch
    point: no_buffer cuts its continuation there (3000, off the 256 grid); extra_buffer snapshots inside the
    continuation at the branch point's last position on the 64-token grid (2944). The document is computed once
    (natively each sibling recomputes it; without the continuation becoming their producer, the first late sibling
    would produce it again beside the continuation), and outputs equal native SGLang's.
    The document spans twelve chunks so that the siblings reach the scheduler before the last one is planned even on a
    loaded 2-core machine (with a 1000-token document, CI once saw the first sibling arrive after that, at 768)."""
    rng = random.Random(41)
    doc = [rng.randrange(3, 2000) for _ in range(3000)]
    prompts = [doc + [rng.randrange(3, 2000) for _ in range(20)] for _ in range(4)]
    prompt_len = len(prompts[0])
    chunk = (*FLOAT32, "--chunked-prefill-size", "256")
    b = len(doc) if strategy == "no_buffer" else len(doc) // 64 * 64
    trace = tmp_path / "radixflow.jsonl"
    server = SGLangServer(str(model_dirs["nemotron_h"]), extra_args=chunk, mamba_strategy=strategy,
                          env={**FLOAT32_ENV, "RADIXFLOW_TRACE": str(trace)})
    server.start()
    try:
        start = len(server.log_text())
        out: dict[str, object] = {}
        worker = threading.Thread(target=lambda: out.update(first=_batch(server, prompts[:1])))
        worker.start()
        first_chunk = "#new-seq: 1, #new-token: 256, #cached-token: 0"
        # polled finely: the siblings must reach the server while the prompt's next chunks are still to come
        log = _log_with(server, first_chunk, timeout_s=60, since=start, poll_s=0.005)
        assert first_chunk in log, log[-2000:]
        siblings = _batch(server, prompts[1:])
        worker.join(timeout=120)
        results = out["first"] + siblings
        assert [o["meta_info"]["cached_tokens"] for o in siblings] == [b] * 3
        own = prompt_len - b
        log = _log_with(server, f"#new-seq: 3, #new-token: {3 * own}, #cached-token: {3 * b}", since=start)
        computed = sum(line["new"] for line in parse_prefill_lines(log))
        assert computed == prompt_len + 3 * own, computed  # the first prompt whole, each sibling past the branch point
        if strategy == "no_buffer":
            native = _batch(hybrid_servers["sglang"], prompts)
        else:
            with SGLangServer(str(model_dirs["nemotron_h"]), radix_cache=None, extra_args=chunk, env=FLOAT32_ENV,
                              mamba_strategy=strategy) as native_server:
                native = _batch(native_server, prompts)
        assert [o["output_ids"] for o in results] == [o["output_ids"] for o in native]
        diffs = [abs(a["meta_info"]["output_token_logprobs"][0][0] - n["meta_info"]["output_token_logprobs"][0][0])
                 for a, n in zip(results, native)]
        assert max(diffs) < LOGPROB_TOL, diffs
        time.sleep(1.0)
        assert LEAK not in server.log_text()
        assert f"'mamba_radix_cache_strategy': '{strategy}'" in server.log_text()
    finally:
        server.stop()
    assert _adopted(trace) == 1


def test_prometheus_exports_round_counters(control_servers: dict[str, SGLangServer]) -> None:
    cands, other = _workload(13)
    _batch(control_servers["radixflow"], cands + [other])
    metrics = control_servers["radixflow"].get("/metrics")
    values = {
        line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
        if line.startswith("radixflow_") and not line.startswith("#")
    }
    assert values["radixflow_blocked_skips_total"] >= 3
    assert values['radixflow_promises_total{outcome="registered"}'] >= 1
    assert values['radixflow_promises_total{outcome="published"}'] >= 1
    assert values['radixflow_rounds_total{kind="prefill"}'] >= 2


PAGE = 16


@pytest.fixture(scope="module")
def paged_servers(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    model = str(model_dirs["qwen3"])
    trace = tmp_path_factory.mktemp("paged") / "radixflow.jsonl"
    args = ["--page-size", str(PAGE), *FLOAT32]
    servers = {
        "sglang": SGLangServer(model, radix_cache=None, extra_args=args),
        "radixflow": SGLangServer(model, extra_args=args, env={"RADIXFLOW_TRACE": str(trace)}),
    }
    with started(servers):
        yield {"servers": servers, "trace": trace}


def test_paged_tree_consumers_wait_once_for_the_last_whole_page(paged_servers: dict) -> None:
    """--page-size 16 (GPU attention backends page their KV): the tree holds the document's whole pages only, so the
    promise ends at the last one (592 of 600 tokens) and the three consumers start from it together, in one round."""
    from sglang_radixflow.observe.trace import read_trace

    servers = paged_servers["servers"]
    cands, other = _workload(21)
    results = {arm: _batch(s, cands + [other]) for arm, s in servers.items()}
    aligned = DOC_LEN - DOC_LEN % PAGE
    assert [o["meta_info"]["cached_tokens"] for o in results["sglang"]] == [0] * 5
    assert [o["meta_info"]["cached_tokens"] for o in results["radixflow"]] == [0, aligned, aligned, aligned, 0]
    assert [o["output_ids"] for o in results["radixflow"]] == [o["output_ids"] for o in results["sglang"]]
    time.sleep(0.5)
    prefill = [r for r in read_trace(str(paged_servers["trace"]), "round") if r["kind_of_round"] == "prefill"]
    producer = next(r for r in prefill if r["producers"] == 1)
    consumers = next(r for r in prefill if r["round"] > producer["round"])
    assert (producer["rows"], producer["blocked_skips"]) == (2, 3)
    assert (consumers["rows"], consumers["producers"], consumers["promises_published_delta"]) == (3, 0, 1)
    assert sum(r["producers"] for r in prefill) == 1  # no consumer re-plans the unreachable rest of the document
    time.sleep(1.5)
    assert servers["radixflow"].generate([9, 8, 7], 2)["output_ids"]
    assert LEAK not in servers["radixflow"].log_text()


def test_extra_buffer_producer_tracks_its_state_at_the_branch_point(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """SGLang's GPU default for hybrids, extra_buffer with the overlap scheduler, on the CPU runtime (NemotronH).
    There radixflow publishes by tracking (publish=track): the producer runs its whole prompt and sets
    `mamba_branching_seqlen` = b, b on the checkpoint grid counted from its prefix (576 for a 600-token document at
    grid 64) in place of SGLang's own snapshot position, and its siblings, Blocked for a round, start from that state. Natively all five recompute the document
    (the snapshot each one keeps enters the tree only after their shared round)."""
    from sglang_radixflow.observe.trace import read_trace

    model = str(model_dirs["nemotron_h"])
    trace = tmp_path / "extra_buffer.jsonl"
    servers = {
        "sglang": SGLangServer(model, radix_cache=None, extra_args=FLOAT32, env=FLOAT32_ENV,
                               mamba_strategy="extra_buffer"),
        "radixflow": SGLangServer(model, extra_args=FLOAT32, env={**FLOAT32_ENV, "RADIXFLOW_TRACE": str(trace)},
                                  mamba_strategy="extra_buffer"),
    }
    # Answers of 80 tokens: SGLang's own snapshot of a 680-token prompt would sit at 640, inside the producer's own
    # answer, where no sibling can use it; only the branch point radixflow asks for serves them.
    rng = random.Random(31)
    doc = [rng.randrange(3, 2000) for _ in range(DOC_LEN)]
    cands = [doc + [rng.randrange(3, 2000) for _ in range(80)] for _ in range(4)]
    other = [rng.randrange(3, 2000) for _ in range(300)]
    # A document seen before: SGLang's match points the snapshot of the next request on it at the document's last
    # grid position (its branch point); a select warm-up (max_new_tokens 0) must leave it there.
    seen = [rng.randrange(3, 2000) for _ in range(DOC_LEN)]
    first, warm_up, later = ([*seen, *(rng.randrange(3, 2000) for _ in range(80))] for _ in range(3))
    results, logs, later_cached = {}, {}, {}
    for arm, server in servers.items():
        with server:
            results[arm] = _batch(server, cands + [other])
            server.generate(first, 1)
            server.post("/generate", {"input_ids": warm_up, "sampling_params": {"max_new_tokens": 0}})
            later_cached[arm] = server.generate(later, 1)["meta_info"]["cached_tokens"]
            time.sleep(1.5)  # the trace's last record, and SGLang's idle memory check
            logs[arm] = server.log_text()
    b = DOC_LEN // 64 * 64
    assert later_cached == {"sglang": b, "radixflow": b}
    assert [o["meta_info"]["cached_tokens"] for o in results["sglang"]] == [0] * 5
    assert [o["meta_info"]["cached_tokens"] for o in results["radixflow"]] == [0, b, b, b, 0]
    assert [o["output_ids"] for o in results["radixflow"]] == [o["output_ids"] for o in results["sglang"]]
    diffs = [abs(a["meta_info"]["output_token_logprobs"][0][0] - n["meta_info"]["output_token_logprobs"][0][0])
             for a, n in zip(results["radixflow"], results["sglang"])]
    assert max(diffs) < LOGPROB_TOL, diffs
    assert "publish=track" in logs["radixflow"]
    for log in logs.values():
        assert "'mamba_radix_cache_strategy': 'extra_buffer'" in log and "'disable_overlap_schedule': False" in log
        assert LEAK not in log
    prefill = [r for r in read_trace(str(trace), "round") if r["kind_of_round"] == "prefill" and r["tokens"] > 100]
    assert [(r["producers"], r["blocked_skips"], r["prefix_requests"]) for r in prefill][0] == (1, 3, 0)
    assert sum(r["producers"] for r in prefill) == 1  # the warm-up planned nothing: SGLang's branch snapshot stays


@pytest.mark.parametrize("arch", HYBRIDS)
def test_extra_buffer_producer_chunked_before_its_boundary_still_publishes_it(
    model_dirs: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    """extra_buffer, a token budget (400) smaller than the shared document (600, b = 576): the producer is chunked.
    SGLang snapshots inside an extend only on the grid counted from that extend's start, so the chunk stops on the
    grid (384) and the continuation runs past b with b tracked inside it. Before, the chunk stopped at 400 and the
    continuation was cut at b, whose state then landed at 528: the promise was cancelled after the siblings had
    waited for it, and they resumed from 528."""
    from sglang_radixflow.observe.trace import read_trace

    model = str(model_dirs[arch])
    budget = ("--chunked-prefill-size", "400", "--max-prefill-tokens", "400")
    trace = tmp_path / "chunked.jsonl"
    radixflow = SGLangServer(model, extra_args=(*FLOAT32, *budget), mamba_strategy="extra_buffer",
                             env={**FLOAT32_ENV, "RADIXFLOW_TRACE": str(trace)})
    out, log, _ = _one_batch_on_a_fresh_server(radixflow, trace, seed=41)
    cands, other = _workload(41)
    with SGLangServer(model, radix_cache=None, extra_args=(*FLOAT32, *budget), env=FLOAT32_ENV,
                      mamba_strategy="extra_buffer") as native_server:
        native = _batch(native_server, cands + [other])
    b = DOC_LEN // 64 * 64
    assert [o["meta_info"]["cached_tokens"] for o in out[:4]] == [0, b, b, b]
    rounds = read_trace(str(trace), "round")
    assert sum(r["promises_published_delta"] for r in rounds) == 1
    assert sum(r["promises_cancelled_delta"] for r in rounds) == 0
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in native]
    assert LEAK not in log


def _one_batch_on_a_fresh_server(server: SGLangServer, trace: Path, seed: int) -> tuple[list[dict], str, list[dict]]:
    """Start `server` (its RADIXFLOW_TRACE is `trace`), send one document's 4 siblings and an unrelated request in
    one batch, stop it: (outputs, server log, the trace's prefill rounds of more than 100 tokens)."""
    from sglang_radixflow.observe.trace import read_trace

    cands, other = _workload(seed)
    with server:
        out = _batch(server, cands + [other])
        time.sleep(1.5)  # the trace's last record, and SGLang's idle memory check
        log = server.log_text()
    prefill = [r for r in read_trace(str(trace), "round") if r["kind_of_round"] == "prefill" and r["tokens"] > 100]
    return out, log, prefill


@ON_NEMOTRON_H
def test_priority_preemption_keeps_sglangs_scheduling(
    hybrid_servers: dict[str, SGLangServer], tmp_path: Path,
) -> None:
    """--enable-priority-scheduling turns on SGLang's priority preemption, which may evict running requests for a
    waiting one before the adder sees it: skipping that request would waste the preemption. radixflow steps aside
    (logged, at bind time) and the hybrid's siblings run as SGLang runs them, with SGLang's outputs. Fails if the
    Scheduler attribute radixflow reads (enable_priority_preemption) is renamed: the traversal would stay on."""
    trace = tmp_path / "priority.jsonl"
    server = SGLangServer(str(hybrid_servers["radixflow"].model_path),
                          extra_args=(*FLOAT32, "--enable-priority-scheduling"),
                          env={**FLOAT32_ENV, "RADIXFLOW_TRACE": str(trace)})
    out, log, prefill = _one_batch_on_a_fresh_server(server, trace, seed=29)
    cands, other = _workload(29)
    native = _batch(hybrid_servers["sglang"], cands + [other])
    assert "state-ready traversal disabled: --enable-priority-preemption is on" in log
    assert "traversal=native" in log
    assert [(r["rows"], r["blocked_skips"], r["producers"], r["prefix_requests"]) for r in prefill] == [(5, 0, 0, 0)]
    assert [o["meta_info"]["cached_tokens"] for o in out] == [0] * 5  # SGLang's own: every sibling recomputes
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in native]
    assert LEAK not in log


def test_prefill_delayer_replaces_the_admission_hold_and_traversal_stays(model_dirs: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """--enable-prefill-delayer (SGLang's own batching delay; it needs the overlap scheduler, on for full attention)
    and radixflow's hold would delay the same prefills twice: the hold steps aside (logged), the state-ready traversal
    keeps working under the delayer (one producer, three Blocked siblings that then reuse the document)."""
    trace = tmp_path / "delayer.jsonl"
    server = SGLangServer(str(model_dirs["qwen3"]), extra_args=["--enable-prefill-delayer"],
                          env={"RADIXFLOW_TRACE": str(trace)})
    out, log, prefill = _one_batch_on_a_fresh_server(server, trace, seed=37)
    assert "admission hold disabled: SGLang's prefill delayer is on" in log
    assert "traversal=skip admission=native" in log
    assert [o["meta_info"]["cached_tokens"] for o in out] == [0, DOC_LEN, DOC_LEN, DOC_LEN, 0]
    assert (prefill[0]["producers"], prefill[0]["blocked_skips"], prefill[0]["admission_holds"]) == (1, 3, 0)
    assert sum(r["admission_holds"] for r in prefill) == 0
    assert LEAK not in log


def test_disabled_radix_cache_keeps_sglangs_scheduling(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """--disable-radix-cache with the radixflow backend: SGLang still builds the tree, but it stores nothing, so a
    promise could never be kept. The siblings used to be let through one per round, each recomputing the document
    anyway; now radixflow steps aside (logged) and all five run in SGLang's one round."""
    trace = tmp_path / "radixflow.jsonl"
    server = SGLangServer(str(model_dirs["qwen3"]), extra_args=["--disable-radix-cache"],
                          env={"RADIXFLOW_TRACE": str(trace)})
    out, log, prefill = _one_batch_on_a_fresh_server(server, trace, seed=23)
    assert [o["meta_info"]["cached_tokens"] for o in out] == [0] * 5
    assert "state-ready traversal disabled: --disable-radix-cache is on" in log
    assert "traversal=native admission=native" in log
    assert [(r["rows"], r["blocked_skips"], r["producers"]) for r in prefill] == [(5, 0, 0)]


def _session_agent(server: SGLangServer, system: list[int], seed: int, start: threading.Barrier,
                   turns: int = 3) -> list[tuple[list[int], int]]:
    """One agent on SGLang's session API: the first turn sends the system prompt + a message, each later turn only
    its new message, continuing from the previous turn's node (`session_params.rid`). The agents' first turns leave
    together (`start`), as siblings do."""
    rng = random.Random(seed)
    sid = server.post("/open_session", {"capacity_of_str_len": 100_000})
    start.wait(timeout=60)
    out, last = [], None
    for turn in range(turns):
        new = (system if turn == 0 else []) + [rng.randrange(3, 2000) for _ in range(80)]
        res = server.post("/generate", {"input_ids": new, "session_params": {"id": sid, "rid": last},
                                        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
        last = res["meta_info"]["id"]
        out.append((res["output_ids"], res["meta_info"]["cached_tokens"]))
    server.post("/close_session", {"session_id": sid})
    return out


@ON_BOTH_HYBRIDS
def test_session_agents_equal_native_and_continue_from_their_history(
    hybrid_servers: dict[str, SGLangServer], trace_path: Path
) -> None:
    """Agents on SGLang's session API, four at once sharing a system prompt. A session request cannot be split into a
    prefix request, so a producer among them cuts its own chunk at the branch point: outputs must still equal native
    SGLang's, every later turn must start from its own history, and nothing may leak once the sessions close."""
    from concurrent.futures import ThreadPoolExecutor

    system = [random.Random(21).randrange(3, 2000) for _ in range(300)]
    results = {}
    trace_start = trace_path.stat().st_size if trace_path.exists() else 0
    for name in ("sglang", "radixflow"):
        start = threading.Barrier(4)
        with ThreadPoolExecutor(4) as pool:
            results[name] = list(pool.map(lambda a: _session_agent(hybrid_servers[name], system, a, start), range(4)))
    assert [[o for o, _ in a] for a in results["radixflow"]] == [[o for o, _ in a] for a in results["sglang"]]
    for agent in results["radixflow"]:
        # turn t's context = turn t-1's context + its 4 outputs (the last one never has KV) + 80 new tokens
        assert [c for _, c in agent[1:]] == [300 + 80 + 3, 300 + 80 + 4 + 80 + 3], agent
    # the first turns share the system prompt: natively each computes it; radixflow's producer publishes it
    first = {name: sum(a[0][1] for a in agents) for name, agents in results.items()}
    assert first["radixflow"] >= first["sglang"], first
    with trace_path.open() as f:
        f.seek(trace_start)
        rounds = [json.loads(line) for line in f if '"kind": "round"' in line]
    cut = [r for r in rounds if r.get("producers") and not r.get("prefix_requests")]
    assert cut, "no producer cut its own chunk (session requests cannot become prefix requests)"
    assert sum(r["promises_published_delta"] for r in rounds) >= 1
    assert sum(r["promises_cancelled_delta"] for r in rounds) == 0
    time.sleep(1.0)
    assert LEAK not in hybrid_servers["radixflow"].log_text()


@ON_BOTH_HYBRIDS
def test_score_api_computes_the_shared_query_once_and_scores_equal_native(
    hybrid_servers: dict[str, SGLangServer]
) -> None:
    """SGLang's own multi-candidate scoring endpoint (`/v1/score`: one request per query + item, no output token,
    label-token logprobs). Natively the hybrid computes the shared query once per item; under radixflow one item
    produces it and the others start from its state: the server computes the query once, scores equal native's."""
    rng = random.Random(31)
    query = [rng.randrange(3, 2000) for _ in range(DOC_LEN)]
    items = [[rng.randrange(3, 2000) for _ in range(12)] for _ in range(4)]
    body = {"query": query, "items": items, "label_token_ids": [5, 6, 7]}
    scores, computed = {}, {}
    for name in ("sglang", "radixflow"):
        server = hybrid_servers[name]
        log_start = len(server.log_text())
        scores[name] = server.post("/v1/score", body)["scores"]
        time.sleep(0.5)  # the last round's log line
        computed[name] = sum(line["new"] for line in parse_prefill_lines(server.log_text()[log_start:]))
    assert len(scores["radixflow"]) == len(items)
    diff = max(abs(a - b) for ours, native in zip(scores["radixflow"], scores["sglang"]) for a, b in zip(ours, native))
    assert diff < LOGPROB_TOL, diff
    assert computed["sglang"] >= len(items) * len(query), computed  # the query once per item, natively
    assert computed["radixflow"] <= len(query) + len(items) * 12 + 64, computed  # once, plus each item (and a grid)
