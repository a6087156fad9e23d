"""Verdicts of the state-ready traversal, read at a request's scan position against the partial batch."""
from __future__ import annotations

import enum


class Verdict(enum.Enum):
    READY = "ready"  # SGLang's adder admits it
    BLOCKED = "blocked"  # its useful prefix is being produced (this round or still in flight): wait one round
    OTHER = "other"  # SGLang's NO_TOKEN / OTHER: native handling (may stop the scan)
