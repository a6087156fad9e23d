"""Full-attention extend on SGLang's `torch_native` backend. See cpu/kv/__init__.py for the table format.

SGLang's `TorchNativeAttnBackend._run_sdpa_forward_extend` pads every request's query to its whole sequence (cached
prefix included) and discards the prefix rows afterwards, so an extend costs O(L^2) whatever the cache hit: on
CPU a prefix hit then saves little attention work, unlike every GPU backend, where the prefix is only read. The
patch (extend.py) computes the same rows for the new tokens only, with the offset causal mask.
"""
SGL_KERNEL: dict[str, dict[str, str]] = {}
POST_IMPORT: dict[str, str | list[str]] = {
    "sglang.srt.layers.attention.torch_native_backend": "sglang_radixflow.cpu.attention.extend:patch_torch_native",
}
