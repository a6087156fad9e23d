"""Decode-time state snapshots for `--mamba-radix-cache-strategy extra_buffer`, in torch.

Mirrors the two Triton kernels of `sglang.kernels.ops.mamba.mamba_state_scatter_triton`: for every batch row whose
track mask is set, copy its conv and SSM state rows from its working slot (`cache_indices[i]`) to its track slot
(`mamba_track_indices[i]`), in one layer's pools (`track_mamba_states_if_needed`, Mamba-2) or in every layer's at
once (`track_mamba_states_all_layers`, [layers, slots, ...] pools; the gated-delta-net backend). With
`check_freed_slots`, rows whose either slot is negative (freed in a shared pool) are skipped, as the kernels do.
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
    src, dst = _tracked_rows(cache_indices, mamba_track_mask, mamba_track_indices, batch_size, check_freed_slots)
    if src.numel():
        conv_states[dst] = conv_states[src]
        ssm_states[dst] = ssm_states[src]


def track_mamba_states_all_layers(
    conv_states_pool: torch.Tensor,
    ssm_states_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
) -> None:
    src, dst = _tracked_rows(cache_indices, mamba_track_mask, mamba_track_indices, batch_size, check_freed_slots)
    if src.numel():
        conv_states_pool[:, dst] = conv_states_pool[:, src]
        ssm_states_pool[:, dst] = ssm_states_pool[:, src]


def _tracked_rows(
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    tracked = mamba_track_mask[:batch_size].to(torch.bool)
    src = cache_indices[:batch_size][tracked].to(torch.long)
    dst = mamba_track_indices[:batch_size][tracked].to(torch.long)
    if check_freed_slots:
        live = (src >= 0) & (dst >= 0)
        src, dst = src[live], dst[live]
    return src, dst
