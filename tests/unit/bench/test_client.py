"""Open-loop client against a stub HTTP server (no SGLang): records, sibling release, errors, agreement."""
from __future__ import annotations

import json
import time
from typing import Iterator

import pytest

from sglang_radixflow.bench import client
from sglang_radixflow.bench.client import OpenLoopClient, first_token_agreement
from sglang_radixflow.bench.workloads import WorkloadParams, make_workload
from tests.unit.bench.http_stub import JsonHandler, serve


class _Stub(JsonHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.read_json()
        if body["rid"].endswith("b3") and body["rid"].startswith("q00001"):
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        assert body["sampling_params"]["max_new_tokens"] == 1
        self.reply_json({"output_ids": [len(body["input_ids"]) % 7],
                         "meta_info": {"cached_tokens": 5, "radixflow_token_hit": [9], "radixflow_state_hit": [4]}})


@pytest.fixture()
def stub_url() -> Iterator[str]:
    with serve(_Stub) as url:
        yield url


def test_open_loop_records_and_sibling_release(stub_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Log, in order, when each body is encoded and when each request is posted. Encoding is slowed (GIL released) so
    # that a client sending each sibling as soon as its own body is ready would post before the next one is encoded.
    events: list[tuple[str, str]] = []
    real_body, real_post = client.generate_body, client.post_json_routed

    def slow_body(input_ids, rid, routing_key=None):  # type: ignore[no-untyped-def]
        time.sleep(0.005)
        events.append(("encode", rid))
        return real_body(input_ids, rid, routing_key)

    def logged_post(url, path, body, timeout_s, headers=None):  # type: ignore[no-untyped-def]
        events.append(("send", json.loads(body)["rid"]))
        return real_post(url, path, body, timeout_s, headers)

    monkeypatch.setattr(client, "generate_body", slow_body)
    monkeypatch.setattr(client, "post_json_routed", logged_post)
    w = make_workload(WorkloadParams(questions=3, rate=20.0, seed=0))
    done: list[int] = []
    records = OpenLoopClient(stub_url, timeout_s=10, on_done=lambda r, n, total: done.append(n)).run(w.requests())
    assert [r.rid for r in records] == [r.rid for r in w.requests()]
    assert sorted(done) == list(range(1, 13))
    bad = [r for r in records if r.error]
    assert [r.rid for r in bad] == ["q00001-b3"] and bad[0].latency_s is None and bad[0].error.startswith("HTTP 500")
    good = [r for r in records if not r.error]
    assert all(r.cached_tokens == 5 and r.token_hit == 9 and r.state_hit == 4 and len(r.output_ids) == 1 for r in good)
    assert all(r.latency_s is not None and r.latency_s >= 0 for r in good)
    # open loop: each send at (or just after) its arrival instant
    for r in records:
        assert r.sent_s >= r.arrival_s - 1e-3
    # siblings go out together: one event releases them once all their bodies are encoded (an order, not a clock)
    for q in range(3):
        rids = {r.rid for r in records if r.qid == q}
        mine = [kind for kind, rid in events if rid in rids]
        assert mine == ["encode"] * len(rids) + ["send"] * len(rids)


def test_first_token_agreement() -> None:
    base = [{"rid": "a", "output_ids": [1]}, {"rid": "b", "output_ids": [2]}, {"rid": "c", "output_ids": [3]}]
    arm = [{"rid": "a", "output_ids": [1]}, {"rid": "b", "output_ids": [5]}, {"rid": "c", "error": "x", "output_ids": []}]
    assert first_token_agreement(arm, base) == 0.5
    assert first_token_agreement([], base) is None
