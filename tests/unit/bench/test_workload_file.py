"""`--workload FILE` (bench/workload_file.py) and the --url run's metrics (bench/remote.py), without servers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_radixflow.bench.remote import counted, parse_metrics
from sglang_radixflow.bench.workload_file import read_workload_file
from sglang_radixflow.bench.workloads import WorkloadParams, arrival_times

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "multi_candidate_workload.jsonl"


def bytes_encode(text: str, specials: bool) -> list[int]:
    """A stand-in tokenizer: one id per byte (+ a BOS of 1 where special tokens are added)."""
    return ([1] if specials else []) + [b + 3 for b in text.encode()]


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_the_example_file_round_trips_into_questions_and_requests() -> None:
    params = WorkloadParams(questions=10 ** 9, rate=3.0, seed=4)
    w = read_workload_file(EXAMPLE, params, bytes_encode)
    assert [q.dataset for q in w.questions] == ["river-q1", "river-q2", "market-q1", "market-q2", "ids-q1"]
    assert [len(q.branches) for q in w.questions] == [4, 4, 3, 4, 3]
    assert [q.arrival_s for q in w.questions] == arrival_times(4, 3.0, 5)  # the synthetic workload's arrivals
    first = w.questions[0]
    context = bytes_encode(json.loads(EXAMPLE.read_text().splitlines()[0])["context"], True)
    assert first.branches[0] == tuple(context + bytes_encode(" The bridge", False)) and first.doc_len == len(context)
    ids = w.questions[4]
    assert ids.branches == ((310, 411, 512, 613, 714, 815, 916, 1017, 1118, 1219, 42),
                            (310, 411, 512, 613, 714, 815, 916, 1017, 1118, 1219, 43, 44),
                            (310, 411, 512, 613, 714, 815, 916, 1017, 1118, 1219, 45))
    desc = w.describe()
    assert (desc["questions"], desc["requests"], desc["candidates"], desc["documents"]) == (5, 18, "varies", 5)
    assert desc["source"] == str(EXAMPLE) and 0 < desc["ideal_reuse_ratio"] < 1
    assert [r.rid for r in w.requests()][:2] == ["q00000-b0", "q00000-b1"]
    assert len(read_workload_file(EXAMPLE, WorkloadParams(questions=2), bytes_encode).questions) == 2  # --questions


def test_questions_on_one_context_share_its_document(tmp_path: Path) -> None:
    path = write(tmp_path, {"context": [5, 6, 7], "candidates": [[8], [9]]},
                 {"context": [5, 6, 7], "candidates": [[10]]}, "", {"context": [5, 6], "candidates": [[7]]})
    w = read_workload_file(path, WorkloadParams(questions=100), None)
    assert [q.doc_id for q in w.questions] == ["context-0000", "context-0000", "context-0001"]
    assert [q.dataset for q in w.questions] == ["line-1", "line-2", "line-4"]


@pytest.mark.parametrize("row, error", [
    ("{not json", ":1: not JSON"),
    ({"context": [1, 2]}, ':1: expected an object with "context" and "candidates"'),
    ({"context": [1, 2], "candidates": [[3]], "label": 1}, ":1: unknown field(s) label; allowed: id, context, "),
    ({"context": [1, 2], "candidates": []}, ':1: "candidates" must be a non-empty list'),
    ({"context": [1, -2], "candidates": [[3]]}, ":1 context: expected text or a list of token ids (integers >= 0)"),
    ({"context": [1, 2], "candidates": [[3], []]}, ":1 candidate 1: empty"),
    ({"context": "some text", "candidates": [[3]]}, ":1 context: text needs the model's tokenizer (add --model-path"),
])
def test_a_bad_line_is_named_with_what_is_allowed(tmp_path: Path, row: object, error: str) -> None:
    path = write(tmp_path, row)
    with pytest.raises(ValueError, match=f"^{str(path)}" + "".join("\\" + c if c in "()[].*+?^$|{}" else c
                                                                      for c in error)):
        read_workload_file(path, WorkloadParams(), None)


def test_an_empty_or_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing in the file"):
        read_workload_file(write(tmp_path, ""), WorkloadParams(), None)
    with pytest.raises(ValueError, match="no such file"):
        read_workload_file(tmp_path / "missing.jsonl", WorkloadParams(), None)


METRICS = """# HELP radixflow_rounds_total Worker calls by kind
# TYPE radixflow_rounds_total counter
radixflow_rounds_total{kind="prefill",tp_rank="0"} 12.0
radixflow_rounds_total{kind="decode",tp_rank="0"} 40.0
radixflow_rounds_total{kind="mixed",tp_rank="0"} 1.0
radixflow_rounds_created{kind="prefill",tp_rank="0"} 1.7e9
radixflow_prefill_rows_total 30.0
radixflow_prefill_tokens_total 4100.0
sglang:num_requests_total 99.0
"""


def test_prefill_rounds_of_a_server_the_bench_did_not_start_come_from_its_counters() -> None:
    start = parse_metrics(METRICS)
    assert start["radixflow_rounds_total{kind=prefill}"] == 12.0 and "radixflow_rounds_created{kind=prefill}" not in start
    end = parse_metrics(METRICS.replace(" 12.0", " 20.0").replace(" 30.0", " 62.0").replace(" 4100.0", " 5000.0"))
    assert counted(start, end) == {"prefill_rounds": 8, "rows": 32, "tokens": 900}
    assert counted(None, end) is None and counted(start, {"sglang:x": 1.0}) is None  # no metrics: missing, not zero


AGENT_EXAMPLE = EXAMPLE.parent / "agent_workload.jsonl"


def test_the_agent_example_becomes_trajectories_under_the_benchs_schedule() -> None:
    from sglang_radixflow.bench.agent_workload import AgentParams
    from sglang_radixflow.bench.workload_file import read_agent_file

    base = AgentParams(agents=5, active=2, capacity=3.0, seed=3)
    w = read_agent_file(AGENT_EXAMPLE, base, bytes_encode)
    p = w.params
    assert (p.agents, p.turns, p.active, p.capacity) == (5, 4, 2, 3.0)
    first_line = json.loads(AGENT_EXAMPLE.read_text().splitlines()[0])["turns"]
    assert w.agents[0].first == bytes_encode(first_line[0], True)
    assert w.agents[0].new == [bytes_encode(t, False) for t in first_line[1:]]
    assert w.agents[4].first == [310, 411, 512, 613, 714, 815, 916, 1017] and w.agents[4].new[-1] == [47]
    assert sorted(w.schedule) == [(a, t) for a in range(5) for t in range(4)]  # every turn once, in turn order
    assert all(w.schedule.index((a, t)) < w.schedule.index((a, t + 1)) for a in range(5) for t in range(3))
    assert w.describe()["requests"] == 20
    # another seed: the same trajectories, another schedule
    other = read_agent_file(AGENT_EXAMPLE, AgentParams(agents=5, active=2, capacity=3.0, seed=4), bytes_encode)
    assert other.agents == w.agents and other.schedule != w.schedule


def test_a_bad_agent_file_is_named(tmp_path: Path) -> None:
    from sglang_radixflow.bench.agent_workload import AgentParams
    from sglang_radixflow.bench.workload_file import read_agent_file

    base = AgentParams(agents=3, active=1, capacity=2.0)
    path = write(tmp_path, {"turns": [[5, 6], [7]]}, {"turns": [[5, 6]]})
    with pytest.raises(ValueError, match=":2: 1 turns; every trajectory needs the same number \\(2\\)"):
        read_agent_file(path, base, None)
    path = write(tmp_path, {"turns": [[5, 6], [7]]}, {"turns": [[5, 8], [9]]})
    with pytest.raises(ValueError, match="need 0 < active \\(n_a=1\\) < capacity \\(m=2.0\\) < agents \\(n=2\\)"):
        read_agent_file(path, base, None)
