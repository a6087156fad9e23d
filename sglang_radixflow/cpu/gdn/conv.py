"""Torch versions of the causal conv1d kernels (`sgl_kernel.mamba.causal_conv1d_fn_cpu` / `causal_conv1d_update_cpu`)
that SGLang 0.5.23's gated-delta-net backend calls on its CPU path. Conventions as in `ops.py`: conv state pool
[slots, dim, width - 1], newest column last; a state index < 0 (pad slot) starts from zeros and writes nothing back.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from sglang_radixflow.cpu.gdn.ops import PAD_SLOT_ID, as_index_list, as_index_tensor


def _silu_flag(activation: object) -> bool:
    if activation is None or activation is False:
        return False
    if activation is True or activation in ("silu", "swish"):
        return True
    raise ValueError(f"unsupported causal conv1d activation {activation!r}")


def causal_conv1d_fn_cpu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: object = "silu",
    conv_states: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    cache_indices: Optional[torch.Tensor] = None,
    query_start_loc: Optional[torch.Tensor] = None,
    seq_lens_cpu: Optional[Sequence[int]] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    block_table: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Varlen causal depthwise conv (prefill). x [dim, T] (sequences concatenated), weight [dim, width],
    conv_states [slots, dim, width - 1]. Sequence i starts from conv_states[cache_indices[i]] when
    has_initial_state[i], else from zeros; afterwards that slot holds the last width - 1 inputs (initial columns
    included when the sequence is shorter). A pad slot (cache index == pad_slot_id) reads zeros and writes nothing.
    Returns [dim, T] in x's dtype. `block_table` is a CUDA launch hint and is ignored."""
    del block_table
    silu = _silu_flag(activation)
    dim, total = x.shape
    width = weight.shape[-1]
    hist = width - 1
    assert weight.shape == (dim, width), (weight.shape, dim)
    if query_start_loc is None:
        cu = [0, total]
    else:
        cu = [int(i) for i in query_start_loc.tolist()]
    n_seq = len(cu) - 1
    assert cu[-1] == total, (cu[-1], total)
    if seq_lens_cpu is not None:
        assert [int(s) for s in seq_lens_cpu] == [cu[i + 1] - cu[i] for i in range(n_seq)], (seq_lens_cpu, cu)
    slots = as_index_list(cache_indices) if cache_indices is not None else list(range(n_seq))
    assert len(slots) == n_seq, (len(slots), n_seq)
    init = [False] * n_seq if has_initial_state is None else [bool(h) for h in has_initial_state.tolist()]
    if conv_states is not None:
        assert conv_states.shape[-2:] == (dim, hist), (conv_states.shape, dim, hist)

    # Lay every sequence out as [its width-1 initial columns | its tokens] so one depthwise conv covers the batch.
    init_cols = x.new_zeros((n_seq, dim, hist))
    if conv_states is not None:
        for i in range(n_seq):
            if init[i] and slots[i] != pad_slot_id:
                init_cols[i] = conv_states[slots[i]].to(x.dtype)
    ext = x.new_empty((dim, total + n_seq * hist))
    tok_pos = torch.cat(
        [torch.arange(cu[i], cu[i + 1], dtype=torch.long) + (i + 1) * hist for i in range(n_seq)]
        or [torch.empty(0, dtype=torch.long)]
    )
    init_pos = torch.cat(
        [torch.arange(hist, dtype=torch.long) + cu[i] + i * hist for i in range(n_seq)]
        or [torch.empty(0, dtype=torch.long)]
    )
    ext[:, tok_pos] = x
    ext[:, init_pos] = init_cols.permute(1, 0, 2).reshape(dim, n_seq * hist)
    w = weight.float().unsqueeze(1)
    y = F.conv1d(ext.float().unsqueeze(0), w, None if bias is None else bias.float(), groups=dim)[0]
    # y column p covers ext[:, p : p + width], i.e. the token at ext column p + width - 1
    out = y[:, tok_pos - hist]
    if silu:
        out = F.silu(out)
    if conv_states is not None:
        for i in range(n_seq):
            if slots[i] == pad_slot_id:
                continue
            end = cu[i + 1] + (i + 1) * hist  # one past this sequence's last column in ext
            conv_states[slots[i]] = ext[:, end - hist : end].to(conv_states.dtype)
    return out.to(x.dtype)


def causal_conv1d_update_cpu(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: object = None,
    conv_state_indices: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    **unsupported: object,
) -> torch.Tensor:
    """Decode step of the causal conv. x [B, dim] or [B, dim, L]; conv_state [slots, dim, width - 1] is shifted by
    L columns in place. Pad rows (index == pad_slot_id) use a zero state and write nothing. Returns x's shape/dtype."""
    used = sorted(k for k, val in unsupported.items() if val is not None)
    if used:
        raise NotImplementedError(f"causal_conv1d_update_cpu: {used} (speculative verify) not supported on CPU")
    assert cache_seqlens is None, "circular conv state (cache_seqlens) is not used by SGLang's CPU path"
    silu = _silu_flag(activation)
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    batch, dim, seqlen = x3.shape
    width = weight.shape[-1]
    hist = width - 1
    assert weight.shape == (dim, width), (weight.shape, dim)
    assert conv_state.shape[-2:] == (dim, hist), (
        f"conv state {tuple(conv_state.shape)} must be [slots, {dim}, {hist}] (state_len == width - 1)"
    )
    idx = (
        torch.arange(batch, dtype=torch.long) if conv_state_indices is None else as_index_tensor(conv_state_indices)
    )
    assert idx.numel() == batch, (idx.numel(), batch)
    valid = idx != pad_slot_id
    all_valid = bool(valid.all())
    if all_valid:
        state = conv_state.index_select(0, idx)
    else:
        state = torch.zeros((batch, dim, hist), dtype=conv_state.dtype)
        state[valid] = conv_state[idx[valid]]
    full = torch.cat([state.to(x3.dtype), x3], dim=-1)  # [B, dim, hist + L]
    w = weight.float().unsqueeze(1)
    y = F.conv1d(full.float(), w, None if bias is None else bias.float(), groups=dim)  # [B, dim, L]
    if silu:
        y = F.silu(y)
    new_state = full[..., -hist:].to(conv_state.dtype)
    if all_valid:
        conv_state.index_copy_(0, idx, new_state)
    elif bool(valid.any()):
        conv_state[idx[valid]] = new_state[valid]
    y = y.to(x.dtype)
    return y.squeeze(-1) if squeeze else y
