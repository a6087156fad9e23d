"""CPU runtime: lets SGLang 0.5.23 serve the tiny models on machines with no GPU and no CPU build of sgl-kernel.

Activated by `_sglang_radixflow_boot` (a .pth start-up hook) only when SGLANG_USE_CPU_ENGINE=1. Two mechanisms:
- a stand-in for the `sgl_kernel` import, used only when the real package fails to import or lacks the CPU ops;
- post-import patches that bind torch implementations where SGLang's CPU path has none (Triton-only call sites).
Each op family (kv, mamba2, gdn) declares what it provides in its package `__init__` as plain strings, so nothing
heavy is imported until SGLang itself imports the module concerned.
"""
