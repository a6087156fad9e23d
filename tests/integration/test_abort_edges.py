"""Aborts and cache flushes at the edges of the state-ready traversal, on real servers (NemotronH, CPU).

Each case checks that the promise closes (every registered promise is published or cancelled), that the requests
around the aborted one finish with native SGLang's outputs, and that no KV or mamba slot leaks (SGLang's idle check).
"""
from __future__ import annotations

import random
import threading
import time
import urllib.error
from pathlib import Path
from typing import Callable, Iterator

import pytest

from sglang_radixflow.bench.server import SGLangServer, ServerError
from sglang_radixflow.observe.trace import read_trace
from tests.integration.server_group import started

LEAK = "memory leak detected"
FLOAT32 = ("--dtype", "float32")
FLOAT32_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
FIRST_CHUNK = "#new-token: 4096, #cached-token: 0"  # a 6000-token document's first chunk (4096: the CPU default)


def _send(server: SGLangServer, prompts: list[list[int]], rids: list[str]) -> dict[str, dict]:
    """Each prompt as its own request (so an abort ends only its own call); {rid: result or the abort's answer}."""
    out: dict[str, dict] = {}

    def one(prompt: list[int], rid: str) -> None:
        try:
            out[rid] = server.post("/generate", {"input_ids": prompt, "rid": rid,
                                                 "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
        except ServerError as err:  # SGLang may answer an aborted request with an error status
            out[rid] = {"error": str(err)}

    threads = [threading.Thread(target=one, args=(p, r)) for p, r in zip(prompts, rids)]
    for th in threads:
        th.start()
        time.sleep(0.002)
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a request never completed"
    return out


def _when_logged(server: SGLangServer, line: str, action: Callable[[], None]) -> threading.Thread:
    """A started thread that runs `action` as soon as the server's log (from now on) holds `line`."""
    start = len(server.log_text())

    def wait_then_act() -> None:
        deadline = time.monotonic() + 120
        while line not in server.log_text()[start:]:
            assert time.monotonic() < deadline, f"never logged: {line}"
            time.sleep(0.005)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread


def _finished(result: dict) -> bool:
    return "error" not in result and result["meta_info"]["finish_reason"]["type"] != "abort"


def _promises_closed(trace: Path) -> None:
    rounds = read_trace(str(trace), "round")
    opened = sum(r["promises_registered_delta"] for r in rounds)
    closed = sum(r["promises_published_delta"] + r["promises_cancelled_delta"] for r in rounds)
    assert opened >= 1 and opened == closed and rounds[-1]["promises_open"] == 0, (opened, closed)


def _idle_and_clean(server: SGLangServer) -> None:
    time.sleep(2.0)  # idle: SGLang's strict memory check runs
    assert server.generate([5, 6, 7], 2)["output_ids"]
    assert LEAK not in server.log_text() and "Scheduler hit an exception" not in server.log_text()


def _document(seed: int, doc_len: int, siblings: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    doc = [rng.randrange(3, 2000) for _ in range(doc_len)]
    return [doc + [rng.randrange(3, 2000) for _ in range(10)] for _ in range(siblings)]


@pytest.fixture(scope="module")
def no_buffer_servers(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[tuple[dict[str, SGLangServer], Path]]:
    trace = tmp_path_factory.mktemp("abort") / "radixflow.jsonl"
    model = str(model_dirs["nemotron_h"])
    servers = {
        "sglang": SGLangServer(model, radix_cache=None, extra_args=FLOAT32, env=FLOAT32_ENV),
        "radixflow": SGLangServer(model, extra_args=FLOAT32, env={**FLOAT32_ENV, "RADIXFLOW_TRACE": str(trace)}),
    }
    with started(servers):
        yield servers, trace


def test_a_blocked_consumer_aborted_while_its_producer_runs(
    no_buffer_servers: tuple[dict[str, SGLangServer], Path],
) -> None:
    """A 6000-token document keeps the producer's prefix request in flight for two rounds (chunk 4096); a Blocked
    sibling is aborted once the first of them is logged. The others still start from the document's state, with
    native outputs."""
    servers, trace = no_buffer_servers
    server = servers["radixflow"]
    prompts = _document(51, 6000)
    rids = [f"blocked-abort-{i}" for i in range(4)]
    aborter = _when_logged(server, FIRST_CHUNK, lambda: server.post("/abort_request", {"rid": rids[2]}))
    out = _send(server, prompts, rids)
    aborter.join()
    assert not _finished(out[rids[2]]), out[rids[2]]
    kept = [rid for rid in rids if rid != rids[2]]
    assert all(_finished(out[rid]) for rid in kept), out
    assert [out[rid]["meta_info"]["cached_tokens"] >= 6000 - 64 for rid in kept[1:]] == [True, True]
    native = _send(servers["sglang"], [prompts[i] for i in (0, 1, 3)], [f"native-{rid}" for rid in kept])
    assert [out[rid]["output_ids"] for rid in kept] == [native[f"native-{rid}"]["output_ids"] for rid in kept]
    _idle_and_clean(server)
    _promises_closed(trace)


def test_flush_cache_while_promises_are_open_is_refused_then_works_once_idle(
    no_buffer_servers: tuple[dict[str, SGLangServer], Path],
) -> None:
    """SGLang flushes only an idle server: a flush sent while a producer's promise is open is refused, nothing the
    siblings wait for goes away, and a flush once they finished empties the tree (the next sibling recomputes)."""
    servers, trace = no_buffer_servers
    server = servers["radixflow"]
    prompts = _document(53, 6000)
    rids = [f"flush-{i}" for i in range(4)]
    flushes: list[tuple[str, str]] = []

    def flush() -> None:
        try:
            flushes.append(("flushed", server.get("/flush_cache")))
        except urllib.error.HTTPError as err:  # SGLang answers a refused flush with 400
            flushes.append(("refused", err.read().decode(errors="replace")))

    flusher = _when_logged(server, FIRST_CHUNK, flush)
    out = _send(server, prompts, rids)
    flusher.join()
    assert all(_finished(out[rid]) for rid in rids), out
    assert [out[rid]["meta_info"]["cached_tokens"] >= 6000 - 64 for rid in rids[1:]] == [True] * 3
    assert [kind for kind, _ in flushes] == ["refused"], flushes
    _idle_and_clean(server)
    _promises_closed(trace)
    assert "Cache flushed" in server.get("/flush_cache")
    again = server.generate(prompts[1], 1)
    assert again["meta_info"]["cached_tokens"] == 0


def test_a_chunked_extra_buffer_producer_aborted_mid_document(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """extra_buffer, 400-token chunks, a 3000-token document: the producer is aborted after its first chunk. Its
    promise is cancelled, the siblings are released and finish with native outputs, nothing leaks."""
    model = str(model_dirs["nemotron_h"])
    budget = ("--chunked-prefill-size", "400", "--max-prefill-tokens", "400")
    trace = tmp_path / "radixflow.jsonl"
    server = SGLangServer(model, extra_args=(*FLOAT32, *budget), mamba_strategy="extra_buffer",
                          env={**FLOAT32_ENV, "RADIXFLOW_TRACE": str(trace)})
    prompts = _document(57, 3000)
    rids = [f"xbuf-abort-{i}" for i in range(4)]
    with server:
        start = len(server.log_text())

        def abort_after_first_chunk() -> None:
            deadline = time.monotonic() + 60
            while "#new-token: 400, #cached-token: 0" not in server.log_text()[start:]:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            server.post("/abort_request", {"rid": rids[0]})

        aborter = threading.Thread(target=abort_after_first_chunk)
        aborter.start()
        out = _send(server, prompts, rids)
        aborter.join()
        assert not _finished(out[rids[0]]), out[rids[0]]
        assert all(_finished(out[rid]) for rid in rids[1:]), out
        _idle_and_clean(server)
    _promises_closed(trace)
    rounds = read_trace(str(trace), "round")
    assert sum(r["promises_cancelled_delta"] for r in rounds) >= 1  # the aborted producer's promise
    with SGLangServer(model, radix_cache=None, extra_args=(*FLOAT32, *budget), env=FLOAT32_ENV,
                      mamba_strategy="extra_buffer") as native_server:
        native = _send(native_server, prompts[1:], [f"native-{rid}" for rid in rids[1:]])
    assert [out[rid]["output_ids"] for rid in rids[1:]] == [native[f"native-{rid}"]["output_ids"] for rid in rids[1:]]
