"""Progress lines of the bench drivers (multi-candidate, agent, replay): a log callable, printed and flushed by
default so long runs show where they are."""
from __future__ import annotations

from typing import Callable

Log = Callable[[str], None]


def print_progress(msg: str) -> None:
    print(msg, flush=True)
