"""Workloads from the user's own data: `radixflow bench multi-candidate --workload FILE` and
`radixflow bench agent --workload FILE`.

Multi-candidate

FILE is JSONL, one question per line: a shared context (a document + its question) and the candidate continuations
scored against it, as text (encoded with the served model's tokenizer) or as token ids:

    {"id": "doc1-q1", "context": "The river report ... Question: what rose?", "candidates": [" The river", " The bridge"]}
    {"id": "doc1-q2", "context": "The river report ... Question: what fell?", "candidates": [" Rain", " Prices", " Fog"]}
    {"context": [101, 2023, 2003, 1037], "candidates": [[2748], [2053]]}

Each candidate becomes one request (context + candidate, one output token), all of a question's requests released
together at its arrival instant; questions arrive in file order at Poisson times of `--rate` questions/s (`--seed`),
as in the synthetic workload. `id` is optional (line number otherwise). Lines with the same context share a document.

Agent: one trajectory per line, its turns in order (text or token ids, as above): the first is its whole first
prompt (system prompt + first message), each later one the user / tool tokens appended after the previous turn's
output. Every trajectory has the same number of turns.

    {"id": "agent-1", "turns": ["You are a coding agent. Task: fix the failing test.", "Tool output: 3 passed", "OK"]}

Who runs next, how many at once and the pool size are the bench's own options (--active, --capacity, --return-order,
--seeds), as for generated agents; the file sets the agents, turns and histories.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from sglang_radixflow.bench.agent_workload import Agent, AgentParams, AgentWorkload, make_schedule
from sglang_radixflow.bench.workloads import Question, Workload, WorkloadParams, arrival_times

Encode = Callable[[str, bool], list[int]]  # (text, add_special_tokens) -> token ids


def _tokens(value: Any, where: str, encode: Optional[Encode], specials: bool) -> list[int]:
    if isinstance(value, str):
        if encode is None:
            raise ValueError(f"{where}: text needs the model's tokenizer (add --model-path DIR)")
        ids = encode(value, specials)
    elif isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        ids = list(value)
    else:
        raise ValueError(f"{where}: expected text or a list of token ids (integers >= 0), got {value!r:.60}")
    if not ids:
        raise ValueError(f"{where}: empty")
    return ids


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """(where, object) per non-blank line; ValueError names the line and what is allowed."""
    if not path.is_file():
        raise ValueError(f"--workload {path}: no such file")
    allowed = ("id", *required)
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err.msg})") from None
        if not isinstance(row, dict) or any(k not in row for k in required):
            raise ValueError(f"{where}: expected an object with " + " and ".join(f'"{k}"' for k in required))
        unknown = sorted(set(row) - set(allowed))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
        rows.append((where, row))
    if not rows:
        raise ValueError(f"--workload {path}: nothing in the file")
    return rows


def read_workload_file(path: Path, params: WorkloadParams, encode: Optional[Encode]) -> Workload:
    """The file's questions with Poisson arrivals (params.rate, params.seed); ValueError names the line and field."""
    questions_raw: list[tuple[str, list[int], list[list[int]]]] = []
    for where, row in _rows(path, ("context", "candidates")):
        lineno = where.rsplit(":", 1)[1]
        cands = row["candidates"]
        if not isinstance(cands, list) or not cands:
            raise ValueError(f"{where}: \"candidates\" must be a non-empty list")
        context = _tokens(row["context"], f"{where} context", encode, True)
        branches = [_tokens(c, f"{where} candidate {i}", encode, False) for i, c in enumerate(cands)]
        questions_raw.append((str(row.get("id", f"line-{lineno}")), context, branches))
    if params.questions < len(questions_raw):
        questions_raw = questions_raw[: params.questions]
    params = replace(params, questions=len(questions_raw), source=str(path))
    docs: dict[tuple[int, ...], str] = {}
    questions = []
    for qid, ((name, context, branches), at) in enumerate(
            zip(questions_raw, arrival_times(params.seed, params.rate, len(questions_raw)))):
        doc_id = docs.setdefault(tuple(context), f"context-{len(docs):04d}")
        questions.append(Question(qid, doc_id, name, at, len(context), 0,
                                  tuple(tuple(context + b) for b in branches)))
    return Workload(params, tuple(questions))


def read_agent_file(path: Path, params: AgentParams, encode: Optional[Encode]) -> AgentWorkload:
    """The file's trajectories under the bench's schedule options (`params`: active, capacity, order, seed); the
    workload's sizes (agents, turns, system / first / new tokens) are the file's, for the pool and report."""
    agents: list[Agent] = []
    turns = None
    for where, row in _rows(path, ("turns",)):
        raw = row["turns"]
        if not isinstance(raw, list) or not raw:
            raise ValueError(f'{where}: "turns" must be a non-empty list')
        if turns is not None and len(raw) != turns:
            raise ValueError(f"{where}: {len(raw)} turns; every trajectory needs the same number ({turns})")
        turns = len(raw)
        ids = [_tokens(t, f"{where} turn {i}", encode, i == 0) for i, t in enumerate(raw)]
        agents.append(Agent(len(agents), ids[0], ids[1:]))
    assert turns is not None
    firsts = [a.first for a in agents]
    system = len(os.path.commonprefix(firsts)) if len(firsts) > 1 else 0
    system = max(1, min(system, min(len(f) for f in firsts) - 1))
    news = [len(n) for a in agents for n in a.new]
    params = replace(params, agents=len(agents), turns=turns, system_tokens=system,
                     first_tokens=max(1, max(len(f) for f in firsts) - system),
                     new_tokens=max(1, round(sum(news) / len(news))) if news else 1)
    return AgentWorkload(params, agents, make_schedule(params, random.Random(params.seed)))


def tokenizer_encode(model_path: Path) -> Encode:
    """The served model's tokenizer as an Encode."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))
    return lambda text, specials: list(tok(text, add_special_tokens=specials)["input_ids"])
