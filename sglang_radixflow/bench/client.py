"""Open-loop HTTP driver: each question's branches are posted concurrently to /generate at the question's arrival
instant, whatever the server is doing (arrivals never wait for completions: that is what makes overload visible).

One thread per in-flight request (stdlib only). A request record keeps what the reports need: latency, SGLang's
meta_info.cached_tokens, radixflow's ĥ/h when present, output ids, errors, and how late the send was.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from sglang_radixflow.bench.gateway import ROUTED_WORKER_HEADER, ROUTING_KEY_HEADER
from sglang_radixflow.bench.workloads import Request


@dataclass
class RequestRecord:
    rid: str
    qid: int
    branch: int
    prompt_len: int
    arrival_s: float  # scheduled, relative to the start of the run
    sent_s: float = 0.0  # actual send, relative to the start of the run
    done_s: float = 0.0
    latency_s: Optional[float] = None  # done - sent; None on error
    cached_tokens: Optional[int] = None
    token_hit: Optional[int] = None  # radixflow meta_info (radixflow backend only)
    state_hit: Optional[int] = None
    output_ids: list[int] = field(default_factory=list)
    error: Optional[str] = None
    worker: Optional[str] = None  # the worker a gateway routed it to (its response header); None on one server

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _first(value: Any) -> Optional[int]:
    # customized_info values come as one-element lists
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else int(value)


def generate_body(input_ids: Sequence[int], rid: str, routing_key: Optional[str] = None) -> bytes:
    payload: dict[str, Any] = {"input_ids": list(input_ids), "rid": rid,
                               "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    if routing_key is not None:  # SGLang's own field; a gateway's `manual` policy reads the header (routing_headers)
        payload["routing_key"] = routing_key
    return json.dumps(payload).encode()


def routing_headers(routing_key: Optional[str]) -> dict[str, str]:
    """The header SGLang's gateway routes `manual` by (and SGLang 0.5.23 counts per key); none without a key."""
    return {ROUTING_KEY_HEADER: routing_key} if routing_key is not None else {}


def post_generate(url: str, input_ids: Sequence[int], rid: str, timeout_s: float,
                  body: Optional[bytes] = None) -> dict[str, Any]:
    return post_json(url, "/generate", body if body is not None else generate_body(input_ids, rid), timeout_s)


def sse_json(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON events of a server-sent-event stream (SGLang's streamed /generate and OpenAI endpoints), up to
    `data: [DONE]`."""
    for raw in lines:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        body = line[len("data:"):].strip()
        if body == "[DONE]":
            return
        yield json.loads(body)


def post_json(url: str, path: str, payload: Any, timeout_s: float) -> Any:
    """POST a JSON body (an object, or bytes already encoded); the decoded answer (None for an empty one)."""
    return post_json_routed(url, path, payload, timeout_s)[0]


def post_json_routed(url: str, path: str, payload: Any, timeout_s: float,
                     headers: Optional[Mapping[str, str]] = None) -> tuple[Any, Optional[str]]:
    """post_json with extra request headers; also returns the worker a gateway says it routed the request to."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        body = resp.read()
        worker = resp.headers.get(ROUTED_WORKER_HEADER)
    return (json.loads(body) if body.strip() else None), worker


def fill_from_response(rec: RequestRecord, body: Mapping[str, Any]) -> None:
    meta = body.get("meta_info") or {}
    rec.cached_tokens = int(meta.get("cached_tokens", 0))
    rec.token_hit = _first(meta.get("radixflow_token_hit"))
    rec.state_hit = _first(meta.get("radixflow_state_hit"))
    rec.output_ids = [int(t) for t in body.get("output_ids") or []]
    if not rec.output_ids:
        rec.error = "no output_ids in the response"


class Completions:
    """Counts finished items across client threads; each finish sets the record's latency (when it has no error) and
    is reported to `on_done(record, finished so far, total)` (progress output)."""

    def __init__(self, on_done: Optional[Callable[[Any, int, int], None]] = None) -> None:
        self.on_done = on_done
        self._lock = threading.Lock()
        self._finished = 0

    def finish(self, rec: Any, total: int) -> None:
        if rec.error is None:
            rec.latency_s = rec.done_s - rec.sent_s
        with self._lock:
            self._finished += 1
            done = self._finished
        if self.on_done is not None:
            self.on_done(rec, done, total)


class OpenLoopClient:
    def __init__(self, url: str, timeout_s: float = 600.0,
                 on_done: Optional[Callable[[RequestRecord, int, int], None]] = None, routed: bool = False) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.on_done = on_done  # (record, finished so far, total): progress output
        self.routed = routed  # through a gateway: each request carries its document's routing key

    def run(self, requests: Sequence[Request], lead_s: float = 0.05) -> list[RequestRecord]:
        """Send every request at its arrival_s after the start; return records in request order.

        Requests with the same arrival instant (a question's branches) are released together: their bodies are
        encoded and their threads started before the instant, then one event fires them, so the spread between
        siblings is a socket send, not thread start-up + JSON encoding under the GIL (that spread was ~10 ms,
        longer than a 5 ms admission hold).
        """
        records = [RequestRecord(r.rid, r.qid, r.branch, len(r.input_ids), r.arrival_s) for r in requests]
        self._completions = Completions(self.on_done)
        threads: list[threading.Thread] = []
        start = time.perf_counter() + lead_s
        i = 0
        while i < len(requests):
            j = i
            while j < len(requests) and requests[j].arrival_s == requests[i].arrival_s:
                j += 1
            go = threading.Event()
            for req, rec in zip(requests[i:j], records[i:j]):
                body = generate_body(req.input_ids, req.rid, req.routing_key if self.routed else None)
                t = threading.Thread(target=self._one, args=(req, rec, body, go, start, len(records)), daemon=True)
                t.start()
                threads.append(t)
            delay = start + requests[i].arrival_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            go.set()
            i = j
        for t in threads:
            t.join()
        return records

    def _one(self, req: Request, rec: RequestRecord, body: bytes, go: threading.Event, start: float,
             total: int) -> None:
        go.wait()
        rec.sent_s = time.perf_counter() - start
        try:
            key = req.routing_key if self.routed else None
            answer, rec.worker = post_json_routed(self.url, "/generate", body, self.timeout_s, routing_headers(key))
            fill_from_response(rec, answer)
        except urllib.error.HTTPError as err:
            rec.error = f"HTTP {err.code}: {err.read().decode(errors='replace')[:300]}"
        except Exception as err:  # a dead server, a timeout: recorded, the run goes on
            rec.error = f"{type(err).__name__}: {err}"[:300]
        rec.done_s = time.perf_counter() - start
        self._completions.finish(rec, total)


def first_token_agreement(arm: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """Share of requests (completed in both runs) whose first output token equals the baseline's."""
    base = {r["rid"]: r["output_ids"][0] for r in baseline if not r.get("error") and r.get("output_ids")}
    pairs = [(r["output_ids"][0], base[r["rid"]]) for r in arm
             if not r.get("error") and r.get("output_ids") and r["rid"] in base]
    if not pairs:
        return None
    return sum(a == b for a, b in pairs) / len(pairs)
