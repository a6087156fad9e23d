"""Bad requests to a running radixflow server: each is answered with an error, nothing around it is lost.

One server for the module (NemotronH, no_buffer). SGLang 0.5.23 checks `token_ids_logprob` against the vocabulary but
not `input_ids`: one out-of-vocabulary id ends a native server (an IndexError in the embedding). radixflow servers
refuse such a request with a 400 (sglang_radixflow/guard.py).
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Iterator

import pytest

from sglang_radixflow.bench.server import SGLangServer, ServerError

LEAK = "memory leak detected"
VOCAB = 2048  # the tiny models' vocabulary (sglang_radixflow.models.VOCAB_SIZE)


@pytest.fixture(scope="module")
def server(model_dirs: dict[str, Path]) -> Iterator[SGLangServer]:
    with SGLangServer(str(model_dirs["nemotron_h"])) as started:
        yield started


def _refused(server: SGLangServer, path: str, payload: dict) -> str:
    """The error text of a request the server must answer with HTTP 400."""
    with pytest.raises(ServerError) as err:
        server.post(path, payload)
    assert "HTTP 400" in str(err.value), err.value
    return str(err.value)


def _still_serves(server: SGLangServer) -> None:
    rng = random.Random(3)
    prompt = [rng.randrange(3, VOCAB) for _ in range(50)]
    assert len(server.generate(prompt, 3)["output_ids"]) == 3
    time.sleep(1.5)  # idle: SGLang's memory check runs
    assert LEAK not in server.log_text() and "Scheduler hit an exception" not in server.log_text()


def test_an_id_outside_the_vocabulary_is_refused_naming_it_and_the_server_keeps_serving(server: SGLangServer) -> None:
    text = _refused(server, "/generate", {"input_ids": [5, 2148, 7], "sampling_params": {"max_new_tokens": 2}})
    assert "input_ids[1] = 2148 is outside the vocabulary; valid range is [0, 2048)" in text
    text = _refused(server, "/generate", {"input_ids": [[5, 6, 7], [8, -3]], "sampling_params": {"max_new_tokens": 2}})
    assert "input_ids[1] = -3 is outside the vocabulary" in text
    text = _refused(server, "/v1/score", {"query": [5, 6, 7], "items": [[8, 9], [10, 4096]],
                                          "label_token_ids": [5, 6]})
    assert "= 4096 is outside the vocabulary" in text
    sid = server.post("/open_session", {"capacity_of_str_len": 1000})
    first = server.post("/generate", {"input_ids": [5, 6, 7], "session_params": {"id": sid},
                                      "sampling_params": {"max_new_tokens": 1}})
    text = _refused(server, "/generate", {"input_ids": [9, VOCAB], "sampling_params": {"max_new_tokens": 1},
                                          "session_params": {"id": sid, "rid": first["meta_info"]["id"]}})
    assert "= 2048 is outside the vocabulary" in text
    server.post("/close_session", {"session_id": sid})
    _still_serves(server)


def test_a_rid_in_the_prefix_request_namespace_is_refused(server: SGLangServer) -> None:
    text = _refused(server, "/generate", {"input_ids": [5, 6, 7], "rid": "radixflow-prefix-64#someone",
                                          "sampling_params": {"max_new_tokens": 1}})
    assert "is reserved" in text
    _refused(server, "/generate", {"input_ids": [5, 6, 7], "rid": "radix", "sampling_params": {"max_new_tokens": 1}})
    _still_serves(server)


@pytest.mark.parametrize("name, payload, message", [
    ("empty input_ids", {"input_ids": []}, "input_ids cannot be empty"),
    ("duplicate rids in one batch", {"input_ids": [[5, 6, 7], [8, 9, 10]], "rid": ["same", "same"]},
     "Duplicate request IDs detected within the request: ['same']"),
    ("cache_salt not a string", {"input_ids": [5, 6, 7], "cache_salt": 5}, "cache_salt"),
    ("cache_salt a mapping", {"input_ids": [5, 6, 7], "cache_salt": {"a": 1}}, "cache_salt"),
    ("cache_salt list with a null", {"input_ids": [[5, 6], [5, 7]], "cache_salt": ["a", None]}, "cache_salt"),
])
def test_malformed_requests_get_sglangs_own_400(server: SGLangServer, name: str, payload: dict, message: str) -> None:
    text = _refused(server, "/generate", {**payload, "sampling_params": {"max_new_tokens": 1}})
    assert message in text, (name, text)
    _still_serves(server)


def test_a_prompt_over_the_context_beside_siblings_waiting_on_its_prefix(server: SGLangServer) -> None:
    """Four siblings of a 600-token document and, at the same time, a 20000-token prompt that starts with the same
    document (over the 16384-token context): the long one is refused with SGLang's 400, the siblings share the
    document as they do without it."""
    import threading

    rng = random.Random(9)
    doc = [rng.randrange(3, VOCAB) for _ in range(600)]
    siblings = [doc + [rng.randrange(3, VOCAB) for _ in range(10)] for _ in range(4)]
    long_prompt = doc + [rng.randrange(3, VOCAB) for _ in range(20000 - len(doc))]
    errors: list[str] = []

    def send_long() -> None:
        try:
            server.post("/generate", {"input_ids": long_prompt, "sampling_params": {"max_new_tokens": 1}})
        except ServerError as err:
            errors.append(str(err))

    longer = threading.Thread(target=send_long)
    longer.start()
    out = server.post("/generate", {"input_ids": siblings, "sampling_params": {"max_new_tokens": 1}})
    longer.join(timeout=120)
    assert len(errors) == 1 and "HTTP 400" in errors[0] and "longer than the model's context length" in errors[0]
    cached = [o["meta_info"]["cached_tokens"] for o in out]
    assert cached.count(600) >= 3 and set(cached) <= {0, 600}, cached  # the producer itself may compute it
    _still_serves(server)


def test_more_parallel_samples_than_running_slots_all_complete(server: SGLangServer) -> None:
    """`n` = 300 copies of one prompt, far more than the server's running-request limit: SGLang queues them; every
    copy completes and the prompt is reused by the copies (the warm-up publishes it). The copies sample (temperature
    1), so one may draw the end-of-sequence token: ignore_eos keeps every copy at its full length."""
    prompt = [random.Random(11).randrange(3, VOCAB) for _ in range(300)]
    out = server.post("/generate", {"input_ids": prompt,
                                    "sampling_params": {"max_new_tokens": 2, "n": 300, "ignore_eos": True}})
    assert len(out) == 300 and all(len(o["output_ids"]) == 2 for o in out)
    assert min(o["meta_info"]["cached_tokens"] for o in out) >= len(prompt) - 2
    _still_serves(server)
