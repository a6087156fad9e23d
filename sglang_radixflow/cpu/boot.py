"""Import hooks of the CPU runtime: the `sgl_kernel` stand-in and post-import patches of SGLang modules.

`install()` runs at interpreter start-up (via the .pth hook) when SGLANG_USE_CPU_ENGINE=1. It only puts a finder on
`sys.meta_path`; nothing is imported until SGLang imports `sgl_kernel` or a patched module.

Decision rule (evaluated once per process, on the first `import sgl_kernel`):
- the real package imports and registers its CPU ops  -> it is used untouched, no patch is applied;
- the real package imports but has no CPU ops (a CUDA build on a machine forced to the CPU engine) -> the
  stand-in's names are added where the real package lacks them, patches apply;
- the real package fails to import (CUDA-only wheel, no driver: `ImportError: libcuda.so.1`) -> the module becomes
  the stand-in, patches apply.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import types
from typing import Optional, Sequence

logger = logging.getLogger("sglang_radixflow.cpu")

SGL_KERNEL = "sgl_kernel"
# A CPU build of sgl-kernel registers this op (csrc/cpu); the CUDA wheels on PyPI do not.
_REAL_CPU_OP_PROBE = "copy_all_layer_kv_cache_cpu"


class _State:
    installed = False
    standin_active: Optional[bool] = None  # None: sgl_kernel not imported yet in this process
    reason = ""
    patched: list[str] = []


def install() -> None:
    """Idempotent. Puts the finder first on sys.meta_path."""
    if _State.installed:
        return
    sys.meta_path.insert(0, _RadixflowCpuFinder())
    _State.installed = True


def standin_active() -> bool:
    """Whether the CPU runtime replaces missing kernels in this process (imports sgl_kernel if needed)."""
    if _State.standin_active is None:
        import sgl_kernel  # noqa: F401  (goes through our loader, which sets the flag)
    assert _State.standin_active is not None, "sgl_kernel was imported before the CPU runtime was installed"
    return _State.standin_active


def status() -> dict[str, object]:
    return {
        "installed": _State.installed,
        "standin_active": _State.standin_active,
        "reason": _State.reason,
        "patched": list(_State.patched),
    }


class _RadixflowCpuFinder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of `sgl_kernel` and of the SGLang modules that have post-import patches."""

    def __init__(self) -> None:
        self._hooks: Optional[tuple[dict[str, list[str]], dict[str, list[str]]]] = None

    def _pre_and_post(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        if self._hooks is None:
            from sglang_radixflow.cpu import registry

            self._hooks = (registry.pre_import_hooks(), registry.post_import_patches())
        return self._hooks

    def _targets(self) -> set[str]:
        pre, post = self._pre_and_post()
        return set(pre) | set(post)

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target=None):  # noqa: ANN001
        if fullname != SGL_KERNEL and not fullname.startswith("sglang."):
            return None
        if fullname != SGL_KERNEL and fullname not in self._targets():
            return None
        spec = _find_with_others(self, fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        if fullname == SGL_KERNEL:
            spec.loader = _SglKernelLoader(spec.loader)
        else:
            pre, post = self._pre_and_post()
            spec.loader = _PatchingLoader(spec.loader, pre.get(fullname, []), post.get(fullname, []))
        return spec


def _find_with_others(me: object, fullname: str, path, target):  # noqa: ANN001
    for finder in sys.meta_path:
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


class _DelegatingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec):  # noqa: ANN201
        return self.inner.create_module(spec)


class _PatchingLoader(_DelegatingLoader):
    def __init__(self, inner: importlib.abc.Loader, pre: list[str], post: list[str]) -> None:
        super().__init__(inner)
        self.pre, self.post = pre, post

    def exec_module(self, module: types.ModuleType) -> None:
        from sglang_radixflow.cpu import registry

        if self.pre and standin_active():
            for ref in self.pre:
                registry.resolve(ref)(module)
                _State.patched.append(f"{module.__name__} <- {ref} (before import)")
        self.inner.exec_module(module)
        if not self.post or not standin_active():
            return
        for ref in self.post:
            registry.resolve(ref)(module)
            _State.patched.append(f"{module.__name__} <- {ref}")


class _SglKernelLoader(_DelegatingLoader):
    def exec_module(self, module: types.ModuleType) -> None:
        from sglang_radixflow.cpu import standin

        try:
            self.inner.exec_module(module)
        except (ImportError, OSError, RuntimeError) as exc:
            _purge_submodules()
            standin.become_standin(module)
            _State.standin_active = True
            _State.reason = f"real sgl_kernel failed to import: {exc}"
            return
        import torch

        if hasattr(torch.ops.sgl_kernel, _REAL_CPU_OP_PROBE):
            _State.standin_active = False
            _State.reason = "real sgl_kernel has CPU ops"
            return
        standin.fill_missing(module)
        _State.standin_active = True
        _State.reason = "real sgl_kernel lacks CPU ops; stand-in names added where missing"


def _purge_submodules() -> None:
    for name in [n for n in sys.modules if n.startswith(SGL_KERNEL + ".")]:
        del sys.modules[name]
