"""Post-import patches for the Qwen3-Next / Qwen3.5 CPU serving path (run only when the sgl_kernel stand-in is active).

Each patch first asserts the SGLang 0.5.23 code shape it relies on, so an upgrade that moves a call site fails at
import time instead of silently falling back to a Triton/CUDA kernel mid-forward.
"""
from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable, Optional

import torch

from sglang_radixflow.cpu.gdn import conv, norm, ops


def _require(module: types.ModuleType, *names: str) -> None:
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"sglang-radixflow gdn patch: {module.__name__} no longer defines {missing} (SGLang upgrade?)"


def _assert_is_cpu(module: types.ModuleType) -> None:
    from sglang.srt.utils import is_cpu

    assert is_cpu(), f"{module.__name__} was imported without the CPU engine (SGLANG_USE_CPU_ENGINE=1)"


# ----------------------------------------------------------------------------------------------------------------------
# GDN kernels
# ----------------------------------------------------------------------------------------------------------------------
_SPECULATIVE_ARGS = (
    "intermediate_states_buffer", "intermediate_state_indices", "cache_steps", "retrieve_parent_token",
    "replayssm_rawv", "replayssm_rawk", "replayssm_g", "replayssm_beta",
)


def fused_sigmoid_gating_delta_rule_update(
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
    is_kda: bool = False,
    disable_state_update: bool = False,
    **speculative: Any,
) -> torch.Tensor:
    """gdn_triton.py's `fused_sigmoid_gating_delta_rule_update` on CPU (decode). Speculative verify arguments,
    KDA gating and read-only updates are rejected by name: the CPU runtime serves no speculative decoding."""
    used = sorted(k for k in _SPECULATIVE_ARGS if speculative.get(k) not in (None, False))
    unknown = sorted(set(speculative) - set(_SPECULATIVE_ARGS) - {"cache_ring", "stable_rows", "lower_bound"})
    if is_kda or disable_state_update or used or unknown or speculative.get("cache_ring"):
        raise NotImplementedError(
            "GDN recurrent update on CPU supports plain decode only; got "
            f"is_kda={is_kda} disable_state_update={disable_state_update} speculative={used} unknown={unknown}"
        )
    return ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices, cu_seqlens,
        use_qk_l2norm_in_kernel, softplus_beta, softplus_threshold, scale,
    )


def fused_gdn_gating(
    A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    return ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias, *args, **kwargs)


def patch_gdn_triton(module: types.ModuleType) -> None:
    """gdn_triton.py binds `chunk_gated_delta_rule` from sgl_kernel.mamba and the decode update from
    torch.ops.sgl_kernel at import time (bind.py registered the op). Rebind the decode update to the Python function:
    no dispatcher hop, and speculative arguments fail by name instead of by schema mismatch."""
    _assert_is_cpu(module)
    _require(module, "TritonGDNKernel", "chunk_gated_delta_rule", "fused_sigmoid_gating_delta_rule_update")
    assert module.chunk_gated_delta_rule is ops.chunk_gated_delta_rule_cpu, module.chunk_gated_delta_rule
    assert module.fused_sigmoid_gating_delta_rule_update is getattr(
        torch.ops.sgl_kernel, "fused_sigmoid_gating_delta_rule_update_cpu"
    ), module.fused_sigmoid_gating_delta_rule_update
    # packed decode is a Triton-only fast path; the dispatcher must take `decode` (our update) on CPU
    assert module.TritonGDNKernel.supports_packed_decode is False
    module.fused_sigmoid_gating_delta_rule_update = fused_sigmoid_gating_delta_rule_update


def patch_gdn_backend(module: types.ModuleType) -> None:
    """gdn_backend.py binds causal_conv1d_fn/update from sgl_kernel.mamba and the prefill gating from
    torch.ops.sgl_kernel. Check the bindings and call the gating function directly."""
    _assert_is_cpu(module)
    _require(module, "GDNAttnBackend", "causal_conv1d_fn", "causal_conv1d_update", "fused_gdn_gating")
    assert module.causal_conv1d_fn is conv.causal_conv1d_fn_cpu, module.causal_conv1d_fn
    assert module.causal_conv1d_update is conv.causal_conv1d_update_cpu, module.causal_conv1d_update
    assert module.fused_gdn_gating is getattr(torch.ops.sgl_kernel, "fused_gdn_gating_cpu"), module.fused_gdn_gating
    module.fused_gdn_gating = fused_gdn_gating


# ----------------------------------------------------------------------------------------------------------------------
# gated RMSNorm (fla/fused_norm_gate.py, fla/layernorm_gated.py)
# ----------------------------------------------------------------------------------------------------------------------
def patch_fused_norm_gate(module: types.ModuleType) -> None:
    """FusedRMSNormGated.forward takes its CPU op only when AMX kernels exist (`_use_cpu`), else the Triton
    `rms_norm_gated` it looks up in this module's globals: replace that global."""
    _require(module, "FusedRMSNormGated", "rms_norm_gated", "_use_cpu")
    assert module._use_cpu is False, "AMX sgl_kernel ops present: FusedRMSNormGated would not use rms_norm_gated"
    assert "rms_norm_gated(" in inspect.getsource(module.FusedRMSNormGated.forward)
    module.rms_norm_gated = norm.rms_norm_gated


def layernorm_fn(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    z: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    group_size: Optional[int] = None,
    norm_before_gate: bool = True,
    is_rms_norm: bool = False,
    activation: str = "swish",
) -> torch.Tensor:
    """fla/layernorm_gated.py `layernorm_fn` (RMSNorm / LayerNorm with an optional gate) in torch."""
    if is_rms_norm:
        return norm.gated_rms_norm(x, weight, bias, z, eps, activation, group_size, norm_before_gate)
    shape, n = x.shape, x.shape[-1]
    gs = n if group_size is None else group_size
    xf = x.float()
    gate = None if z is None else norm.gate_act(z.float().reshape(shape), activation)
    if gate is not None and not norm_before_gate:
        xf = xf * gate
    xg = xf.reshape(*shape[:-1], n // gs, gs)
    xg = (xg - xg.mean(-1, keepdim=True)) * torch.rsqrt(xg.var(-1, unbiased=False, keepdim=True) + eps)
    y = xg.reshape(shape)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    if gate is not None and norm_before_gate:
        y = y * gate
    return y.to(x.dtype)


def patch_layernorm_gated(module: types.ModuleType) -> None:
    """RMSNorm/LayerNorm.forward (used by Qwen3.5 and by Qwen3-Next under piecewise graphs) call the Triton
    `layernorm_fn` from this module's globals unless AMX ops exist. `rms_norm_gated` here (Mamba-2's mixer norm)
    is left to the mamba2 family."""
    _require(module, "RMSNorm", "LayerNorm", "layernorm_fn", "_use_cpu")
    assert module._use_cpu is False, "AMX sgl_kernel ops present: RMSNorm would not use layernorm_fn"
    assert "layernorm_fn(" in inspect.getsource(module.RMSNorm.forward)
    module.layernorm_fn = layernorm_fn


# ----------------------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------------------
def _cpu_device_module(original: Callable[..., types.ModuleType]) -> Callable[..., types.ModuleType]:
    def get_device_module(device: Any = None) -> types.ModuleType:
        return torch.cpu if device is None else original(device)

    return get_device_module


def patch_qwen3_next(module: types.ModuleType) -> None:
    """Qwen3GatedDeltaNet.__init__ builds its gated norm on `torch.get_device_module().current_device()`. With a
    CUDA build of torch and no driver that is torch.cuda ("Found no NVIDIA driver"). Answer torch.cpu while the
    constructor runs (model construction is single-threaded); everything else keeps torch's own answer."""
    _assert_is_cpu(module)
    _require(module, "Qwen3GatedDeltaNet")
    cls = module.Qwen3GatedDeltaNet
    assert "torch.get_device_module().current_device()" in inspect.getsource(cls.__init__)
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original = torch.get_device_module
        torch.get_device_module = _cpu_device_module(original)
        try:
            init(self, *args, **kwargs)
        finally:
            torch.get_device_module = original

    __init__.__module__ = __name__
    cls.__init__ = __init__


def patch_qwen2_moe(module: types.ModuleType) -> None:
    """Qwen2MoeSparseMoeBlock adds the sigmoid-gated shared expert with the Triton `fused_gate_sigmoid_mul_add`
    (and `fused_gate_sigmoid_mul`) whenever the shared-expert gate is not an AMX layer, i.e. always here."""
    _require(module, "Qwen2MoeSparseMoeBlock", "fused_gate_sigmoid_mul_add", "fused_gate_sigmoid_mul")
    assert "fused_gate_sigmoid_mul_add(" in inspect.getsource(module.Qwen2MoeSparseMoeBlock.forward)
    module.fused_gate_sigmoid_mul_add = norm.fused_gate_sigmoid_mul_add
    module.fused_gate_sigmoid_mul = norm.fused_gate_sigmoid_mul
