"""KV-cache and request-pool ops that SGLang imports from sgl_kernel on every CPU model (full attention included).

Table format shared by every family (strings only: this module is imported before torch):
- SGL_KERNEL: {submodule of sgl_kernel ('' = top level): {exported name: 'python.module:attribute'}}
- POST_IMPORT: {SGLang module name: 'python.module:patch_function' or a list of them}; each patch gets the module.
"""
SGL_KERNEL: dict[str, dict[str, str]] = {
    "": {
        "copy_all_layer_kv_cache_cpu": "sglang_radixflow.cpu.kv.ops:copy_all_layer_kv_cache_cpu",
        "assign_req_to_token_pool_cpu": "sglang_radixflow.cpu.kv.ops:assign_req_to_token_pool_cpu",
    },
}
POST_IMPORT: dict[str, str | list[str]] = {}

# Imported at module level on SGLang's CPU path but used only by features this runtime does not support:
# the stand-in exports a function that raises NotImplementedError naming the feature when called.
UNSUPPORTED: dict[str, str] = {
    name: "speculative decoding"
    for name in (
        "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu", "fill_accept_out_cache_loc_cpu",
        "fill_bonus_tokens_cpu", "rotate_input_ids_cpu", "assign_draft_cache_locs_contiguous_cpu",
        "assign_extend_cache_locs_cpu", "build_draft_decode_metadata_cpu",
    )
}
