"""Torch versions of the gated RMSNorm (Qwen3.5's `FusedRMSNormGated`, `rms_norm_gated`) and of the sigmoid-gated
shared expert's `fused_gate_sigmoid_mul(_add)` that SGLang 0.5.23 calls on its CPU path. Float32 arithmetic, results
in the input dtype.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def gate_act(z: torch.Tensor, activation: str) -> torch.Tensor:
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
    zf = None if z is None else gate_act(z.float().reshape(shape), activation)
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
