"""Real SGLang 0.5.23 servers (CPU) with and without the radixflow backend, on the tiny architectures; the
gated-delta-net hybrids in both mamba radix-cache strategies (extra_buffer with the overlap scheduler on, as on a GPU).

Parity is checked in float32: bf16 reductions are ordered differently in HF and SGLang and flip near-ties of the
near-uniform random-init models, which says nothing about correctness. Tolerances are tight (see sglang-cpu notes:
a wrong state or wrong KV moves logprobs by ~1e-3 on these models), and each test shows that its tolerance
separates the right context from a wrong one.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

import pytest
import torch

from sglang_radixflow.bench.server import SGLangServer
from sglang_radixflow.models import HYBRID_ARCHS

# (arch, the hybrid's --mamba-radix-cache-strategy); the control has no mamba state
CASES = (
    ("nemotron_h", "no_buffer"), ("qwen3", "no_buffer"),
    ("qwen3_next", "no_buffer"), ("qwen3_next", "extra_buffer"),
    ("qwen3_5", "no_buffer"), ("qwen3_5", "extra_buffer"),
)
FLOAT32 = ("--dtype", "float32")
# SGLang keeps the Mamba conv state in bf16 by default even under --dtype float32: that alone moves logprobs by
# ~7e-4 right after a cache or chunk boundary. Parity servers keep it in float32 too.
FLOAT32_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
NEW_TOKENS = 12
EXTRA_BUFFER_GRID = 64  # SGLang's mamba cache chunk size on the tiny hybrids (their SSD / GDN chunk size)
LOGPROB_TOL = 2e-4  # float32 HF vs SGLang; a wrong context moves these by far more (asserted below)
REGISTERED_LINE = "Tree cache initialized: source=registered('radixflow')"


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 2000) for _ in range(n)] for n in (7, 90, 333)]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(case))
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param


@pytest.fixture(scope="module")
def arch(case: tuple[str, str]) -> str:
    return case[0]


@pytest.fixture(scope="module")
def servers(case: tuple[str, str], model_dirs: dict[str, Path]) -> Iterator[dict[str, SGLangServer]]:
    """A native and a radixflow server for the case; the flag is spelled both ways across architectures."""
    arch, strategy = case
    flag = ["--radix-cache", "radixflow"] if arch == "qwen3" else ["--radix-cache-backend", "radixflow"]
    model = str(model_dirs[arch])
    native = SGLangServer(model, radix_cache=None, extra_args=FLOAT32, env=FLOAT32_ENV, mamba_strategy=strategy)
    ours = SGLangServer(model, radix_cache=None, extra_args=[*FLOAT32, *flag], env=FLOAT32_ENV,
                        mamba_strategy=strategy)
    with native, ours:
        if arch in HYBRID_ARCHS:
            assert f"'mamba_radix_cache_strategy': '{strategy}'" in ours.log_text()
        yield {"native": native, "radixflow": ours}


@pytest.fixture(scope="module")
def hf_model(arch: str, model_dirs: dict[str, Path]):  # noqa: ANN201
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dirs[arch]), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # compare fixed-length continuations (SGLang: ignore_eos)
    return model


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:  # noqa: ANN001
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _hf_next_logprobs(model, ids: list[int]) -> torch.Tensor:  # noqa: ANN001
    """log p(ids[i+1] | ids[:i+1]) for i < len-1."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)


def test_backend_is_registered_and_logged(servers: dict[str, SGLangServer]) -> None:
    assert REGISTERED_LINE in servers["radixflow"].log_text()
    assert REGISTERED_LINE not in servers["native"].log_text()


def test_greedy_and_prompt_logprobs_match_hf(servers: dict[str, SGLangServer], hf_model) -> None:  # noqa: ANN001
    for prompt in _prompts(1):
        expected = _hf_greedy(hf_model, prompt, NEW_TOKENS)
        hf_lp = _hf_next_logprobs(hf_model, prompt)
        for name, server in servers.items():
            out = server.generate(prompt, NEW_TOKENS, return_logprob=True, logprob_start_len=0)
            assert out["output_ids"] == expected, (name, len(prompt))
            ours = torch.tensor([lp for lp, _tok, *_ in out["meta_info"]["input_token_logprobs"][1:]])
            assert ours.shape == hf_lp.shape
            diff = (ours - hf_lp).abs().max().item()
            assert diff < LOGPROB_TOL, (name, len(prompt), diff)


def test_multi_turn_continuation_hits_and_equals_native_and_hf(
    case: tuple[str, str], servers: dict[str, SGLangServer], hf_model  # noqa: ANN001
) -> None:
    """Turn 2 = turn-1 prompt + its output + new tokens: it must reuse the cache (also on the hybrids), and the
    reused KV / state must give the same continuation as a full recomputation (HF) and as native SGLang.
    extra_buffer keeps turn 1's state on its snapshot grid inside the extend (the last multiple of the chunk size),
    no_buffer where the prompt ends."""
    arch, strategy = case
    rng = random.Random(2)
    turn1 = [rng.randrange(3, 2000) for _ in range(200)]
    user_turn = [rng.randrange(3, 2000) for _ in range(30)]
    reused_at_least = len(turn1)
    if arch in HYBRID_ARCHS and strategy == "extra_buffer":
        reused_at_least = len(turn1) // EXTRA_BUFFER_GRID * EXTRA_BUFFER_GRID
    results = {}
    for name, server in servers.items():
        first = server.generate(turn1, NEW_TOKENS)
        turn2 = turn1 + first["output_ids"] + user_turn
        second = server.generate(turn2, NEW_TOKENS, return_logprob=True)
        results[name] = (turn2, second)
        assert second["meta_info"]["cached_tokens"] >= reused_at_least, (name, second["meta_info"]["cached_tokens"])
    turn2, ours = results["radixflow"]
    native = results["native"][1]
    assert results["native"][0] == turn2
    assert ours["output_ids"] == native["output_ids"]
    assert ours["meta_info"]["cached_tokens"] == native["meta_info"]["cached_tokens"]

    # Against a full recomputation: the first generated token's logprob, read off the cached prefix.
    expected = _hf_greedy(hf_model, turn2, NEW_TOKENS)
    assert ours["output_ids"] == expected
    lp_ours = ours["meta_info"]["output_token_logprobs"][0][0]
    lp_hf = torch.log_softmax(hf_model(torch.tensor([turn2])).logits[0, -1].float(), -1)[expected[0]].item()
    assert abs(lp_ours - lp_hf) < LOGPROB_TOL
    # Sensitivity: a wrong context (one early token changed) moves the same logprob by more than the tolerance.
    wrong = list(turn2)
    wrong[5] = (wrong[5] + 7) % 2000 + 3
    with torch.no_grad():
        lp_wrong = torch.log_softmax(hf_model(torch.tensor([wrong])).logits[0, -1].float(), -1)[expected[0]].item()
    assert abs(lp_wrong - lp_hf) > LOGPROB_TOL, "tolerance cannot tell a wrong context from the right one"


def test_concurrent_batch_equals_sequential(servers: dict[str, SGLangServer]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server = servers["radixflow"]
    prompts = _prompts(3) + _prompts(4)
    sequential = [server.generate(p, 6)["output_ids"] for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        concurrent = list(pool.map(lambda p: server.generate(p, 6)["output_ids"], prompts))
    assert concurrent == sequential


def test_hybrid_reports_hybrid(arch: str, servers: dict[str, SGLangServer]) -> None:
    line = next(l for l in servers["radixflow"].log_text().splitlines() if REGISTERED_LINE in l)
    assert f"hybrid_ssm={arch in HYBRID_ARCHS}" in line
    ours = next(l for l in servers["radixflow"].log_text().splitlines() if "sglang-radixflow: cache ready" in l)
    # The effective configuration of `--radix-cache radixflow` alone: the radixflow arm's defaults.
    assert "(arm=radixflow, traversal=skip, admission=flex, producer_rows=2," in ours


def test_parallel_sampling_copies_reuse_the_prompt_and_equal_native(
    case: tuple[str, str], servers: dict[str, SGLangServer]
) -> None:
    """`n` > 1 (parallel sampling): SGLang first sends the prompt alone with max_new_tokens = 0, then the n copies.
    On a no_buffer hybrid that warm-up's only state natively sits at the prompt's end, past the copies' match cap
    (input length − 1), so natively every copy recomputes the prompt. Under radixflow the copies start from a state
    at most one token short of that cap (the warm-up's cache-only publication leaves it; were it missing, one copy
    would produce it for the others), on every architecture, with the same greedy outputs. On extra_buffer the
    warm-up snapshots its state on the grid inside its extend, natively too: the copies start there."""
    arch, strategy = case
    prompt = _prompts(5)[2]
    results = {name: server.generate(prompt, 4, sampling={"n": 4}) for name, server in servers.items()}
    native, ours = results["native"], results["radixflow"]
    assert len(ours) == len(native) == 4
    assert [o["output_ids"] for o in ours] == [o["output_ids"] for o in native]
    cached = [o["meta_info"]["cached_tokens"] for o in ours]
    if arch in HYBRID_ARCHS and strategy == "extra_buffer":
        assert min(cached) >= (len(prompt) - 1) // EXTRA_BUFFER_GRID * EXTRA_BUFFER_GRID, cached
        return
    assert min(cached) >= len(prompt) - 2, cached
    if arch in HYBRID_ARCHS:
        assert max(o["meta_info"]["cached_tokens"] for o in native) < min(cached), "the hybrid reuses natively now"


def test_chat_completions_answer_and_equal_native(servers: dict[str, SGLangServer]) -> None:
    """The tiny models carry a chat template: SGLang's OpenAI chat endpoint (what agent frameworks call) answers, and
    a second turn that extends the first conversation reuses it and reads as native's."""
    conversation = [{"role": "system", "content": "You are a terse assistant."},
                    {"role": "user", "content": "Summarise the river report in one line."}]
    replies = {}
    for name, server in servers.items():
        turns = []
        for messages in (conversation, conversation + [{"role": "assistant", "content": "The river rose."},
                                                        {"role": "user", "content": "And the bridge?"}]):
            body = server.post("/v1/chat/completions", {"model": "default", "messages": messages, "max_tokens": 6,
                                                        "temperature": 0, "ignore_eos": True})
            assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 6, body
            turns.append((body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]))
        replies[name] = turns
    assert replies["radixflow"] == replies["native"]
