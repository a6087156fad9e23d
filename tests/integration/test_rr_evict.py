"""RR-Evict on real SGLang servers (CPU): the start-up check, and a soak of agent turns with aborts under heavy
eviction that ends with SGLang's idle memory check (strict by default: a leaked KV or mamba slot kills the scheduler)
and its tree sanity check (SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK) passing."""
from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from sglang_radixflow.bench.agent import stream_generate
from sglang_radixflow.bench.server import SGLangServer, ServerError

LEAK = "memory leak detected"


def test_rr_without_the_radixflow_backend_is_refused_at_startup(model_dirs: dict[str, Path]) -> None:
    server = SGLangServer(str(model_dirs["qwen3"]), radix_cache=None, extra_args=["--radix-eviction-policy", "rr"])
    with pytest.raises(ServerError):
        server.start()
    assert ("--radix-eviction-policy rr (RR-Evict) requires --radix-cache-backend radixflow, got "
            "--radix-cache-backend=None") in server.log_text()


def test_a_bad_rr_policy_config_stops_the_server_at_startup(model_dirs: dict[str, Path]) -> None:
    server = SGLangServer(str(model_dirs["qwen3"]), extra_args=[
        "--radix-eviction-policy", "rr", "--radix-eviction-policy-config", '{"nonsense": 1}'])
    with pytest.raises(ServerError):
        server.start()
    assert ("--radix-eviction-policy-config: unknown key(s) 'nonsense' for --radix-eviction-policy rr; allowed keys: "
            "block: ") in server.log_text()


def _soak(server: SGLangServer, agents: int, turns: int, seed: int) -> tuple[int, int, int]:
    """Agents take turns concurrently (4 at a time); every 7th turn is aborted mid-flight. Returns
    (finished turns, aborted turns, turns that found part of their own history cached)."""
    rng = random.Random(seed)
    system = [rng.randrange(3, 2000) for _ in range(64)]
    history = {a: system + [rng.randrange(3, 2000) for _ in range(rng.randint(60, 120))] for a in range(agents)}
    plan = [(a, t) for t in range(turns) for a in rng.sample(range(agents), agents)]
    counts = {"done": 0, "aborted": 0, "hits": 0}
    lock = threading.Lock()
    busy = {a: threading.Lock() for a in range(agents)}
    cursor = [0]

    def worker() -> None:
        while True:
            with lock:
                if cursor[0] >= len(plan):
                    return
                i = cursor[0]
                a, t = plan[i]
                cursor[0] += 1
            with busy[a]:
                prompt = history[a] + [rng.randrange(3, 2000) for _ in range(12)]
                rid = f"soak-{a}-{t}-{i}"
                if i % 7 == 3:
                    timer = threading.Timer(0.05, lambda: server.post("/abort_request", {"rid": rid}))
                    timer.start()
                try:
                    _, _, last = stream_generate(server.url, prompt, 6, f"agent-{a}", rid, 120)
                except Exception:  # an aborted stream may end without a chunk or with an HTTP error
                    last = {}
                meta = last.get("meta_info") or {}
                finished = (meta.get("finish_reason") or {}).get("type") == "length"
                with lock:
                    if finished:
                        counts["done"] += 1
                        counts["hits"] += int(meta.get("cached_tokens", 0)) > len(system)
                        history[a] = prompt + [int(x) for x in last.get("output_ids") or []]
                    else:
                        counts["aborted"] += 1
                    if len(history[a]) > 700:  # keep prompts short: the soak is about churn, not length
                        history[a] = history[a][:200]

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not any(th.is_alive() for th in threads), "soak did not finish"
    return counts["done"], counts["aborted"], counts["hits"]


@pytest.mark.parametrize("arch, strategy", [
    ("nemotron_h", "no_buffer"),
    ("nemotron_h", "extra_buffer"),  # SGLang's GPU default: states tracked inside extends, overlap scheduler on
    ("qwen3", None),
])
def test_soak_with_aborts_under_heavy_eviction_ends_with_the_idle_checks_passing(
    model_dirs: dict[str, Path], arch: str, strategy: str | None
) -> None:
    # 12 agents of ~200-700 tokens against 2500 KV tokens: every few turns the pool is full and RR-Evict cuts tails.
    server = SGLangServer(
        str(model_dirs[arch]), mamba_strategy=strategy or "no_buffer",
        extra_args=["--radix-eviction-policy", "rr", "--radix-eviction-policy-config", '{"block": 8}',
                    "--max-total-tokens", "2500", "--max-running-requests", "4"],
        env={"SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK": "1", "RADIXFLOW_RR_BLOCK": "64"},  # the flag wins
    )
    with server:
        done, aborted, hits = _soak(server, agents=12, turns=17, seed=1 if arch == "qwen3" else 2)
        assert done + aborted == 12 * 17 and done > 150 and aborted > 0
        assert hits > done // 3  # idle agents kept reusable prefixes of their own history
        time.sleep(2.0)  # idle: SGLang's memory check and tree sanity check run
        assert server.generate([7, 8, 9], 2)["output_ids"]
        log = server.log_text()
        assert "impl=RadixFlowRRCache" in log
        assert "RR-Evict: block=8 tokens, order=share" in log
        assert LEAK not in log and "Traceback" not in log
