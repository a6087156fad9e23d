"""Extend attention for the new tokens only: the rows SGLang's padded `_run_sdpa_forward_extend` keeps, computed
without the prefix rows it throws away.

Query row i of a request (absolute position p + i, p = its cached prefix) attends keys j <= p + i (and, with a
sliding window w, j >= p + i - w): exactly the mask SGLang's padded call applies to that row. Cross-attention and
encoder-decoder batches (encoder_lens set) and non-causal layers keep SGLang's own method.
"""
from __future__ import annotations

import inspect
import types
from typing import Callable, Optional

import torch
from torch.nn.functional import scaled_dot_product_attention

TORCH_NATIVE_MODULE = "sglang.srt.layers.attention.torch_native_backend"

# The keyword arguments SGLang's method takes (checked at patch time: an upgrade that changes them fails loudly).
_SIGNATURE = (
    "self", "query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
    "extend_prefix_lens", "extend_seq_lens", "encoder_lens", "scaling", "enable_gqa", "causal", "is_cross_attn",
    "sliding_window_size",
)


def new_rows_mask(prefix: int, new: int, sliding_window: Optional[int], device: torch.device) -> torch.Tensor:
    """(new, prefix + new) boolean mask: True where query row i (position prefix + i) may attend key j."""
    q_pos = torch.arange(prefix, prefix + new, device=device).unsqueeze(1)
    k_pos = torch.arange(prefix + new, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if sliding_window is not None and sliding_window > -1:
        mask &= k_pos >= q_pos - sliding_window
    return mask


def make_extend(original: Callable) -> Callable:
    def _run_sdpa_forward_extend(
        self,  # noqa: ANN001
        query: torch.Tensor,
        output: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        extend_prefix_lens: torch.Tensor,
        extend_seq_lens: torch.Tensor,
        encoder_lens: Optional[torch.Tensor] = None,
        scaling: Optional[float] = None,
        enable_gqa: bool = False,
        causal: bool = False,
        is_cross_attn: bool = False,
        sliding_window_size: Optional[int] = None,
    ) -> torch.Tensor:
        if encoder_lens is not None or is_cross_attn or not causal:
            return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                            extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling, enable_gqa=enable_gqa,
                            causal=causal, is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
        assert seq_lens.shape[0] == extend_prefix_lens.shape[0] == extend_seq_lens.shape[0]
        heads_first = query.movedim(0, query.dim() - 2)  # [heads, tokens, head_dim]
        windowed = sliding_window_size is not None and sliding_window_size > -1
        start_q = 0
        # one host sync for the lengths instead of three per request
        for idx, (seq_len, prefix, new) in enumerate(zip(seq_lens.tolist(), extend_prefix_lens.tolist(),
                                                         extend_seq_lens.tolist())):
            assert prefix + new == seq_len, (prefix, new, seq_len)
            end_q = start_q + new
            q = heads_first[:, start_q:end_q, :]
            tokens = req_to_token[req_pool_indices[idx], :seq_len]
            k = k_cache[tokens].movedim(0, query.dim() - 2)
            v = v_cache[tokens].movedim(0, query.dim() - 2)
            if not (q.dtype == k.dtype == v.dtype):
                k, v = k.to(q.dtype), v.to(q.dtype)
            if prefix == 0 and not windowed:
                mask, is_causal = None, True  # square causal: SDPA's own (top-left aligned) mask is the right one
            else:
                mask, is_causal = new_rows_mask(prefix, new, sliding_window_size, q.device), False
            out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask,
                                               enable_gqa=enable_gqa, scale=scaling, is_causal=is_causal)
            output[start_q:end_q, :, :] = out.squeeze(0).movedim(query.dim() - 2, 0)
            start_q = end_q
        return output

    _run_sdpa_forward_extend.radixflow_original = original  # type: ignore[attr-defined]
    return _run_sdpa_forward_extend


def patch_torch_native(module: types.ModuleType) -> None:
    backend = module.TorchNativeAttnBackend
    original = backend._run_sdpa_forward_extend
    params = tuple(inspect.signature(original).parameters)
    assert params == _SIGNATURE, (
        f"{TORCH_NATIVE_MODULE}.TorchNativeAttnBackend._run_sdpa_forward_extend takes {params}; the CPU runtime's "
        f"extend (sglang_radixflow/cpu/attention/extend.py) was written for {_SIGNATURE}")
    # forward_extend is the only caller, and passes the prefix / extend lengths this patch relies on
    assert "extend_prefix_lens" in backend.forward_extend.__code__.co_names, backend.forward_extend.__code__.co_names
    backend._run_sdpa_forward_extend = make_extend(original)
