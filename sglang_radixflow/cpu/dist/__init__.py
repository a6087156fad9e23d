"""Tensor parallelism on the CPU engine: SGLang's group set-up asks for NCCL communicators on CPU (it excludes only
NPU / XPU), which fail without CUDA; on CPU its collectives fall back to torch.distributed (gloo) by themselves."""
SGL_KERNEL: dict[str, dict[str, str]] = {}
POST_IMPORT: dict[str, str | list[str]] = {
    "sglang.srt.distributed.parallel_state": "sglang_radixflow.cpu.dist.patches:no_nccl_on_cpu",
}
