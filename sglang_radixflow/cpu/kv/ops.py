"""Torch versions of sgl_kernel's CPU KV-pool ops (same signatures as the C++ ops SGLang calls)."""
from __future__ import annotations

import ctypes

import numpy as np
import torch


def _byte_rows(data_ptr: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    """A (num_rows, row_bytes) uint8 view over memory SGLang owns (it passes raw buffer addresses)."""
    raw = (ctypes.c_uint8 * (row_bytes * num_rows)).from_address(data_ptr)
    return torch.from_numpy(np.ctypeslib.as_array(raw)).view(num_rows, row_bytes)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer b: row tgt_loc[i] := row src_loc[i] (rows of strides[b] bytes). Safe when ranges overlap."""
    if src_loc.numel() == 0:
        return
    src = src_loc.to(torch.int64)
    tgt = tgt_loc.to(torch.int64)
    rows = int(torch.maximum(src.max(), tgt.max()).item()) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        view = _byte_rows(int(ptr), int(stride), rows)
        view[tgt] = view[src]  # advanced indexing reads a copy first


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the i-th consecutive slice of out_cache_loc."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n
