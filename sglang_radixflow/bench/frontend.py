"""The multi-candidate workload sent through SGLang's frontend language (`--path select|fork`) instead of raw /generate.

A question is one `sgl.function` program against `sgl.RuntimeEndpoint`:
- `select`: `s += context; s += sgl.select("answer", choices=candidates)`. SGLang's RuntimeEndpoint.select first sends
  the context alone with max_new_tokens=0 (a cache-only warm-up), then the 4 choice texts in one batched request
  (max_new_tokens=0, return_logprob, logprob_start_len = context tokens − 2) and picks the best normalised logprob;
- `fork`: `s += context; forks = s.fork(4)`: fork commits the context (the same cache-only warm-up), then each branch
  `f += candidate + sgl.gen(max_tokens=1)` runs in its own thread.
Reuse on this path = Σ meta_info.cached_tokens / Σ prompt tokens of the CHOICE requests (what the warm-up was for).

Texts come from the token workload (bench/workloads.py, same documents / questions / arrivals): each token id becomes
one whole-word token of the model's tokenizer (" word"), so a context tokenizes to the same ids alone and as the
prefix of context + candidate (candidates start with a space). Prompt sizes are the server's own counts.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from sglang_radixflow.bench.client import Completions
from sglang_radixflow.bench.workloads import Workload, shared_prefixes

FRONTEND_PATHS: tuple[str, ...] = ("select", "fork")
_WORD = re.compile(r"Ġ[a-z]+")  # byte-level BPE: "Ġ" is the leading space


@dataclass(frozen=True)
class TextQuestion:
    qid: int
    arrival_s: float
    context: str  # document + question
    candidates: tuple[str, ...]  # each starts with a space


def word_lexicon(model_path: str | Path) -> list[str]:
    """Whole-word vocabulary entries of the model's tokenizer, as text (" word"): one token each."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    words = sorted(" " + w[1:] for w in tok.get_vocab() if _WORD.fullmatch(w))
    if len(words) < 64:
        raise ValueError(f"{model_path}: tokenizer has only {len(words)} whole-word tokens; need >= 64 for texts")
    return words


def text_questions(workload: Workload, lexicon: Sequence[str]) -> list[TextQuestion]:
    def text(ids: Sequence[int]) -> str:
        return "".join(lexicon[i % len(lexicon)] for i in ids)

    out = []
    for q in workload.questions:
        cut = q.doc_len + q.question_len
        context = text(q.branches[0][:cut])
        out.append(TextQuestion(q.qid, q.arrival_s, context, tuple(text(b[cut:]) for b in q.branches)))
    return out


def frontend_ideal_reuse(questions: Sequence[TextQuestion], tokenize: Callable[[str], list[int]]) -> float:
    """Ideal reuse of the choice requests: each prompt's longest common prefix with any earlier prompt (warm-ups
    included, in send order), summed over the choice prompts only, over their prompt tokens."""
    prompts: list[list[int]] = []
    is_choice: list[bool] = []
    for q in questions:
        prompts.append(tokenize(q.context))
        is_choice.append(False)
        for c in q.candidates:
            prompts.append(tokenize(q.context + c))
            is_choice.append(True)
    shared = list(shared_prefixes(prompts))
    total = sum(len(p) for p, c in zip(prompts, is_choice) if c)
    return sum(s for s, c in zip(shared, is_choice) if c) / total if total else 0.0


# ---------------------------------------------------------------- programs

def programs() -> dict[str, Any]:
    """The two frontend programs (built lazily: importing sglang's frontend pulls in its whole client)."""
    import sglang as sgl

    @sgl.function
    def score_select(s, context: str, candidates: list[str]):  # noqa: ANN202
        s += context
        s += sgl.select("answer", choices=list(candidates))

    @sgl.function
    def score_fork(s, context: str, candidates: list[str]):  # noqa: ANN202
        s += context
        # fork commits the context (a max_new_tokens=0 request) only if the executor thread has already appended it;
        # without this sync, whether the warm-up happens is a race inside SGLang's interpreter.
        s.sync()
        forks = s.fork(len(candidates))
        for f, c in zip(forks, candidates):
            f += c + sgl.gen("next", max_tokens=1, temperature=0.0)
        forks.join()

    return {"select": score_select, "fork": score_fork}


def metered_endpoint(url: str) -> Any:
    """sgl.RuntimeEndpoint that also keeps every /generate response's meta_info, by program (the `context` argument
    is shared by a program and its forks)."""
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    class MeteredEndpoint(RuntimeEndpoint):
        def __init__(self, base_url: str) -> None:
            super().__init__(base_url)
            self.lock = threading.Lock()
            self.seen: dict[int, list[tuple[str, dict[str, Any]]]] = {}  # id(arguments) -> (role, meta_info)

        def _keep(self, s: Any, role: str, metas: Sequence[dict[str, Any]]) -> None:
            with self.lock:
                self.seen.setdefault(id(s.arguments), []).extend((role, m) for m in metas)

        def _generate_http_request(self, s: Any, data: dict[str, Any]) -> Any:  # select's two requests
            obj = super()._generate_http_request(s, data)
            batch = obj if isinstance(obj, list) else [obj]
            self._keep(s, "choice" if isinstance(data.get("text"), list) else "warmup", [r["meta_info"] for r in batch])
            return obj

        def commit_lazy_operations(self, s: Any) -> None:
            # fork's warm-up: the very request RuntimeEndpoint.commit_lazy_operations sends, through the path that
            # keeps the response (the original drops it)
            self._generate_http_request(s, {"text": s.text_, "sampling_params": {"max_new_tokens": 0}})

        def generate(self, s: Any, sampling_params: Any) -> Any:  # fork's branches
            comp, meta = super().generate(s, sampling_params)
            self._keep(s, "choice", [meta])
            return comp, meta

        def take(self, arguments: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
            with self.lock:
                return self.seen.pop(id(arguments), [])

    return MeteredEndpoint(url)


@dataclass
class QuestionRecord:
    qid: int
    path: str
    arrival_s: float
    sent_s: float = 0.0
    done_s: float = 0.0
    latency_s: Optional[float] = None
    decision: Optional[str] = None
    warmup_requests: int = 0
    warmup_prompt_tokens: Optional[int] = None
    warmup_cached_tokens: Optional[int] = None
    choice_prompt_tokens: list[int] = field(default_factory=list)
    choice_cached_tokens: list[int] = field(default_factory=list)
    error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def request_records(self, q: TextQuestion) -> list[dict[str, Any]]:
        """One client-record per choice request (bench/client.py RequestRecord fields) for the standard summary:
        latency is the question's program latency; output_ids = [index of the selected candidate] (select)."""
        decided = [q.candidates.index(self.decision)] if self.decision in q.candidates else []
        out = []
        for b in range(len(q.candidates)):
            ok = self.error is None and b < len(self.choice_prompt_tokens)
            out.append({
                "rid": f"q{self.qid:05d}-b{b}", "qid": self.qid, "branch": b,
                "prompt_len": self.choice_prompt_tokens[b] if ok else 0, "arrival_s": self.arrival_s,
                "sent_s": self.sent_s, "done_s": self.done_s, "latency_s": self.latency_s if ok else None,
                "cached_tokens": self.choice_cached_tokens[b] if ok else None, "token_hit": None, "state_hit": None,
                "output_ids": decided, "error": None if ok else (self.error or "no choice request recorded"),
            })
        return out


class FrontendClient:
    """Open loop over questions: each program starts at its question's arrival time, in its own thread."""

    def __init__(self, url: str, path: str, on_done: Optional[Callable[[QuestionRecord, int, int], None]] = None,
                 timeout_s: float = 600.0) -> None:
        if path not in FRONTEND_PATHS:
            raise ValueError(f"path={path!r}; frontend paths: {', '.join(FRONTEND_PATHS)}")
        self.url, self.path, self.timeout_s = url, path, timeout_s
        self._completions = Completions(on_done)

    def run(self, questions: Sequence[TextQuestion], lead_s: float = 0.05) -> list[QuestionRecord]:
        program = programs()[self.path]
        endpoint = metered_endpoint(self.url)
        records = [QuestionRecord(q.qid, self.path, q.arrival_s) for q in questions]
        start = time.perf_counter() + lead_s
        threads = []
        for q, rec in zip(questions, records):
            delay = start + q.arrival_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t = threading.Thread(target=self._one, args=(program, endpoint, q, rec, start, len(records)), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(self.timeout_s)
        return records

    def _one(self, program: Any, endpoint: Any, q: TextQuestion, rec: QuestionRecord, start: float,
             total: int) -> None:
        rec.sent_s = time.perf_counter() - start
        arguments: Optional[dict[str, Any]] = None
        try:
            state = program.run(context=q.context, candidates=list(q.candidates), backend=endpoint)
            state.sync()
            arguments = state.stream_executor.arguments
            if state.error() is not None:
                raise RuntimeError(str(state.error()))
            if self.path == "select":
                rec.decision = state["answer"]
        except Exception as err:  # a dead server, an HTTP error: recorded, the run goes on
            rec.error = f"{type(err).__name__}: {err}"[:300]
        rec.done_s = time.perf_counter() - start
        seen = endpoint.take(arguments) if arguments is not None else []
        warm = [m for role, m in seen if role == "warmup"]
        choices = [m for role, m in seen if role == "choice"]
        rec.warmup_requests = len(warm)
        if warm and "prompt_tokens" in warm[0]:
            rec.warmup_prompt_tokens = int(warm[0]["prompt_tokens"])
            rec.warmup_cached_tokens = int(warm[0].get("cached_tokens", 0))
        rec.choice_prompt_tokens = [int(m["prompt_tokens"]) for m in choices]
        rec.choice_cached_tokens = [int(m.get("cached_tokens", 0)) for m in choices]
        if rec.error is None and len(choices) != len(q.candidates):
            rec.error = f"{len(choices)} choice requests recorded, expected {len(q.candidates)}"
        self._completions.finish(rec, total)

