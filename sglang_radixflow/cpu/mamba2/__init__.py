"""Mamba-2 (NemotronH) ops: causal conv1d, SSD chunk scan, selective_state_update. See cpu/kv/__init__.py.

Nothing goes through sgl_kernel: mamba.py takes these ops from its own imports, so one post-import patch binds them.
"""
SGL_KERNEL: dict[str, dict[str, str]] = {}
POST_IMPORT: dict[str, str | list[str]] = {
    "sglang.srt.layers.attention.mamba.mamba": "sglang_radixflow.cpu.mamba2.patches:patch_mamba_mixer2",
}
