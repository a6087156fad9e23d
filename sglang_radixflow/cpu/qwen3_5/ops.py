"""Torch versions of the four sgl-kernel CPU ops SGLang 0.5.23's Qwen3.5 model calls (its `_is_cpu` branch).

Pure functions. Semantics follow the model's own non-fused code path (`forward_prepare_native`,
`fix_query_key_value_ordering`) and SGLang's `GemmaRMSNorm`: y = x * rsqrt(mean(x^2) + eps) * (1 + w), in float32,
cast back to the input dtype.
"""
from __future__ import annotations

import torch


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma RMSNorm over the last dim (weight stored as w, applied as 1 + w), float32 inside."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return y.to(x.dtype)


def fused_sigmoid_mul_cpu(x: torch.Tensor, gate: torch.Tensor) -> None:
    """In place: x *= sigmoid(gate). x [T, N*D]; gate [T, N*D] or the strided per-head view [T, N, D]."""
    assert x.shape[0] == gate.shape[0] and x[0].numel() == gate[0].numel(), (x.shape, gate.shape)
    product = x.float() * torch.sigmoid(gate.reshape(x.shape).float())
    x.copy_(product.to(x.dtype))


def fused_qk_gemma_rmsnorm_cpu(
    q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head Gemma RMSNorm of q [T, Hq*D] and k [T, Hk*D] (possibly strided slices of qkv): new tensors
    [T*Hq, D] and [T*Hk, D], which the model views back to q's and k's shapes."""
    q_by_head = gemma_rms_norm(q.reshape(-1, head_dim), q_weight, eps)
    k_by_head = gemma_rms_norm(k.reshape(-1, head_dim), k_weight, eps)
    return q_by_head, k_by_head


def fused_qk_gemma_rmsnorm_with_gate_cpu(
    q_gate: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    head_dim: int,
    num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q_gate [T, Hq*2*D] holds per head [q_h | gate_h]: returns normed q [T, Hq*D], normed k [T, Hk*D] and the
    gate [T, Hq*D] (contiguous)."""
    tokens = q_gate.shape[0]
    per_head = q_gate.reshape(tokens, num_heads, 2 * head_dim)
    q, gate = per_head[..., :head_dim], per_head[..., head_dim:]
    q_normed = gemma_rms_norm(q, q_weight, eps).reshape(tokens, -1)
    k_normed = gemma_rms_norm(k.reshape(tokens, -1, head_dim), k_weight, eps).reshape(tokens, -1)
    return q_normed, k_normed, gate.reshape(tokens, -1).contiguous()


def fused_qkvzba_split_reshape_cat_contiguous_cpu(
    mixed_qkvz: torch.Tensor,
    mixed_ba: torch.Tensor,
    num_heads_qk: int,
    num_heads_v: int,
    head_qk: int,
    head_v: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3.5's contiguous projection layout: mixed_qkvz [T, all_q | all_k | all_v | all_z], mixed_ba
    [T, all_b | all_a] -> (mixed_qkv [T, q|k|v], z [T, HV, V], b [T, HV], a [T, HV]), all contiguous."""
    key_dim, value_dim = num_heads_qk * head_qk, num_heads_v * head_v
    assert mixed_qkvz.shape[-1] == 2 * key_dim + 2 * value_dim, (mixed_qkvz.shape, key_dim, value_dim)
    assert mixed_ba.shape[-1] == 2 * num_heads_v, (mixed_ba.shape, num_heads_v)
    tokens = mixed_qkvz.shape[0]
    mixed_qkv = mixed_qkvz[:, : 2 * key_dim + value_dim].contiguous()
    z = mixed_qkvz[:, 2 * key_dim + value_dim :].reshape(tokens, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v:].contiguous()
    return mixed_qkv, z, b, a
