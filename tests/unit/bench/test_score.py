"""Score path pieces without SGLang: the /v1/score body from the token workload, the client's per-item records
against a stub server (the client's job, not SGLang's behaviour: tests/integration/test_bench_e2e.py runs the path
on real servers), and the report's handling of a path with no client cached-token count."""
from __future__ import annotations

import pytest

from sglang_radixflow.bench import score
from sglang_radixflow.bench.report import arm_summary
from sglang_radixflow.bench.workloads import WorkloadParams, make_workload
from tests.unit.bench.http_stub import JsonHandler, serve


def test_score_body_is_the_shared_context_and_the_candidates() -> None:
    w = make_workload(WorkloadParams(questions=4, stream="reuse", seed=3))
    for q in w.questions:
        body = score.score_body(q)
        cut = q.doc_len + q.question_len
        assert len(body["query"]) == cut and body["label_token_ids"] == list(score.LABELS)
        # query + item is exactly the raw path's branch prompt
        assert [tuple(body["query"] + item) for item in body["items"]] == list(q.branches)
        assert all(len(item) >= 1 for item in body["items"])


def test_score_body_refuses_branches_that_do_not_share_the_context() -> None:
    q = make_workload(WorkloadParams(questions=1, seed=1)).questions[0]
    broken = type(q)(q.qid, q.doc_id, q.dataset, q.arrival_s, q.doc_len, q.question_len,
                     (q.branches[0], (q.branches[1][0] + 1,) + q.branches[1][1:], *q.branches[2:]))
    with pytest.raises(ValueError, match="do not share their first"):
        score.score_body(broken)


class _Stub(JsonHandler):
    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.read_json()
        _Stub.bodies.append(body)
        assert self.path == "/v1/score"
        if len(_Stub.bodies) == 2:  # the second question: a malformed answer (3 rows for 4 items)
            rows = [[0.0, -1.0]] * 3
        else:  # item i prefers label i % 2
            rows = [[-1.0, -0.5] if i % 2 else [-0.5, -1.0] for i in range(len(body["items"]))]
        self.reply_json({"scores": rows, "object": "scoring"})


def test_client_sends_one_call_per_question_and_records_each_item() -> None:
    w = make_workload(WorkloadParams(questions=3, stream="cold", rate=50.0, seed=2))
    _Stub.bodies = []
    done: list[int] = []
    with serve(_Stub) as url:
        records = score.ScoreClient(url, timeout_s=10, on_done=lambda rec, n, total: done.append(total)).run(
            w.questions)
    assert len(_Stub.bodies) == 3  # one call per question, not one per candidate
    assert [r.rid for r in records] == [q.rid(b) for q in w.questions for b in range(4)]
    assert [r.prompt_len for r in records] == [len(ids) for q in w.questions for ids in q.branches]
    assert done == [12] * 12
    first, second, third = records[:4], records[4:8], records[8:]
    for group in (first, third):
        assert [r.output_ids for r in group] == [[0], [1], [0], [1]]  # the best label of each item
        assert all(r.error is None and r.latency_s is not None and r.cached_tokens is None for r in group)
        assert len({(r.sent_s, r.done_s) for r in group}) == 1  # the question's own timing
    assert all(r.error is not None and "expected 4 score rows, got 3" in r.error for r in second)
    assert all(r.latency_s is None for r in second)


def test_summary_of_a_path_without_cached_counts_has_no_client_reuse() -> None:
    requests = [
        {"rid": f"q0-b{b}", "qid": 0, "prompt_len": 1000, "latency_s": 0.2, "done_s": 0.3, "sent_s": 0.1,
         "cached_tokens": None, "output_ids": [0], "error": None}
        for b in range(4)
    ]
    prefill = [{"seqs": 1, "new": 990, "cached": 0, "running": 0, "queue": 3},
               {"seqs": 4, "new": 40, "cached": 3960, "running": 0, "queue": 0}]
    arm = arm_summary("nemotron_h", "radixflow", requests, prefill, None, 8, 2048, None)
    assert arm["reuse_ratio"] is None  # unknown, not 0%
    assert arm["extra"]["computed_reuse_ratio"] == pytest.approx(1 - 1030 / 4000)
    assert arm["round_lower_bound"] == 1  # ⌈1030 / 2048⌉, ⌈5 / 8⌉, and one round of depth
    with_counts = [dict(r, cached_tokens=990) for r in requests]
    assert arm_summary("nemotron_h", "radixflow", with_counts, prefill, None, 8, 2048, None)["reuse_ratio"] == (
        pytest.approx(0.99))
