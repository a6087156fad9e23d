"""JSONL trace sink ($RADIXFLOW_TRACE): one JSON object per line, each with a "kind" ("request", later "round").

Written by TP rank 0 only (every rank takes the same decisions; one copy is enough), unless the path contains
`{tp_rank}`: then every rank writes its own file, with its rank in place of the placeholder (to check that the ranks
did decide alike). Line-buffered so a reader sees whole records while the server runs, and nothing is lost when the
server is killed between records.
"""
from __future__ import annotations

import json
import os
from typing import IO, Any, Optional


RANK_PLACEHOLDER = "{tp_rank}"


def rank_trace_path(path: Optional[str], tp_rank: int) -> Optional[str]:
    """The file this TP rank writes, or None (no trace, or a single-copy trace on a rank other than 0)."""
    if path is None:
        return None
    if RANK_PLACEHOLDER in path:
        return path.replace(RANK_PLACEHOLDER, str(tp_rank))
    return path if tp_rank == 0 else None


class TraceWriter:
    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self._fh: Optional[IO[str]] = None

    @property
    def active(self) -> bool:
        return self.path is not None

    def write(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        if self._fh is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fh = open(self.path, "a", buffering=1)
        self._fh.write(json.dumps({"kind": kind, **fields}, sort_keys=True) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_trace(path: str, kind: Optional[str] = None) -> list[dict[str, Any]]:
    with open(path) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    return [r for r in records if kind is None or r.get("kind") == kind]
