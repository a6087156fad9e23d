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
