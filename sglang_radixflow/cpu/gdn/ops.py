"""Torch versions of the gated-delta-net (Qwen3-Next / Qwen3.5) kernels SGLang 0.5.23 calls on its CPU path.

Pure functions, no registration side effects (see `bind.py` for how they reach SGLang). Conventions follow the
SGLang pools and the Triton kernels they stand in for:
- recurrent state pool: [slots, HV, V, K] (`Mamba2StateShape.temporal` = (num_v_heads, head_v_dim, head_k_dim)),
  i.e. S maps a key to a value, o = S q; usually float32.
- conv state pool: [slots, dim, width - 1], newest column last.
- q/k: [1, T, H, K], v: [1, T, HV, V], varlen via cu_seqlens [N + 1]; value head h reads key head h // (HV // H).
- a state index < 0 (pad slot) means: start from zeros and write nothing back.
All arithmetic is float32; results are cast to the activation dtype (states to the pool dtype) at the end.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1
L2NORM_EPS = 1e-6  # FLA's l2norm_fwd default, also HF transformers' l2norm
CHUNK_SIZE = 64  # FLA's chunk size; any value gives the same result up to rounding


# ----------------------------------------------------------------------------------------------------------------------
# gating
# ----------------------------------------------------------------------------------------------------------------------
def gdn_gate(
    A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, softplus_beta: float = 1.0, threshold: float = 20.0
) -> torch.Tensor:
    """g = -exp(A_log) * softplus(a + dt_bias), float32 (log-space decay per token and value head)."""
    x = a.float() + dt_bias.float()
    return -torch.exp(A_log.float()) * F.softplus(x, beta=softplus_beta, threshold=threshold)


def fused_gdn_gating_cpu(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `fused_gdn_gating`: a, b [T, HV] -> (g, beta) each [1, T, HV] float32.

    beta = sigmoid(b) is rounded to b's dtype before widening, as the Triton kernel stores it."""
    assert a.dim() == 2 and b.shape == a.shape, (a.shape, b.shape)
    g = gdn_gate(A_log, a, dt_bias, softplus_beta, softplus_threshold)
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    return g.unsqueeze(0), beta.unsqueeze(0)


# ----------------------------------------------------------------------------------------------------------------------
# gated delta rule
# ----------------------------------------------------------------------------------------------------------------------
def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, use_qk_l2norm: bool, scale: Optional[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, H, K] -> float32 [T, HV, K] (GQA-expanded, l2-normalised, q scaled)."""
    num_k_heads, head_k = q.shape[-2], q.shape[-1]
    assert num_v_heads % num_k_heads == 0, (num_v_heads, num_k_heads)
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * (head_k**-0.5 if scale is None else scale)
    group = num_v_heads // num_k_heads
    if group > 1:
        q, k = q.repeat_interleave(group, dim=-2), k.repeat_interleave(group, dim=-2)
    return q, k


def _as_index_list(t: Optional[torch.Tensor]) -> Optional[list[int]]:
    return None if t is None else [int(x) for x in t.tolist()]


def _as_index_tensor(indices: Optional[Sequence[int] | torch.Tensor]) -> Optional[torch.Tensor]:
    return None if indices is None else torch.as_tensor(indices).to(torch.long).reshape(-1)


def _gather_states(
    pool: Optional[torch.Tensor], idx: Optional[torch.Tensor], n: int, shape: tuple[int, ...]
) -> torch.Tensor:
    """Initial states [n, HV, V, K] float32 (a fresh tensor). idx None: `pool` holds one state per sequence
    (or is None: zeros); idx < 0: zeros."""
    if pool is None:
        return torch.zeros((n, *shape), dtype=torch.float32)
    if idx is None:
        assert pool.shape[0] == n and tuple(pool.shape[1:]) == shape, (pool.shape, n, shape)
        return pool.to(torch.float32, copy=True)
    valid = idx >= 0
    if bool(valid.all()):
        return pool.index_select(0, idx).to(torch.float32)  # index_select already copies
    out = torch.zeros((n, *shape), dtype=torch.float32)
    if bool(valid.any()):
        out[valid] = pool[idx[valid]].float()
    return out


def _scatter_states(pool: torch.Tensor, idx: Optional[torch.Tensor], states: torch.Tensor) -> None:
    if idx is None:
        pool.copy_(states.to(pool.dtype))
        return
    valid = idx >= 0
    if bool(valid.all()):
        pool.index_copy_(0, idx, states.to(pool.dtype))
    elif bool(valid.any()):
        pool[idx[valid]] = states[valid].to(pool.dtype)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    initial_state: Optional[torch.Tensor] = None,
    initial_state_indices: Optional[Sequence[int]] = None,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = False,
    write_final_state: bool = True,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked (WY) gated delta rule over a varlen batch.

    q, k [T, H, K]; v [T, HV, V]; g, beta [T, HV]. Returns (o [T, HV, V] in q's dtype, final states [N, HV, V, K]
    float32, chunk states [NC, HV, V, K] float32); with `write_final_state`, final states go back to
    `initial_state` (at `initial_state_indices`). Chunk states follow the Triton kernel's `h`: one per chunk of
    every sequence, sequences one after another, row c of a sequence = its state *before* its chunk c (row 0 = the
    initial state), i.e. after its first c * chunk_size tokens. SGLang's extra_buffer reads its snapshots there.

    Per token: S <- e^g S;  u = beta (v - S k);  S <- S + u k^T;  o = S q.
    Within a chunk with cumulative log decay c_i (Gamma_i = e^{c_i}) and start state S0, the deltas solve the unit
    lower-triangular system (I + L) U = beta V - beta Gamma K S0^T with L_ij = beta_i e^{c_i - c_j} k_i.k_j (j < i), so
    U = T (beta V) - W S0^T, T = (I + L)^-1, W = T (beta Gamma K); then O = Gamma Q S0^T + (M o Q K^T) U with
    M_ij = e^{c_i - c_j} (j <= i), and S_end = e^{c_C} S0 + U^T (e^{c_C - c} K). Chunks of all sequences are packed
    together; only the chunk-to-chunk state hand-off runs as a loop (over the chunk index, all sequences at once).
    """
    total, num_v_heads, head_v = v.shape
    head_k = q.shape[-1]
    cu = [int(x) for x in cu_seqlens]
    n_seq = len(cu) - 1
    assert cu[0] == 0 and cu[-1] == total, (cu[:1], cu[-1:], total)
    assert g.shape == (total, num_v_heads) and beta.shape == (total, num_v_heads), (g.shape, beta.shape)
    idx = _as_index_tensor(initial_state_indices)
    if idx is not None:
        assert idx.numel() == n_seq, (idx.numel(), n_seq)
    state_shape = (num_v_heads, head_v, head_k)
    if initial_state is not None:
        assert tuple(initial_state.shape[1:]) == state_shape, (initial_state.shape, state_shape)

    S = _gather_states(initial_state, idx, n_seq, state_shape)  # [N, HV, V, K]
    out = torch.zeros((total, num_v_heads, head_v), dtype=torch.float32)
    lens = [cu[i + 1] - cu[i] for i in range(n_seq)]
    n_chunks = [(n + chunk_size - 1) // chunk_size for n in lens]
    chunk_states = torch.zeros((sum(n_chunks), *state_shape), dtype=torch.float32)
    if total > 0:
        qf, kf = _prepare_qk(q, k, num_v_heads, use_qk_l2norm, scale)
        C = chunk_size
        chunk_start = [0]
        for n in n_chunks:
            chunk_start.append(chunk_start[-1] + n)
        nc = chunk_start[-1]
        # slot of every token in the packed [nc * C] layout (padding stays zero: beta=0, g=0, k=0 change nothing)
        slot = torch.cat(
            [torch.arange(lens[i], dtype=torch.long) + chunk_start[i] * C for i in range(n_seq) if lens[i] > 0]
        )

        def pack(x: torch.Tensor) -> torch.Tensor:  # [T, HV, ...] -> [nc, HV, C, ...]
            buf = x.new_zeros((nc * C, *x.shape[1:]))
            buf[slot] = x
            buf = buf.view(nc, C, *x.shape[1:])
            return buf.transpose(1, 2).contiguous()

        Qc, Kc = pack(qf), pack(kf)  # [nc, HV, C, K]
        Vc = pack(v.float())  # [nc, HV, C, V]
        Bc = pack(beta.float())  # [nc, HV, C]
        Gc = pack(g.float()).cumsum(-1)  # cumulative log decay within the chunk
        diff = Gc.unsqueeze(-1) - Gc.unsqueeze(-2)  # c_i - c_j
        causal = torch.ones(C, C, dtype=torch.bool).tril()
        strict = causal.clone().fill_diagonal_(False)
        decay = torch.where(causal, diff, torch.full_like(diff, float("-inf"))).exp()  # M, zero above the diagonal
        KK = Kc @ Kc.transpose(-1, -2)
        L = torch.where(strict, decay * KK * Bc.unsqueeze(-1), torch.zeros_like(KK))
        eye = torch.eye(C, dtype=torch.float32)
        Tinv = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
        gamma = Gc.exp()
        U0 = Tinv @ (Vc * Bc.unsqueeze(-1))  # [nc, HV, C, V]
        W = Tinv @ (Kc * (Bc * gamma).unsqueeze(-1))  # [nc, HV, C, K]
        A = (Qc @ Kc.transpose(-1, -2)) * decay  # [nc, HV, C, C]
        Qg = Qc * gamma.unsqueeze(-1)
        last = Gc[..., -1:]  # c_C (padding keeps the last real value)
        Kd = Kc * (last - Gc).exp().unsqueeze(-1)
        end_decay = last.exp().unsqueeze(-1)  # [nc, HV, 1, 1]

        Oc = torch.empty_like(U0)
        for j in range(max(n_chunks)):
            seqs = [i for i in range(n_seq) if n_chunks[i] > j]
            cid = torch.tensor([chunk_start[i] + j for i in seqs], dtype=torch.long)
            sid = torch.tensor(seqs, dtype=torch.long)
            chunk_states[cid] = S[sid]
            S0t = S[sid].transpose(-1, -2)  # [n, HV, K, V]
            U = U0[cid] - W[cid] @ S0t
            Oc[cid] = Qg[cid] @ S0t + A[cid] @ U
            S[sid] = end_decay[cid] * S[sid] + U.transpose(-1, -2) @ Kd[cid]
        out = Oc.transpose(1, 2).reshape(nc * C, num_v_heads, head_v)[slot]
    if write_final_state and initial_state is not None:
        _scatter_states(initial_state, idx, S)
    return out.to(q.dtype), S, chunk_states


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: Sequence[int] | torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: Sequence[int] | torch.Tensor,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = False,
    write_final_state: bool = True,
) -> torch.Tensor:
    """Token-by-token gated delta rule (decode: one token per sequence). Shapes as `chunk_gated_delta_rule`;
    the step loop runs over positions, all sequences of the batch at once. Returns o [T, HV, V] in q's dtype."""
    total, num_v_heads, head_v = v.shape
    head_k = q.shape[-1]
    cu_t = torch.as_tensor(cu_seqlens).to(torch.long).reshape(-1)
    idx = _as_index_tensor(state_indices)
    n_seq = cu_t.numel() - 1
    assert int(cu_t[0]) == 0 and int(cu_t[-1]) == total and idx.numel() == n_seq, (cu_t, total, idx)
    S = _gather_states(state_pool, idx, n_seq, (num_v_heads, head_v, head_k))  # [N, HV, V, K]
    qf, kf = _prepare_qk(q, k, num_v_heads, use_qk_l2norm, scale)
    vf, gf, bf = v.float(), g.float(), beta.float()
    lens_t = cu_t[1:] - cu_t[:-1]
    if total == n_seq and bool((lens_t == 1).all()):  # decode: token i is sequence i's only token
        S = S * gf.exp()[..., None, None]
        u = bf.unsqueeze(-1) * (vf - (S @ kf.unsqueeze(-1)).squeeze(-1))  # [N, HV, V]
        S = S + u.unsqueeze(-1) * kf.unsqueeze(-2)
        out = (S @ qf.unsqueeze(-1)).squeeze(-1)
    else:
        cu, lens = cu_t.tolist(), lens_t.tolist()
        out = torch.zeros((total, num_v_heads, head_v), dtype=torch.float32)
        for s in range(max(lens, default=0)):
            seqs = [i for i in range(n_seq) if lens[i] > s]
            sid = torch.tensor(seqs, dtype=torch.long)
            tok = torch.tensor([cu[i] + s for i in seqs], dtype=torch.long)
            St = S[sid] * gf[tok].exp()[..., None, None]
            kt = kf[tok]
            u = bf[tok].unsqueeze(-1) * (vf[tok] - (St @ kt.unsqueeze(-1)).squeeze(-1))
            St = St + u.unsqueeze(-1) * kt.unsqueeze(-2)
            out[tok] = (St @ qf[tok].unsqueeze(-1)).squeeze(-1)
            S[sid] = St
    if write_final_state:
        _scatter_states(state_pool, idx, S)
    return out.to(q.dtype)


def _flat_tokens(x: torch.Tensor, name: str) -> torch.Tensor:
    """[1, T, ...] (varlen) -> [T, ...]."""
    assert x.shape[0] == 1, f"{name}: varlen inputs must have batch dim 1, got {tuple(x.shape)}"
    return x[0]


def chunk_gated_delta_rule_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: Optional[torch.Tensor],
    cu_seqlens: torch.Tensor,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    initial_state_indices: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sgl_kernel.mamba.chunk_gated_delta_rule_cpu` (gdn_triton.py binds it as `chunk_gated_delta_rule`).

    Reads initial states from `initial_state[initial_state_indices]` and writes the final states back there, like
    the Triton kernel with inplace_update=True. Returns (o [1, T, HV, V], final states [N, HV, V, K] float32,
    h [1, NC, HV, V, K] float32): `h`, the per-chunk states, is where extra_buffer takes a snapshot inside an extend
    (`_track_mamba_state_extend` reads h[offset of the sequence + tracked length // chunk size])."""
    assert not head_first, "head_first layout is not used by SGLang's GDN backend"
    assert cu_seqlens is not None, "SGLang always passes cu_seqlens (query_start_loc)"
    o, final, h = chunk_gated_delta_rule(
        _flat_tokens(q, "q"),
        _flat_tokens(k, "k"),
        _flat_tokens(v, "v"),
        _flat_tokens(g, "g"),
        _flat_tokens(beta, "beta"),
        cu_seqlens=_as_index_list(cu_seqlens),
        initial_state=initial_state,
        initial_state_indices=initial_state_indices,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
    )
    return o.unsqueeze(0), final, h.unsqueeze(0)


def fused_sigmoid_gating_delta_rule_update_cpu(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """`torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu` (GDN decode): gating + one recurrent step
    per token, states read from and written back to `initial_state_source[initial_state_indices]`.

    q, k [1, T, H, K]; v [1, T, HV, V]; a, b [T, HV]; returns o [1, T, HV, V] (the Triton kernel's layout)."""
    qf, kf, vf = _flat_tokens(q, "q"), _flat_tokens(k, "k"), _flat_tokens(v, "v")
    total = vf.shape[0]
    a2, b2 = a.reshape(total, -1), b.reshape(total, -1)
    g = gdn_gate(A_log, a2, dt_bias, softplus_beta, softplus_threshold)
    beta = torch.sigmoid(b2.float())
    o = recurrent_gated_delta_rule(
        qf,
        kf,
        vf,
        g,
        beta,
        cu_seqlens=cu_seqlens,
        state_pool=initial_state_source,
        state_indices=initial_state_indices,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
    )
    return o.unsqueeze(0)


# ----------------------------------------------------------------------------------------------------------------------
# causal conv1d (sgl_kernel.mamba.causal_conv1d_fn_cpu / causal_conv1d_update_cpu)
# ----------------------------------------------------------------------------------------------------------------------
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
    slots = _as_index_list(cache_indices) if cache_indices is not None else list(range(n_seq))
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
        torch.arange(batch, dtype=torch.long) if conv_state_indices is None else _as_index_tensor(conv_state_indices)
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


# ----------------------------------------------------------------------------------------------------------------------
# gated RMSNorm and the shared-expert gate
# ----------------------------------------------------------------------------------------------------------------------
def _gate_act(z: torch.Tensor, activation: str) -> torch.Tensor:
    if activation in ("swish", "silu"):
        return F.silu(z)
    if activation == "sigmoid":
        return torch.sigmoid(z)
    raise ValueError(f"unsupported gate activation {activation!r}")


def gated_rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    z: Optional[torch.Tensor],
    eps: float,
    activation: str = "swish",
    group_size: Optional[int] = None,
    norm_before_gate: bool = True,
) -> torch.Tensor:
    """RMSNorm over the last dim (or groups of `group_size`), times act(z) after (norm_before_gate) or applied to x
    before the norm. float32 inside, x's dtype out (the FLA Triton kernels' numerics)."""
    shape = x.shape
    n = shape[-1]
    gs = n if group_size is None else group_size
    assert n % gs == 0, (n, gs)
    xf = x.float()
    zf = None if z is None else _gate_act(z.float().reshape(shape), activation)
    if zf is not None and not norm_before_gate:
        xf = xf * zf
    xg = xf.reshape(*shape[:-1], n // gs, gs)
    y = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).reshape(shape)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    if zf is not None and norm_before_gate:
        y = y * zf
    return y.to(x.dtype)


def rms_norm_gated(
    x: torch.Tensor,
    g: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    activation: str = "swish",
    residual: Optional[torch.Tensor] = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """fla/fused_norm_gate.py `rms_norm_gated`: y = rmsnorm(x [+ residual]) * w (+ b), times act(g).
    With prenorm, also returns the pre-norm sum (float32 if residual_in_fp32, else residual's/x's dtype)."""
    xs = x.float() if residual is None else x.float() + residual.float()
    y = gated_rms_norm(xs, weight, bias, g, eps, activation).to(x.dtype)
    if not prenorm:
        return y
    res_dtype = residual.dtype if residual is not None else (torch.float32 if residual_in_fp32 else x.dtype)
    return y, xs.to(res_dtype)


def fused_gate_sigmoid_mul(
    hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor
) -> torch.Tensor:
    """sigmoid(hidden_states . gate_weight) * shared_output per row (float32 inside, shared_output's dtype out)."""
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float().reshape(-1, 1))  # [T, 1]
    return (gate * shared_output.float()).to(shared_output.dtype)


def fused_gate_sigmoid_mul_add(
    hidden_states: torch.Tensor,
    gate_weight: torch.Tensor,
    shared_output: torch.Tensor,
    final_hidden_states: torch.Tensor,
) -> None:
    """final_hidden_states += sigmoid(hidden_states . gate_weight) * shared_output, in place, float32 inside."""
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float().reshape(-1, 1))
    final_hidden_states.copy_((final_hidden_states.float() + gate * shared_output.float()).to(final_hidden_states.dtype))
