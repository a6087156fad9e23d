"""Frontend path pieces that need no server: texts from the token workload, ideal reuse, per-choice records."""
from __future__ import annotations

import pytest

from sglang_radixflow.bench import frontend
from sglang_radixflow.bench.workloads import WorkloadParams, make_workload

LEXICON = [f" w{i}" for i in range(100)]


def _words(text: str) -> list[str]:
    return text.split()


def test_texts_keep_the_workload_structure() -> None:
    w = make_workload(WorkloadParams(questions=6, stream="reuse", seed=3))
    qs = frontend.text_questions(w, LEXICON)
    assert [q.qid for q in qs] == [q.qid for q in w.questions]
    for tq, q in zip(qs, w.questions):
        assert tq.arrival_s == q.arrival_s
        assert len(_words(tq.context)) == q.doc_len + q.question_len  # one word per token
        assert len(tq.candidates) == 4 and all(c.startswith(" ") for c in tq.candidates)
        for c, ids in zip(tq.candidates, q.branches):
            assert len(_words(tq.context + c)) == len(ids)
    # questions on one document share its text: the document prefix is identical
    first, second = w.questions[0], w.questions[1]
    assert first.doc_id == second.doc_id
    n = first.doc_len
    assert _words(qs[0].context)[:n] == _words(qs[1].context)[:n]


def test_frontend_ideal_reuse_counts_choices_after_their_warm_up() -> None:
    q = frontend.TextQuestion(0, 0.0, " a b c d", (" x", " y", " z", " u v"))
    # warm-up "a b c d" first: each choice shares 4 tokens with it -> 16 / (5 + 5 + 5 + 6)
    assert frontend.frontend_ideal_reuse([q], _words) == pytest.approx(16 / 21)


def test_question_record_becomes_one_client_record_per_choice() -> None:
    q = frontend.TextQuestion(7, 1.5, " a b", (" x", " y", " z", " u"))
    rec = frontend.QuestionRecord(7, "select", 1.5, sent_s=1.6, done_s=2.0, latency_s=0.4, decision=" z",
                                  warmup_requests=1, warmup_prompt_tokens=2, warmup_cached_tokens=0,
                                  choice_prompt_tokens=[3, 3, 3, 3], choice_cached_tokens=[0, 2, 2, 2])
    rows = rec.request_records(q)
    assert [r["rid"] for r in rows] == [f"q00007-b{b}" for b in range(4)]
    assert [r["cached_tokens"] for r in rows] == [0, 2, 2, 2] and all(r["latency_s"] == 0.4 for r in rows)
    assert all(r["output_ids"] == [2] and r["error"] is None for r in rows)  # the selected candidate's index
    failed = frontend.QuestionRecord(7, "select", 1.5, error="HTTP 500").request_records(q)
    assert all(r["error"] == "HTTP 500" and r["latency_s"] is None for r in failed)


def test_bad_path_is_rejected() -> None:
    with pytest.raises(ValueError, match="frontend paths"):
        frontend.FrontendClient("http://127.0.0.1:1", "raw")
