"""Post-import patch of SGLang's Mamba-2 mixer module: binds the torch ops where its CPU branch binds nothing.

`sglang/srt/layers/attention/mamba/mamba.py` imports causal_conv1d only under is_cuda/is_npu/is_xpu, and takes
`mamba_chunk_scan_combined` / `selective_state_update` from the Triton package (whose kernels fail on CPU).
`MambaMixer2.forward` looks all of them up as module globals at call time, so setting the globals is enough.
"""
from __future__ import annotations

import inspect
import types
from typing import Callable

MAMBA_MODULE = "sglang.srt.layers.attention.mamba.mamba"

# Module globals that MambaMixer2.forward reads, and what we bind them to.
_CONV_NAMES = ("causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_fn_triton", "causal_conv1d_update_triton")
_SSD_NAMES = ("mamba_chunk_scan_combined", "selective_state_update")
# Hybrids whose CPU kernels return the states extra_buffer snapshots inside an extend: Mamba-2 (the SSD scan's track
# states) and gated delta net (the chunk op's per-chunk states, cpu/gdn/ops.py).
CPU_EXTRA_BUFFER_ARCHS = (
    "NemotronHForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
)


def _params(fn: Callable) -> set[str]:
    return {
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }


def _assert_covers(ours: Callable, theirs: Callable) -> None:
    missing = _params(theirs) - _params(ours)
    assert not missing, (
        f"SGLang's {theirs.__module__}.{theirs.__qualname__} takes {sorted(missing)}, which the CPU stand-in "
        f"{ours.__module__}.{ours.__qualname__} does not: update sglang_radixflow/cpu/mamba2"
    )


def patch_mamba_mixer2(module: types.ModuleType) -> None:
    from sglang.kernels.ops.mamba import causal_conv1d_triton as conv_triton
    from sglang.kernels.ops.mamba.triton_ops import ssd_combined, ssu_dispatch
    from sglang.srt.layers.attention.mamba import causal_conv1d as conv_cuda

    from sglang_radixflow.cpu.mamba2 import conv, decode, ssd

    # The CPU branch of mamba.py binds no causal conv; if it ever does, this patch must be revisited.
    for name in _CONV_NAMES:
        assert not hasattr(module, name), f"{MAMBA_MODULE}.{name} is bound on CPU now; revisit the mamba2 patch"
    assert module.mamba_chunk_scan_combined is ssd_combined.mamba_chunk_scan_combined, module.mamba_chunk_scan_combined
    assert module.selective_state_update is ssu_dispatch.selective_state_update, module.selective_state_update
    used = set(module.MambaMixer2.forward.__code__.co_names)
    assert used >= {"causal_conv1d_fn", "causal_conv1d_update", *_SSD_NAMES}, sorted(used)

    # Our functions accept every argument SGLang's implementations do (an upgrade adding one fails here).
    _assert_covers(conv.causal_conv1d_fn, conv_cuda.causal_conv1d_fn)
    _assert_covers(conv.causal_conv1d_update, conv_cuda.causal_conv1d_update)
    _assert_covers(conv.causal_conv1d_fn_triton_order, conv_triton.causal_conv1d_fn)
    _assert_covers(conv.causal_conv1d_update, conv_triton.causal_conv1d_update)
    _assert_covers(ssd.mamba_chunk_scan_combined, ssd_combined.mamba_chunk_scan_combined)
    _assert_covers(decode.selective_state_update, ssu_dispatch.selective_state_update)
    assert conv.PAD_SLOT_ID == conv_triton.PAD_SLOT_ID

    module.causal_conv1d_fn = conv.causal_conv1d_fn
    module.causal_conv1d_update = conv.causal_conv1d_update
    # Used when use_triton_causal_conv (page-major layout, or a model forcing it): ours index through torch,
    # so strided state views are fine.
    module.causal_conv1d_fn_triton = conv.causal_conv1d_fn_triton_order
    module.causal_conv1d_update_triton = conv.causal_conv1d_update
    module.mamba_chunk_scan_combined = ssd.mamba_chunk_scan_combined
    module.selective_state_update = decode.selective_state_update


def allow_extra_buffer_on_cpu(module: types.ModuleType) -> None:
    """`--mamba-radix-cache-strategy extra_buffer` on the CPU runtime: SGLang refuses it on any platform but
    CUDA / ROCm / MUSA / NPU / XPU. Its snapshots inside an extend come from the Mamba-2 SSD scan's track states
    (ssd.mamba_chunk_scan_combined) or the gated-delta-net chunk op's per-chunk states (gdn/ops.py), decode snapshots
    from `patch_decode_tracking`. Other hybrids (whose CPU kernels return neither) are refused, by name."""
    import torch

    original_platform = module._platform_supports_mamba_cache_extra_buffer
    original_validate = module.validate_mamba_extra_buffer
    assert "_platform_supports_mamba_cache_extra_buffer" in original_validate.__code__.co_names

    def platform_supported() -> bool:
        return original_platform() or not torch.cuda.is_available()  # an accelerator keeps SGLang's own answer

    def validate_mamba_extra_buffer(view, hf_config, **kwargs):  # noqa: ANN001, ANN003, ANN202
        arch = hf_config.architectures[0]
        if not torch.cuda.is_available() and arch not in CPU_EXTRA_BUFFER_ARCHS:
            raise AssertionError(
                f"extra_buffer on the CPU runtime supports {', '.join(CPU_EXTRA_BUFFER_ARCHS)} only, not "
                f"{arch}; use --mamba-radix-cache-strategy no_buffer")
        return original_validate(view, hf_config, **kwargs)

    module._platform_supports_mamba_cache_extra_buffer = platform_supported
    module.validate_mamba_extra_buffer = validate_mamba_extra_buffer


def patch_decode_tracking(module: types.ModuleType) -> None:
    """extra_buffer decode snapshots: the backend copies a request's state to its track slot every
    `--mamba-track-interval` tokens with a Triton kernel (per layer, or once for all layers when it knows the
    layer: the gated-delta-net path); bind the torch copies (track.py) in their place."""
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as triton_track

    from sglang_radixflow.cpu.mamba2 import track

    for name in ("track_mamba_states_if_needed", "track_mamba_states_all_layers"):
        assert getattr(module, name) is getattr(triton_track, name), name
        _assert_covers(getattr(track, name), getattr(triton_track, name))
        setattr(module, name, getattr(track, name))


def pageable_decode_track_mask(module: types.ModuleType) -> None:
    """extra_buffer decode: `ScheduleBatch.prepare_for_decode` pins its track mask with a bare `.pin_memory()` (every
    other copy in SGLang asks `is_pin_memory_available` first), which raises without CUDA. Pinning only speeds up a
    host-to-device copy, and on CPU there is none: inside that method, `pin_memory()` returns the tensor itself."""
    import functools

    import torch

    if torch.cuda.is_available():
        return
    original = module.ScheduleBatch.prepare_for_decode
    assert ".pin_memory()" in inspect.getsource(original), "SGLang's prepare_for_decode no longer pins: drop this patch"

    def pageable(self: torch.Tensor, device: object = None) -> torch.Tensor:
        return self

    @functools.wraps(original)
    def prepare_for_decode(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        pin, torch.Tensor.pin_memory = torch.Tensor.pin_memory, pageable
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.Tensor.pin_memory = pin

    module.ScheduleBatch.prepare_for_decode = prepare_for_decode
