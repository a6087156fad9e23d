"""The CPU runtime's extend attention (sglang_radixflow.cpu.attention) against SGLang's own padded method.

SGLang's `TorchNativeAttnBackend._run_sdpa_forward_extend` pads each request's query to its whole sequence; ours
computes the new rows only. Both run here on the same random batches (cached prefixes of different lengths, a
request with no prefix, GQA, a sliding window, a scattered req_to_token mapping) and must give the same rows. The
last test checks that a CPU-engine process runs ours inside SGLang's backend.
"""
from __future__ import annotations

from typing import Optional

import pytest
import torch

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang_radixflow.cpu.attention.extend import make_extend, new_rows_mask
from tests.unit.cpu.fresh import failure_text, run_in_cpu_engine

SGLANG_EXTEND = getattr(TorchNativeAttnBackend._run_sdpa_forward_extend, "radixflow_original",
                        TorchNativeAttnBackend._run_sdpa_forward_extend)
OURS = make_extend(SGLANG_EXTEND)


def _batch(prefixes: list[int], news: list[int], q_heads: int, kv_heads: int, dim: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    pool = 4 * sum(p + n for p, n in zip(prefixes, news)) + 16
    k_cache = torch.randn(pool, kv_heads, dim, generator=gen)
    v_cache = torch.randn(pool, kv_heads, dim, generator=gen)
    max_len = max(p + n for p, n in zip(prefixes, news))
    req_to_token = torch.zeros(len(prefixes) + 2, max_len, dtype=torch.int64)
    slots = torch.randperm(pool, generator=gen)  # scattered KV slots, as after evictions
    used = 0
    req_pool_indices = torch.tensor([i + 1 for i in range(len(prefixes))])  # not 0..B-1
    for i, (p, n) in enumerate(zip(prefixes, news)):
        req_to_token[i + 1, : p + n] = slots[used: used + p + n]
        used += p + n
    total_new = sum(news)
    query = torch.randn(total_new, q_heads, dim, generator=gen)
    return dict(query=query, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token,
                req_pool_indices=req_pool_indices, seq_lens=torch.tensor([p + n for p, n in zip(prefixes, news)]),
                extend_prefix_lens=torch.tensor(prefixes), extend_seq_lens=torch.tensor(news))


def _run(fn, b: dict, enable_gqa: bool, sliding_window: Optional[int]) -> torch.Tensor:
    backend = object.__new__(TorchNativeAttnBackend)  # the method reads no instance state
    out = torch.full_like(b["query"], float("nan"))
    return fn(backend, b["query"], out, b["k_cache"], b["v_cache"], b["req_to_token"], b["req_pool_indices"],
              b["seq_lens"], b["extend_prefix_lens"], b["extend_seq_lens"], None, scaling=0.3,
              enable_gqa=enable_gqa, causal=True, is_cross_attn=False, sliding_window_size=sliding_window)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("sliding_window", [None, 7])
def test_new_rows_equal_sglangs_padded_rows(seed: int, gqa: bool, sliding_window: Optional[int]) -> None:
    prefixes, news = [0, 37, 5, 120], [9, 1, 64, 23]
    b = _batch(prefixes, news, q_heads=4, kv_heads=2 if gqa else 4, dim=16, seed=seed)
    expected = _run(SGLANG_EXTEND, b, gqa, sliding_window)
    actual = _run(OURS, b, gqa, sliding_window)
    assert not torch.isnan(actual).any()  # every new row written
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_mask_offsets_the_diagonal_by_the_prefix() -> None:
    m = new_rows_mask(prefix=3, new=2, sliding_window=None, device=torch.device("cpu"))
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    w = new_rows_mask(prefix=3, new=2, sliding_window=1, device=torch.device("cpu"))
    assert w.tolist() == [[False, False, True, True, False], [False, False, False, True, True]]


def test_a_wrong_prefix_mask_would_be_caught() -> None:
    """The comparison above is sharp: top-left causal alignment (SDPA's is_causal with fewer queries than keys)
    gives different rows once a prefix is cached."""
    b = _batch([20], [5], q_heads=2, kv_heads=2, dim=8, seed=3)
    expected = _run(SGLANG_EXTEND, b, False, None)
    q = b["query"].movedim(0, 1).unsqueeze(0)
    keys = b["k_cache"][b["req_to_token"][1, :25]].movedim(0, 1).unsqueeze(0)
    vals = b["v_cache"][b["req_to_token"][1, :25]].movedim(0, 1).unsqueeze(0)
    wrong = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, is_causal=True, scale=0.3)
    assert not torch.allclose(wrong.squeeze(0).movedim(1, 0), expected, atol=1e-3)


def test_cpu_engine_process_runs_the_new_rows_extend() -> None:
    code = (
        "import sglang.srt.layers.attention.torch_native_backend as m\n"
        "from sglang_radixflow.cpu import boot\n"
        "fn = m.TorchNativeAttnBackend._run_sdpa_forward_extend\n"
        "assert boot.status()['standin_active'], boot.status()\n"
        "assert fn.__module__ == 'sglang_radixflow.cpu.attention.extend', fn.__module__\n"
        "assert fn.radixflow_original.__module__ == m.__name__\n"
        "assert any('patch_torch_native' in p for p in boot.status()['patched'])\n"
        "print('BOUND')\n"
    )
    proc = run_in_cpu_engine(code)
    assert proc.returncode == 0 and "BOUND" in proc.stdout, failure_text(proc)
