"""The multi-candidate workload sent through SGLang's scoring endpoint (`--path score`) instead of raw /generate.

A question is one `POST /v1/score`: query = the document + question token ids, items = the 4 candidates' token ids,
label_token_ids = LABELS (stand-ins for a "yes" / "no" readout). SGLang expands it into one request per query + item
(max_new_tokens = 0, the label tokens' logprobs at the item's end), all sent to the scheduler together: the same 4
prompts as the raw path's branches, arriving as one batch.

The endpoint reports no cached tokens, so the client's reuse ratio is unknown on this path (None); the server's own
count (the report's computed reuse, from SGLang's prefill log lines) measures it. Per item the record keeps the
question's latency and, as its "output", the index of the label with the highest score (compared across arms like
the raw path's first token).
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench.client import Completions, RequestRecord
from sglang_radixflow.bench.workloads import Question

LABELS: tuple[int, ...] = (3, 4)  # label token ids read out after each item (in every tiny model's vocabulary)


def score_body(question: Question) -> dict[str, Any]:
    """The /v1/score request of one question: its shared context as the query, the candidates as items."""
    cut = question.doc_len + question.question_len
    query = list(question.branches[0][:cut])
    if any(tuple(b[:cut]) != tuple(query) for b in question.branches):
        raise ValueError(f"question {question.qid}: branches do not share their first {cut} tokens")
    return {"query": query, "items": [list(b[cut:]) for b in question.branches], "label_token_ids": list(LABELS)}


def best_label(row: Sequence[float]) -> int:
    """Index of the highest-scoring label (the first on ties)."""
    return max(range(len(row)), key=lambda i: row[i])


def fill_from_scores(records: Sequence[RequestRecord], body: dict[str, Any]) -> None:
    scores = body.get("scores")
    if not isinstance(scores, list) or len(scores) != len(records):
        got = len(scores) if isinstance(scores, list) else type(scores).__name__
        raise ValueError(f"expected {len(records)} score rows, got {got}")
    for rec, row in zip(records, scores):
        if not isinstance(row, list) or len(row) != len(LABELS):
            raise ValueError(f"{rec.rid}: expected {len(LABELS)} label scores, got {row!r}"[:300])
        rec.output_ids = [best_label(row)]


class ScoreClient:
    """Open loop over questions: each question's /v1/score call is sent at its arrival time, in its own thread.
    Returns one RequestRecord per item (rid q<qid>-b<item>, as the raw path's branches)."""

    def __init__(self, url: str, timeout_s: float = 600.0,
                 on_done: Optional[Callable[[RequestRecord, int, int], None]] = None) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._completions = Completions(on_done)

    def run(self, questions: Sequence[Question], lead_s: float = 0.05) -> list[RequestRecord]:
        groups = [
            [RequestRecord(q.rid(b), q.qid, b, len(ids), q.arrival_s) for b, ids in enumerate(q.branches)]
            for q in questions
        ]
        bodies = [json.dumps(score_body(q)).encode() for q in questions]  # encoded before the clock starts
        total = sum(len(g) for g in groups)
        start = time.perf_counter() + lead_s
        threads = []
        for q, body, group in zip(questions, bodies, groups):
            delay = start + q.arrival_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t = threading.Thread(target=self._one, args=(body, group, start, total), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        return [rec for group in groups for rec in group]

    def _one(self, body: bytes, group: list[RequestRecord], start: float, total: int) -> None:
        sent = time.perf_counter() - start
        error: Optional[str] = None
        try:
            req = urllib.request.Request(self.url + "/v1/score", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                fill_from_scores(group, json.loads(resp.read()))
        except urllib.error.HTTPError as err:
            error = f"HTTP {err.code}: {err.read().decode(errors='replace')[:300]}"
        except Exception as err:  # a dead server, a timeout, a malformed answer: recorded, the run goes on
            error = f"{type(err).__name__}: {err}"[:300]
        done = time.perf_counter() - start
        for rec in group:
            rec.sent_s, rec.done_s, rec.error = sent, done, error
            self._completions.finish(rec, total)
