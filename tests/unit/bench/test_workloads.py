"""Multi-candidate workload: determinism, question shape, stream properties, ideal reuse ratio."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest

from sglang_radixflow.bench.workloads import (
    CANDIDATES,
    FIRST_TOKEN,
    QUALITY,
    RACE_M,
    WARMUP_TOKEN,
    WorkloadParams,
    ideal_reuse_ratio,
    make_workload,
    shared_prefixes,
    warmup_prompts,
)


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _prefix_len(q) -> int:
    return q.doc_len + q.question_len


@pytest.mark.parametrize("stream", ["cold", "reuse", "mixed"])
def test_same_seed_same_workload_other_seed_other_workload(stream: str) -> None:
    p = WorkloadParams(questions=12, stream=stream, rate=3.0, seed=5)
    a, b = make_workload(p), make_workload(p)
    assert [(r.rid, r.arrival_s, r.input_ids) for r in a.requests()] == [
        (r.rid, r.arrival_s, r.input_ids) for r in b.requests()
    ]
    c = make_workload(WorkloadParams(questions=12, stream=stream, rate=3.0, seed=6))
    assert [r.input_ids for r in c.requests()] != [r.input_ids for r in a.requests()]


def test_question_is_four_branches_sharing_exactly_document_and_question() -> None:
    w = make_workload(WorkloadParams(questions=10, stream="mixed", seed=1))
    assert len(w.requests()) == 10 * CANDIDATES
    for q in w.questions:
        assert len(q.branches) == CANDIDATES
        shared = _prefix_len(q)
        for a, b in itertools.combinations(q.branches, 2):
            assert _lcp(a, b) == shared  # the branch point is the end of doc + question
        for br in q.branches:
            assert len(br) > shared
            assert all(FIRST_TOKEN <= t for t in br)
        spec = {"quality": QUALITY, "race_m": RACE_M}[q.dataset]
        assert round(spec.lo * spec.scale) <= q.doc_len <= round(spec.hi * spec.scale)
    reqs = w.requests()
    assert [r.rid for r in reqs[:4]] == ["q00000-b0", "q00000-b1", "q00000-b2", "q00000-b3"]
    assert all(r.arrival_s == w.questions[r.qid].arrival_s for r in reqs)  # branches arrive together


def test_cold_stream_shares_nothing_across_questions() -> None:
    w = make_workload(WorkloadParams(questions=20, stream="cold", seed=2))
    assert len({q.doc_id for q in w.questions}) == 20
    for qa, qb in itertools.combinations(w.questions, 2):
        assert _lcp(qa.branches[0], qb.branches[0]) == 0
    # ideal: within a question, branches 2..4 reuse doc + question; nothing else is shared
    expected = sum((CANDIDATES - 1) * _prefix_len(q) for q in w.questions) / w.prompt_tokens
    assert w.ideal_reuse_ratio() == pytest.approx(expected)


def test_reuse_stream_asks_each_document_consecutively_and_mixed_interleaves() -> None:
    reuse = make_workload(WorkloadParams(questions=24, stream="reuse", seed=3))
    docs = [q.doc_id for q in reuse.questions]
    runs = [k for k, _ in itertools.groupby(docs)]
    assert len(runs) == len(set(docs)) < len(docs)  # each document is one run of questions
    per_doc = Counter(docs)
    for q in reuse.questions[:-4]:  # the last document may be cut short by the question count
        assert per_doc[q.doc_id] == {"quality": QUALITY, "race_m": RACE_M}[q.dataset].questions_per_doc
    # questions on one document share exactly the document
    for qa, qb in itertools.combinations(reuse.questions, 2):
        expect = qa.doc_len if qa.doc_id == qb.doc_id else 0
        assert _lcp(qa.branches[0], qb.branches[0]) == expect

    mixed = make_workload(WorkloadParams(questions=24, stream="mixed", seed=3))
    mdocs = [q.doc_id for q in mixed.questions]
    assert len([k for k, _ in itertools.groupby(mdocs)]) > len(set(mdocs))  # documents interleave
    cold = make_workload(WorkloadParams(questions=24, stream="cold", seed=3))
    assert mixed.ideal_reuse_ratio() > cold.ideal_reuse_ratio()
    assert reuse.ideal_reuse_ratio() > cold.ideal_reuse_ratio()


def test_reverse_order_is_the_same_requests_reversed() -> None:
    fwd = make_workload(WorkloadParams(questions=9, stream="mixed", seed=4))
    rev = make_workload(WorkloadParams(questions=9, stream="mixed", order="reverse", seed=4))
    assert [q.branches for q in rev.questions] == [q.branches for q in reversed(fwd.questions)]
    assert [q.arrival_s for q in rev.questions] == [q.arrival_s for q in fwd.questions]


def test_poisson_arrivals() -> None:
    w = make_workload(WorkloadParams(questions=400, stream="cold", rate=4.0, seed=0))
    times = [q.arrival_s for q in w.questions]
    assert times[0] == 0.0 and times == sorted(times)
    mean_gap = times[-1] / (len(times) - 1)
    assert 0.8 / 4.0 < mean_gap < 1.2 / 4.0


def test_dataset_mix_is_two_to_one() -> None:
    w = make_workload(WorkloadParams(questions=300, stream="cold", seed=0))
    share = sum(q.dataset == "quality" for q in w.questions) / 300
    assert 0.58 < share < 0.75


def test_ideal_reuse_on_a_hand_made_example() -> None:
    prompts = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9], [7, 8], [1, 2, 3, 4, 6]]
    # longest prefix shared with any EARLIER prompt: 0, 3 (with #0), 2, 0, 4 (with #0)
    assert list(shared_prefixes(prompts)) == [0, 3, 2, 0, 4]
    assert ideal_reuse_ratio(prompts) == pytest.approx(9 / 18)
    # order matters: the first arrival of a prefix computes it; [1,2,3,4] is now a prefix of an earlier prompt,
    # capped at len - 1 = 3
    assert list(shared_prefixes(prompts[::-1])) == [0, 0, 2, 3, 3]
    # capped at len - 1: an identical prompt still computes its last token
    assert list(shared_prefixes([[1, 2], [1, 2]])) == [0, 1]
    assert ideal_reuse_ratio([]) == 0.0


def test_ideal_reuse_matches_brute_force_on_a_workload() -> None:
    w = make_workload(WorkloadParams(questions=10, stream="mixed", seed=8))
    prompts = [r.input_ids for r in w.requests()]
    brute = [
        min(max((_lcp(p, prompts[j]) for j in range(i)), default=0), len(p) - 1) for i, p in enumerate(prompts)
    ]
    assert list(shared_prefixes(prompts)) == brute
    assert w.describe()["ideal_reuse_ratio"] == pytest.approx(sum(brute) / w.prompt_tokens)


def test_warmup_prompts_share_no_prefix_with_the_workload() -> None:
    w = make_workload(WorkloadParams(questions=6, seed=0))
    for p in warmup_prompts():
        assert p[0] == WARMUP_TOKEN
        assert all(r.input_ids[0] != WARMUP_TOKEN for r in w.requests())


def test_doc_scale_shortens_documents_only_and_one_is_the_default() -> None:
    base = make_workload(WorkloadParams(questions=40, stream="reuse", seed=2))
    assert make_workload(WorkloadParams(questions=40, stream="reuse", seed=2, doc_scale=1.0)) == base
    short = make_workload(WorkloadParams(questions=40, stream="reuse", seed=2, doc_scale=0.25))
    assert [q.dataset for q in short.questions] == [q.dataset for q in base.questions]
    assert [q.doc_id for q in short.questions] == [q.doc_id for q in base.questions]
    assert [q.arrival_s for q in short.questions] == [q.arrival_s for q in base.questions]
    for s, b in zip(short.questions, base.questions):
        # the leading quarter of the same document, then the same question and candidates
        assert s.doc_len == round(b.doc_len * 0.25), (s.doc_len, b.doc_len)
        for s_ids, b_ids in zip(s.branches, b.branches):
            assert s_ids[: s.doc_len] == b_ids[: s.doc_len]
            assert s_ids[s.doc_len:] == b_ids[b.doc_len:]
        assert all(_lcp(x, y) == _prefix_len(s) for x, y in itertools.combinations(s.branches, 2))
    assert short.describe()["doc_scale"] == 0.25
    assert short.prompt_tokens < 0.5 * base.prompt_tokens


def test_bad_parameters_are_refused() -> None:
    for bad in (dict(questions=0), dict(stream="hot"), dict(order="sideways"), dict(rate=0.0), dict(doc_scale=0.0),
                dict(doc_scale=-1.0), dict(doc_scale=float("nan")), dict(doc_scale=1.5)):
        with pytest.raises(ValueError):
            WorkloadParams(**bad)
    with pytest.raises(ValueError, match=r"doc_scale=0.0: must be in \(0, 1\]"):
        WorkloadParams(doc_scale=0.0)


def test_groups_of_one_anchor_and_nine_candidates() -> None:
    """--candidates 9 --anchor: the vLLM shape, the document + question alone first, then the candidates extending
    it; the default groups (4 candidates) are the workload they always were."""
    from sglang_radixflow.bench.workloads import WorkloadParams, make_workload

    base = make_workload(WorkloadParams(questions=6, seed=3))
    assert base == make_workload(WorkloadParams(questions=6, seed=3, candidates=4, anchor=False))
    w = make_workload(WorkloadParams(questions=6, seed=3, candidates=9, anchor=True))
    for q in w.questions:
        anchor, *cands = q.branches
        assert len(cands) == 9 and len(anchor) == q.doc_len + q.question_len
        assert all(c[:len(anchor)] == anchor and len(c) > len(anchor) for c in cands)
        assert len({c[len(anchor)] for c in cands}) == 9  # the candidates branch right after the anchor
    desc = w.describe()
    assert (desc["candidates"], desc["anchor"], desc["group_size"], desc["requests"]) == (9, True, 10, 60)
    assert desc["ideal_reuse_ratio"] > base.describe()["ideal_reuse_ratio"]
    with pytest.raises(ValueError, match="candidates=0: need at least 1"):
        WorkloadParams(candidates=0)
