"""Torch causal conv1d for the Mamba-2 mixer on CPU: the varlen prefill and the decode update.

Signatures follow what `sglang/srt/layers/attention/mamba/mamba.py` calls: `causal_conv1d_fn` has the argument order
of `sglang.srt.layers.attention.mamba.causal_conv1d.causal_conv1d_fn` (the name mamba.py binds on CUDA), and
`causal_conv1d_update` the full keyword set of the Triton `causal_conv1d_update` (speculative / EAGLE-tree options
included). Semantics mirror the Triton kernels in `sglang/kernels/ops/mamba/causal_conv1d_triton.py`:
- conv state of a slot = its last `width - 1` inputs, oldest first, in `conv_states[slot, :, :width - 1]`;
- a slot id equal to `pad_slot_id` is skipped (its state is neither read nor written).
All tensors are indexed through torch, so strided state views (page-major / AMX layouts) work unchanged.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1

Activation = Union[str, bool, None]


def _silu_wanted(activation: Activation) -> bool:
    if activation is True or activation in ("silu", "swish"):
        return True
    if activation is None or activation is False:
        return False
    raise NotImplementedError(f"activation must be None, silu or swish, got {activation!r}")


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    query_start_loc: Optional[torch.Tensor] = None,
    cache_indices: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    conv_states: Optional[torch.Tensor] = None,
    activation: Activation = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    seq_lens_cpu: Optional[Sequence[int]] = None,
    block_table: Optional[torch.Tensor] = None,
    validate_data: bool = False,
) -> torch.Tensor:
    """Depthwise causal conv over concatenated sequences; returns a new tensor shaped like `x`.

    x: (dim, total_tokens) with `query_start_loc` (num_seqs + 1), or (batch, dim, seqlen) without it.
    weight: (dim, width). conv_states: (slots, dim, >= width - 1), read where `has_initial_state[i]` and
    overwritten with each sequence's last `width - 1` inputs (history included when the sequence is shorter).
    """
    del validate_data  # shape checks of the Triton wrapper; ours are the asserts below
    if block_table is not None:
        raise NotImplementedError("causal_conv1d_fn: block_table (CUDA-graph prefill launch) is not supported on CPU")
    silu = _silu_wanted(activation)
    batched = x.dim() == 3
    if batched:
        assert query_start_loc is None, "(batch, dim, seqlen) input takes no query_start_loc"
        nb, dim, seqlen = x.shape
        flat = x.permute(1, 0, 2).reshape(dim, nb * seqlen)
        lens = [seqlen] * nb
    else:
        dim = x.shape[0]
        flat = x
        if seq_lens_cpu is not None:
            lens = [int(n) for n in seq_lens_cpu]
        elif query_start_loc is not None:
            lens = query_start_loc.diff().tolist()
        else:
            lens = [x.shape[1]]
    width = weight.shape[1]
    assert weight.shape == (dim, width), (weight.shape, dim)
    hist_len = width - 1
    num_seqs = len(lens)
    total = sum(lens)
    assert flat.shape[1] >= total, (flat.shape, total)
    device = x.device

    slots = _slot_ids(cache_indices, num_seqs, device)
    live = slots != pad_slot_id
    # One token-major stream where every sequence is preceded by its width-1 history rows; the depthwise conv is
    # then width shifted multiply-adds over contiguous rows (SGLang's x is a transposed (T, dim) buffer).
    xt = flat[:, :total].t()  # (total, dim)
    starts = [0] * num_seqs
    for i in range(1, num_seqs):
        starts[i] = starts[i - 1] + lens[i - 1]
    base = [s + hist_len * i for i, s in enumerate(starts)]  # stream row of each sequence's first history row
    stream = torch.empty(total + hist_len * num_seqs, dim, dtype=torch.float32, device=device)
    hist = torch.zeros(num_seqs, hist_len, dim, dtype=torch.float32, device=device)
    if conv_states is not None and has_initial_state is not None:
        take = has_initial_state[:num_seqs].to(torch.bool) & live
        if bool(take.any()):
            rows = take.nonzero(as_tuple=True)[0]
            hist[rows] = conv_states[slots[rows], :, :hist_len].permute(0, 2, 1).to(torch.float32)
    for i, (b0, s0, n) in enumerate(zip(base, starts, lens)):
        stream[b0 : b0 + hist_len] = hist[i]
        stream[b0 + hist_len : b0 + hist_len + n] = xt[s0 : s0 + n]
    wf = weight.to(torch.float32).t()  # (width, dim)
    n_out = stream.shape[0] - hist_len
    y = stream[:n_out] * wf[0]  # y[p] = output for the token at stream row p + hist_len
    for k in range(1, width):
        y.addcmul_(stream[k : k + n_out], wf[k])
    if bias is not None:
        y.add_(bias.to(torch.float32))
    if silu:
        F.silu(y, inplace=True)
    if conv_states is not None and bool(live.any()):
        rows = live.nonzero(as_tuple=True)[0]
        ends = torch.tensor([base[i] + hist_len + lens[i] for i in rows.tolist()], dtype=torch.long, device=device)
        last = ends[:, None] - hist_len + torch.arange(hist_len, device=device)  # the width-1 rows ending each seq
        conv_states[slots[rows], :, :hist_len] = (
            stream[last.reshape(-1)].view(-1, hist_len, dim).permute(0, 2, 1).to(conv_states.dtype)
        )
    out_dtype = torch.float32 if batched else x.dtype
    out_tm = torch.empty(total if batched else x.shape[1], dim, dtype=out_dtype, device=device)
    if out_tm.shape[0] > total:
        out_tm[total:] = 0
    for b0, s0, n in zip(base, starts, lens):
        out_tm[s0 : s0 + n] = y[b0 : b0 + n]
    if batched:
        return out_tm.t().reshape(dim, nb, seqlen).permute(1, 0, 2).to(x.dtype).contiguous()
    # Same memory order as x: token-major x (mamba.py's transposed view) gets a transposed view back.
    return out_tm.t() if x.stride(0) == 1 else out_tm.t().contiguous()


def _slot_ids(indices: Optional[torch.Tensor], n: int, device: torch.device) -> torch.Tensor:
    if indices is None:
        return torch.arange(n, dtype=torch.long, device=device)
    return indices[:n].to(torch.long)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Activation = None,
    cache_seqlens: Optional[torch.Tensor] = None,
    conv_state_indices: Optional[torch.Tensor] = None,
    num_accept_tokens: Optional[torch.Tensor] = None,
    intermediate_conv_window: Optional[torch.Tensor] = None,
    intermediate_state_indices: Optional[torch.Tensor] = None,
    retrieve_next_token: Optional[torch.Tensor] = None,
    retrieve_next_sibling: Optional[torch.Tensor] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    metadata: object = None,
    validate_data: bool = False,
) -> torch.Tensor:
    """Decode / verify step: x (batch, dim) or (batch, dim, seqlen); returns the conv output shaped like x.

    conv_state[conv_state_indices[b]] is rolled by seqlen (by 1 and read from offset num_accept_tokens-1 in
    speculative mode, as the Triton kernel does). intermediate_conv_window[slot, t] receives the window after
    token t. With retrieve_next_token/retrieve_next_sibling (EAGLE tree) each token convolves over its ancestors,
    and the parent of every token is written to retrieve_parent_token.
    """
    del metadata, validate_data
    if cache_seqlens is not None:
        raise NotImplementedError("causal_conv1d_update: circular-buffer cache_seqlens is not supported on CPU")
    silu = _silu_wanted(activation)
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    batch, dim, seqlen = xs.shape
    width = weight.shape[1]
    hist_len = width - 1
    device = x.device
    spec = num_accept_tokens is not None
    state_len = hist_len + (seqlen - 1) if spec else hist_len

    out = torch.zeros(batch, dim, seqlen, dtype=x.dtype, device=device)
    slots = _slot_ids(conv_state_indices, batch, device)
    rows = (slots != pad_slot_id).nonzero(as_tuple=True)[0]
    if rows.numel() == 0:
        return out.squeeze(-1) if squeeze else out
    slot = slots[rows]
    xr = xs[rows].to(torch.float32)  # (k, dim, seqlen)
    offset = (
        num_accept_tokens[rows].to(torch.long) - 1
        if spec
        else torch.zeros(rows.numel(), dtype=torch.long, device=device)
    )
    # Window before this step: conv_state[slot, :, offset + 0 .. offset + width-2].
    window_pos = offset[:, None] + torch.arange(hist_len, device=device)
    window = _gather_positions(conv_state, slot, window_pos).to(torch.float32)  # (k, dim, hist_len)
    w = weight.to(torch.float32)
    b = None if bias is None else bias.to(torch.float32)

    if retrieve_next_token is not None:
        assert retrieve_next_sibling is not None
        y = _tree_conv(
            xr, window, w, b, rows, retrieve_next_token, retrieve_next_sibling, retrieve_parent_token,
            intermediate_conv_window, _intermediate_slots(intermediate_state_indices, conv_state_indices, rows, slot),
        )
    else:
        full = torch.cat([window, xr], dim=-1)  # (k, dim, hist_len + seqlen)
        y = (full.unfold(-1, width, 1) * w[None, :, None, :]).sum(-1)  # (k, dim, seqlen)
        if b is not None:
            y = y + b[None, :, None]
        if intermediate_conv_window is not None:
            islot = _intermediate_slots(intermediate_state_indices, conv_state_indices, rows, slot)
            # Window after consuming token t: full[..., t+1 : t+1+hist_len].
            after = full.unfold(-1, hist_len, 1)[:, :, 1 : seqlen + 1, :]  # (k, dim, seqlen, hist_len)
            intermediate_conv_window[islot, :seqlen, :, :hist_len] = after.permute(0, 2, 1, 3).to(
                intermediate_conv_window.dtype
            )
    if silu:
        y = F.silu(y)
    out[rows] = y.to(x.dtype)

    # Roll the state: new[i] = old[offset + i + shift] while i + seqlen < state_len, else the new inputs.
    shift = 1 if spec else seqlen
    keep = max(state_len - seqlen, 0)
    new_state = torch.empty(rows.numel(), dim, state_len, dtype=torch.float32, device=device)
    if keep:
        keep_pos = offset[:, None] + shift + torch.arange(keep, device=device)
        new_state[:, :, :keep] = _gather_positions(conv_state, slot, keep_pos).to(torch.float32)
    new_state[:, :, keep:] = xr[:, :, seqlen - (state_len - keep) :]
    conv_state[slot, :, :state_len] = new_state.to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


def _gather_positions(conv_state: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """conv_state[slot[k], :, pos[k, j]] -> (k, dim, j)."""
    return conv_state[slot[:, None], :, pos].permute(0, 2, 1)


def _intermediate_slots(
    intermediate_state_indices: Optional[torch.Tensor],
    conv_state_indices: Optional[torch.Tensor],
    rows: torch.Tensor,
    slot: torch.Tensor,
) -> torch.Tensor:
    # The Triton kernel reads intermediate_state_indices in continuous batching, else the batch row.
    if conv_state_indices is None:
        return rows
    assert intermediate_state_indices is not None, "intermediate_conv_window needs intermediate_state_indices"
    return intermediate_state_indices[rows].to(torch.long)


def _tree_parents(next_token: list[int], next_sibling: list[int]) -> list[int]:
    """Parent of each draft token from first-child / next-sibling links (token 0 is the root: parent 0)."""
    parents = [0] * len(next_token)
    for t in range(len(next_token)):
        if next_token[t] != -1:
            parents[next_token[t]] = t
        if next_sibling[t] != -1:
            parents[next_sibling[t]] = parents[t]
    return parents


def _tree_conv(
    xr: torch.Tensor,
    window: torch.Tensor,
    w: torch.Tensor,
    b: Optional[torch.Tensor],
    rows: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    retrieve_parent_token: Optional[torch.Tensor],
    intermediate_conv_window: Optional[torch.Tensor],
    islot: torch.Tensor,
) -> torch.Tensor:
    """EAGLE-tree verify: token t convolves itself, its parent, grand-parent, ... then the pre-step window."""
    k, dim, seqlen = xr.shape
    width = w.shape[1]
    hist_len = width - 1
    y = torch.zeros(k, dim, seqlen, dtype=torch.float32, device=xr.device)
    for i, row in enumerate(rows.tolist()):
        parents = _tree_parents(
            retrieve_next_token[row, :seqlen].tolist(), retrieve_next_sibling[row, :seqlen].tolist()
        )
        if retrieve_parent_token is not None:
            retrieve_parent_token[row, :seqlen] = torch.tensor(parents, dtype=retrieve_parent_token.dtype)
        for t in range(seqlen):
            # Nodes: >= 0 is draft token `node`; -m is window column hist_len - m (the m-th newest history input).
            chain = []  # newest first: the token itself, its parent, ..., then the window, newest first
            node = t
            for _ in range(width):
                chain.append(xr[i, :, node] if node >= 0 else window[i, :, hist_len + node])
                node = parents[node] if node > 0 else node - 1
            acc = sum(chain[j] * w[:, width - 1 - j] for j in range(width))
            y[i, :, t] = acc if b is None else acc + b
            if intermediate_conv_window is not None:
                for j in range(hist_len):
                    intermediate_conv_window[islot[i], t, :, hist_len - 1 - j] = chain[j].to(
                        intermediate_conv_window.dtype
                    )
    return y



def causal_conv1d_fn_triton_order(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_states: Optional[torch.Tensor],
    query_start_loc: Optional[torch.Tensor],
    seq_lens_cpu: Optional[Sequence[int]] = None,
    cache_indices: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    activation: Activation = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    validate_data: bool = False,
    block_table: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`causal_conv1d_fn` with the positional order of the Triton entry point (`causal_conv1d_fn_triton`)."""
    return causal_conv1d_fn(
        x, weight, bias, query_start_loc=query_start_loc, cache_indices=cache_indices,
        has_initial_state=has_initial_state, conv_states=conv_states, activation=activation,
        pad_slot_id=pad_slot_id, seq_lens_cpu=seq_lens_cpu, block_table=block_table, validate_data=validate_data,
    )
