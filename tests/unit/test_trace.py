"""The trace's rank rule: one copy (rank 0) unless the path asks for one file per TP rank."""
from __future__ import annotations

from pathlib import Path

from sglang_radixflow.observe.trace import TraceWriter, rank_trace_path, read_trace


def test_rank_0_writes_a_plain_path_and_every_rank_writes_a_placeholder_path() -> None:
    assert [rank_trace_path("/t/x.jsonl", r) for r in (0, 1)] == ["/t/x.jsonl", None]
    assert [rank_trace_path("/t/x-{tp_rank}.jsonl", r) for r in (0, 1)] == ["/t/x-0.jsonl", "/t/x-1.jsonl"]
    assert rank_trace_path(None, 0) is None


def test_records_round_trip_and_a_writer_without_a_path_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "trace.jsonl"
    w = TraceWriter(str(path))
    w.write("round", round=1, rows=2)
    w.write("request", rid="a")
    w.close()
    assert read_trace(str(path), kind="round") == [{"kind": "round", "round": 1, "rows": 2}]
    off = TraceWriter(None)
    off.write("round", round=1)
    assert not off.active
