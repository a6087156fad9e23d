"""Multi-candidate scoring workload (the paper's QuALITY + RACE-M setting), generated locally and deterministically.

A question is a document + question tokens + `candidates` candidate answers (4 by default), sent as that many branch
requests (document + question + candidate i, max_new_tokens=1), all at the question's arrival instant. With `anchor`
the group also holds the document + question alone, first (the anchor request the candidates extend: vLLM's
hybrid prefix-caching proposal measures groups of 1 anchor + 9 candidates).

Document lengths follow the two datasets, scaled so a 2-core CPU run takes minutes:
- `quality` (QuALITY articles, long): ~N(4800, 1200) tokens clipped to [2400, 6000], times 0.25 -> 600..1500 tokens;
- `race_m`  (RACE-M passages, short): ~N(330, 90) tokens clipped to [240, 600], times 1.0 -> 240..600 tokens.
Questions are drawn 2:1 quality:race_m (the paper's 1034:517). The budget T is scaled like QuALITY (8192 x 0.25).
`doc_scale` in (0, 1] (default 1) keeps that leading fraction of every document, everything else (datasets,
questions, candidates, arrivals) unchanged: on a CPU a round's cost grows with its tokens, while on a GPU it is nearly
flat at these sizes; shorter documents move a CPU run toward the GPU's regime (see docs/benchmarks.md).

Streams (how documents are shared ACROSS questions; the 4 branches of a question always share doc + question):
- `cold`:  every question has its own document: no token is shared between questions;
- `reuse`: each document gets several questions (4 for quality, 2 for race_m), asked consecutively;
- `mixed`: the same documents and questions as `reuse`, in a shuffled order: documents interleave.
Orders: `forward` or `reverse` (the question sequence reversed) - the paper runs each stream in two input orders.
Arrivals: Poisson at `rate` questions/s (first question at t=0).

Token ids are drawn from [FIRST_TOKEN, VOCAB_SIZE); ids below FIRST_TOKEN are specials or reserved for warm-up prompts,
so no warm-up prompt shares a single token of prefix with the workload. Within a question the 4 candidates start with
4 different tokens (the branch point is exactly the end of doc + question); questions on one document start with
different tokens; different documents start with different tokens while the vocabulary allows.

Ideal reuse ratio (a property of the workload, reported with it): requests in arrival order (questions by arrival,
branches of one question by index); for request r, shared(r) = the longest common prefix of r with ANY earlier
request, capped at len(r) - 1 (an engine computes at least one prompt token per request to produce its output; the
cap never binds here because no prompt is a prefix of another). ideal = Σ shared(r) / Σ len(r): the reuse ratio of an
engine that computes every shared prefix exactly once and never evicts.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence

from sglang_radixflow.models import VOCAB_SIZE

STREAMS: tuple[str, ...] = ("cold", "reuse", "mixed")
ORDERS: tuple[str, ...] = ("forward", "reverse")
FIRST_TOKEN = 4  # ids 0..2 are specials, 3 starts every warm-up prompt
WARMUP_TOKEN = 3
CANDIDATES = 4


@dataclass(frozen=True)
class DatasetSpec:
    """Document length distribution in the dataset's own tokens, and the factor that scales it for the CPU."""

    name: str
    mean: float
    sd: float
    lo: int
    hi: int
    scale: float
    questions_per_doc: int  # in the reuse / mixed streams
    weight: int  # share of questions

    def draw_length(self, rng: random.Random) -> int:
        raw = min(self.hi, max(self.lo, rng.gauss(self.mean, self.sd)))
        return max(2, int(round(raw * self.scale)))


QUALITY = DatasetSpec("quality", mean=4800, sd=1200, lo=2400, hi=6000, scale=0.25, questions_per_doc=4, weight=2)
RACE_M = DatasetSpec("race_m", mean=330, sd=90, lo=240, hi=600, scale=1.0, questions_per_doc=2, weight=1)
DATASETS: tuple[DatasetSpec, ...] = (QUALITY, RACE_M)


@dataclass(frozen=True)
class WorkloadParams:
    questions: int = 16
    stream: str = "mixed"
    order: str = "forward"
    rate: float = 4.0  # questions per second (Poisson)
    seed: int = 0
    question_len: tuple[int, int] = (12, 40)  # uniform, inclusive
    candidate_len: tuple[int, int] = (3, 24)
    datasets: tuple[DatasetSpec, ...] = DATASETS
    doc_scale: float = 1.0  # the leading fraction of every document kept
    candidates: int = CANDIDATES  # branch requests per question
    anchor: bool = False  # the document + question alone as the group's first request
    source: Optional[str] = None  # the user's workload file (bench/workload_file.py); None: generated here

    def __post_init__(self) -> None:
        if self.questions < 1:
            raise ValueError(f"questions={self.questions}: need at least 1")
        if self.stream not in STREAMS:
            raise ValueError(f"stream={self.stream!r}; allowed: {', '.join(STREAMS)}")
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r}; allowed: {', '.join(ORDERS)}")
        if not self.rate > 0 or math.isinf(self.rate):
            raise ValueError(f"rate={self.rate}: must be a positive finite number of questions/s")
        if not 0 < self.doc_scale <= 1:  # NaN fails too
            raise ValueError(f"doc_scale={self.doc_scale}: must be in (0, 1] (1 = the default document lengths)")
        if self.candidates < 1:
            raise ValueError(f"candidates={self.candidates}: need at least 1")
        for lo, hi in (self.question_len, self.candidate_len):
            assert 1 <= lo <= hi, (lo, hi)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["question_len"], d["candidate_len"] = list(self.question_len), list(self.candidate_len)
        d["rate_unit"] = "questions/s"
        d["group_size"] = self.candidates + int(self.anchor)
        d["max_new_tokens"] = 1
        return d


@dataclass(frozen=True)
class Question:
    qid: int
    doc_id: str
    dataset: str
    arrival_s: float
    doc_len: int
    question_len: int
    branches: tuple[tuple[int, ...], ...]  # the group's prompts: [doc + question,] then doc + question + candidate i

    def rid(self, branch: int) -> str:
        return f"q{self.qid:05d}-b{branch}"


@dataclass(frozen=True)
class Request:
    rid: str
    qid: int
    branch: int
    arrival_s: float
    input_ids: tuple[int, ...]
    routing_key: Optional[str] = None  # its document: what a gateway's `manual` policy keeps on one worker


@dataclass(frozen=True)
class Workload:
    params: WorkloadParams
    questions: tuple[Question, ...]  # in arrival order
    _ideal: list[float] = field(default_factory=list, compare=False, repr=False)

    def requests(self) -> list[Request]:
        """All branch requests in arrival order (ties inside a question broken by branch index)."""
        return [
            Request(q.rid(b), q.qid, b, q.arrival_s, ids, f"doc-{q.doc_id}")
            for q in self.questions for b, ids in enumerate(q.branches)
        ]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for q in self.questions for ids in q.branches)

    def ideal_reuse_ratio(self) -> float:
        if not self._ideal:
            self._ideal.append(ideal_reuse_ratio([r.input_ids for r in self.requests()]))
        return self._ideal[0]

    def describe(self) -> dict[str, Any]:
        """Every parameter plus what follows from them (what summary.json calls "workload")."""
        docs = {q.doc_id for q in self.questions}
        sizes = {len(q.branches) for q in self.questions}
        group = sizes.pop() if len(sizes) == 1 else "varies"
        return {
            **self.params.to_dict(),
            "group_size": group,
            "candidates": self.params.candidates if self.params.source is None else group,
            "requests": sum(len(q.branches) for q in self.questions),
            "documents": len(docs),
            "prompt_tokens": self.prompt_tokens,
            "mean_doc_len": sum(q.doc_len for q in self.questions) / len(self.questions),
            "duration_s": self.questions[-1].arrival_s,
            "ideal_reuse_ratio": self.ideal_reuse_ratio(),
            "ideal_reuse_definition": (
                "sum over requests in arrival order of the longest common prefix with any earlier request "
                "(capped at len-1) / sum of prompt tokens"
            ),
        }

    def request_table(self) -> list[dict[str, Any]]:
        """Per-request facts without the token ids (saved next to the results)."""
        return [
            {"rid": q.rid(b), "qid": q.qid, "branch": b, "doc_id": q.doc_id, "dataset": q.dataset,
             "arrival_s": q.arrival_s, "prompt_len": len(ids), "doc_len": q.doc_len, "question_len": q.question_len}
            for q in self.questions for b, ids in enumerate(q.branches)
        ]


# ---------------------------------------------------------------- generation

class _Tokens:
    """Random token ids with the distinct-first-token guarantees described in the module docstring."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.doc_firsts: set[int] = set()

    def draw(self, n: int) -> list[int]:
        return [self.rng.randrange(FIRST_TOKEN, VOCAB_SIZE) for _ in range(n)]

    def draw_avoiding(self, n: int, avoid: set[int]) -> list[int]:
        """n tokens whose first token is not in `avoid` (while the vocabulary allows)."""
        seq = self.draw(n)
        free = VOCAB_SIZE - FIRST_TOKEN - len(avoid)
        while free > 0 and seq[0] in avoid:
            seq[0] = self.rng.randrange(FIRST_TOKEN, VOCAB_SIZE)
        return seq

    def document(self, n: int) -> list[int]:
        doc = self.draw_avoiding(n, self.doc_firsts)
        self.doc_firsts.add(doc[0])
        return doc


@dataclass
class _Doc:
    doc_id: str
    dataset: DatasetSpec
    tokens: list[int]
    question_firsts: set[int] = field(default_factory=set)


def _pick_dataset(rng: random.Random, datasets: Sequence[DatasetSpec]) -> DatasetSpec:
    return rng.choices(list(datasets), weights=[d.weight for d in datasets], k=1)[0]


def _question(p: WorkloadParams, toks: _Tokens, doc: _Doc) -> tuple[int, tuple[tuple[int, ...], ...]]:
    rng = toks.rng
    ask = toks.draw_avoiding(rng.randint(*p.question_len), doc.question_firsts)
    doc.question_firsts.add(ask[0])
    firsts: set[int] = set()
    branches = [tuple(doc.tokens + ask)] if p.anchor else []
    for _ in range(p.candidates):
        cand = toks.draw_avoiding(rng.randint(*p.candidate_len), firsts)
        firsts.add(cand[0])
        branches.append(tuple(doc.tokens + ask + cand))
    return len(ask), tuple(branches)


def arrival_times(seed: int, rate: float, n: int) -> list[float]:
    """Poisson arrival instants of n questions at `rate` questions/s, the first at t=0 (seeded by seed and rate)."""
    rng = random.Random(f"arrivals/{seed}/{rate}")
    times, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        times.append(t)
    return times


def make_workload(params: WorkloadParams) -> Workload:
    """The workload for `params` (same params -> same token ids, documents, order and arrival times)."""
    rng = random.Random(f"multi-candidate/{params.seed}")  # string seeds are stable across Python versions
    toks = _Tokens(rng)
    docs: list[_Doc] = []

    def new_doc() -> _Doc:
        spec = _pick_dataset(rng, params.datasets)
        tokens = toks.document(spec.draw_length(rng))  # drawn whole: the random stream is that of scale 1
        kept = max(2, int(round(len(tokens) * params.doc_scale)))
        doc = _Doc(f"{spec.name}-{len(docs):04d}", spec, tokens[:kept])
        docs.append(doc)
        return doc

    plan: list[_Doc] = []  # one entry per question: the document it is asked about
    if params.stream == "cold":
        plan = [new_doc() for _ in range(params.questions)]
    else:
        while len(plan) < params.questions:
            doc = new_doc()
            plan += [doc] * doc.dataset.questions_per_doc
        plan = plan[: params.questions]
        if params.stream == "mixed":
            rng.shuffle(plan)
    drawn = [(doc, *_question(params, toks, doc)) for doc in plan]
    if params.order == "reverse":
        drawn.reverse()  # the same requests, asked in the opposite order
    arrivals = arrival_times(params.seed, params.rate, len(drawn))
    questions = [
        Question(qid, doc.doc_id, doc.dataset.name, at, len(doc.tokens), qlen, branches)
        for qid, ((doc, qlen, branches), at) in enumerate(zip(drawn, arrivals))
    ]
    return Workload(params, tuple(questions))


def warmup_prompts(n: int = 4, length: int = 96, seed: int = 0) -> list[list[int]]:
    """Prompts that share no token of prefix with any workload request (they start with WARMUP_TOKEN)."""
    rng = random.Random(f"warmup/{seed}")
    base = [WARMUP_TOKEN] + [rng.randrange(FIRST_TOKEN, VOCAB_SIZE) for _ in range(length)]
    return [base + [rng.randrange(FIRST_TOKEN, VOCAB_SIZE) for _ in range(8)] for _ in range(n)]


# ---------------------------------------------------------------- ideal reuse

def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_prefixes(prompts: Sequence[Sequence[int]]) -> Iterator[int]:
    """For each prompt in order: the longest common prefix with any earlier prompt, capped at len - 1.

    The longest common prefix with a set of sequences is reached at a lexicographic neighbour, so a sorted list of
    the earlier prompts answers each query with two comparisons (no trie of all tokens in memory).
    """
    seen: list[tuple[int, ...]] = []
    for p in prompts:
        key = tuple(p)
        i = bisect.bisect_left(seen, key)
        best = 0
        if i > 0:
            best = _lcp(key, seen[i - 1])
        if i < len(seen):
            best = max(best, _lcp(key, seen[i]))
        yield max(0, min(best, len(key) - 1))
        seen.insert(i, key)


def ideal_reuse_ratio(prompts: Sequence[Sequence[int]]) -> float:
    total = sum(len(p) for p in prompts)
    return sum(shared_prefixes(prompts)) / total if total else 0.0


def held_out(params: WorkloadParams, questions: int, rate: Optional[float] = None) -> WorkloadParams:
    """A calibration slice: same distributions, another seed (so no document is shared with the bench workload)."""
    return replace(params, questions=questions, seed=params.seed + 100_003, rate=rate or params.rate)
