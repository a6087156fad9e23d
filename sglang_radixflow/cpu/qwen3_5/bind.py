"""How the Qwen3.5 ops reach SGLang: four `torch.ops.sgl_kernel` ops, registered before the model module runs.

`qwen3_5.py` binds `torch.ops.sgl_kernel.<name>` to module globals in its body when `is_cpu()`, so the ops are
defined just before that body executes (PRE_IMPORT hook) via torch.library (CompositeImplicitAutograd: plain torch
code, no autograd formula needed). After the import, `check_bindings` asserts the module bound these ops and
rebinds its globals to the Python functions (no dispatcher hop).
None of these names is one SGLang reads as "AMX kernels exist".
"""
from __future__ import annotations

import types

import torch

from sglang_radixflow.cpu.qwen3_5 import ops
from sglang_radixflow.cpu.torch_ops import register_missing

NAMESPACE = "sgl_kernel"
TORCH_OPS: dict[str, tuple[str, object]] = {
    "fused_sigmoid_mul_cpu": ("fused_sigmoid_mul_cpu(Tensor(a!) x, Tensor gate) -> ()", ops.fused_sigmoid_mul_cpu),
    "fused_qk_gemma_rmsnorm_cpu": (
        "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim)"
        " -> (Tensor, Tensor)",
        ops.fused_qk_gemma_rmsnorm_cpu,
    ),
    "fused_qk_gemma_rmsnorm_with_gate_cpu": (
        "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps, "
        "int head_dim, int num_heads) -> (Tensor, Tensor, Tensor)",
        ops.fused_qk_gemma_rmsnorm_with_gate_cpu,
    ),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": (
        "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, "
        "int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)",
        ops.fused_qkvzba_split_reshape_cat_contiguous_cpu,
    ),
}
def register_torch_ops() -> list[str]:
    """Define the ops that are missing from torch.ops.sgl_kernel (idempotent); returns the names registered now."""
    return register_missing(NAMESPACE, TORCH_OPS)


def register_before_import(module: types.ModuleType) -> None:
    """PRE_IMPORT hook of sglang.srt.models.qwen3_5 (the module object exists, its body has not run)."""
    register_torch_ops()


def check_bindings(module: types.ModuleType) -> None:
    """After qwen3_5.py ran: it must have taken its CPU branch and bound our ops; bind the Python functions."""
    from sglang.srt.utils import is_cpu

    assert is_cpu(), f"{module.__name__} was imported without the CPU engine (SGLANG_USE_CPU_ENGINE=1)"
    for name in ("_fused_sigmoid_mul_cpu", "fused_qk_gemma_rmsnorm", "fused_qk_gemma_rmsnorm_with_gate",
                 "fused_qkvzba_split_reshape_cat_contiguous", "fused_sigmoid_mul"):
        assert hasattr(module, name), f"{module.__name__} no longer defines {name} (SGLang upgrade?)"
    bound = {
        "_fused_sigmoid_mul_cpu": "fused_sigmoid_mul_cpu",
        "fused_qk_gemma_rmsnorm": "fused_qk_gemma_rmsnorm_cpu",
        "fused_qk_gemma_rmsnorm_with_gate": "fused_qk_gemma_rmsnorm_with_gate_cpu",
        "fused_qkvzba_split_reshape_cat_contiguous": "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    }
    for attr, op in bound.items():
        assert getattr(module, attr) is getattr(torch.ops.sgl_kernel, op), (attr, getattr(module, attr))
        setattr(module, attr, getattr(ops, op))
