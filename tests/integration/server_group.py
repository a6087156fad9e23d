"""Module fixtures' server groups: start them together, stop them together."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping, TypeVar

from sglang_radixflow.bench.server import SGLangServer

Group = TypeVar("Group", bound=Mapping[str, SGLangServer])


@contextmanager
def started(servers: Group) -> Iterator[Group]:
    """Start every server in order; stop all of them on exit, also when one of them failed to start (stop is a no-op
    for a server that never started), so that no test session leaves a server behind."""
    try:
        for server in servers.values():
            server.start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()
