"""Torch Mamba-2 SSD for CPU: the chunked prefill scan (the decode step is in `decode.py`).

`mamba_chunk_scan_combined` mirrors `sglang.kernels.ops.mamba.triton_ops.ssd_combined.mamba_chunk_scan_combined`
(same arguments, same return shapes for every `return_*` combination) in the chunked matrix form of the SSD paper:
- the token stream is cut at sequence boundaries and at the physical chunk grid (every `chunk_size` tokens of a
  batch row), giving "logical chunks" of one sequence each, like the Triton kernels' chunk_indices/chunk_offsets;
- inside a logical chunk the output is a masked (L x L) attention-like matmul (C B^T * decay * dt) @ x;
- each logical chunk also yields its state contribution (B^T (decay * dt * x)) and total decay; chunk states are
  passed along each sequence with one small update per chunk (all sequences at once), starting from the
  sequence's initial state, and the state entering a chunk adds C (state) * exp(cumsum dA) to its outputs.
The per-physical-chunk states (`return_intermediate_states` / `return_track_states`) follow Triton's layout:
h[c] is the state at flat position c * chunk_size of the sequence owning the token just before it (h[0]: the
first sequence's initial state), which SGLang's prefix-cache tracking indexes by `end_loc // chunk_size`.
Everything is computed in float32; outputs are cast to the dtypes Triton produces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1
# Bytes of float32 scratch per block of logical chunks (bounds the (n, H, L, L) decay matrices).
_BLOCK_BYTES = 64 << 20


def _process_dt(
    dt: torch.Tensor, dt_bias: Optional[torch.Tensor], dt_softplus: bool, dt_limit: tuple[float, float]
) -> torch.Tensor:
    dt = dt.to(torch.float32)
    if dt_bias is not None:
        dt = dt + dt_bias.to(torch.float32)
    if dt_softplus:
        dt = F.softplus(dt, beta=1.0, threshold=20.0)  # Triton: x > 20 -> x, else log(1 + e^x)
    lo, hi = dt_limit
    if lo != 0.0 or hi != math.inf:
        dt = dt.clamp(min=lo, max=hi)
    return dt


@dataclass
class _Plan:
    """Logical chunks of a flattened (batch * seqlen) token stream."""

    start: torch.Tensor  # (n,) flat token index where the logical chunk starts
    length: torch.Tensor  # (n,) tokens in it (1 .. chunk_size)
    seg: torch.Tensor  # (n,) segment (sequence) it belongs to
    first_chunk: torch.Tensor  # (num_segs,) index of each segment's first logical chunk
    num_chunks: list[int]  # logical chunks per segment
    phys_end: torch.Tensor  # (num_phys,) logical chunk closing each physical chunk, row-major over (batch, chunk)


def _plan(seg_start: list[int], seg_end: list[int], row_len: int, num_rows: int, chunk: int) -> _Plan:
    starts: list[int] = []
    lengths: list[int] = []
    segs: list[int] = []
    first: list[int] = []
    counts: list[int] = []
    nphys = -(-row_len // chunk)
    phys_end = [-1] * (num_rows * nphys)
    for i, (s, e) in enumerate(zip(seg_start, seg_end)):
        row = s // row_len if row_len else 0
        base = row * row_len
        first.append(len(starts))
        pos = s
        while pos < e:
            k = (pos - base) // chunk
            stop = min(e, base + (k + 1) * chunk)
            phys_end[row * nphys + k] = len(starts)  # segments are in order, so the last writer closes the chunk
            starts.append(pos)
            lengths.append(stop - pos)
            segs.append(i)
            pos = stop
        counts.append(len(starts) - first[-1])
    as_t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return _Plan(as_t(starts), as_t(lengths), as_t(segs), as_t(first), counts, as_t(phys_end))


def _segments(
    batch: int,
    seqlen: int,
    cu_seqlens: Optional[torch.Tensor],
    seq_idx: Optional[torch.Tensor],
) -> tuple[list[int], list[int], list[int]]:
    """Flat [start, end) of every sequence, and its initial-state row (-1: starts from zero)."""
    if cu_seqlens is not None:
        assert batch == 1, "cu_seqlens (varlen) needs batch == 1"
        cu = cu_seqlens.tolist()
        return cu[:-1], cu[1:], list(range(len(cu) - 1))
    starts: list[int] = []
    ends: list[int] = []
    init_rows: list[int] = []
    for b in range(batch):
        if seq_idx is None:
            cuts = [0, seqlen]
        else:
            change = (seq_idx[b, 1:] != seq_idx[b, :-1]).nonzero(as_tuple=True)[0] + 1
            cuts = [0, *change.tolist(), seqlen]
        for j in range(len(cuts) - 1):
            starts.append(b * seqlen + cuts[j])
            ends.append(b * seqlen + cuts[j + 1])
            init_rows.append(b if j == 0 else -1)  # per-row initial state only seeds the row's first sequence
    return starts, ends, init_rows


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    seg_start: Sequence[int],
    seg_end: Sequence[int],
    init: Optional[torch.Tensor],
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    row_len: Optional[int] = None,
    track_seg: Optional[Sequence[int]] = None,
    track_end: Optional[Sequence[int]] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Core chunked SSD over a flat stream.

    x (T, H, P); dt (T, H) already softplus'ed; A (H,); B, C (T, G, N); init (num_segs, H, P, N) or None.
    Segments [seg_start[i], seg_end[i]) must be ordered, disjoint and cover the stream; the chunk grid restarts
    every `row_len` tokens (default: T). Returns (y (T, H, P) float32, final state per segment (S, H, P, N),
    h per physical chunk (rows * nchunks, H, P, N) = state at the chunk's start, track states or None).
    """
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    R = H // G
    L = chunk_size
    row_len = T if row_len is None else row_len
    num_rows = T // row_len if row_len else 1
    dev = x.device
    assert list(seg_start[1:]) == list(seg_end[:-1]) and (not seg_start or (seg_start[0] == 0 and seg_end[-1] == T)), (
        "segments must tile the token stream"
    )
    plan = _plan(list(seg_start), list(seg_end), row_len, num_rows, L)
    n = plan.start.numel()
    S = len(seg_start)
    HP, GN = H * P, G * N

    # Padded chunk layout (n, L, features): one float32 copy of x | dt | B | C, padding rows carry dt = 0
    # (no input, no decay). When only the last logical chunk is short this is a plain pad + view.
    nf = HP + H + 2 * GN
    parts = (x.reshape(T, HP), dt, B.reshape(T, GN), C.reshape(T, GN))
    contiguous = bool((plan.length[:-1] == L).all()) if n else True
    keep = None
    if contiguous:
        padded = torch.empty(n * L, nf, dtype=torch.float32, device=dev)
        col = 0
        for part in parts:  # one converting copy per part, straight into the padded layout
            padded[:T, col : col + part.shape[1]] = part
            col += part.shape[1]
        padded[T:] = 0
        padded = padded.view(n, L, nf)
    else:
        ar = torch.arange(L, device=dev)
        keep = ar[None, :] < plan.length[:, None]  # (n, L)
        idx = (plan.start[:, None] + ar[None, :]).clamp(max=max(T - 1, 0))
        padded = torch.cat(parts, dim=1).to(torch.float32)[idx]
        padded[..., HP : HP + H] *= keep[..., None]
    Xc = padded[..., :HP].view(n, L, H, P)
    dtc = padded[..., HP : HP + H]  # (n, L, H)
    Bc = padded[..., HP + H : HP + H + GN].view(n, L, G, N)
    Cc = padded[..., HP + H + GN :].view(n, L, G, N)
    Af = A.to(torch.float32)

    dA_cs = torch.cumsum(dtc * Af, dim=1)  # (n, L, H)
    chunk_decay = dA_cs[:, -1, :]  # (n, H): padding adds no decay
    y_pad = torch.empty(n, L, H, P, dtype=torch.float32, device=dev)
    chunk_state = torch.empty(n, H, P, N, dtype=torch.float32, device=dev)
    block = max(1, _BLOCK_BYTES // (4 * H * L * L * 2))
    notril = ~torch.tril(torch.ones(L, L, dtype=torch.bool, device=dev))
    # Pass 1 (blocks of logical chunks): the diagonal (intra-chunk) output and each chunk's state contribution.
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        m = hi - lo
        cs = dA_cs[lo:hi].permute(0, 2, 1)  # (m, H, L)
        xdt = Xc[lo:hi] * dtc[lo:hi, :, :, None]  # (m, L, H, P): dt_s x_s
        # y_l = sum_{s <= l} exp(sum of dA over (s, l]) (C_l . B_s) dt_s x_s
        M = cs[..., :, None] - cs[..., None, :]  # (m, H, L, L)
        M.masked_fill_(notril, -math.inf).exp_()
        CB = torch.matmul(Cc[lo:hi].permute(0, 2, 1, 3), Bc[lo:hi].permute(0, 2, 3, 1))  # (m, G, L, L)
        M.view(m, G, R, L, L).mul_(CB[:, :, None])
        y_pad[lo:hi] = torch.matmul(M, xdt.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        # State contribution at the chunk end: sum_s exp(dA_cs[last] - dA_cs[s]) dt_s x_s B_s^T.
        to_end = torch.exp(dA_cs[lo:hi, -1:, :] - dA_cs[lo:hi])  # (m, L, H)
        Xw = xdt.mul_(to_end[..., None]).view(m, L, G, R * P)
        st = torch.matmul(Xw.permute(0, 2, 3, 1), Bc[lo:hi].permute(0, 2, 1, 3))  # (m, G, R*P, N)
        chunk_state[lo:hi] = st.view(m, H, P, N)

    state_in, final = _pass_states(plan, init, chunk_state, torch.exp(chunk_decay), S, (H, P, N), dev)

    # Pass 3: the state entering each chunk adds exp(dA_cs[l]) * C_l . state_in.
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        m = hi - lo
        y_off = torch.matmul(Cc[lo:hi].permute(0, 2, 1, 3), state_in[lo:hi].view(m, G, R * P, N).transpose(-1, -2))
        y_off = y_off.permute(0, 2, 1, 3).reshape(m, L, H, P).mul_(torch.exp(dA_cs[lo:hi])[..., None])
        y_pad[lo:hi] += y_off
    y = y_pad.view(n * L, H, P)[:T] if contiguous else y_pad.view(n * L, H, P)[keep.reshape(-1)]
    if D is not None:
        Df = D.to(torch.float32)
        xf = Xc.reshape(n * L, H, P)[:T] if contiguous else x.to(torch.float32)
        y = y.addcmul_(xf, Df[:, None] if D.dim() == 1 else Df)
    if z is not None:
        y = y * F.silu(z.to(torch.float32))

    # States at the physical chunk starts (Triton's h): h[c] = state after the chunk closing physical chunk c-1.
    nphys = -(-row_len // L) if row_len else 0
    h = torch.zeros(num_rows * nphys, H, P, N, dtype=torch.float32, device=dev)
    closers = plan.phys_end.view(num_rows, nphys)[:, :-1].reshape(-1) if nphys else plan.phys_end
    if closers.numel():
        after = state_in[closers] * torch.exp(chunk_decay[closers])[..., None, None] + chunk_state[closers]
        h.view(num_rows, nphys, H, P, N)[:, 1:] = after.view(num_rows, nphys - 1, H, P, N)
    if init is not None and nphys:
        # h[row, 0]: the initial state of the sequence that opens the row (zeros where it has none).
        for i, s0 in enumerate(seg_start):
            if s0 % row_len == 0:
                h[(s0 // row_len) * nphys] = init[i]

    track = None
    if track_seg is not None and track_end is not None and len(track_seg):
        track = _states_at(
            plan, list(track_seg), list(track_end), list(seg_start), init, state_in, dA_cs, dt, x, B, G, R
        )
    return y, final, h, track


def _pass_states(
    plan: _Plan,
    init: Optional[torch.Tensor],
    chunk_state: torch.Tensor,
    chunk_decay_exp: torch.Tensor,
    S: int,
    shape: tuple[int, int, int],
    dev: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """State entering every logical chunk, and each segment's final state.

    One step per chunk index k, all segments at once: segments sorted by chunk count (descending) make the
    segments still running at step k a prefix, and chunks laid out k-major make their inputs a contiguous slice.
    """
    n = chunk_state.shape[0]
    counts = plan.num_chunks
    order = sorted(range(S), key=lambda i: -counts[i])
    sorted_counts = [counts[i] for i in order]
    perm_parts = []
    active: list[int] = []
    first = plan.first_chunk
    order_t = torch.tensor(order, dtype=torch.long)
    for k in range(sorted_counts[0] if S else 0):
        nk = sum(1 for c in sorted_counts if c > k)
        active.append(nk)
        perm_parts.append(first[order_t[:nk]] + k)
    identity = S == 1
    perm = torch.cat(perm_parts) if perm_parts else torch.zeros(0, dtype=torch.long)
    cs_km = chunk_state if identity else chunk_state[perm]
    dec_km = (chunk_decay_exp if identity else chunk_decay_exp[perm])[..., None, None]
    state = torch.zeros(S, *shape, dtype=torch.float32, device=dev) if init is None else init.to(torch.float32)[order_t]
    state_in_km = torch.empty(n, *shape, dtype=torch.float32, device=dev)
    off = 0
    for nk in active:
        cur = state[:nk]
        state_in_km[off : off + nk] = cur
        cur.mul_(dec_km[off : off + nk]).add_(cs_km[off : off + nk])
        off += nk
    if identity:
        state_in = state_in_km
        final = state
    else:
        state_in = torch.empty_like(state_in_km)
        state_in[perm] = state_in_km
        final = torch.empty_like(state)
        final[order_t] = state
    return state_in, final


def _states_at(
    plan: _Plan,
    track_seg: list[int],
    track_end: list[int],
    seg_start: list[int],
    init: Optional[torch.Tensor],
    state_in: torch.Tensor,
    dA_cs_all: torch.Tensor,
    dt: torch.Tensor,
    xf: torch.Tensor,
    Bf: torch.Tensor,
    G: int,
    R: int,
) -> torch.Tensor:
    """State of sequence track_seg[i] after the flat token position track_end[i] - 1 (exclusive end)."""
    _, H, P = xf.shape
    N = Bf.shape[-1]
    out = torch.empty(len(track_seg), H, P, N, dtype=torch.float32, device=xf.device)
    for i, (seg, end) in enumerate(zip(track_seg, track_end)):
        if end <= seg_start[seg]:
            out[i] = 0.0 if init is None else init[seg].to(torch.float32)
            continue
        first = int(plan.first_chunk[seg])
        chunk_starts = plan.start[first : first + plan.num_chunks[seg]]
        j = first + int(torch.searchsorted(chunk_starts, torch.tensor(end - 1), right=True)) - 1
        s0 = int(plan.start[j])
        upto = end - s0  # tokens of chunk j that are included
        cs = dA_cs_all[j, :upto]  # (upto, H)
        w = torch.exp(cs[-1:] - cs) * dt[s0:end]  # (upto, H)
        xw = (xf[s0:end].to(torch.float32) * w[..., None]).reshape(upto, G, R * P)
        contrib = torch.einsum("tgq,tgn->gqn", xw, Bf[s0:end].to(torch.float32)).reshape(H, P, N)
        out[i] = state_in[j] * torch.exp(cs[-1])[:, None, None] + contrib
    return out


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    seq_idx: Optional[torch.Tensor] = None,
    chunk_indices: Optional[torch.Tensor] = None,
    chunk_offsets: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    out: Optional[torch.Tensor] = None,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    return_intermediate_states: bool = False,
    state_dtype: Optional[torch.dtype] = None,
    return_track_states: bool = False,
    track_seq_idx: Optional[torch.Tensor] = None,
    track_end_locs: Optional[torch.Tensor] = None,
) -> Union[None, torch.Tensor, tuple[Optional[torch.Tensor], ...]]:
    """Same contract as SGLang's Triton `mamba_chunk_scan_combined`; the output is written into `out`.

    x (batch, seqlen, H, P), dt (batch, seqlen, H), A (H,), B/C (batch, seqlen, G, N), D (H,) or (H, P),
    z like x, dt_bias (H,), initial_states (num_seqs, H, P, N) with cu_seqlens else (batch, H, P, N).
    chunk_indices / chunk_offsets are Triton launch metadata; the logical chunks are derived here instead.
    """
    del chunk_indices, chunk_offsets
    if not return_varlen_states:
        cu_seqlens = None
    else:
        assert cu_seqlens is not None, "cu_seqlens must be provided if return_varlen_states is True"
    assert out is not None, "out (preallocated output) is required, as for the Triton kernel"
    batch, seqlen, H, P = x.shape
    _, _, G, N = B.shape
    assert H % G == 0 and B.shape == (batch, seqlen, G, N) and C.shape == B.shape
    assert dt.shape == (batch, seqlen, H) and A.shape == (H,)
    assert chunk_size > 0 and chunk_size & (chunk_size - 1) == 0, "chunk_size must be a power of 2"
    if z is not None:
        assert z.shape == x.shape
    if seq_idx is not None:
        assert seq_idx.shape == (batch, seqlen)
    seg_start, seg_end, init_rows = _segments(batch, seqlen, cu_seqlens, seq_idx)
    init = None
    if initial_states is not None:
        rows = initial_states.shape[0]
        assert initial_states.shape == (rows, H, P, N)
        assert rows == (len(seg_start) if cu_seqlens is not None else batch), initial_states.shape
        init = torch.zeros(len(seg_start), H, P, N, dtype=torch.float32, device=x.device)
        has = [i for i, r in enumerate(init_rows) if r >= 0]
        init[has] = initial_states[[init_rows[i] for i in has]].to(torch.float32)

    track_seg = track_end = None
    if return_varlen_states and track_seq_idx is not None and track_end_locs is not None and track_end_locs.numel():
        track_seg, track_end = track_seq_idx.tolist(), track_end_locs.tolist()
    T = batch * seqlen
    dt_p = _process_dt(dt, dt_bias, dt_softplus, dt_limit).reshape(T, H)
    y, final, h, track = ssd_chunked(
        x.reshape(T, H, P),
        dt_p,
        A,
        B.reshape(T, G, N),
        C.reshape(T, G, N),
        chunk_size,
        seg_start,
        seg_end,
        init,
        D=D,
        z=None if z is None else z.reshape(T, H, P),
        row_len=seqlen,
        track_seg=track_seg,
        track_end=track_end,
    )
    out.copy_(y.view(batch, seqlen, H, P))

    st_dtype = state_dtype if state_dtype is not None else C.dtype
    nchunks = h.shape[0] // batch
    states = h.view(batch, nchunks, H, P, N).to(st_dtype)
    # Triton's final_states: float32, the state at the end of each batch row (its last sequence).
    last_seg_of_row = [max(i for i, s in enumerate(seg_start) if s < (b + 1) * seqlen) for b in range(batch)]
    final_states = final[last_seg_of_row]
    if return_track_states:
        assert return_varlen_states, "return_track_states requires return_varlen_states (cu_seqlens mode)"
        track_states = None if track is None else track.to(st_dtype).unsqueeze(0)
        return states, final.to(st_dtype), track_states
    if return_intermediate_states:
        if return_varlen_states:
            varlen = final.to(st_dtype)
            return (states, final_states, varlen) if return_final_states else (states, varlen)
        return (states, final_states) if return_final_states else states
    if not return_varlen_states:
        return final_states if return_final_states else None
    varlen = final.to(st_dtype)
    return (final_states, varlen) if return_final_states else varlen
