"""Qwen3.5 (gated delta net + gated attention) ops. See cpu/kv/__init__.py for the table format.

`sglang/srt/models/qwen3_5.py` reads four `torch.ops.sgl_kernel.*_cpu` ops in its module body when it runs on a
CPU, so they must exist before that body runs: the PRE_IMPORT hook registers them (bind.py) just before the module
executes. Its GDN layers then run on the gdn family's kernels (chunked delta rule, conv, gating, gated norm).
"""
SGL_KERNEL: dict[str, dict[str, str]] = {}
PRE_IMPORT: dict[str, str | list[str]] = {
    "sglang.srt.models.qwen3_5": "sglang_radixflow.cpu.qwen3_5.bind:register_before_import",
}
POST_IMPORT: dict[str, str | list[str]] = {
    "sglang.srt.models.qwen3_5": "sglang_radixflow.cpu.qwen3_5.bind:check_bindings",
}
