"""Mamba-2 (NemotronH) ops: causal conv1d (conv.py), SSD chunk scan (ssd.py), selective_state_update (decode.py).
See cpu/kv/__init__.py.

Nothing goes through sgl_kernel: mamba.py takes these ops from its own imports, so one post-import patch binds them.
`--mamba-radix-cache-strategy extra_buffer` (SGLang's GPU default, a state snapshot inside an extend) runs too, for
Mamba-2 models: the SSD scan returns its track states, and three small patches cover the rest (patches.py).
"""
SGL_KERNEL: dict[str, dict[str, str]] = {}
POST_IMPORT: dict[str, str | list[str]] = {
    "sglang.srt.layers.attention.mamba.mamba": "sglang_radixflow.cpu.mamba2.patches:patch_mamba_mixer2",
    "sglang.srt.arg_groups.mamba_hook": "sglang_radixflow.cpu.mamba2.patches:allow_extra_buffer_on_cpu",
    "sglang.srt.managers.schedule_batch": "sglang_radixflow.cpu.mamba2.patches:pageable_decode_track_mask",
    "sglang.srt.layers.attention.hybrid_linear_attn_backend": "sglang_radixflow.cpu.mamba2.patches:patch_decode_tracking",
}
