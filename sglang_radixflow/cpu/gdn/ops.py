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


def as_index_list(t: Optional[torch.Tensor]) -> Optional[list[int]]:
    return None if t is None else [int(x) for x in t.tolist()]


def as_index_tensor(indices: Optional[Sequence[int] | torch.Tensor]) -> Optional[torch.Tensor]:
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
    idx = as_index_tensor(initial_state_indices)
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
    idx = as_index_tensor(state_indices)
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
        cu_seqlens=as_index_list(cu_seqlens),
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
