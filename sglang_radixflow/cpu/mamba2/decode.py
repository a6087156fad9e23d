"""Torch Mamba-2 decode step for CPU: `selective_state_update`, standing in for SGLang 0.5.23's Triton
`selective_state_update` (same arguments; the state pool is updated in place).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sglang_radixflow.cpu.mamba2.ssd import PAD_SLOT_ID


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    state_batch_indices: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: Optional[torch.Tensor] = None,
    disable_state_update: bool = False,
    intermediate_states_buffer: Optional[torch.Tensor] = None,
    cache_steps: Optional[int] = None,
    retrieve_parent_token: Optional[torch.Tensor] = None,
    intermediate_state_indices: Optional[torch.Tensor] = None,
    enable_stochastic_rounding: bool = False,
    cache_philox_rounds: int = 0,
) -> None:
    """Same contract as SGLang's `selective_state_update` (Triton kernel): one recurrent step per token.

    state (slots, H, P, N) or (slots, P, N); x (batch, [T,] H, P); dt like x; A (H, P, N); B/C (batch, [T,] G, N);
    D/dt_bias (H, P); out like x (written). Rows whose state_batch_indices equal pad_slot_id start from a zero
    state and write nothing back. intermediate_states_buffer[cache_idx, t] receives the state after token t; with
    retrieve_parent_token (EAGLE tree) token t > 0 starts from the buffered state of its parent.
    """
    if enable_stochastic_rounding:
        raise NotImplementedError("selective_state_update: stochastic rounding of the cache is CUDA-only")
    del cache_philox_rounds
    assert out is not None
    st = state.unsqueeze(1) if state.dim() == 3 else state

    def four(t: torch.Tensor) -> torch.Tensor:  # (batch, T, heads, last)
        if t.dim() == 2:
            t = t.unsqueeze(1)
        return t.unsqueeze(1) if t.dim() == 3 else t

    xs, dts, Bs, Cs, outs = four(x), four(dt), four(B), four(C), four(out)
    zs = None if z is None else four(z)
    As = A.unsqueeze(0) if A.dim() == 2 else A
    Ds = None if D is None else (D.unsqueeze(0) if D.dim() == 1 else D)
    dtb = None if dt_bias is None else (dt_bias.unsqueeze(0) if dt_bias.dim() == 1 else dt_bias)
    _, H, P, N = st.shape
    batch, T = xs.shape[:2]
    G = Bs.shape[2]
    assert xs.shape == (batch, T, H, P) and dts.shape == xs.shape and As.shape == (H, P, N)
    assert Bs.shape == (batch, T, G, N) and Cs.shape == Bs.shape and outs.shape == xs.shape
    R = H // G
    dev = x.device

    slots = (
        torch.arange(batch, device=dev) if state_batch_indices is None else state_batch_indices.to(torch.long)
    )
    live = slots != pad_slot_id if state_batch_indices is not None else torch.ones(batch, dtype=torch.bool, device=dev)
    s = torch.zeros(batch, H, P, N, dtype=torch.float32, device=dev)
    rows = live.nonzero(as_tuple=True)[0]
    s[rows] = st[slots[rows]].to(torch.float32)
    if intermediate_state_indices is not None:
        cache_idx = intermediate_state_indices.to(torch.long)
    else:
        cache_idx = slots  # pad rows carry pad_slot_id (-1) here, like the kernel
    buf = None
    if intermediate_states_buffer is not None:
        assert cache_steps is not None
        buf = intermediate_states_buffer.view(-1, cache_steps, H, P, N)
    Af = As.to(torch.float32)
    for t in range(T):
        if retrieve_parent_token is not None and buf is not None and t > 0:
            parent = retrieve_parent_token[:, t].to(torch.long)
            use = (cache_idx >= 0) & (parent >= 0) & (parent < T)
            if bool(use.any()):
                r = use.nonzero(as_tuple=True)[0]
                s[r] = buf[cache_idx[r], parent[r]].to(torch.float32)
        d = dts[:, t].to(torch.float32)  # (batch, H, P)
        if dtb is not None:
            d = d + dtb.to(torch.float32)
        if dt_softplus:
            d = F.softplus(d, beta=1.0, threshold=20.0)
        dA = torch.exp(Af * d[..., None])  # (batch, H, P, N)
        Bh = Bs[:, t].to(torch.float32).repeat_interleave(R, dim=1)  # (batch, H, N)
        Ch = Cs[:, t].to(torch.float32).repeat_interleave(R, dim=1)
        xt = xs[:, t].to(torch.float32)
        s = s * dA + (d * xt)[..., None] * Bh[:, :, None, :]
        if buf is not None and state_batch_indices is not None:  # the kernel caches only with slot indices
            buf[cache_idx[rows], t] = s[rows].to(buf.dtype)
        yt = (s * Ch[:, :, None, :]).sum(-1)
        if Ds is not None:
            yt = yt + xt * Ds.to(torch.float32)
        if zs is not None:
            zt = zs[:, t].to(torch.float32)
            yt = yt * zt * torch.sigmoid(zt)
        outs[:, t] = yt.to(outs.dtype)
    if not disable_state_update:
        st[slots[rows]] = s[rows].to(st.dtype)
