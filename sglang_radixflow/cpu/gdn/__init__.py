"""Gated delta net (Qwen3-Next / Qwen3.5) ops. See cpu/kv/__init__.py for the table format.

- ops.py, conv.py, norm.py: torch implementations (ops: chunked gated delta rule, recurrent decode update, gating;
  conv: causal conv1d; norm: gated RMSNorm, shared-expert sigmoid gate).
- bind.py: the `sgl_kernel.mamba` names below; importing it registers torch.ops.sgl_kernel.fused_gdn_gating_cpu
  and fused_sigmoid_gating_delta_rule_update_cpu, which gdn_backend.py / gdn_triton.py read at import time.
- patches.py: post-import patches for the Triton/CUDA-only call sites on the Qwen3-Next path.
"""
_BIND = "sglang_radixflow.cpu.gdn.bind"
_PATCHES = "sglang_radixflow.cpu.gdn.patches"

SGL_KERNEL: dict[str, dict[str, str]] = {
    "mamba": {
        "chunk_gated_delta_rule_cpu": f"{_BIND}:chunk_gated_delta_rule_cpu",
        "causal_conv1d_fn_cpu": f"{_BIND}:causal_conv1d_fn_cpu",
        "causal_conv1d_update_cpu": f"{_BIND}:causal_conv1d_update_cpu",
    },
}
POST_IMPORT: dict[str, str | list[str]] = {
    "sglang.srt.layers.attention.linear.kernels.gdn_triton": f"{_PATCHES}:patch_gdn_triton",
    "sglang.srt.layers.attention.linear.gdn_backend": f"{_PATCHES}:patch_gdn_backend",
    "sglang.kernels.ops.attention.fla.fused_norm_gate": f"{_PATCHES}:patch_fused_norm_gate",
    "sglang.kernels.ops.attention.fla.layernorm_gated": f"{_PATCHES}:patch_layernorm_gated",
    "sglang.srt.models.qwen3_next": f"{_PATCHES}:patch_qwen3_next",
    "sglang.srt.models.qwen2_moe": f"{_PATCHES}:patch_qwen2_moe",
}
