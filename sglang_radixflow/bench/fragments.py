"""Fragments and rounds of a prefill schedule (light: no torch / SGLang import, so saved schedules load fast)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable


@dataclass(frozen=True, order=True)
class Fragment:
    """One row of one round: a request's extend [prefix_len, prefix_len + extend_len)."""

    rid: str
    prefix_len: int
    extend_len: int


@dataclass(frozen=True)
class RoundRecord:
    round_id: int
    fragments: tuple[Fragment, ...]

    @property
    def rows(self) -> int:
        return len(self.fragments)

    @property
    def tokens(self) -> int:
        return sum(f.extend_len for f in self.fragments)

    @property
    def rids(self) -> list[str]:
        return [f.rid for f in self.fragments]

    def fragment(self, rid: str) -> Fragment:
        (found,) = [f for f in self.fragments if f.rid == rid]
        return found


def write_rounds(path: Path, rounds: Iterable[RoundRecord]) -> None:
    """One JSON line per round: {"round", "rows", "tokens", "fragments": [{"rid", "prefix_len", "extend_len"}]}."""
    with open(path, "w") as fh:
        for r in rounds:
            frags = [{"rid": f.rid, "prefix_len": f.prefix_len, "extend_len": f.extend_len} for f in r.fragments]
            fh.write(json.dumps({"round": r.round_id, "rows": r.rows, "tokens": r.tokens, "fragments": frags}) + "\n")


def read_rounds(path: Path) -> list[RoundRecord]:
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [RoundRecord(int(r["round"]), tuple(Fragment(f["rid"], int(f["prefix_len"]), int(f["extend_len"]))
                                               for f in r["fragments"])) for r in rows]
