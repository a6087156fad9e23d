"""Cache-only requests (sgl.select / fork warm-ups: max_new_tokens = 0, no logprobs) leave their states where the
followers can use them, on SGLang's real pass, allocation and result processing.

Natively on a no_buffer hybrid the warm-up's only state is at its prompt end, while select's choices are matched
only up to prompt_len - 2 (their logprob_start_len): they reuse nothing. With radixflow the warm-up's extend is cut
at prompt_len - 2 (and at the branch point the tree already knows is shared), one more chunk for this request alone.
"""
from __future__ import annotations

import pytest

from sglang_radixflow.schedule.producers import CACHE_ONLY_BACKOFF
from tests.unit.cache.helpers import FULL, HYBRID
from tests.unit.schedule.harness import Fragment, PassHarness, make_request

DOC = list(range(1000, 1400))  # 400 shared tokens


def warm_up(rid: str, tokens: list[int]):  # noqa: ANN201
    return make_request(rid, tokens, max_new_tokens=0)


def choice(rid: str, prefix: list[int], answer: list[int]):  # noqa: ANN201
    """A select choice: prefix + answer, prompt logprobs from prompt_len - 2 (what RuntimeEndpoint.select sends)."""
    req = make_request(rid, prefix + answer, max_new_tokens=0)
    req.return_logprob, req.logprob_start_len = True, len(prefix) - CACHE_ONLY_BACKOFF
    return req


def run(h: PassHarness, *reqs):  # noqa: ANN001, ANN201
    h.submit(*reqs)
    return h.run_rounds()


def score(h: PassHarness, *choices) -> list[int]:  # noqa: ANN001
    """Admit the choices in one pass; their state-ready hits. The harness runs no model (no logprobs to process), so
    the round then completes as a plain prefill."""
    h.submit(*choices)
    admitted = h.run_pass()
    assert admitted == list(choices)
    hits = [int(c.prefix_len) for c in choices]
    h.batch.return_logprob = False
    for c in choices:
        c.return_logprob = False
    h.execute()
    return hits


@pytest.mark.parametrize("arm", ["radixflow", "sglang"])
def test_select_choices_reuse_the_warm_up_state_on_a_hybrid(arm: str) -> None:
    h = PassHarness(HYBRID, arm=arm, kv_size=8192, mamba_cache_size=64)
    prefix = DOC + list(range(50, 70))
    rounds = run(h, warm_up("w", prefix))
    cut = len(prefix) - CACHE_ONLY_BACKOFF
    if arm == "radixflow":  # the warm-up's extend ends at prompt_len - 2, then finishes
        assert [r.fragments for r in rounds] == [(Fragment("w", 0, cut),), (Fragment("w", cut, 2),)]
    else:
        assert [r.fragments for r in rounds] == [(Fragment("w", 0, len(prefix)),)]
    choices = [choice(f"c{i}", prefix, [7000 + i, 7100 + i]) for i in range(4)]
    assert score(h, *choices) == [cut if arm == "radixflow" else 0] * 4
    h.assert_idle_invariants()


def test_a_second_question_on_the_same_document_leaves_a_state_at_the_document_end() -> None:
    h = PassHarness(HYBRID, arm="radixflow", kv_size=8192, mamba_cache_size=64)
    q1, q2, q3 = (DOC + list(range(k, k + 20)) for k in (50, 150, 250))
    run(h, warm_up("w1", q1))
    # The tree knows DOC is shared (token hit 400) but has no state there: the warm-up cuts at 400 and at len - 2.
    rounds = run(h, warm_up("w2", q2))
    assert [r.fragments for r in rounds] == [
        (Fragment("w2", 0, len(DOC)),), (Fragment("w2", len(DOC), 18),), (Fragment("w2", len(q2) - 2, 2),),
    ]
    third = warm_up("w3", q3)
    run(h, third)
    assert third.cached_tokens == len(DOC)  # the state at the document end serves every later question
    h.assert_idle_invariants()


def test_generating_requests_and_full_attention_are_not_cut() -> None:
    h = PassHarness(HYBRID, arm="radixflow", kv_size=8192, mamba_cache_size=64)
    (only,) = run(h, make_request("g", DOC, max_new_tokens=1))
    assert only.fragments == (Fragment("g", 0, len(DOC)),)  # an ordinary request gets no extra round
    h = PassHarness(FULL, arm="radixflow", kv_size=8192)
    (only,) = run(h, warm_up("w", DOC))
    assert only.fragments == (Fragment("w", 0, len(DOC)),)  # full attention: the KV is usable at any length
    assert score(h, choice("c", DOC, [7000, 7001])) == [len(DOC) - CACHE_ONLY_BACKOFF]
    h.assert_idle_invariants()
