"""Decode-time state snapshots for `--mamba-radix-cache-strategy extra_buffer`, in torch.

Mirrors `sglang.kernels.ops.mamba.mamba_state_scatter_triton.track_mamba_states_if_needed` (a Triton kernel): for
every batch row whose track mask is set, copy its conv and SSM state rows from its working slot
(`cache_indices[i]`) to its track slot (`mamba_track_indices[i]`). With `check_freed_slots`, rows whose either
slot is negative (freed in a shared pool) are skipped, as the kernel does.
"""
from __future__ import annotations

import torch


def track_mamba_states_if_needed(
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
) -> None:
    tracked = mamba_track_mask[:batch_size].to(torch.bool)
    src = cache_indices[:batch_size][tracked].to(torch.long)
    dst = mamba_track_indices[:batch_size][tracked].to(torch.long)
    if check_freed_slots:
        live = (src >= 0) & (dst >= 0)
        src, dst = src[live], dst[live]
    if src.numel():
        conv_states[dst] = conv_states[src]
        ssm_states[dst] = ssm_states[src]
