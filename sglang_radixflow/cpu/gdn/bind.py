"""How the GDN ops reach SGLang: the `sgl_kernel.mamba` names and two `torch.ops.sgl_kernel` ops.

`gdn_triton.py` and `gdn_backend.py` read `torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu` and
`torch.ops.sgl_kernel.fused_gdn_gating_cpu` at module import time, so a post-import patch comes too late: the ops
must exist before those module bodies run. Both modules import a name from `sgl_kernel.mamba` first, and every such
name resolves into this module, so importing it registers the ops (torch.library, CompositeImplicitAutograd: plain
torch code, no autograd formula needed). The post-import patches in `patches.py` then rebind the module globals to
the Python functions directly, which skips the dispatcher and reports unsupported arguments by name.
Nothing here registers `convert_weight_packed` or any other op SGLang reads as "AMX kernels exist".
"""
from __future__ import annotations

from sglang_radixflow.cpu.gdn import conv, ops
from sglang_radixflow.cpu.torch_ops import register_missing

# sgl_kernel.mamba exports (signatures of sgl_kernel/mamba.py's Python wrappers; SGLang calls them with keywords)
chunk_gated_delta_rule_cpu = ops.chunk_gated_delta_rule_cpu
causal_conv1d_fn_cpu = conv.causal_conv1d_fn_cpu
causal_conv1d_update_cpu = conv.causal_conv1d_update_cpu

NAMESPACE = "sgl_kernel"
TORCH_OPS: dict[str, tuple[str, object]] = {
    "fused_gdn_gating_cpu": (
        "fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias, float softplus_beta=1.0, "
        "float softplus_threshold=20.0) -> (Tensor, Tensor)",
        ops.fused_gdn_gating_cpu,
    ),
    "fused_sigmoid_gating_delta_rule_update_cpu": (
        "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, "
        "Tensor a, Tensor b, Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor cu_seqlens, "
        "bool use_qk_l2norm_in_kernel=False, float softplus_beta=1.0, float softplus_threshold=20.0, "
        "float? scale=None) -> Tensor",
        ops.fused_sigmoid_gating_delta_rule_update_cpu,
    ),
}
def register_torch_ops() -> list[str]:
    """Define the ops that are missing from torch.ops.sgl_kernel (idempotent); returns the names registered now."""
    return register_missing(NAMESPACE, TORCH_OPS)


register_torch_ops()
